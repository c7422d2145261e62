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
import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rankjax._src.config import MLPConfig
from rankjax._src import fast_paths
from rankjax._src.measure import engine
from rankjax._src.measure import precision as precision_lib
from rankjax._src.measure import seed_devices, weight_draws
from rankjax._src.models import activations
from rankjax._src.models import blocks as blocks_lib
from rankjax._src.models import norms

Array = jax.Array


# The engine's names, re-exported: the MLP is one of its adapters.
BlockJacobianMethod = engine.BlockJacobianMethod
BlockJacobians = engine.BlockJacobians


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
    # J_f = (da (d x m) @ W_down (m x d))^T (fast_paths: the product kept untransposed
    # on CPU, where it runs faster than the folded W_down^T da^T)
    return act @ params["w_down"], fast_paths.transposed_product(da_DxM, params["w_down"])
  return act, da_DxM.T


def mlp_block(cfg: MLPConfig, beta: Array | float | None = None) -> engine.JacobianBlock:
  """The residual MLP's block (Eq. 17) for the engine, with its closed forms.

  One block's parameters are ``(params, closes)``: the block's slice of the stacked
  parameters and its skip flag (``blocks.skip_flags``; read only when ``skip_every !=
  1``). ``beta`` (possibly traced) defaults to ``cfg.beta`` and multiplies the branch of
  closing blocks only. The closed form: ``branch_jacobian`` (Eq. 9, 25) with the P and B
  norm Jacobians applied as their low-rank updates (Eq. 19-20, Table 2), and the R norm's
  Jacobian applied to G and to the skip (``models.norms.jacobian_left``).
  """
  p_op, b_op, r_op = cfg.norm_ops
  eps = cfg.norm_eps
  beta = cfg.beta if beta is None else beta
  grouped = cfg.skip_every != 1

  def beta_eff(p, dtype):
    return jnp.where(p[1], beta, 1.0).astype(dtype) if grouped else \
        jnp.where(True, beta, 1.0).astype(dtype)

  def branch(p, h):
    return beta_eff(p, h.dtype) * blocks_lib.branch_out(p[0], h, cfg)

  def closed_branch(p, h):
    params = p[0]
    z = blocks_lib._norm(params, "p", p_op, h, eps)
    f, jf = branch_jacobian(params, z, cfg.activation)
    jfp = norms.jacobian_right(jf, h, p_op, eps, params.get("p_scale"))
    u = blocks_lib._norm(params, "b", b_op, f, eps)
    jbfp = norms.jacobian_left(jfp, f, b_op, eps, params.get("b_scale"))
    b = beta_eff(p, h.dtype)
    return b * u, b * jbfp

  has_r = r_op != "none"
  return engine.JacobianBlock(
      branch=branch,
      post=(lambda p, y: blocks_lib._norm(p[0], "r", r_op, y, eps)) if has_r else None,
      closes=(lambda p: p[1]) if grouped else None,
      branch_jacobian=closed_branch,
      post_jacobian=(lambda p, y, m: norms.jacobian_left(m, y, r_op, eps,
                                                          p[0].get("r_scale"))) if has_r else None)


@precision_lib.measured
def block_jacobians(blocks: dict, h0_D: Array, cfg: MLPConfig,
                    method: BlockJacobianMethod | str = BlockJacobianMethod.CLOSED_FORM,
                    beta: Array | float | None = None) -> BlockJacobians:
  """K_l, B_l and G_l of every block along the forward pass from ``h0_D`` (Eq. 18;
  ``engine.block_jacobians`` of ``mlp_block``).

  Args:
    blocks: the stacked block parameters (``variables["params"]["blocks"]``).
    h0_D: one input ``(d,)``; ``vmap`` for batches.
    cfg: the model config.
    method: ``BlockJacobianMethod`` (closed form by default; not MATRIX_FREE).
    beta: the branch scale, possibly traced; default cfg.beta.
  """
  return engine.block_jacobians(mlp_block(cfg, beta), (blocks, blocks_lib.skip_flags(cfg)),
                                h0_D, method)


@precision_lib.measured
def input_output_jacobians(bj: BlockJacobians, cfg: MLPConfig | None = None) -> Array:
  """``(L, d, d)`` dh_l/dh_0 for l = 1..L by the running product (Eq. 2, 10;
  ``engine.input_output_jacobians``; ``cfg`` is not needed: the skip groups travel in
  ``bj.closes``)."""
  del cfg
  return engine.input_output_jacobians(bj)


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
    erank: (L,) erank(dh_l/dh_0)/d, l = 1..L (Eq. 3; Fig 1, 2, 4, 5); at the study's
      ``spectra_layers`` only when it lists them.
    stable_rank: (L,) st(dh_l/dh_0)/d (as erank).
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
                        beta: Array | float | None = None, *, with_paths: bool | None = None,
                        method: BlockJacobianMethod | str = BlockJacobianMethod.CLOSED_FORM,
                        reference: str = "product", num_chunks: int | None = None,
                        spectra_layers: tuple[int, ...] | None = None) -> dict:
  """Every per-sample measurement of the study for one input and one weight draw.

  A pure function of the parameters (``vmap``/``lax.map`` it over inputs and draws):
  block Jacobians, dh_l/dh_0 for every l and their singular values, the path sums
  (``with_paths``; needs ``supports_path_sums(cfg)``), stream rms and branch ratios.
  ``spectra_layers``: the layers whose spectra are measured (``engine.measurements``).
  Returns a dict with the per-sample versions of the ``JacobianStudy`` fields.
  """
  if with_paths is None:
    with_paths = supports_path_sums(cfg)
  elif with_paths and not supports_path_sums(cfg):
    raise ValueError(f"path sums need skip_every in {{0, 1}}; got {cfg.skip_every}")
  bj = block_jacobians(blocks, h0_D, cfg, method, beta)
  ref = network_jacobian(blocks, h0_D, cfg) if with_paths and reference == "network" else None
  out = engine.measurements(bj, with_paths=with_paths, num_chunks=num_chunks, reference=ref,
                            spectra_layers=spectra_layers)
  del out["input_output"]
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
  distribution, different numbers), made at float32 and cast to ``cfg.param_dtype``,
  so every dtype gets the same weights and inputs at one key (to float32 rounding of
  the scale alpha/sqrt(fan_in)). ``alpha`` may be traced, so an alpha sweep reuses
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


@dataclasses.dataclass(frozen=True)
class StudyOptions:
  """How ``mlp_jacobian_study`` measures: every field is used or refused, none ignored.

  Attributes:
    num_inputs: inputs h_0 ~ N(0, I_d) per weight draw.
    num_seeds: independent weight draws (seed s uses ``jax.random.split(key, S)[s]``).
    path_sums: compute the per-order path sums (O(L^2 d^3) per sample). None (default):
      when the config allows them (``skip_every`` 0 or 1; else the path fields are NaN);
      True with another spacing is refused.
    method: "closed_form" or "jacfwd" block Jacobians (``BlockJacobianMethod``).
    reference: what the reconstruction is compared with: "product" (the running
      product of the block Jacobians) or "network" (``jax.jacfwd`` of the whole block
      stack, which reads ``cfg.beta``: the study's beta is then fixed; about a third of
      the DP's cost at d=256, 4x). Needs path sums.
    num_chunks: static block groups of the DP (``paths.path_sums``); needs path sums.
    devices: devices of the seed mesh (default ``jax.local_devices()``; this process's
      devices only when ``across_processes``).
    seed_batch: seeds vmapped together on a device (default
      ``seed_devices.default_seed_batch``).
    precision: matmul precision of every dot (``rankjax._src.measure.precision``; default
      'highest', full float32 on every backend).
    draw: the bit generator of the weights and inputs (``weight_draws.DRAWS``; default
      "threefry", the recorded numbers, and the fastest on CPU). Every option draws the
      same distribution; the numbers differ.
    spectra_layers: the layers l (1..L) whose dh_l/dh_0 spectra give ``erank`` and
      ``stable_rank``, in that order (default every layer: L decompositions per sample;
      a study that reads only the last layer passes ``(L,)``).
    across_processes: split the seeds between the processes of a ``jax.distributed``
      job: process p measures the p-th contiguous block of seeds on its own devices and
      every process gets every seed's results, in seed order
      (``seed_devices.process_seed_blocks`` / ``gather_seed_blocks``). Every process
      must then call the study; on one process it changes nothing. False (default): the
      study is process-local, as one that a single process runs alone must be.
  """

  num_inputs: int = 1
  num_seeds: int = 1
  path_sums: bool | None = None
  method: str = "closed_form"
  reference: str = "product"
  num_chunks: int | None = None
  devices: tuple | None = None
  seed_batch: int | None = None
  precision: str | None = None
  draw: str = "threefry"
  spectra_layers: tuple[int, ...] | None = None
  across_processes: bool = False

  def __post_init__(self):
    method = BlockJacobianMethod(self.method)
    if method is BlockJacobianMethod.MATRIX_FREE:
      raise ValueError("method='matrix_free' forms no block Jacobian; use "
                       "matrix_free.network_rank_estimates")
    object.__setattr__(self, "method", method.value)
    if self.reference not in ("product", "network"):
      raise ValueError(f"reference={self.reference!r}; choose 'product' or 'network'")
    for name in ("num_inputs", "num_seeds"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.seed_batch is not None and int(self.seed_batch) < 1:
      raise ValueError(f"seed_batch must be >= 1, got {self.seed_batch}")
    weight_draws.check_draw(self.draw)
    object.__setattr__(self, "precision", precision_lib.check_precision(self.precision))
    if self.devices is not None:
      object.__setattr__(self, "devices", tuple(self.devices))
    if self.spectra_layers is not None:   # checked against the depth by the study
      object.__setattr__(self, "spectra_layers", tuple(int(l) for l in self.spectra_layers))
    if self.path_sums is False and (self.num_chunks is not None
                                    or self.reference != "product"):
      raise ValueError("num_chunks and reference='network' need path sums "
                       "(path_sums=False was given)")

  def with_paths(self, cfg: MLPConfig) -> bool:
    """Whether path sums run for ``cfg`` (refusing ``path_sums=True`` where they do not
    apply)."""
    if self.path_sums and not supports_path_sums(cfg):
      raise ValueError(f"path sums need skip_every in {{0, 1}}; got {cfg.skip_every} "
                       "(pass path_sums=None or False)")
    if self.path_sums is None and not supports_path_sums(cfg) and (
        self.num_chunks is not None or self.reference != "product"):
      raise ValueError(f"num_chunks / reference='network' need path sums, which "
                       f"skip_every={cfg.skip_every} does not allow")
    return supports_path_sums(cfg) if self.path_sums is None else bool(self.path_sums)

  @property
  def beta_is_static(self) -> bool:
    """The network reference reads cfg.beta (a Python float); otherwise beta is traced."""
    return self.reference == "network"


def _per_seed(keys, alpha, beta, cfg, options: StudyOptions, with_paths, seed_batch):
  if options.beta_is_static:
    beta = cfg.beta

  def one_seed(key):
    blocks, h0 = seed_samples(cfg, key, options.num_inputs, alpha, options.draw)
    fn = lambda h: sample_measurements(blocks, h, cfg, beta, with_paths=with_paths,
                                       method=options.method, reference=options.reference,
                                       num_chunks=options.num_chunks,
                                       spectra_layers=options.spectra_layers)
    return jax.vmap(fn)(h0)
  # Seeds in groups of seed_batch, vmapped within a group (``seed_devices``: one
  # at a time on CPU, memory-bounded groups on GPU/TPU).
  return jax.lax.map(one_seed, keys, batch_size=seed_batch)


def make_study_fn(cfg: MLPConfig, num_inputs: int = 1, num_seeds: int = 1, *,
                  options: StudyOptions | None = None, **fields):
  """A jitted ``fn(key, alpha, beta) -> per-sample dict`` for configs like ``cfg``.

  The study is ``StudyOptions(num_inputs, num_seeds, **fields)`` (or ``options``).
  alpha and beta are traced, so one compilation serves a whole (alpha, beta) sweep
  (``cfg.alpha`` and ``cfg.beta`` are not read), except that with
  ``reference="network"`` beta is ``cfg.beta`` and ``fn`` refuses any other.
  The seed axis is split over a 1-D ``seeds`` mesh of local devices (``shard_map``
  inside ``jax.jit`` with ``NamedSharding`` in/out shardings); each device runs its
  seeds in ``lax.map`` groups of ``seed_batch`` vmapped seeds
  (``seed_devices.default_seed_batch``: 1 on CPU for d >= 128, memory-bounded on
  GPU/TPU). Every dot is traced at ``precision``. Weights and inputs come from the bit
  generator ``draw`` (``seed_samples``). Cached on (cfg, options). With
  ``across_processes`` on several processes ``fn`` measures this process's block of
  seeds (``fn.seeds``) and returns every seed's results as numpy arrays; ``fn.jitted``
  / ``fn.args`` are then this process's part.
  """
  if options is None:
    options = StudyOptions(num_inputs, num_seeds, **fields)
  elif fields or (num_inputs, num_seeds) != (1, 1):
    raise ValueError("give the study's settings either as options= or as arguments")
  return _study_fn(cfg, options)


@functools.lru_cache(maxsize=64)
def _study_fn(cfg: MLPConfig, options: StudyOptions):
  if options.spectra_layers is not None:
    engine.check_layers(options.spectra_layers, cfg.depth)
  if options.across_processes and jax.process_count() > 1:
    return _split_study_fn(cfg, options)
  with_paths = options.with_paths(cfg)
  num_seeds = options.num_seeds
  mesh = seed_devices.seed_mesh(num_seeds, options.devices)
  local_seeds = num_seeds // mesh.size
  seed_batch = options.seed_batch
  if seed_batch is None:
    seed_batch = seed_devices.default_seed_batch(cfg, options.num_inputs, local_seeds,
                                                 with_paths, mesh.devices.flat[0])
  sharded = NamedSharding(mesh, PartitionSpec("seeds"))
  replicated = NamedSharding(mesh, PartitionSpec())
  def on_device(ks, a, b):
    with precision_lib.matmul_precision(options.precision):   # every dot traced in the study
      return _per_seed(ks, a, b, cfg, options, with_paths, min(seed_batch, local_seeds))

  per_device = jax.shard_map(
      on_device,
      mesh=mesh, in_specs=(PartitionSpec("seeds"), PartitionSpec(), PartitionSpec()),
      out_specs=PartitionSpec("seeds"), check_vma=False)   # all values are per-device
  jitted = jax.jit(per_device, in_shardings=(sharded, replicated, replicated),
                   out_shardings=sharded)
  dtype = jnp.dtype(cfg.param_dtype)

  def args(key: Array, alpha: float | Array, beta: float | Array, keys=None) -> tuple:
    """The jitted study's arguments; ``keys``: the seeds' keys (default the
    ``num_seeds`` keys split from ``key``)."""
    if options.beta_is_static and not isinstance(beta, jax.core.Tracer) \
        and float(beta) != cfg.beta:
      raise ValueError(f"reference='network' measures cfg.beta={cfg.beta}; beta={beta} "
                       "would be ignored (set it in the config)")
    keys = jax.random.split(key, num_seeds) if keys is None else keys
    return jax.device_put(keys, sharded), jnp.asarray(alpha, dtype), jnp.asarray(beta, dtype)

  def fn(key: Array, alpha: float | Array, beta: float | Array) -> dict:
    return jitted(*args(key, alpha, beta))

  fn.jitted, fn.args = jitted, args    # for lowering/exporting the whole study
  return fn


def _split_study_fn(cfg: MLPConfig, options: StudyOptions):
  """The study split across processes: this process's block of seeds on its devices
  (the process-local study of that many seeds, each seed's key the one it has in the
  whole study), then every block gathered on every process."""
  me = jax.process_index()
  if options.devices is not None and any(d.process_index != me for d in options.devices):
    raise ValueError("devices= must be this process's devices when across_processes=True "
                     "(each process measures its seeds on its own devices)")
  blocks = seed_devices.process_seed_blocks(options.num_seeds, jax.process_count())
  seeds = blocks[me]
  local = _study_fn(cfg, dataclasses.replace(options, num_seeds=len(seeds),
                                             across_processes=False))

  def args(key: Array, alpha: float | Array, beta: float | Array) -> tuple:
    keys = jax.random.split(key, options.num_seeds)[seeds.start:seeds.stop]
    return local.args(key, alpha, beta, keys=keys)

  def fn(key: Array, alpha: float | Array, beta: float | Array) -> dict:
    return seed_devices.gather_seed_blocks(local.jitted(*args(key, alpha, beta)), blocks)

  fn.jitted, fn.args, fn.seeds = local.jitted, args, seeds
  return fn


def mlp_jacobian_study(cfg: MLPConfig, key: Array, num_inputs: int = 1, num_seeds: int = 1, *,
                       options: StudyOptions | None = None,
                       return_samples: bool = False, **fields):
  """Measures a residual MLP config at initialization (Sec 2-4, App A-B).

  Each of ``num_seeds`` weight draws is evaluated at ``num_inputs`` Gaussian inputs
  ``h_0 ~ N(0, I_d)``; the seed axis is sharded over a 1-D mesh of this process's
  devices (``jax.jit`` with a ``NamedSharding``; the mesh uses the largest local device
  count dividing ``num_seeds``), and with ``across_processes`` split between the
  processes of a ``jax.distributed`` job (every process calls the study and gets every
  seed's results; ``make_study_fn``). The settings are ``StudyOptions(num_inputs, num_seeds,
  **fields)`` (or ``options``): path_sums, method, reference, num_chunks, devices,
  seed_batch, precision, draw, across_processes; an unknown or inapplicable one is refused.

  Args:
    cfg: the model config (``input_dim``/``num_classes`` layers are not part of the
      measured block stack; h_0 is the first block's input).
    key: PRNG key.
    return_samples: also return the per-(seed, input) arrays.

  Returns:
    ``JacobianStudy`` (and the dict of per-sample arrays with leading
    ``(num_seeds, num_inputs)`` axes when ``return_samples``).
  """
  if options is None:
    options = StudyOptions(num_inputs, num_seeds, **fields)
  elif fields or (num_inputs, num_seeds) != (1, 1):
    raise ValueError("give the study's settings either as options= or as arguments")
  base = dataclasses.replace(cfg, alpha=1.0)
  if not options.beta_is_static:
    base = dataclasses.replace(base, beta=1.0)   # traced: one compilation per shape
  samples = _study_fn(base, options)(key, cfg.alpha, cfg.beta)
  study = summarize(samples, num_inputs=options.num_inputs, num_seeds=options.num_seeds)
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
