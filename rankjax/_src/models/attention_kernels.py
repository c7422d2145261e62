"""The attention kernels behind ``CausalSelfAttention``: one signature, what each
supports, the P - alpha C_n correction written once, and the one selector.

Every kernel is ``kernel(q, k, v, request) -> out``: q ``(B, T, H, D)``, k and v ``(B,
T, K, D)`` (K = H, or K < H kv heads where the kernel takes grouped K/V: query head h
reads kv head ``h // (H / K)``), out ``(B, T, H, D)`` in q's dtype, the function

  ``(P - alpha C_n) V``,  ``P = softmax_row(Q K^T / (sqrt(d_head) tau) + M_causal)``

(postnorm paper Eq. 2 with the temperature of the softmax paper's Eq. 1; the
intervention of postnorm Cor 3.3, ``(C_n)_ij = 1/i`` for ``i >= j``), with dropout on
the probabilities where the request asks for it. Every kernel is causal (the decoder's
only mask). A :class:`Kernel` declares what it supports; :func:`select` maps the
settings (``attention_impl``, ``attn_dropout_mask``, ``attn_dropout_kernel``) and a
call's :class:`Need` to a kernel, refusing an explicit choice that cannot serve the call
in one line (``UserError``); ``auto`` takes the choices the library always took.

  name         probabilities  dropout    float64  grouped K/V  prefix removal
  einsum       yes (capture)  both masks  yes     no (repeat)  on P, before dropout
  xla          no             no          no      yes          on the output
  cudnn        no             no          no      yes          on the output
  splash       no             no          no      no (repeat)  on the output
  flash        no             hash        no      no (repeat)  refused
  blocks       no             threefry    yes     no (repeat)  on P, before dropout
  hash_blocks  no             hash        yes     no (repeat)  on P, before dropout

(xla: ``jax.nn.dot_product_attention``'s softmax is float32 whatever the inputs, so no
float64; cudnn: 16-bit, d_head a multiple of 8 up to 128; splash: T a multiple of 128;
flash: ``flash_dropout.supported``; cudnn, splash and flash bake the logits' scale in as
a number, the others take it traced: ``traced_scale``.) The first four serve calls
without dropout (einsum with dropout too); the last three are the training paths
with attention dropout, which ``attention_impl`` does not choose
(``attn_dropout_mask`` and ``attn_dropout_kernel`` do).

The correction is exact in two forms: on the probabilities (:func:`remove_prefix`, where
dropout follows it: ``D o (P - alpha C_n)`` is not ``D o P - alpha C_n``), and on the
output of a kernel that never forms P (:func:`remove_prefix_mean`: ``(P - alpha C_n) V =
P V - alpha C_n V``, row i of ``C_n V`` the mean of the first i rows of V: no T x T
matrix). A kernel declares its form; :func:`attend` applies the output form after every
kernel that declares it, the probability kernels call :func:`remove_prefix` themselves.

Attention-probability dropout in training (no public JAX kernel drops probabilities)
takes a query-block path (blocks, hash_blocks): no (T, T) buffer exists on any
backend, each block's probabilities are recomputed in the backward pass.
``attn_dropout_mask`` picks it:

  threefry  ``blocked_attention`` (the default: the masks and bits of every recorded
          run): ``jax.random.bernoulli`` per block of rows over all T keys, the hidden
          ones computed and zeroed, the bits drawn again in the backward pass.
  hash      ``causal_dropout_attention``: block i of rows meets keys [0, (i+1) block)
          only (56% of the square's work at T = 1024), its masks a uint32 hash of the
          entry's indices (``rankjax._src.models.dropout_mask``: which masks, that they
          differ from threefry's, the keep probability within 2^-33 of 1 - rate).
          The softmax study's paper scale sets it. Estimated 24-36% MFU for that step
          on one H200 (threefry: 17-27%; ``experiments/benchmarks/dropout_attention.py``,
          FLOP / byte accounting): both paths write each block's float32 logits and
          probabilities to HBM.
  flash     ``rankjax._src.models.flash_dropout``: the hash masks computed in a fused Pallas
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

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from rankjax._src.errors import UserError
from rankjax._src.models import dropout_mask, flash_dropout, splash_attention
from rankjax._src.numerics import float_dtype

# checkpoint_name of what a fused kernel's backward reads (its inputs, output and softmax
# statistics): saved by remat="dots", so the backward never runs the kernel's forward again
ATTENTION_RESIDUALS = "attention_residuals"
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
QUERY_BLOCK = 128   # query rows per block of the dropout paths


# --- the request, the settings and a call's needs -----------------------------------

@dataclasses.dataclass(frozen=True)
class Request:
  """What one call asks of a kernel. ``tau``: the temperature (the scale is ``1 /
  (sqrt(d_head) tau)``); ``alpha``: the prefix removal P - alpha C_n (0: none);
  ``dropout_rate`` with ``dropout_mask`` (threefry or hash) and the key ``rng``;
  ``sow``: receives the probabilities ``(B, H, T, T)`` (after the correction, before
  dropout), capture."""
  tau: float = 1.0
  alpha: float = 0.0
  dropout_rate: float = 0.0
  dropout_mask: str = "threefry"
  rng: Any = None
  sow: Callable[[jax.Array], Any] | None = None


def scale(d_head: int, tau: float) -> float:
  """``1 / (sqrt(d_head) tau)``: the logits' scale (postnorm Eq. 2, softmax paper Eq. 1)."""
  return 1.0 / (math.sqrt(d_head) * tau)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The configured choice: ``attention_impl`` (auto, einsum, xla, cudnn, splash) and
  ``attn_dropout_kernel`` (auto, pallas, blocks)."""
  impl: str = "auto"
  dropout_kernel: str = "auto"


@dataclasses.dataclass(frozen=True)
class Need:
  """What one call needs: its dtype, T and d_head; ``capture`` (the probabilities),
  ``dropout`` (on the probabilities in training: the masks, threefry or hash
  (``attn_dropout_mask``); None: none), ``prefix`` (alpha != 0); ``backend`` (None:
  ``jax.default_backend()``, for auto)."""
  dtype: Any
  t: int
  d_head: int
  capture: bool = False
  dropout: str | None = None
  prefix: bool = False
  backend: str | None = None

  @property
  def float64(self) -> bool:
    return jnp.dtype(self.dtype) == jnp.dtype(jnp.float64)


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One kernel and what it supports: ``probabilities`` (it forms P: capture),
  ``dropout`` (the masks it drops with), ``float64`` (float64 logits and softmax),
  ``grouped_kv`` (takes K/V with fewer heads), ``prefix`` ("probabilities", "output" or
  None: refused), ``dtypes`` (None: any), ``shapes(t, d_head)`` (why not, or None),
  ``traced_scale`` (takes the logits' scale as a traced value: a temperature swept per
  run, ``rankjax._src.train.runs``; the custom calls and Pallas kernels bake in a float)."""
  name: str
  fn: Callable[..., jax.Array]
  probabilities: bool = False
  dropout: tuple[str, ...] = ()
  float64: bool = False
  grouped_kv: bool = False
  prefix: str | None = "output"
  dtypes: tuple[Any, ...] | None = None
  shapes: Callable[[int, int], str | None] = lambda t, d_head: None
  traced_scale: bool = True

  def refusal(self, need: Need) -> str | None:
    """Why this kernel cannot serve ``need`` (one phrase), or None."""
    if need.capture and not self.probabilities:
      return "forms no attention probabilities (capture): use einsum"
    if need.float64 and not self.float64:
      return "computes no float64 softmax: use einsum"
    if need.dropout and need.dropout not in self.dropout:
      return f"has no attention dropout with {need.dropout} masks"
    if need.prefix and self.prefix is None:
      return "has no prefix removal (prefix_avg_removal)"
    if self.dtypes is not None and jnp.dtype(need.dtype) not in [jnp.dtype(d) for d in self.dtypes]:
      return (f"takes {', '.join(jnp.dtype(d).name for d in self.dtypes)}, "
              f"not {jnp.dtype(need.dtype).name}")
    return self.shapes(need.t, need.d_head)


# --- the prefix removal, postnorm Cor 3.3 -------------------------------------------

def prefix_rows(rows_N: jax.Array, keys: int, dtype: Any) -> jax.Array:
  """Rows ``rows_N`` (0-indexed) of ``C_n``, its first ``keys`` columns, ``(N, keys)``:
  ``1/(i+1)`` where key ``j <= i``, else 0 (postnorm Eq. 3; the 1-indexed ``1/i``)."""
  visible = rows_N[:, None] >= jnp.arange(keys)[None, :]
  return jnp.where(visible, 1.0 / (rows_N[:, None] + 1).astype(dtype), 0.0).astype(dtype)


def remove_prefix(p_BxHxNxS: jax.Array, alpha: float, rows_N: jax.Array) -> jax.Array:
  """``P - alpha C_n`` on rows ``rows_N`` of the probabilities (postnorm Cor 3.3)."""
  return p_BxHxNxS - alpha * prefix_rows(rows_N, p_BxHxNxS.shape[-1], p_BxHxNxS.dtype)


def prefix_mean(v_BxTxKxD: jax.Array) -> jax.Array:
  """``C_n V`` without C_n: row i is the mean of rows 1..i (in float32)."""
  t = v_BxTxKxD.shape[1]
  acc = float_dtype(v_BxTxKxD.dtype)
  counts = jnp.arange(1, t + 1, dtype=acc)[None, :, None, None]
  return jnp.cumsum(v_BxTxKxD.astype(acc), axis=1) / counts


def remove_prefix_mean(out_BxTxHxD: jax.Array, v_BxTxKxD: jax.Array, alpha: float
                       ) -> jax.Array:
  """``(P - alpha C_n) V = P V - alpha C_n V`` from a kernel's ``P V`` (postnorm Cor
  3.3), in float32, returned in the output's dtype; V may have fewer (kv) heads, query
  head h taking kv head ``h // (H / K)``."""
  heads, kv = out_BxTxHxD.shape[2], v_BxTxKxD.shape[2]
  mean = prefix_mean(v_BxTxKxD)
  if kv != heads:   # a (B, T, H, D) float32 copy, fused into the subtraction
    mean = jnp.repeat(mean, heads // kv, axis=2)
  return (out_BxTxHxD.astype(float_dtype(out_BxTxHxD.dtype))
          - alpha * mean).astype(out_BxTxHxD.dtype)


# --- the probabilities ----------------------------------------------------------------

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
  one einsum attention of the library (the einsum kernel, the GPT-2 reader's forward
  pass, ``flax_capture.causal_probs`` and ``sensitivity_bounds.mha_attention_probs``
  call it). The logits are :func:`attention_logits` (a float32 contraction of 16-bit q
  and k: never rounded to their dtype), the softmax in float32 (float64 for float64
  input); keys after the query get ``finfo.min`` (zero probability: every row keeps its
  diagonal). ``causal=False`` (may be traced) lets every query see every key."""
  t, dh = q_BxTxHxD.shape[-3], q_BxTxHxD.shape[-1]
  acc = float_dtype(q_BxTxHxD.dtype)
  logits_BxHxTxT = attention_logits(q_BxTxHxD, k_BxTxHxD) / (math.sqrt(dh) * tau)
  visible = jnp.tril(jnp.ones((t, t), bool)) | jnp.logical_not(causal)
  logits_BxHxTxT = jnp.where(visible, logits_BxHxTxT, jnp.finfo(acc).min)
  return jax.nn.softmax(logits_BxHxTxT, axis=-1)


def _apply(p_BxHxNxS, v_BxSxHxD):
  """``P V`` with P rounded to V's dtype, accumulated in float32, in V's dtype."""
  return jnp.einsum("bhqk,bkhd->bqhd", p_BxHxNxS.astype(v_BxSxHxD.dtype), v_BxSxHxD,
                    preferred_element_type=float_dtype(v_BxSxHxD.dtype)
                    ).astype(v_BxSxHxD.dtype)


def _inverted_dropout(p, keep, rate: float):
  """Kept entries divided by ``1 - rate``, the others 0."""
  return jnp.where(keep, p / (1.0 - rate), 0.0)


def einsum_attention(q, k, v, r: Request) -> jax.Array:
  """The explicit ``(B, H, T, T)`` probabilities (:func:`causal_probabilities`), minus
  alpha C_n, sown (``r.sow``), dropped (threefry: ``jax.random.bernoulli`` of the whole
  matrix, flax ``nn.Dropout``'s draw; hash: ``dropout_mask.keep`` of every entry, the
  masks of the hash paths), applied to V accumulating in the probabilities' dtype."""
  dtype, t = q.dtype, q.shape[1]
  probs = causal_probabilities(q, k, r.tau)     # float32, or float64 under x64
  if r.alpha:
    probs = remove_prefix(probs, r.alpha, jnp.arange(t))
  if r.sow is not None:
    r.sow(probs)
  if r.dropout_rate and r.dropout_mask == "hash":
    words = dropout_mask.streams(r.rng, q.shape[0], q.shape[2])
    probs = _inverted_dropout(probs, dropout_mask.keep(words, jnp.arange(t), jnp.arange(t),
                                                       t, r.dropout_rate), r.dropout_rate)
  elif r.dropout_rate:   # flax nn.Dropout's ops (lax.select of probs / keep_prob)
    keep_prob = 1.0 - r.dropout_rate
    keep = jax.random.bernoulli(r.rng, p=keep_prob, shape=probs.shape)
    probs = jax.lax.select(keep, probs / keep_prob, jnp.zeros_like(probs))
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(dtype), v,
                    preferred_element_type=probs.dtype).astype(dtype)


# --- the query-block dropout paths ----------------------------------------------------

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
  return remove_prefix(p, prefix_avg_removal, rows_N) if prefix_avg_removal else p


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
      p = _inverted_dropout(p, keep, dropout_rate)
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
  ``rankjax._src.models.dropout_mask``), skipping the keys the causal mask hides: query rows
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
      p = _inverted_dropout(p, keep, dropout_rate)
    return _apply(p, v_BxSxHxD)

  outs = []
  for start in range(0, t, block):
    stop = min(start + block, t)
    outs.append(jax.checkpoint(functools.partial(one, start=start))(
        q_BxTxHxD[:, start:stop], k_BxTxHxD[:, :stop], v_BxTxHxD[:, :stop]))
  return jnp.concatenate(outs, axis=1)


# --- the fused kernels ---------------------------------------------------------------

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


def _dot_product(implementation: str):
  """``jax.nn.dot_product_attention`` (causal; K/V may have fewer heads: GQA)."""
  def run(q, k, v, r: Request):
    kernel = functools.partial(jax.nn.dot_product_attention, is_causal=True,
                               scale=scale(q.shape[-1], r.tau), implementation=implementation)
    # cuDNN's kernel is a custom VJP already (no forward-mode autodiff either way); XLA's
    # is plain ops, kept differentiable both ways for the Jacobian measurements
    return (with_named_residuals(kernel) if implementation == "cudnn" else kernel)(q, k, v)
  return run


def _splash(q, k, v, r: Request):
  kernel = functools.partial(splash_attention.causal_attention, scale=scale(q.shape[-1], r.tau))
  return with_named_residuals(kernel)(q, k, v)


def _flash(q, k, v, r: Request):
  return flash_dropout.causal_attention(q, k, v, scale(q.shape[-1], r.tau), r.dropout_rate,
                                        r.rng, residual_name=ATTENTION_RESIDUALS)


def _blocks(q, k, v, r: Request):
  return blocked_attention(q, k, v, scale(q.shape[-1], r.tau), r.alpha, r.dropout_rate, r.rng)


def _hash_blocks(q, k, v, r: Request):
  return causal_dropout_attention(q, k, v, scale(q.shape[-1], r.tau), r.alpha,
                                  r.dropout_rate, r.rng)


def _cudnn_shapes(t: int, d_head: int) -> str | None:
  if d_head % 8 or d_head > 128:
    return f"needs d_head a multiple of 8 up to 128, not {d_head}"
  return None


def _splash_shapes(t: int, d_head: int) -> str | None:
  if not splash_attention.supported(t):
    return (f"needs a sequence length that is a multiple of "
            f"{splash_attention.BLOCK_CHOICES[-1]}, not {t}")
  return None


def _flash_shapes(t: int, d_head: int) -> str | None:
  if d_head not in flash_dropout.D_HEADS or t > dropout_mask.MAX_SEQ:
    return (f"needs d_head in {flash_dropout.D_HEADS} and T <= {dropout_mask.MAX_SEQ}, "
            f"not {d_head} and {t}")
  return None


KERNELS = {k.name: k for k in (
    Kernel("einsum", einsum_attention, probabilities=True, dropout=("threefry", "hash"),
           float64=True, prefix="probabilities"),
    Kernel("xla", _dot_product("xla"), grouped_kv=True),
    Kernel("cudnn", _dot_product("cudnn"), grouped_kv=True, traced_scale=False,
           dtypes=CUDNN_DTYPES, shapes=_cudnn_shapes),
    Kernel("splash", _splash, shapes=_splash_shapes, traced_scale=False),
    Kernel("flash", _flash, dropout=("hash",), prefix=None, traced_scale=False,
           dtypes=flash_dropout.DTYPES, shapes=_flash_shapes),
    Kernel("blocks", _blocks, dropout=("threefry",), float64=True, prefix="probabilities"),
    Kernel("hash_blocks", _hash_blocks, dropout=("hash",), float64=True,
           prefix="probabilities"),
)}
FUSED = ("xla", "cudnn", "splash")   # the attention_impl choices besides auto and einsum


# --- the selector --------------------------------------------------------------------

def select(settings: Settings, need: Need) -> Kernel:
  """The kernel of one call. einsum when ``attention_impl`` is einsum, when the call
  captures the probabilities (a measurement: the diagnostics, ``flax_capture``; only
  einsum forms P, whatever ``attention_impl`` names for the computation itself), or
  under auto for float64. Dropout in training: the flash
  kernel where ``attn_dropout_kernel`` is pallas, or auto on a GPU backend with a 16-bit
  dtype, and it supports the call (hash masks, no prefix removal, its shapes); else the
  query blocks of the call's masks (blocks, hash_blocks). Otherwise the named
  fused kernel, or under auto cudnn on a GPU backend and splash on a TPU backend where
  they support the call, else xla. An explicit fused kernel that cannot serve the call
  (float64, dtype, shapes) is refused: ``UserError``, one line. The backend is
  not checked for an explicit choice (a step may be lowered for another platform)."""
  if settings.impl == "einsum" or need.capture or (settings.impl == "auto" and need.float64):
    return KERNELS["einsum"]
  if settings.impl not in FUSED + ("auto",):
    raise UserError(f"attention_impl {settings.impl!r}; choose auto, einsum, {', '.join(FUSED)}")
  if need.float64:
    _refuse(settings.impl, dataclasses.replace(need, dropout=None))
  backend = need.backend or jax.default_backend()
  if need.dropout:
    flash = KERNELS["flash"]
    if (settings.dropout_kernel != "blocks" and flash.refusal(need) is None
        and (settings.dropout_kernel == "pallas" or (
            backend == "gpu" and jnp.dtype(need.dtype) != jnp.dtype(jnp.float32)))):
      return flash
    return next(KERNELS[n] for n in ("blocks", "hash_blocks")
                if need.dropout in KERNELS[n].dropout)
  if settings.impl == "auto":
    preferred = {"gpu": "cudnn", "tpu": "splash"}.get(backend)
    return KERNELS[preferred if preferred and KERNELS[preferred].refusal(need) is None
                   else "xla"]
  return _refuse(settings.impl, need)


def _refuse(name: str, need: Need) -> Kernel:
  """``KERNELS[name]``, or a one-line ``UserError`` saying why it cannot serve ``need``."""
  reason = KERNELS[name].refusal(need)
  if reason:
    raise UserError(f"attention_impl={name!r} {reason}")
  return KERNELS[name]


def kv_for(kernel: Kernel, heads: int, k_BxTxKxD: jax.Array, v_BxTxKxD: jax.Array
           ) -> tuple[jax.Array, jax.Array]:
  """K and V as ``kernel`` takes them: grouped (K < H kv heads) as they are where it
  takes grouped K/V, else copied to the H query heads (``jnp.repeat``: query head h
  reads kv head ``h // (H / K)``)."""
  kv = k_BxTxKxD.shape[2]
  if kv == heads or kernel.grouped_kv:
    return k_BxTxKxD, v_BxTxKxD
  return (jnp.repeat(k_BxTxKxD, heads // kv, axis=2),
          jnp.repeat(v_BxTxKxD, heads // kv, axis=2))


def attend(kernel: Kernel, q_BxTxHxD: jax.Array, k_BxTxKxD: jax.Array,
           v_BxTxKxD: jax.Array, request: Request) -> jax.Array:
  """``kernel`` on q and K/V as it takes them (:func:`kv_for`), then the output form of
  the prefix removal (:func:`remove_prefix_mean`) where the kernel declares it."""
  k, v = kv_for(kernel, q_BxTxHxD.shape[2], k_BxTxKxD, v_BxTxKxD)
  out = kernel.fn(q_BxTxHxD, k, v, request)
  if request.alpha and kernel.prefix == "output":
    out = remove_prefix_mean(out, v, request.alpha)
  return out
