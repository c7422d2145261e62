"""Block Jacobians, input-output Jacobians and the one-call study of a residual MLP.

"Transforming Rank", Eq. 17-18: block l maps ``h_l = R(h_skip + beta B(f(P(h_{l-1}))))``
and its Jacobian splits into a skip part and a branch part,

    dh_l/dh_{l-1} = K_l + B_l,    K_l = J_R,   B_l = J_R G_l,   G_l = beta J_B J_f J_P,

with ``K_l = I`` when R is the identity (``pre``, ``output``, ``peri``, ``none``).
``G_l`` is the branch term relative to the skip: its Frobenius norm over ``||I||_F`` is
the branch-to-skip ratio r_l (Eq. 4, 21); J_R multiplies both terms and cancels.

With ``skip_every = k != 1`` (Fig 1) the blocks inside a group are plain layers
``h_l = R(B(f(P(h_{l-1}))))`` and the group's last block adds the group input
``h_start``; then ``K_l = J_R`` is the Jacobian with respect to ``h_start`` (zero for
inner blocks) and ``B_l = J_R J_B J_f J_P`` (beta only on closing blocks). The
input-output Jacobian is the recurrence ``T_l = K_l T_start + B_l T_{l-1}`` (Eq. 2
for k=1). Path sums need the ``K + B`` product form, which holds for
``skip_every`` in {0, 1} (0: no skips, K = 0, every path has order L); for other
spacings the study leaves the path fields NaN.

Everything is evaluated along one forward pass (Sec 2, App A.1) with ``lax.scan`` over
depth, ``vmap`` over inputs and over independent weight draws.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import math
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rankjax.config import MLPConfig
from rankjax.measure import host_svd, paths, spectra
from rankjax.measure import precision as precision_lib
from rankjax.measure import seed_devices, weight_draws
from rankjax.models import activations
from rankjax.models import blocks as blocks_lib
from rankjax.models import norms
from rankjax.numerics import as_float

Array = jax.Array


class BlockJacobianMethod(enum.Enum):
  """How block Jacobians are computed; both are exact.

  CLOSED_FORM: ``J_f = W_down^T diag(sigma'(pre)) W_up^T`` (Eq. 9, 25; row-vector
    code ``x @ W``), one ``d x m x d`` GEMM per block, and every norm Jacobian applied
    as its rank-one/two update (Eq. 19-20, Table 2) in O(d^2)
    (``models.norms.jacobian_left/right``). Default; about half
    the FLOPs of JACFWD.
  JACFWD: ``jax.jacfwd`` of ``blocks.block_fn`` with respect to (h, h_skip) and of
    ``blocks.branch_out`` (for G): 2d forward tangents per block, each costing one
    forward pass of the branch. Works for any block; used to check CLOSED_FORM.
  """

  CLOSED_FORM = "closed_form"
  JACFWD = "jacfwd"


class BlockJacobians(NamedTuple):
  """Block Jacobians along one forward pass (one input, one weight draw).

  Attributes:
    skip: ``(L, d, d)`` K_l, or None when every K_l is the identity.
    branch: ``(L, d, d)`` B_l.
    relative_branch: ``(L, d, d)`` G_l = beta J_B J_f J_P (the branch term inside
      ``J_R (I + G_l)``).
    stream: ``(L+1, d)`` h_0 .. h_L.
  """

  skip: Array | None
  branch: Array
  relative_branch: Array
  stream: Array


def identity_skip(cfg: MLPConfig) -> bool:
  """True when every K_l = I (no post-residual op and a skip around every block)."""
  return cfg.norm_ops[2] == "none" and cfg.skip_every == 1


def supports_path_sums(cfg: MLPConfig) -> bool:
  return cfg.skip_every in (0, 1)


def branch_jacobian(params: dict, z_D: Array, activation: str) -> tuple[Array, Array]:
  """``(f, J_f)``: the branch core ``f(z)`` and its Jacobian in z (Eq. 9, 25), the
  library's one branch Jacobian of an MLP branch.

  Convention: ``J_f[i, j] = d f_i / d z_j`` (rows are outputs: ``J = dB/dh``), with the
  weights in the code's row layout ``x @ W`` (``blocks.matrix_shapes``): ``w_up``
  (d, m), ``w_down`` (m, d), or one ``w`` (d, d); ``w_gate`` like ``w_up`` for swiglu.
  The paper's column-layout matrices are their transposes (``W_up = w_up^T``, m x d),
  so for M=2 ``J_f = W_down diag(sigma'(W_up z)) W_up = w_down^T diag(sigma'(z w_up))
  w_up^T``.
  """
  two = "w_up" in params
  w_in = params["w_up"] if two else params["w"]
  pre = z_D @ w_in
  # da_DxM = d a / d z laid out like w_in: da_DxM[j, i] = d a_i / d z_j.
  if activation == "swiglu":
    gate = z_D @ params["w_gate"]
    silu_g = activations.silu(gate)
    act = silu_g * pre
    dgate = activations.silu_derivative(gate) * pre
    da_DxM = params["w_gate"] * dgate[None, :] + w_in * silu_g[None, :]
  else:
    fn = blocks_lib.ACTIVATIONS[activation]
    act = fn(pre)
    da_DxM = w_in * blocks_lib.derivative(fn, pre)[None, :]
  if two:
    # J_f^T = da (d x m) @ W_down (m x d), then transposed: XLA:CPU runs this
    # (d x m)(m x d) product at about twice the rate of J_f = W_down^T da^T (a
    # transposed-operand dot), 0.12 vs 0.19 s for L=48, d=256, 4x on one core; the
    # barrier keeps XLA from folding the transpose back into the dot.
    jt_DxD = jax.lax.optimization_barrier(da_DxM @ params["w_down"])
    return act @ params["w_down"], jt_DxD.T
  return act, da_DxM.T


def _block_closed_form(params, h, h_start, closes, cfg, beta):
  p_op, b_op, r_op = cfg.norm_ops
  eps = cfg.norm_eps
  z = blocks_lib._norm(params, "p", p_op, h, eps)
  f, jf = branch_jacobian(params, z, cfg.activation)
  jfp = norms.jacobian_right(jf, h, p_op, eps, params.get("p_scale"))
  u = blocks_lib._norm(params, "b", b_op, f, eps)
  jbfp = norms.jacobian_left(jfp, f, b_op, eps, params.get("b_scale"))
  beta_eff = jnp.where(closes, beta, 1.0).astype(h.dtype)
  g = beta_eff * jbfp
  pre_r = jnp.where(closes, h_start + beta * u, u)
  h_new = blocks_lib._norm(params, "r", r_op, pre_r, eps)
  b = norms.jacobian_left(g, pre_r, r_op, eps, params.get("r_scale"))
  if identity_skip(cfg):
    k = None
  else:
    eye = jnp.eye(h.shape[-1], dtype=h.dtype) * closes.astype(h.dtype)
    k = norms.jacobian_left(eye, pre_r, r_op, eps, params.get("r_scale"))
  return h_new, k, b, g


def _block_jacfwd(params, h, h_start, closes, cfg, beta):
  del beta  # block_fn reads cfg.beta
  fn = lambda x, s: blocks_lib.block_fn(params, x, s, closes, cfg)
  b, k = jax.jacfwd(fn, argnums=(0, 1))(h, h_start)
  beta_eff = jnp.where(closes, cfg.beta, 1.0).astype(h.dtype)
  g = beta_eff * jax.jacfwd(lambda x: blocks_lib.branch_out(params, x, cfg))(h)
  return fn(h, h_start), (None if identity_skip(cfg) else k), b, g


@precision_lib.measured
def block_jacobians(blocks: dict, h0_D: Array, cfg: MLPConfig,
                    method: BlockJacobianMethod | str = BlockJacobianMethod.CLOSED_FORM,
                    beta: Array | float | None = None) -> BlockJacobians:
  """K_l, B_l and G_l of every block along the forward pass from ``h0_D`` (Eq. 18).

  Args:
    blocks: the stacked block parameters (``variables["params"]["blocks"]``).
    h0_D: one input ``(d,)``; ``vmap`` for batches.
    cfg: the model config.
    method: ``BlockJacobianMethod`` (closed form by default).
    beta: the branch scale, possibly traced (closed form only); default cfg.beta.
  """
  method = BlockJacobianMethod(method)
  one = _block_closed_form if method is BlockJacobianMethod.CLOSED_FORM else _block_jacfwd
  if beta is None or method is BlockJacobianMethod.JACFWD:
    beta = cfg.beta

  def step(carry, xs):
    h, h_start = carry
    params, closes = xs
    h_new, k, b, g = one(params, h, h_start, closes, cfg, beta)
    h_start = jnp.where(closes, h_new, h_start)
    return (h_new, h_start), (k, b, g, h_new)

  _, (k, b, g, hs) = jax.lax.scan(step, (h0_D, h0_D), (blocks, blocks_lib.skip_flags(cfg)))
  return BlockJacobians(k, b, g, jnp.concatenate([h0_D[None], hs], axis=0))


@precision_lib.measured
def input_output_jacobians(bj: BlockJacobians, cfg: MLPConfig) -> Array:
  """``(L, d, d)`` dh_l/dh_0 for l = 1..L by the running product (Eq. 2, 10).

  ``T_l = K_l T_start + B_l T_{l-1}``, with ``T_start`` the Jacobian of the current
  skip group's input; for ``skip_every = 1`` this is ``T_l = (K_l + B_l) T_{l-1}``.
  """
  d = bj.branch.shape[-1]
  eye = jnp.eye(d, dtype=bj.branch.dtype)
  flags = blocks_lib.skip_flags(cfg)

  if cfg.skip_every == 1:
    def step(t, xs):
      k, b = xs
      t_new = (b if k is None else k + b) @ t + (t if k is None else 0.0)
      return t_new, t_new
    _, ts = jax.lax.scan(step, eye, (bj.skip, bj.branch))
    return ts

  def step(carry, xs):
    t, t_start = carry
    k, b, closes = xs
    t_new = k @ t_start + b @ t
    return (t_new, jnp.where(closes, t_new, t_start)), t_new
  _, ts = jax.lax.scan(step, (eye, eye), (bj.skip, bj.branch, flags))
  return ts


@precision_lib.measured
def network_jacobian(blocks: dict, h0_D: Array, cfg: MLPConfig) -> Array:
  """dh_L/dh_0 by ``jax.jacfwd`` of the whole block stack (the autodiff reference)."""
  return jax.jacfwd(lambda h: blocks_lib.stack_forward(blocks, h, cfg)[0])(h0_D)


# ---------------------------------------------------------------------------
# The one-call study


@flax.struct.dataclass
class JacobianStudy:
  """Jacobian measurements of one config, averaged over inputs and weight draws.

  Attributes (L = depth, d = width):
    erank: (L,) erank(dh_l/dh_0)/d, l = 1..L (Eq. 3; Fig 1, 2, 4, 5).
    stable_rank: (L,) st(dh_l/dh_0)/d.
    order_log_mass: (L+1,) log of the mean over samples of mu_k = ||beta^k S_k||_F of
      dh_L/dh_0 (Fig 3a; App A.1); NaN where path sums do not apply.
    order_profile: (L+1,) mean over samples of mu_k / sum_j mu_j (Fig 3b).
    mean_order: () mean over samples of <k> (Fig 3d).
    stream_rms: (L+1,) mean rms(h_l), l = 0..L (Fig 5a, 11).
    branch_to_skip: (L,) r_l = ||G_l||_F / ||I||_F (Eq. 4, 21).
    accumulated_branch: (L,) ||sum_{l<=k} G_l||_F / sqrt(d) (Fig 5b).
    accumulated_uncorrelated: (L,) (sum_{l<=k} ||G_l||_F^2 / d)^{1/2} (Fig 12b).
    reconstruction_error: () max over samples of ||sum_k S_k - J|| / ||J||.
    num_inputs, num_seeds: the sample counts (static).
  """

  erank: Array
  stable_rank: Array
  order_log_mass: Array
  order_profile: Array
  mean_order: Array
  stream_rms: Array
  branch_to_skip: Array
  accumulated_branch: Array
  accumulated_uncorrelated: Array
  reconstruction_error: Array
  num_inputs: int = flax.struct.field(pytree_node=False, default=1)
  num_seeds: int = flax.struct.field(pytree_node=False, default=1)

  def to_dict(self) -> dict:
    out = {f: np.asarray(getattr(self, f)).tolist() for f in (
        "erank", "stable_rank", "order_log_mass", "order_profile", "mean_order",
        "stream_rms", "branch_to_skip", "accumulated_branch",
        "accumulated_uncorrelated", "reconstruction_error")}
    out.update(num_inputs=self.num_inputs, num_seeds=self.num_seeds)
    return out


@precision_lib.measured
def sample_measurements(blocks: dict, h0_D: Array, cfg: MLPConfig,
                        beta: Array | float | None = None, *, with_paths: bool = True,
                        method: BlockJacobianMethod | str = BlockJacobianMethod.CLOSED_FORM,
                        reference: str = "product", num_chunks: int | None = None) -> dict:
  """Every per-sample measurement of the study for one input and one weight draw.

  A pure function of the parameters (``vmap``/``lax.map`` it over inputs and draws):
  block Jacobians, dh_l/dh_0 for every l and their singular values, the path sums
  (``with_paths``; needs ``supports_path_sums(cfg)``), stream rms and branch ratios.
  Returns a dict with the per-sample versions of the ``JacobianStudy`` fields.
  """
  method = BlockJacobianMethod(method)
  with_paths = with_paths and supports_path_sums(cfg)
  bj = block_jacobians(blocks, h0_D, cfg, method, beta)
  d = cfg.width
  ts = input_output_jacobians(bj, cfg)
  # L * seeds SVDs, a thread per core on CPU (host_svd): 0.94 s against 1.29 s for XLA's
  # batched SVD in the benchmark's study (L=48, d=256, 8 seeds, 2 cores).
  sv = host_svd.singular_values_threaded(as_float(ts))
  acc, unc = paths.accumulated_branch(bj.relative_branch)
  out = {
      "erank": spectra.effective_rank_from_singular_values(sv) / d,
      "stable_rank": spectra.stable_rank_from_singular_values(sv) / d,
      "stream_rms": jnp.sqrt(jnp.mean(jnp.square(bj.stream), axis=-1)),
      "branch_to_skip": jnp.linalg.norm(bj.relative_branch, axis=(-2, -1)) / math.sqrt(d),
      "accumulated_branch": acc,
      "accumulated_uncorrelated": unc,
  }
  nan = jnp.full((cfg.depth + 1,), jnp.nan, ts.dtype)
  if with_paths:
    ps = paths.path_sums(bj.skip, bj.branch, num_chunks=num_chunks)
    ref = ts[-1] if reference == "product" else network_jacobian(blocks, h0_D, cfg)
    out.update(order_log_mass=ps.log_norm, order_profile=paths.order_profile(ps),
               mean_order=paths.mean_order(ps),
               reconstruction_error=paths.reconstruction_error(ps, ref))
  else:
    out.update(order_log_mass=nan, order_profile=nan, mean_order=nan[0],
               reconstruction_error=nan[0])
  return out


def init_blocks(cfg: MLPConfig, key: Array, alpha: Array | float | None = None) -> dict:
  """Stacked block parameters from the paper's init (Sec 2): N(0, alpha^2/fan_in), gains 1.

  The same distribution and layout as ``ResidualMLP`` (``(L, fan_in, fan_out)`` per
  matrix), drawn with one ``jax.random.normal`` call for all matrices: vmapping
  ``blocks.init_block`` over depth, or tracing ``ResidualMLP(cfg).init``, costs
  5-10 s of compile time per config on a small CPU (each threefry draw is a large
  XLA:CPU kernel). The values therefore differ from ``ResidualMLP(cfg).init``; to
  measure a model's own parameters, pass ``variables["params"]["blocks"]`` to
  ``block_jacobians`` directly. ``alpha`` (possibly traced) overrides ``cfg.alpha``.
  """
  return seed_samples(cfg, key, 0, alpha)[0]


def seed_samples(cfg: MLPConfig, key: Array, num_inputs: int,
                 alpha: Array | float | None = None,
                 draw: str = "threefry") -> tuple[dict, Array]:
  """One weight draw (``init_blocks``) and ``num_inputs`` inputs h_0 ~ N(0, I_d) (Sec 2).

  Everything comes from one standard normal draw (``weight_draws.standard_normal_pieces``
  with the bit generator ``draw``, one of ``weight_draws.DRAWS``: the same
  distribution, different numbers). ``alpha`` may be traced, so an alpha sweep reuses
  one compiled function.
  """
  dtype = jnp.dtype(cfg.param_dtype)
  alpha = cfg.alpha if alpha is None else alpha
  shapes = sorted(blocks_lib.matrix_shapes(cfg).items())
  sizes = [cfg.depth * a * b for _, (a, b) in shapes] + [num_inputs * cfg.width]
  pieces = weight_draws.standard_normal_pieces(key, sizes, dtype, draw)
  out = {}
  for (name, shape), piece in zip(shapes, pieces):
    std = jnp.asarray(alpha, dtype) / math.sqrt(shape[0])
    out[name] = std * piece.reshape(cfg.depth, *shape)
  for name in blocks_lib.gain_names(cfg):
    out[name] = jnp.ones((cfg.depth, cfg.width), dtype)
  return out, pieces[-1].reshape(num_inputs, cfg.width)


def _beta_is_static(method: BlockJacobianMethod, reference: str) -> bool:
  """JACFWD block Jacobians and the network reference read cfg.beta (a Python float)."""
  return method is BlockJacobianMethod.JACFWD or reference == "network"


def _per_seed(keys, alpha, beta, cfg, num_inputs, with_paths, method, reference, num_chunks,
              seed_batch, draw):
  if _beta_is_static(method, reference):
    beta = cfg.beta

  def one_seed(key):
    blocks, h0 = seed_samples(cfg, key, num_inputs, alpha, draw)
    fn = lambda h: sample_measurements(blocks, h, cfg, beta, with_paths=with_paths,
                                       method=method, reference=reference,
                                       num_chunks=num_chunks)
    return jax.vmap(fn)(h0)
  # Seeds in groups of seed_batch, vmapped within a group (``seed_devices``: one
  # at a time on CPU, memory-bounded groups on GPU/TPU).
  return jax.lax.map(one_seed, keys, batch_size=seed_batch)


@functools.lru_cache(maxsize=64)
def make_study_fn(cfg: MLPConfig, num_inputs: int = 1, num_seeds: int = 1, *,
                  path_sums: bool = True, method: str = "closed_form",
                  reference: str = "product", num_chunks: int | None = None,
                  devices: tuple | None = None, seed_batch: int | None = None,
                  precision: str | None = None, draw: str = "threefry"):
  """A jitted ``fn(key, alpha, beta) -> per-sample dict`` for configs like ``cfg``.

  alpha and beta are traced, so one compilation serves a whole (alpha, beta) sweep
  (``cfg.alpha`` and ``cfg.beta`` are ignored), except that with ``method="jacfwd"``
  or ``reference="network"`` the beta argument is ignored and ``cfg.beta`` is used.
  The seed axis is split over a 1-D ``seeds`` mesh of local devices (``shard_map``
  inside ``jax.jit`` with ``NamedSharding`` in/out shardings); each device runs its
  seeds in ``lax.map`` groups of ``seed_batch`` vmapped seeds
  (``seed_devices.default_seed_batch``:
  1 on CPU for d >= 128, memory-bounded on GPU/TPU). Every dot is traced at
  ``precision``. Weights and inputs come from the bit generator ``draw``
  (``seed_samples``). Cached on its (hashable) arguments.
  """
  if reference not in ("product", "network"):
    raise ValueError(f"reference={reference!r}; choose 'product' or 'network'")
  weight_draws.check_draw(draw)
  precision = precision_lib.check_precision(precision)
  method = BlockJacobianMethod(method)
  with_paths = bool(path_sums) and supports_path_sums(cfg)
  mesh = seed_devices.seed_mesh(num_seeds, devices)
  local_seeds = num_seeds // mesh.size
  if seed_batch is None:
    seed_batch = seed_devices.default_seed_batch(cfg, num_inputs, local_seeds, with_paths,
                                                 mesh.devices.flat[0])
  sharded = NamedSharding(mesh, PartitionSpec("seeds"))
  replicated = NamedSharding(mesh, PartitionSpec())
  def on_device(ks, a, b):
    with precision_lib.matmul_precision(precision):   # every dot traced in the study
      return _per_seed(ks, a, b, cfg, num_inputs, with_paths, method, reference,
                       num_chunks, min(seed_batch, local_seeds), draw)

  per_device = jax.shard_map(
      on_device,
      mesh=mesh, in_specs=(PartitionSpec("seeds"), PartitionSpec(), PartitionSpec()),
      out_specs=PartitionSpec("seeds"), check_vma=False)   # all values are per-device
  jitted = jax.jit(per_device, in_shardings=(sharded, replicated, replicated),
                   out_shardings=sharded)
  dtype = jnp.dtype(cfg.param_dtype)

  def args(key: Array, alpha: float | Array, beta: float | Array) -> tuple:
    keys = jax.device_put(jax.random.split(key, num_seeds), sharded)
    return keys, jnp.asarray(alpha, dtype), jnp.asarray(beta, dtype)

  def fn(key: Array, alpha: float | Array, beta: float | Array) -> dict:
    return jitted(*args(key, alpha, beta))

  fn.jitted, fn.args = jitted, args    # for lowering/exporting the whole study
  return fn


def mlp_jacobian_study(cfg: MLPConfig, key: Array, num_inputs: int = 1, num_seeds: int = 1, *,
                       path_sums: bool = True, method: str = "closed_form",
                       reference: str = "product", num_chunks: int | None = None,
                       devices=None, seed_batch: int | None = None,
                       return_samples: bool = False, precision: str | None = None,
                       draw: str = "threefry"):
  """Measures a residual MLP config at initialization (Sec 2-4, App A-B).

  Each of ``num_seeds`` weight draws (seed s uses ``jax.random.split(key, S)[s]``)
  is evaluated at ``num_inputs`` Gaussian inputs ``h_0 ~ N(0, I_d)``; the seed axis
  is sharded over a 1-D mesh of this process's devices (``jax.jit`` with a
  ``NamedSharding``; the mesh uses the largest local device count dividing
  ``num_seeds``).

  Args:
    cfg: the model config (``input_dim``/``num_classes`` layers are not part of the
      measured block stack; h_0 is the first block's input).
    key: PRNG key.
    num_inputs: inputs per weight draw.
    num_seeds: independent weight draws.
    path_sums: compute the per-order path sums (O(L^2 d^3) per sample); ignored
      (NaN fields) unless ``skip_every`` is 0 or 1.
    method: "closed_form" or "jacfwd" block Jacobians (``BlockJacobianMethod``).
    reference: what the reconstruction is compared with: "product" (the running
      product of the block Jacobians) or "network" (``jax.jacfwd`` of the whole
      block stack; costs about a third of the path-sum DP at d=256, 4x).
    num_chunks: static block groups of the DP (``paths.path_sums``).
    devices: devices for the seed mesh (default ``jax.local_devices()``).
    seed_batch: seeds vmapped together on a device (default
      ``seed_devices.default_seed_batch``).
    return_samples: also return the per-(seed, input) arrays.
    precision: matmul precision of every dot (``rankjax.measure.precision``; default
      'highest', full float32 on every backend).
    draw: the bit generator of the weights and inputs (``weight_draws.DRAWS``; default
      "threefry", the recorded numbers, and the fastest on CPU). Every
      option draws the same distribution; the numbers differ.

  Returns:
    ``JacobianStudy`` (and the dict of per-sample arrays with leading
    ``(num_seeds, num_inputs)`` axes when ``return_samples``).
  """
  method = BlockJacobianMethod(method)
  base = dataclasses.replace(cfg, alpha=1.0)
  if not _beta_is_static(method, reference):
    base = dataclasses.replace(base, beta=1.0)   # traced: one compilation per shape
  fn = make_study_fn(base, num_inputs, num_seeds, path_sums=path_sums, method=method.value,
                     reference=reference, num_chunks=num_chunks,
                     devices=None if devices is None else tuple(devices),
                     seed_batch=seed_batch, precision=precision, draw=draw)
  samples = fn(key, cfg.alpha, cfg.beta)
  study = summarize(samples, num_inputs=num_inputs, num_seeds=num_seeds)
  return (study, samples) if return_samples else study


def summarize(samples: dict, num_inputs: int, num_seeds: int) -> JacobianStudy:
  """Averages per-sample arrays with leading (seeds, inputs) axes into a study."""
  mean = lambda x: jnp.mean(x, axis=(0, 1))
  lm = samples["order_log_mass"]
  n = lm.shape[0] * lm.shape[1]
  log_mass = jax.scipy.special.logsumexp(lm, axis=(0, 1)) - jnp.log(n)
  return JacobianStudy(
      erank=mean(samples["erank"]), stable_rank=mean(samples["stable_rank"]),
      order_log_mass=log_mass, order_profile=mean(samples["order_profile"]),
      mean_order=mean(samples["mean_order"]), stream_rms=mean(samples["stream_rms"]),
      branch_to_skip=mean(samples["branch_to_skip"]),
      accumulated_branch=mean(samples["accumulated_branch"]),
      accumulated_uncorrelated=mean(samples["accumulated_uncorrelated"]),
      reconstruction_error=jnp.max(samples["reconstruction_error"]),
      num_inputs=num_inputs, num_seeds=num_seeds)
