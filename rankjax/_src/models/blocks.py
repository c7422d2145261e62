"""The residual block of Transforming Rank, Eq. 17, as pure functions of arrays.

  h_l = R(h_skip + beta * B(f(P(h_{l-1}))))

with ``h_skip = h_{l-1}`` for the usual residual block. ``skip_every = k`` puts one
skip connection around each group of k blocks: the k-1 inner blocks of a group are
plain feedforward blocks ``h_l = R(B(f(P(h_{l-1}))))`` and the block that closes the
group adds the group's input, ``h_l = R(h_start + beta * B(f(P(h_{l-1}))))``.
``skip_every = 0`` has no skips (a plain deep MLP).

Each block's parameters are a dict of arrays; ``ResidualMLP`` stores them stacked
along a leading depth axis so that ``lax.scan`` and the Jacobian engine can walk the
blocks without Python loops. Shapes for one block (d = width, m = hidden width):

  M=2:  w_up (d, m), w_down (m, d), and w_gate (d, m) for swiglu
  M=1:  w (d, d), and w_gate (d, d) for swiglu
  p_scale / b_scale / r_scale (d,) when ``norm_gain`` and the op has a gain.

``residual_sublayer`` is Eq. 17 for any branch and any norm implementation: the
MLP's blocks (pure functions of parameter dicts, here) and each of the decoder
LM's two sublayers (linen modules, ``rankjax._src.models.transformer``) are built on it.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from rankjax._src.config import MLPConfig
from rankjax._src import partitioning
from rankjax._src.models import activations, norms
from rankjax._src.numerics import as_float

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": activations.gelu,
    "silu": activations.silu,
    "abs": jnp.abs,
    "tanh": jnp.tanh,
}


def derivative(fn: Callable[[jax.Array], jax.Array], z: jax.Array) -> jax.Array:
  """``fn'(z)`` of an elementwise ``fn`` (one forward tangent of ones)."""
  return jax.jvp(fn, (z,), (jnp.ones_like(z),))[1]


def matrix_shapes(cfg: MLPConfig) -> dict[str, tuple[int, int]]:
  """Shapes (fan_in, fan_out) of one block's branch matrices (P, B of Eq. 17)."""
  d, m = cfg.width, cfg.hidden_width
  if cfg.branch_matrices == 2:
    shapes = {"w_up": (d, m), "w_down": (m, d)}
    if cfg.activation == "swiglu":
      shapes["w_gate"] = (d, m)
  else:
    shapes = {"w": (d, d)}
    if cfg.activation == "swiglu":
      shapes["w_gate"] = (d, d)
  return shapes


def gain_names(cfg: MLPConfig) -> tuple[str, ...]:
  """Names of the learned norm gains of one block (R, P, B of Eq. 17; none unless
  ``norm_gain``)."""
  if not cfg.norm_gain:
    return ()
  return tuple(f"{loc}_scale" for loc, op in zip("pbr", cfg.norm_ops) if norms.has_gain(op))


def init_block(key: jax.Array, cfg: MLPConfig) -> dict[str, jax.Array]:
  """One block's parameters: matrices N(0, alpha^2 / fan_in) (paper Sec 2), gains 1."""
  dtype = jnp.dtype(cfg.param_dtype)
  params = {}
  shapes = matrix_shapes(cfg)
  for k, (name, shape) in zip(jax.random.split(key, len(shapes)), sorted(shapes.items())):
    std = cfg.alpha / math.sqrt(shape[0])
    params[name] = std * jax.random.normal(k, shape, dtype)
  for name in gain_names(cfg):
    params[name] = jnp.ones((cfg.width,), dtype)
  return params


def _norm(params: dict, loc: str, op: str, x: jax.Array, eps: float) -> jax.Array:
  """The norm at ``loc``, computed in float32 (``as_float``) and returned in ``x``'s
  dtype, its gain kept in its own dtype (``numerics.compute_copy``)."""
  y = norms.normalize(as_float(x), op, eps)
  scale = params.get(f"{loc}_scale")
  return (y if scale is None else y * scale).astype(x.dtype)


def activation(params: dict, z: jax.Array, pre: jax.Array, cfg: MLPConfig) -> jax.Array:
  """sigma applied to the pre-activation ``pre`` (swiglu gates with ``z @ w_gate``)."""
  if cfg.activation == "swiglu":
    return activations.silu(z @ params["w_gate"]) * pre
  return ACTIVATIONS[cfg.activation](pre)


def residual_sublayer(h: jax.Array, branch: Callable[[jax.Array], jax.Array],
                      norm: Callable[[str, jax.Array], jax.Array], beta: float,
                      h_skip: jax.Array | None = None,
                      has_skip: jax.Array | bool = True,
                      tap: Callable[[str, jax.Array], jax.Array] | None = None,
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One residual sublayer of Eq. 17: ``R(h_skip + beta * B(f(P(h))))``.

  ``branch`` is f; ``norm(loc, x)`` applies the operation at ``loc`` in "p", "b", "r"
  (the identity where there is none). ``h_skip`` defaults to ``h``; a false
  ``has_skip`` (may be traced) drops the skip: ``R(B(f(P(h))))``.

  Returns ``(x, y, h_new)``: the branch input ``x = P(h)``, the residual sum before
  the R norm ``y = h_skip + beta * B(f(x))`` and the block output ``h_new = R(y)``
  (the postnorm paper's X_k, Y_k and the next sublayer's stream, its Eq. 1).
  ``beta`` is a Python float, or a scalar array (a per-run value of one program).
  ``tap(name, value)``, when given, sees ``x`` ("x") and ``y`` ("y") as they are made
  and returns what the computation continues with (capture / perturbation hooks).
  """
  tap = tap or (lambda _, value: value)
  x = tap("x", norm("p", h))
  u = norm("b", branch(x))
  skip = h if h_skip is None else h_skip
  if isinstance(beta, jax.Array):   # one run's traced value (rankjax._src.train.runs): in the
    beta = beta.astype(u.dtype)     # branch's dtype, as a Python float's weak type is
  if has_skip is True:
    y = skip + beta * u
  else:
    y = jnp.where(has_skip, skip + beta * u, u)
  y = tap("y", y)
  return x, y, norm("r", y)


def _branch_core(params: dict, z: jax.Array, cfg: MLPConfig) -> jax.Array:
  """f(z) without the P norm."""
  if cfg.branch_matrices == 2:
    return activation(params, z, z @ params["w_up"], cfg) @ params["w_down"]
  return activation(params, z, z @ params["w"], cfg)


def _norm_at(params: dict, cfg: MLPConfig) -> Callable[[str, jax.Array], jax.Array]:
  ops = dict(zip("pbr", cfg.norm_ops))
  return lambda loc, x: _norm(params, loc, ops[loc], x, cfg.norm_eps)


def branch_fn(params: dict, x: jax.Array, cfg: MLPConfig) -> jax.Array:
  """``f(P(x))``: the branch before its output norm and without beta."""
  return _branch_core(params, _norm_at(params, cfg)("p", x), cfg)


def branch_out(params: dict, x: jax.Array, cfg: MLPConfig) -> jax.Array:
  """``B(f(P(x)))``: the branch of Transforming Rank, Eq. 17."""
  return _norm(params, "b", cfg.norm_ops[1], branch_fn(params, x, cfg), cfg.norm_eps)


def block_fn(params: dict, h: jax.Array, h_skip: jax.Array, has_skip: jax.Array | bool,
             cfg: MLPConfig) -> jax.Array:
  """One block of Eq. 17: ``R(h_skip + beta B(f(P(h))))`` or ``R(B(f(P(h))))``.

  ``has_skip`` may be a traced boolean (inside ``lax.scan``).
  """
  has_skip = jnp.asarray(has_skip)       # the MLP always selects (bit-stable HLO)
  _, _, h_new = residual_sublayer(h, lambda z: _branch_core(params, z, cfg),
                                  _norm_at(params, cfg), cfg.beta, h_skip, has_skip)
  return h_new


def skip_flags(cfg: MLPConfig) -> jax.Array:
  """(L,) booleans: block l (1-indexed) closes a skip group iff k > 0 and l % k == 0
  (the skip every k blocks of Transforming Rank, Fig 1)."""
  k = cfg.skip_every
  if k == 0:
    return jnp.zeros((cfg.depth,), bool)
  return (jnp.arange(1, cfg.depth + 1) % k) == 0


def stack_forward(blocks: dict, h0: jax.Array, cfg: MLPConfig) -> tuple[jax.Array, jax.Array]:
  """Runs all L blocks of Eq. 17 with ``lax.scan``; ``blocks`` holds arrays stacked on
  axis 0.

  Returns (h_L, hs) with hs of shape (L, ...) holding every block output h_1..h_L.
  """

  def step(carry, xs):
    h, h_start = carry
    h = partitioning.constrain(h, ("batch", "embed"))
    params, closes = xs
    h_new = block_fn(params, h, h_start, closes, cfg)
    h_start = jnp.where(closes, h_new, h_start)
    return (h_new, h_start), h_new

  (h_last, _), hs = jax.lax.scan(step, (h0, h0), (blocks, skip_flags(cfg)))
  return h_last, hs
