"""Causal multi-head attention with temperature, rotary positions and the P - alpha*C_n
intervention, through a fused kernel or the explicit probability matrix.

Post-Norm collapse paper, Eq. 2: ``Attn(X) = P X W_V W_O`` with
``P = softmax_row(X W_Q (X W_K)^T / sqrt(d_head) / tau + M_causal)``. Corollary 3.3's
intervention replaces P by ``P - alpha * C_n``, where C_n is the causal
prefix-average matrix, ``(C_n)_ij = 1/i`` for ``i >= j`` (1-indexed). Since row i of
``C_n V`` is the mean of the first i rows of V, ``(P - alpha C_n) V = P V - alpha *
cumsum(V) / i``: the fused path applies the intervention without any T x T matrix.

Two paths compute the same function:

  fused   ``jax.nn.dot_product_attention`` (causal, scale ``1/(sqrt(d_head) tau)``):
          cuDNN flash attention on GPU (``attention_impl`` cudnn, or auto with a
          16-bit dtype and a d_head cuDNN takes), XLA elsewhere; or Pallas splash
          attention (``splash_attention.py``; auto on TPU when T is a multiple of
          128), tested here in Pallas' interpreter and lowered for TPU by jax.export.
  einsum  the explicit (B, H, T, T) probabilities; used only where they are needed:
          ``capture_probs`` (diagnostics), float64, and ``attention_impl="einsum"``
          (the reference the fused path is tested against).

Attention-probability dropout in training (no public JAX kernel drops probabilities)
takes a query-block path: no (T, T) buffer exists on any backend, each block's
probabilities are recomputed in the backward pass. ``attn_dropout_mask`` picks it:

  threefry  ``blocked_attention`` (the default: the masks and bits of every recorded
          run): ``jax.random.bernoulli`` per block of rows over all T keys, the hidden
          ones computed and zeroed, the bits drawn again in the backward pass.
  hash      ``causal_dropout_attention``: block i of rows meets keys [0, (i+1) block)
          only (56% of the square's work at T = 1024), its masks a uint32 hash of the
          entry's indices (``rankjax.models.dropout_mask``: which masks, that they
          differ from threefry's, the keep probability within 2^-33 of 1 - rate).
          The softmax study's paper scale sets it. Estimated 24-36% MFU for that step
          on one H200 (threefry: 17-27%; ``experiments/benchmarks/dropout_attention.py``,
          FLOP / byte accounting): both paths write each block's float32 logits and
          probabilities to HBM.
  flash     ``rankjax.models.flash_dropout``: the hash masks computed in a fused Pallas
          (Triton) flash-attention kernel, no block in HBM; taken on a GPU for 16-bit
          dtypes when it takes the shapes and there is no prefix removal
          (``attn_dropout_kernel``); estimated 34-50% MFU for that step.

cuDNN's fused attention has a dropout (``jax._src.cudnn.fused_attention_stablehlo.
dot_product_attention(dropout_rate=...)``, a private API in jax 0.10.2) and lowers for
CUDA from a CPU (``__cudnn$fmhaSoftmaxDropout`` and its backward, tested), but it is not
taken: its ``seed`` is a static Python int written into the custom call's backend
config (default 42), not an operand, so the masks cannot follow the run's dropout key
(``rngs={"dropout": ...}``): the same compiled step (every update, and every layer of
the layer scan, one custom call) gets one seed, and whether cuDNN's Philox offset moves
between executions, and stays paired between a forward and its backward, is XLA
runtime state that cannot be checked without a GPU. A new seed per update would mean a
compile per update.

Precision of the logits under 16-bit q and k (the quantities the softmax paper is
about: p_max, row entropy):

  einsum, blocked   ``attention_logits``: a float32 contraction
          (``preferred_element_type``), the scale, mask and softmax in float32; only
          the probabilities are rounded to the compute dtype for the product with V,
          which accumulates in float32.
  xla     ``jax.nn.dot_product_attention(implementation="xla")`` does the same (its
          logits einsum has ``preferred_element_type=float32`` and the bf16 x bf16 ->
          float32 dot preset; softmax in float32; probabilities cast to the value dtype).
  cudnn   cuDNN's fused flash attention keeps the scores and the online softmax in
          float32 accumulators; the probabilities enter the P V product in the
          16-bit dtype (as every flash kernel).
  splash  the Pallas kernel contracts q k^T with ``preferred_element_type=float32`` and
          keeps its softmax statistics in float32, but takes no scale: ours is folded
          into q, one more rounding of each query entry to the 16-bit dtype (relative
          2^-9; exact when the scale is a power of two, d_head 16, 64 or 256 at tau 1).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import with_logical_partitioning as logical
from jax.ad_checkpoint import checkpoint_name

from rankjax.config import RopeConfig, TransformerConfig
from rankjax.models import dropout_mask, flash_dropout, splash_attention
from rankjax.models.annotated import PlainInit
from rankjax.models.matmul import weight_matmul

ATTENTION_OUT = "attention_out"   # checkpoint_name of the heads' output, before W_O
# checkpoint_name of what a fused kernel's backward reads (its inputs, output and softmax
# statistics): saved by remat="dots", so the backward never runs the kernel's forward again
ATTENTION_RESIDUALS = "attention_residuals"
from rankjax.numerics import float_dtype

CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


# the matrices ``init_scale_to="value_ffn"`` scales (TransformerConfig.init_scale_to), and
# those each of its extensions scales; "all" scales every matrix
VALUE_FFN_MATRICES = ("w_v", "w_o", "w_2", "w_3")
INIT_SCALE_MATRICES = {"value_ffn": VALUE_FFN_MATRICES,
                       "value_ffn_qk": (*VALUE_FFN_MATRICES, "w_q", "w_k"),
                       "value_ffn_gate": (*VALUE_FFN_MATRICES, "w_1")}
OUTPUT_PROJECTIONS = ("w_o", "w_2")   # gpt2's 1/sqrt(2N) output projections


def matrix_init(cfg: TransformerConfig, name: str, fan_in: int):
  """The init of weight matrix ``name`` (w_q, w_k, w_v, w_o, w_1, w_2, w_3, lm_head)
  under ``cfg.init``, times ``cfg.init_scale`` in variance where ``cfg.init_scale_to``
  includes it ("all", or ``name`` in :data:`INIT_SCALE_MATRICES` of it).

  paper_collapse (postnorm Sec 2): N(0, 1/(3 fan_in)) -- 1/(3d) for every d-input
  matrix and 1/(3 d_ff) for W_2. gpt2: N(0, 0.02^2), output projections (W_O and the
  FFN's down projection, :data:`OUTPUT_PROJECTIONS`) N(0, (0.02/sqrt(2N))^2) with N the
  number of layers.
  """
  scale = (cfg.init_scale if cfg.init_scale_to == "all"
           or name in INIT_SCALE_MATRICES[cfg.init_scale_to] else 1.0)
  if cfg.init == "paper_collapse":
    std = math.sqrt(scale / (3.0 * fan_in))
  else:
    std = 0.02 * math.sqrt(scale)
    if name in OUTPUT_PROJECTIONS:
      std /= math.sqrt(2.0 * cfg.num_layers)
  return nn.initializers.normal(stddev=std)


def rope_frequencies(d_head: int, cfg: RopeConfig, dtype=jnp.float32) -> jax.Array:
  """The rotation frequencies ``theta_i``, ``(d_head/2,)``, of the RoPE settings ``cfg``
  (``TransformerConfig.rope``): ``base^(-2i/d_head)`` (RoFormer Eq. 34), scaled by
  ``scaling``: "linear" divides every one by ``factor``
  (position interpolation, Chen et al. 2023); "llama3" (Llama 3.1) divides those whose
  wavelength ``2 pi / theta`` exceeds ``original_max_len / low_freq_factor`` by
  ``factor``, keeps those below ``original_max_len / high_freq_factor``, and between
  them interpolates ``(1 - s) theta / factor + s theta`` with ``s = (original_max_len /
  wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)`` (the formula of
  transformers' ``_compute_llama3_parameters``); "yarn" (YaRN, Peng et al. 2023, Eq. 18-19
  "NTK-by-parts") blends ``theta / factor`` and ``theta`` with a ramp over the dimension
  index between ``d(beta_fast)`` and ``d(beta_slow)``, ``d(r) = d_head ln(original_max_len
  / (2 pi r)) / (2 ln base)`` (floored and ceiled when ``truncate``; transformers'
  ``_compute_yarn_parameters``); its attention factor is ``cfg.attention_factor``."""
  base, scaling, factor, original_max_len = cfg.base, cfg.scaling, cfg.factor, cfg.original_max_len
  theta = base ** (-jnp.arange(0, d_head, 2, dtype=dtype) / d_head)
  if scaling == "none":
    return theta
  if scaling == "linear":
    return theta / factor
  if scaling == "yarn":
    dim = lambda r: d_head * math.log(original_max_len / (r * 2 * math.pi)) / (2 * math.log(base))
    low, high = dim(cfg.beta_fast), dim(cfg.beta_slow)
    if cfg.truncate:
      low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_head - 1)
    high = high + 0.001 if low == high else high
    ramp = jnp.clip((jnp.arange(d_head // 2, dtype=dtype) - low) / (high - low), 0, 1)
    return theta / factor * ramp + theta * (1 - ramp)
  if scaling != "llama3":
    raise ValueError(f"rope scaling {scaling!r}; choose none, linear, llama3 or yarn")
  wavelength = 2 * math.pi / theta
  low_freq_factor, high_freq_factor = cfg.low_freq_factor, cfg.high_freq_factor
  low, high = original_max_len / low_freq_factor, original_max_len / high_freq_factor
  s = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
  mid = (1 - s) * theta / factor + s * theta
  return jnp.where(wavelength > low, theta / factor, jnp.where(wavelength < high, theta, mid))


def rope(x_BxTxHxD: jax.Array, base: float = 10000.0, theta: jax.Array | None = None
         ) -> jax.Array:
  """Rotary position embedding (RoFormer, Su et al. 2021, Eq. 34; Llama-2's RoPE).

  Position m rotates each pair ``(x_{2i}, x_{2i+1})`` of a head by the angle
  ``m * theta_i``, ``theta_i = base^(-2i/d_head)`` (or the given ``theta``, e.g. a
  scaled ``rope_frequencies``): ``R_m = diag(R(m theta_0), ...)`` with ``R(a) = [[cos a,
  -sin a], [sin a, cos a]]``, so ``<R_m q, R_n k>`` depends on ``m - n`` only. Computed
  in float32 (float64 for float64 input), returned in the input's dtype.
  """
  _, t, _, dh = x_BxTxHxD.shape
  acc = float_dtype(x_BxTxHxD.dtype)
  theta = (base ** (-jnp.arange(0, dh, 2, dtype=acc) / dh) if theta is None
           else theta.astype(acc))                                         # (dh/2,)
  angle = jnp.arange(t, dtype=acc)[:, None] * theta[None, :]             # (T, dh/2)
  cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]      # (T, 1, dh/2)
  x = x_BxTxHxD.astype(acc).reshape(*x_BxTxHxD.shape[:-1], dh // 2, 2)
  even, odd = x[..., 0], x[..., 1]
  out = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  return out.reshape(x_BxTxHxD.shape).astype(x_BxTxHxD.dtype)


def attention_logits(q_BxQxHxD: jax.Array, k_BxKxHxD: jax.Array) -> jax.Array:
  """``Q K^T`` per head, ``(B, H, Q, K)`` in ``float_dtype(q)``: float32 for 16-bit q and
  k (the products of two bf16 numbers are exact in float32 and summed there:
  ``preferred_element_type``), float64 for float64. Never rounded to the inputs' dtype:
  at T = 1024 bf16 logits put p_max off by up to 10% and the row entropy by 0.08 nats
  (tests/models/test_attention.py). The one place the einsum and blocked paths form
  their logits."""
  acc = float_dtype(jnp.result_type(q_BxQxHxD, k_BxKxHxD))
  return jnp.einsum("...qhd,...khd->...hqk", q_BxQxHxD, k_BxKxHxD,
                    preferred_element_type=acc)


def causal_probabilities(q_BxTxHxD: jax.Array, k_BxTxHxD: jax.Array,
                         tau: float = 1.0, causal: bool | jax.Array = True) -> jax.Array:
  """``P = softmax_row(Q K^T / (sqrt(d_head) tau) + M_causal)`` per head (postnorm
  Eq. 2; softmax paper Sec 4.1's ``A_h``), ``(B, H, T, T)`` in ``float_dtype(q)``: the
  one einsum attention of the library (``CausalSelfAttention``'s einsum path, the GPT-2
  reader's forward pass, ``flax_capture.causal_probs`` and
  ``sensitivity_bounds.mha_attention_probs`` call it). The logits are
  :func:`attention_logits` (a float32 contraction of 16-bit q and k: never rounded to
  their dtype), the softmax in float32 (float64 for float64 input); keys after the
  query get ``finfo.min`` (zero probability: every row keeps its diagonal).
  ``causal=False`` (may be traced) lets every query see every key."""
  t, dh = q_BxTxHxD.shape[-3], q_BxTxHxD.shape[-1]
  acc = float_dtype(q_BxTxHxD.dtype)
  logits_BxHxTxT = attention_logits(q_BxTxHxD, k_BxTxHxD) / (math.sqrt(dh) * tau)
  visible = jnp.tril(jnp.ones((t, t), bool)) | jnp.logical_not(causal)
  logits_BxHxTxT = jnp.where(visible, logits_BxHxTxT, jnp.finfo(acc).min)
  return jax.nn.softmax(logits_BxHxTxT, axis=-1)


@functools.partial(jax.jit, static_argnames=("n", "dtype"))
def prefix_average_matrix(n: int, dtype: Any = jnp.float32) -> jax.Array:
  """The causal prefix-average matrix ``C_n`` (postnorm Eq. (3), Assumption C.2).

  ``(C_n)_ij = 1/i`` for ``i >= j`` and ``0`` otherwise (1-indexed rows ``i``), i.e.
  row ``i`` averages the first ``i`` tokens. Identities used by Thm C.3:
  ``||C_n||_F^2 = H_n`` and ``||Pi_1 C_n||_F^2 = 2 - H_n / n``. Also
  ``rankjax.prefix_average_matrix`` and ``rankjax.measure.similarity``'s.

  Args:
    n: sequence length (static).
    dtype: output dtype.

  Returns:
    ``(n, n)`` lower-triangular row-stochastic matrix.
  """
  i_N = jnp.arange(1, n + 1, dtype=dtype)
  mask_NxN = jnp.tril(jnp.ones((n, n), dtype=bool))
  return jnp.where(mask_NxN, 1.0 / i_N[:, None], 0.0).astype(dtype)


def fused_impl(cfg: TransformerConfig, dtype, seq_len: int | None = None) -> str:
  """The fused kernel for ``cfg.kernels.attention_impl``: a ``jax.nn.dot_product_attention``
  implementation (xla, cudnn) or splash (``rankjax.models.splash_attention``).

  auto: cudnn on a GPU backend when the dtype is 16-bit and d_head a multiple of 8 up
  to 128 (cuDNN flash attention's limits); splash on a TPU backend when ``seq_len`` is
  a multiple of 128 (the kernel's blocks); else xla.
  """
  if cfg.kernels.attention_impl != "auto":
    return cfg.kernels.attention_impl
  backend = jax.default_backend()
  ok = (jnp.dtype(dtype) in [jnp.dtype(d) for d in CUDNN_DTYPES]
        and cfg.d_head % 8 == 0 and cfg.d_head <= 128)
  if backend == "gpu" and ok:
    return "cudnn"
  if backend == "tpu" and seq_len is not None and splash_attention.supported(seq_len):
    return "splash"
  return "xla"


def prefix_mean(v_BxTxHxD: jax.Array) -> jax.Array:
  """``C_n V`` without C_n: row i is the mean of rows 1..i (in float32)."""
  t = v_BxTxHxD.shape[1]
  acc = float_dtype(v_BxTxHxD.dtype)
  counts = jnp.arange(1, t + 1, dtype=acc)[None, :, None, None]
  return jnp.cumsum(v_BxTxHxD.astype(acc), axis=1) / counts


def projections(x: jax.Array, weights: dict[str, jax.Array],
                biases: dict[str, jax.Array] | None = None, fused: bool = False,
                grad_reduce_dtype: str = "float32") -> list[jax.Array]:
  """``[x @ W_n (+ b_n) for n in weights]`` (in the dicts' order). ``fused``: one matmul
  with the weights concatenated along their output axis, its product split back.

  The parameters keep their own names and shapes either way (checkpoints, sharding
  rules, the Jacobian adapters and loaders see no difference); the concatenation is
  formed where the layer uses its weights, so under FSDP it joins the layer's gathered
  slices, one copy per layer. One dot of width sum(cols) instead of several narrow ones
  (QKV, and W1|W3 of SwiGLU): fewer, larger matmuls and one read of x. Each product is
  ``matmul.weight_matmul`` (``grad_reduce_dtype``: the weight gradient's dtype)."""
  names = list(weights)
  mm = lambda w: weight_matmul(x, w, grad_reduce_dtype)
  if fused:
    y = mm(jnp.concatenate([weights[n] for n in names], axis=-1))
    if biases is not None:
      y = y + jnp.concatenate([biases[n] for n in names], axis=-1)
    ends = np.cumsum([weights[n].shape[-1] for n in names])[:-1]
    return jnp.split(y, ends.tolist(), axis=-1)
  ys = [mm(weights[n]) for n in names]
  return ys if biases is None else [y + biases[n] for y, n in zip(ys, names)]


def with_named_residuals(kernel):
  """``kernel(q, k, v)`` whose backward reads residuals named ``ATTENTION_RESIDUALS``
  (``checkpoint_name``): a fused attention kernel's custom VJP keeps its residuals (the
  softmax statistics among them) unnamed, so a remat policy that saves only named values
  and dots ran the kernel's forward a second time in the backward pass; named, the
  ``dots`` policy saves them. Values and gradients are the kernel's own."""
  @jax.custom_vjp
  def attend(q, k, v):
    return kernel(q, k, v)

  def fwd(q, k, v):
    out, pullback = jax.vjp(kernel, q, k, v)
    leaves, tree = jax.tree_util.tree_flatten(pullback)
    return out, jax.tree_util.tree_unflatten(
        tree, [checkpoint_name(x, ATTENTION_RESIDUALS) for x in leaves])

  def bwd(pullback, g):
    return pullback(g)

  attend.defvjp(fwd, bwd)
  return attend


QUERY_BLOCK = 128   # query rows per block of the dropout paths


def query_block(t: int, block: int = QUERY_BLOCK) -> int:
  """The largest divisor of ``t`` that is at most ``block``."""
  return max(n for n in range(1, min(t, block) + 1) if t % n == 0)


def _block_probabilities(q_BxNxHxD, k_BxSxHxD, rows_N, scale, prefix_avg_removal):
  """One block of query rows ``rows_N`` against the first S keys: ``softmax(q k^T scale +
  M_causal)`` (postnorm Eq. 2; logits by :func:`attention_logits`, softmax in float32)
  minus ``prefix_avg_removal`` times those rows of C_n (Cor 3.3), ``(B, H, N, S)``."""
  acc = float_dtype(q_BxNxHxD.dtype)
  keys_S = jnp.arange(k_BxSxHxD.shape[1])
  logits = attention_logits(q_BxNxHxD, k_BxSxHxD) * scale
  visible_NxS = rows_N[:, None] >= keys_S[None, :]
  p = jax.nn.softmax(jnp.where(visible_NxS, logits, jnp.finfo(acc).min), axis=-1)
  if prefix_avg_removal:
    p = p - prefix_avg_removal * jnp.where(visible_NxS, 1.0 / (rows_N[:, None] + 1), 0.0
                                           ).astype(acc)
  return p


def _apply(p_BxHxNxS, v_BxSxHxD):
  """``P V`` with P rounded to V's dtype, accumulated in float32, in V's dtype."""
  return jnp.einsum("bhqk,bkhd->bqhd", p_BxHxNxS.astype(v_BxSxHxD.dtype), v_BxSxHxD,
                    preferred_element_type=float_dtype(v_BxSxHxD.dtype)
                    ).astype(v_BxSxHxD.dtype)


def blocked_attention(q_BxTxHxD: jax.Array, k_BxTxHxD: jax.Array, v_BxTxHxD: jax.Array,
                      scale: float, prefix_avg_removal: float = 0.0, dropout_rate: float = 0.0,
                      key: jax.Array | None = None, block: int = QUERY_BLOCK) -> jax.Array:
  """Causal attention with threefry dropout on the probabilities (``attn_dropout_mask=
  "threefry"``, the default: the masks and bits of every recorded run), without a
  ``(T, T)`` buffer: the queries go in blocks of :func:`query_block` rows (``lax.map``),
  each block's ``(B, H, block, T)`` probabilities (:func:`_block_probabilities`, every
  key, the hidden ones at zero; then inverted dropout: kept with probability ``1 -
  dropout_rate`` and divided by it) formed, applied to V and dropped; ``jax.checkpoint``
  per block recomputes them (and draws the bits again) in the backward pass, so the
  peak is one block's probabilities. Block ``i``'s mask is ``bernoulli(fold_in(key,
  i))`` of shape ``(B, H, block, T)``. :func:`causal_dropout_attention` is the fast path."""
  b, t, h, dh = q_BxTxHxD.shape
  n = query_block(t, block)

  @jax.checkpoint
  def one(i, q_BxNxHxD):
    p = _block_probabilities(q_BxNxHxD, k_BxTxHxD, i * n + jnp.arange(n), scale,
                             prefix_avg_removal)
    if dropout_rate:
      keep = jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - dropout_rate, p.shape)
      p = jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
    return _apply(p, v_BxTxHxD)

  q_KxBxNxHxD = jnp.moveaxis(q_BxTxHxD.reshape(b, t // n, n, h, dh), 1, 0)
  out = jax.lax.map(lambda a: one(*a), (jnp.arange(t // n), q_KxBxNxHxD))
  return jnp.moveaxis(out, 0, 1).reshape(b, t, h, dh)


def causal_dropout_attention(q_BxTxHxD: jax.Array, k_BxTxHxD: jax.Array,
                             v_BxTxHxD: jax.Array, scale: float,
                             prefix_avg_removal: float = 0.0, dropout_rate: float = 0.0,
                             key: jax.Array | None = None, block: int = QUERY_BLOCK
                             ) -> jax.Array:
  """Causal attention with hash dropout masks (``attn_dropout_mask="hash"``,
  ``rankjax.models.dropout_mask``), skipping the keys the causal mask hides: query rows
  ``[s, e)`` (blocks of ``block`` rows, the last one shorter when T is not a multiple)
  meet keys ``[0, e)`` only, statically sliced in a Python loop over the ``ceil(T /
  block)`` blocks, so the logits, softmax, mask and both products cover ``(n_b + 1) /
  (2 n_b)`` of the T x T square (56% at T = 1024, block 128) instead of all of it.
  Each block is ``jax.checkpoint``-ed: its probabilities are recomputed in the backward
  pass (the peak is one block's ``(B, H, block, e)``), its mask bits hashed again from
  the same indices (``dropout_mask.keep``: the same mask, no PRNG state). The same
  function as :func:`blocked_attention` (the probabilities of
  :func:`_block_probabilities`, kept with probability ``1 - dropout_rate`` and divided
  by it) with other masks.

  Why a loop of sliced blocks and not a flash-style pass with an online softmax: each
  block's row is whole (no running max and rescaling), the backward is jax's own (no
  custom VJP to keep right), and the FLOPs are a flash kernel's (forward QK^T and PV,
  backward one recomputed QK^T and four products); what it gives up is the fusion of
  the softmax into the matmuls, one block's probabilities a round trip to memory."""
  b, t, h, _ = q_BxTxHxD.shape
  words = dropout_mask.streams(key, b, h) if dropout_rate else None

  def one(q_BxNxHxD, k_BxSxHxD, v_BxSxHxD, start):
    rows_N = start + jnp.arange(q_BxNxHxD.shape[1])
    p = _block_probabilities(q_BxNxHxD, k_BxSxHxD, rows_N, scale, prefix_avg_removal)
    if dropout_rate:
      keep = dropout_mask.keep(words, rows_N, jnp.arange(k_BxSxHxD.shape[1]), t,
                               dropout_rate)
      p = jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
    return _apply(p, v_BxSxHxD)

  outs = []
  for start in range(0, t, block):
    stop = min(start + block, t)
    outs.append(jax.checkpoint(functools.partial(one, start=start))(
        q_BxTxHxD[:, start:stop], k_BxTxHxD[:, :stop], v_BxTxHxD[:, :stop]))
  return jnp.concatenate(outs, axis=1)


class CausalSelfAttention(PlainInit, nn.Module):
  """Multi-head causal self-attention (grouped-query with ``num_kv_heads``; q/k/v biases
  with ``attn_bias``, a bias on the output projection with ``attn_out_bias``). Input and output ``(B, T, d)``.

  With ``capture_probs`` the probabilities (after the P - alpha*C_n change, before
  dropout), shape (B, H, T, T), are sown as ``attn_probs``.
  """

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, *, deterministic: bool = True,
               capture_probs: bool = False) -> jax.Array:
    cfg = self.cfg
    d, heads, dh = cfg.d_model, cfg.num_heads, cfg.d_head
    dtype = x_BxTxD.dtype
    pdt = jnp.dtype(cfg.param_dtype)
    b, t, _ = x_BxTxD.shape

    kv = cfg.kv_heads

    def proj(name, cols=d):
      names = ("heads", "embed") if name == "w_o" else ("embed", "heads")
      return self.param(name, logical(matrix_init(cfg, name, d), names), (d, cols),
                        pdt).astype(dtype)

    counts = {"q": heads, "k": kv, "v": kv}
    weights, biases = {}, {}
    for n, c in counts.items():     # created in this order: w_q, b_q, w_k, ... (init rngs)
      weights[n] = proj(f"w_{n}", c * dh)
      if cfg.attn_bias:
        biases[n] = self.param(f"b_{n}", logical(nn.initializers.zeros, ("heads",)), (c * dh,),
                               pdt).astype(dtype)
    q, k, v = (y.reshape(b, t, c, dh) for y, c in zip(
        projections(x_BxTxD, weights, biases or None, cfg.kernels.fused_projections,
                    cfg.kernels.grad_reduce_dtype),
        counts.values()))
    if kv != heads:   # grouped-query attention: query head h reads key/value head h // group
      k, v = jnp.repeat(k, heads // kv, axis=2), jnp.repeat(v, heads // kv, axis=2)
    if cfg.pos_embedding == "rope":
      theta = None if cfg.rope.scaling == "none" else rope_frequencies(
          dh, cfg.rope, float_dtype(dtype))
      q, k = rope(q, cfg.rope.base, theta), rope(k, cfg.rope.base, theta)
      if cfg.rope.attention_factor != 1.0:
        q, k = q * cfg.rope.attention_factor, k * cfg.rope.attention_factor
    drop_probs = bool(cfg.attn_dropout_rate) and not deterministic
    # float64 (the checks in x64) keeps float64 logits: only the einsum path has them
    wide = jnp.dtype(dtype) == jnp.float64
    if capture_probs or wide or cfg.kernels.attention_impl == "einsum":
      out = self._einsum(q, k, v, capture_probs, drop_probs)
    elif drop_probs and flash_dropout.takes(cfg, dtype, t):   # hash masks in a flash kernel
      out = flash_dropout.causal_attention(q, k, v, 1.0 / (math.sqrt(dh) * cfg.tau),
                                           cfg.attn_dropout_rate, self.make_rng("dropout"),
                                           residual_name=ATTENTION_RESIDUALS)
    elif drop_probs:       # no T x T buffer: query blocks, each recomputed in the backward
      path = (causal_dropout_attention if cfg.attn_dropout_mask == "hash"
              else blocked_attention)
      out = path(q, k, v, 1.0 / (math.sqrt(dh) * cfg.tau), cfg.prefix_avg_removal,
                 cfg.attn_dropout_rate, self.make_rng("dropout"))
    else:
      scale, impl = 1.0 / (math.sqrt(dh) * cfg.tau), fused_impl(cfg, dtype, t)
      if impl == "splash":
        kernel = functools.partial(splash_attention.causal_attention, scale=scale)
      else:
        kernel = functools.partial(jax.nn.dot_product_attention, is_causal=True,
                                   scale=scale, implementation=impl)
      # the fused kernels are custom VJPs already (no forward-mode autodiff either way);
      # XLA's is plain ops, kept differentiable both ways for the Jacobian measurements
      out = (with_named_residuals(kernel) if impl in ("cudnn", "splash") else kernel)(q, k, v)
      if cfg.prefix_avg_removal:
        out = (out.astype(float_dtype(dtype))
               - cfg.prefix_avg_removal * prefix_mean(v)).astype(dtype)
    out = checkpoint_name(out, ATTENTION_OUT)     # saved by remat="dots" (not recomputed)
    out = weight_matmul(out.reshape(b, t, d), proj("w_o"), cfg.kernels.grad_reduce_dtype)
    if cfg.attn_out_bias:
      out = out + self.param("b_o", logical(nn.initializers.zeros, ("embed",)), (d,),
                             pdt).astype(dtype)
    return out

  def _einsum(self, q, k, v, capture_probs: bool, drop_probs: bool) -> jax.Array:
    cfg, dtype, t = self.cfg, q.dtype, q.shape[1]
    probs = causal_probabilities(q, k, cfg.tau)     # float32, or float64 under x64
    if cfg.prefix_avg_removal:
      probs = probs - cfg.prefix_avg_removal * prefix_average_matrix(t, probs.dtype)
    if capture_probs:
      self.sow("intermediates", "attn_probs", probs)
    if drop_probs and cfg.attn_dropout_mask == "hash":   # the fast path's masks, whole
      rate, b = cfg.attn_dropout_rate, q.shape[0]
      keep = dropout_mask.keep(dropout_mask.streams(self.make_rng("dropout"), b, cfg.num_heads),
                               jnp.arange(t), jnp.arange(t), t, rate)
      probs = jnp.where(keep, probs / (1.0 - rate), 0.0)
    elif drop_probs:
      probs = nn.Dropout(cfg.attn_dropout_rate)(probs, deterministic=False)
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(dtype), v,
                      preferred_element_type=probs.dtype).astype(dtype)
