"""Forward representations and branch conditioning ("Transforming Rank", Sec 5-6, App C-D).

Representation side (Sec 5, App C): the residual representation ``Z_l`` (rows: the
stream h_l of n probe inputs), its effective rank and top-direction energy, the mean
spike ``mu_l = mean_n h_l`` (= m_1 + ... + m_l for an identity skip), the branch means
``m_l`` (the across-input mean of block l's increment beta B(f(P(h)))), their
alignments ``cos(m_l, m_l')`` and ``cos(m_l, 1)`` (``similarity.cosine`` /
``cosine_matrix``), and the growth exponent of ``||mu_l||``.

Branch side (Sec 6, App D): the masked up-projection ``D W_up`` with
``D = diag(sigma'(W_up x))``, its Gram matrix ``G = (D W_up)^T (D W_up) / n_eff`` with
``n_eff = sum_i sigma'(z_i)^2`` (Fig 9, App D.4), smallest Gram eigenvalues and
conditioning (App D.7). These follow the paper's column convention: ``W_up`` is
``m x d``. The branch Jacobian core ``J_f = W_down D W_up`` (Eq. 9, 25) is
``jacobians.branch_jacobian`` (the code's row layout, ``w_up = W_up^T``).

The measurements are pure functions of arrays; ``trace_representations`` and
``mlp_representation_study`` connect them to a residual MLP config.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.config import MLPConfig
from rankjax._src.measure import jacobians, spectra
from rankjax._src.measure import precision as precision_lib
from rankjax._src.measure.similarity import cosine, cosine_matrix
from rankjax._src.models import blocks as blocks_lib

Array = jax.Array


# ---------------------------------------------------------------------------
# Pure measurements


def consecutive_cosine(m_LxD: Array) -> Array:
  """``cos(m_l, m_{l+1})`` (Fig 7a), ``(..., L-1)``."""
  return cosine(m_LxD[..., :-1, :], m_LxD[..., 1:, :])


def cosine_with_ones(m_LxD: Array) -> Array:
  """``cos(m_l, 1)``, which tends to sqrt(c) for one uncentered matrix (App C)."""
  return cosine(m_LxD, jnp.ones_like(m_LxD))


def off_diagonal_mean(c_LxL: Array) -> Array:
  """Mean of the off-diagonal entries of ``(..., L, L)`` matrices (the pairwise
  cosines of Transforming Rank, Fig 7)."""
  n = c_LxL.shape[-1]
  mask = 1.0 - jnp.eye(n, dtype=c_LxL.dtype)
  return jnp.sum(c_LxL * mask, axis=(-2, -1)) / (n * (n - 1))


def mean_spike(z_NxD: Array) -> Array:
  """``||mean_n Z||``, the norm of the across-input mean (Fig 7b)."""
  return jnp.linalg.norm(jnp.mean(z_NxD, axis=-2), axis=-1)


def mean_noise_floor(z_NxD: Array) -> Array:
  """``sqrt(E||z||^2 / n)``: what ``mean_spike`` reads for a zero-mean process (App C)."""
  n = z_NxD.shape[-2]
  return jnp.sqrt(jnp.mean(jnp.sum(jnp.square(z_NxD), axis=-1), axis=-1) / n)


def growth_exponent(values: np.ndarray, layers: np.ndarray, lo: float = 0.0,
                    hi: float = np.inf) -> float:
  """Least-squares slope q of ``log values ~ q log layers`` over ``lo <= l <= hi``
  (the growth of the mean across depth: Transforming Rank, Fig 7b, App C)."""
  values, layers = np.asarray(values, float), np.asarray(layers, float)
  keep = (layers >= lo) & (layers <= hi) & (values > 0) & (layers > 0)
  return float(np.polyfit(np.log(layers[keep]), np.log(values[keep]), 1)[0])


def activation_derivative(activation: str, z: Array) -> Array:
  """``sigma'(z)`` elementwise for a pointwise activation of ``blocks.ACTIVATIONS`` (the
  diagonal D of the branch Jacobian ``J_f = W_down D W_up``, Transforming Rank Eq. 9)."""
  return blocks_lib.derivative(blocks_lib.ACTIVATIONS[activation], z)


def masked_up_projection(w_up_MxD: Array, x_D: Array, activation: str) -> tuple[Array, Array]:
  """``(D W_up, n_eff)`` with ``D = diag(sigma'(W_up x))``, ``n_eff = sum sigma'^2`` (Sec 6)."""
  dsig = activation_derivative(activation, w_up_MxD @ x_D)
  return dsig[:, None] * w_up_MxD, jnp.sum(jnp.square(dsig))


@precision_lib.measured
def masked_gram_eigenvalues(w_up_MxD: Array, x_D: Array, activation: str
                            ) -> tuple[Array, Array]:
  """Eigenvalues of ``G = (D W_up)^T (D W_up) / n_eff`` and ``gamma = n_eff / d`` (Fig 9).

  With unit-variance ``W_up`` and unit-norm x, the pre-activations are standard
  Gaussian; G then follows Marchenko-Pastur at ``gamma`` (exactly for relu/abs,
  approximately for smooth activations, App D.2-D.4).
  """
  a, n_eff = masked_up_projection(w_up_MxD, x_D, activation)
  gram = a.T @ a / n_eff
  return jnp.linalg.eigvalsh(gram), n_eff / w_up_MxD.shape[-1]


@precision_lib.measured
def smallest_gram_eigenvalue(a_NxD: Array) -> Array:
  """``sigma_min(A)^2``, the smallest eigenvalue of ``A^T A`` (App D.7), batched."""
  return jnp.min(spectra.singular_values(a_NxD), axis=-1) ** 2


@precision_lib.measured
def condition_number(a_NxD: Array) -> Array:
  """``sigma_max / sigma_min`` over the last two axes."""
  s = spectra.singular_values(a_NxD)
  return s[..., 0] / s[..., -1]


@precision_lib.measured
def post_activation(w_DxM: Array, h_NxD: Array, activation: str) -> Array:
  """``sigma(H W)`` for probe rows H (Table 1's ``sigma(W h)`` in row convention)."""
  return blocks_lib.ACTIVATIONS[activation](h_NxD @ w_DxM)


# ---------------------------------------------------------------------------
# Connecting to a residual MLP


class RepresentationTrace(NamedTuple):
  """Per-layer forward statistics of n probe inputs through one network.

  Attributes:
    stream_mean: ``(L+1, d)`` mean_n h_l, l = 0..L.
    branch_mean: ``(L, d)`` m_l, the mean over inputs of block l's increment.
    noise_floor: ``(L+1,)`` ``mean_noise_floor(Z_l)``.
    stream_rms: ``(L+1,)`` rms over inputs and features of h_l.
    singular_values: ``(len(layers), min(n, d))`` singular values of Z_l at the
      requested layers.
  """

  stream_mean: Array
  branch_mean: Array
  noise_floor: Array
  stream_rms: Array
  singular_values: Array


def _layer_mask(layers: Sequence[int], depth: int) -> tuple[list[int], np.ndarray]:
  """Sorted unique layers in [0, depth] and the (depth+1,) mask that selects them."""
  layers = sorted(set(int(l) for l in layers))
  if layers and (layers[0] < 0 or layers[-1] > depth):
    raise ValueError(f"layers must lie in [0, {depth}], got {layers}")
  selected = np.zeros(depth + 1, bool)
  selected[layers] = True
  return layers, selected


def _singular_values_if(flag: Array, z: Array, k: int) -> Array:
  """Singular values of z where ``flag`` (inside a depth scan), zeros elsewhere."""
  return jax.lax.cond(flag, lambda: spectra.singular_values(z), lambda: jnp.zeros((k,), z.dtype))


@precision_lib.measured
def trace_representations(blocks: dict, x_NxD: Array, cfg: MLPConfig,
                          layers: Sequence[int], beta: Array | float | None = None
                          ) -> RepresentationTrace:
  """Runs the block stack on probe rows ``x_NxD`` keeping O(L d) statistics (Sec 5).

  The spectra of ``Z_l`` are taken only at ``layers`` (0 = the input) inside the
  depth scan, so memory stays O(n d + L d) at any depth.
  """
  beta = cfg.beta if beta is None else beta
  n, d = x_NxD.shape
  k = min(n, d)
  layers, selected = _layer_mask(layers, cfg.depth)
  p_op, b_op, r_op = cfg.norm_ops
  eps = cfg.norm_eps

  sv_if = functools.partial(_singular_values_if, k=k)

  def step(carry, xs):
    h, h_start = carry
    params, closes, flag = xs
    u = jax.vmap(lambda r: blocks_lib.branch_out(params, r, cfg))(h)
    inc = jnp.where(closes, beta, 1.0).astype(h.dtype) * u
    pre_r = jnp.where(closes, h_start + inc, inc)
    h_new = jax.vmap(lambda r: blocks_lib._norm(params, "r", r_op, r, eps))(pre_r)
    h_start = jnp.where(closes, h_new, h_start)
    stats = (jnp.mean(h_new, axis=0), jnp.mean(inc, axis=0), mean_noise_floor(h_new),
             jnp.sqrt(jnp.mean(jnp.square(h_new))), sv_if(flag, h_new))
    return (h_new, h_start), stats

  del p_op, b_op
  xs = (blocks, blocks_lib.skip_flags(cfg), jnp.asarray(selected[1:]))
  _, (smean, bmean, floor, rms, sv) = jax.lax.scan(step, (x_NxD, x_NxD), xs)
  sv0 = sv_if(jnp.asarray(selected[0]), x_NxD)
  cat = lambda first, rest: jnp.concatenate([first[None], rest], axis=0)
  sv_all = cat(sv0, sv)
  return RepresentationTrace(
      stream_mean=cat(jnp.mean(x_NxD, axis=0), smean), branch_mean=bmean,
      noise_floor=cat(mean_noise_floor(x_NxD), floor),
      stream_rms=cat(jnp.sqrt(jnp.mean(jnp.square(x_NxD))), rms),
      singular_values=sv_all[np.asarray(layers, int)])


@precision_lib.measured
def backward_stream(blocks: dict, x_NxD: Array, delta_L_NxD: Array, cfg: MLPConfig,
                    layers: Sequence[int]) -> dict[str, Array]:
  """The backward residual stream ``delta_{l-1} = delta_l + beta J_l^T delta_l`` (Sec 5,
  App C "No backward analogue"), for probe rows ``x_NxD`` and a given gradient
  ``delta_L_NxD`` at the output, by exact per-block VJPs (``jax.vjp`` of each block).

  Needs an identity skip at every block (``jacobians.identity_skip`` and
  ``skip_every=1``). Returns, with l = L..1 stored in order 1..L:
    ``contribution_mean`` (L, d): n_l = mean_x[beta J_l^T delta_l], the backward
      analogue of the branch mean m_l;
    ``stream_mean`` (L+1, d): mean_x delta_l for l = 0..L;
    ``mean_fraction`` (L+1,): ||mean_x delta_l||^2 / mean_x ||delta_l||^2;
    ``singular_values`` (len(layers), min(n, d)) of the n x d matrix of delta_l at
      ``layers`` (0 = the input);
  and, from the same forward pass, ``branch_mean`` (L, d) m_l and the forward
  ``forward_mean_fraction`` (L+1,) of h_l.
  """
  if not jacobians.identity_skip(cfg) or cfg.skip_every != 1:
    raise ValueError("backward_stream needs an identity skip at every block "
                     f"(norm_position pre/output/none, skip_every=1); got {cfg.norm_position!r}, "
                     f"skip_every={cfg.skip_every}")
  n, d = x_NxD.shape
  k = min(n, d)
  layers, selected = _layer_mask(layers, cfg.depth)

  def fraction(z_NxD):
    return jnp.sum(jnp.square(jnp.mean(z_NxD, 0))) / jnp.mean(jnp.sum(jnp.square(z_NxD), -1))

  sv_if = functools.partial(_singular_values_if, k=k)

  _, hs = blocks_lib.stack_forward(blocks, x_NxD, cfg)          # (L, n, d): h_1..h_L
  h_in = jnp.concatenate([x_NxD[None], hs[:-1]], axis=0)        # block l's input h_{l-1}

  def back(delta, xs):
    params, h, flag = xs
    block = lambda r: blocks_lib.block_fn(params, r, r, True, cfg)
    _, vjp = jax.vjp(jax.vmap(block), h)
    new = vjp(delta)[0]
    return new, (jnp.mean(new - delta, 0), jnp.mean(new, 0), fraction(new), sv_if(flag, new))

  xs = (blocks, h_in, jnp.asarray(selected[:-1]))
  _, (contrib, smean, frac, sv) = jax.lax.scan(back, delta_L_NxD, xs, reverse=True)
  cat = lambda rest, last: jnp.concatenate([rest, last[None]], axis=0)
  sv_all = cat(sv, sv_if(jnp.asarray(selected[-1]), delta_L_NxD))
  h_all = jnp.concatenate([x_NxD[None], hs], axis=0)
  return {"contribution_mean": contrib,
          "stream_mean": cat(smean, jnp.mean(delta_L_NxD, 0)),
          "mean_fraction": cat(frac, fraction(delta_L_NxD)),
          "singular_values": sv_all[np.asarray(layers, int)],
          "branch_mean": jnp.mean(hs - h_in, axis=1),
          "forward_mean_fraction": jax.vmap(fraction)(h_all)}


@flax.struct.dataclass
class RepresentationStudy:
  """Representation measurements averaged over weight draws (Sec 5, App C; Fig 7, 14, 15).

  Attributes:
    layers: the layers at which Z_l's spectrum was taken (static).
    erank: (len(layers),) erank(Z_l)/d.
    top_energy: (len(layers),) sigma_1^2 / sum sigma^2 of Z_l.
    stable_rank: (len(layers),) st(Z_l).
    top_singular_values: (len(layers), min(n, d)) mean singular values, normalized by
      the largest (the spectrum of Fig 7c).
    mean_spike: (L+1,) ||mean_n h_l||.
    stream_cosine_ones: (L+1,) cos(mu_l, 1), which tends to 1 as the spike grows (App C).
    noise_floor: (L+1,) sqrt(E||h_l||^2 / n).
    stream_rms: (L+1,) rms(h_l).
    consecutive_cosine: (L-1,) cos(m_l, m_{l+1}).
    cosine_ones: (L,) cos(m_l, 1).
    branch_cosine: (L, L) cos(m_l, m_l').
    per_seed: every measurement above before the mean over weight draws, by name,
      with a leading (num_seeds,) axis (a row's spread).
  """

  erank: Array
  top_energy: Array
  stable_rank: Array
  top_singular_values: Array
  mean_spike: Array
  stream_cosine_ones: Array
  noise_floor: Array
  stream_rms: Array
  consecutive_cosine: Array
  cosine_ones: Array
  branch_cosine: Array
  per_seed: dict
  layers: tuple = flax.struct.field(pytree_node=False, default=())


def mlp_representation_study(cfg: MLPConfig, key: Array, num_inputs: int = 512,
                             num_seeds: int = 1, layers: Sequence[int] | None = None,
                             precision: str | None = None) -> RepresentationStudy:
  """Forward representation study of a config at initialization (Sec 5, Fig 7, 14, 15).

  ``num_inputs`` Gaussian probe inputs ``N(0, I_d)`` per weight draw; seeds run one
  after another (the probe batch is the parallel axis). ``layers`` defaults to every
  layer 1..L. ``precision``: matmul precision (``rankjax._src.measure.precision``; default
  'highest').
  """
  layers = tuple(range(1, cfg.depth + 1)) if layers is None else tuple(sorted(set(layers)))
  d = cfg.width

  precision = precision_lib.check_precision(precision)

  @jax.jit
  @functools.partial(precision_lib.measured_at, precision)
  def one(k):
    blocks, x = jacobians.seed_samples(cfg, k, num_inputs)
    tr = trace_representations(blocks, x, cfg, layers)
    sv = tr.singular_values
    return {
        "erank": spectra.effective_rank_from_singular_values(sv) / d,
        "top_energy": spectra.top_energy_fraction_from_singular_values(sv),
        "stable_rank": spectra.stable_rank_from_singular_values(sv),
        "top_singular_values": sv / sv[:, :1],
        "mean_spike": jnp.linalg.norm(tr.stream_mean, axis=-1),
        "stream_cosine_ones": cosine_with_ones(tr.stream_mean),
        "noise_floor": tr.noise_floor, "stream_rms": tr.stream_rms,
        "consecutive_cosine": consecutive_cosine(tr.branch_mean),
        "cosine_ones": cosine_with_ones(tr.branch_mean),
        "branch_cosine": cosine_matrix(tr.branch_mean),
    }

  per_seed = [one(k) for k in jax.random.split(key, num_seeds)]
  mean = {name: jnp.mean(jnp.stack([p[name] for p in per_seed]), axis=0) for name in per_seed[0]}
  stacked = {name: jnp.stack([p[name] for p in per_seed]) for name in per_seed[0]}
  return RepresentationStudy(layers=layers, per_seed=stacked, **mean)
