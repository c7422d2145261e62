"""Causal flash attention with the hash dropout masks in the kernel (Pallas, Triton on
GPU): the function of ``attention.causal_dropout_attention`` (``attn_dropout_mask=
"hash"``) without any block of logits or probabilities in HBM.

Adapted from JAX's Pallas GPU flash attention (``jax.experimental.pallas.ops.gpu.
attention``: ``mha``, its forward kernel and fused backward kernel, Apache 2.0; Dao et
al. 2022, FlashAttention Alg. 2 (forward with dropout) and 4 (backward); Dao 2023,
FlashAttention-2 Sec 3.1), with the causal mask, the dropout and only what this library
needs (no segment ids, d_head a power of two, no padded head dimension).

With ``S = Q K^T scale`` (postnorm Eq. 2's logits), ``P = softmax_row(S + M_causal)``,
``D = keep / (1 - rate)`` (``keep = dropout_mask.keep(streams(key, B, H), i, j, T,
rate)``, hashed in the kernel from the global query and key indices and the two words of
the block's (batch, head): the masks of ``causal_dropout_attention``):

  forward   ``O = (D o P) V``. Per block of query rows, over the key blocks up to the
            diagonal (those above it are skipped), the online softmax of FlashAttention
            keeps the running max ``m`` and normalizer ``l = sum_j exp(S_ij - m)``
            over every visible entry, dropped or not (P is normalized before the
            dropout), while the accumulator takes only the kept entries:
            ``o += (keep o exp(S - m)) V``; at the end ``O = o / (l (1 - rate))``.
            The residual is the row log-sum-exp (base 2).
  backward  with dO given and P recomputed from S and the log-sum-exp:
            ``dV = (D o P)^T dO``; ``dP = D o (dO V^T)`` (the cotangent of D o P is
            dO V^T, and D is a constant); ``dS = P o (dP - delta)`` with ``delta_i =
            sum_j P_ij dP_ij`` (the softmax's Jacobian ``diag(p) - p p^T`` per row);
            ``dQ = dS K scale``, ``dK = dS^T Q scale``. Under dropout delta is still
            ``rowsum(dO o O)``: ``sum_j P_ij dP_ij = sum_j P_ij D_ij (dO_i . V_j) =
            dO_i . sum_j (D o P)_ij V_j = dO_i . O_i``. So the backward reads Q, K, V,
            O, dO and the log-sum-exp, never a T x T matrix; each key block's dK, dV
            runs over the query blocks from the diagonal down, each query block's dQ
            over the key blocks up to it.

T need not be a multiple of the block: Q, K, V are zero-padded to one (the padded keys
lie after every real query, so the causal mask hides them; the padded queries' rows are
sliced off, and their zero cotangents add nothing to dK, dV), the hash still counts ``i T +
j`` with the real T. ``supported`` says which shapes the kernel takes (float32 or
16-bit, d_head a power of two from 16 to 128); ``CausalSelfAttention`` takes it for hash
dropout in training on a GPU (the "flash" kernel of ``attention_kernels``, chosen by
``attention_kernels.select`` under ``TransformerConfig.kernels.attn_dropout_kernel``),
never with the P - alpha C_n intervention (the kernel declares none: that path stays
``causal_dropout_attention``). Off a GPU it runs in Pallas' interpreter (the tests);
on a GPU it lowers to two Triton kernels (``__gpu$xla.gpu.triton``, exported for CUDA
from a CPU in the tests; Triton's own compilation to PTX happens on the GPU only).
Under the training step's sharding context (``rankjax._src.partitioning``) the kernel runs
inside ``jax.shard_map`` with the batch split (as ``splash_attention``): each device
its own sequences and their (batch, head) words, the masks those of the whole batch.
Precision: the logits and the softmax in float32, the probabilities rounded to V's
dtype for the products with V and dO (as every flash kernel), accumulators in float32;
float32 operands' dots at full precision (no tf32).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from rankjax._src import partitioning
from rankjax._src.errors import UserError
from rankjax._src.models import dropout_mask

BLOCK = 64          # query and key rows per block, forward and backward (untuned)
MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)   # JAX's DEFAULT_MASK_VALUE
LOG2E = math.log2(math.e)
D_HEADS = (16, 32, 64, 128)
DTYPES = tuple(jnp.dtype(d) for d in (jnp.float32, jnp.bfloat16, jnp.float16))


def supported(dtype, d_head: int, t: int) -> bool:
  """Whether the kernel takes these shapes: float32, bfloat16 or float16, d_head a power
  of two from 16 to 128 (Triton's dot and the registers), T within the hash counter's
  range."""
  return (jnp.dtype(dtype) in DTYPES and d_head in D_HEADS and t <= dropout_mask.MAX_SEQ)


def _blocks(t: int, block: int) -> tuple[int, int]:
  """The block (a power of two, at least 16, at most ``block``) and T padded to it."""
  b = max(16, min(block, 1 << (t - 1).bit_length()))
  return b, -(-t // b) * b


def _keep(words_ref, rows, cols, t: int, rate: float):
  """``dropout_mask.keep`` of the entries (rows, cols) for this program's (batch, head)."""
  return dropout_mask.keep((words_ref[0], words_ref[1]), rows, cols, t, rate)


def _dot(a, b, **kw):
  """``plgpu.dot`` into float32; float32 operands at full precision (not tf32)."""
  from jax.experimental.pallas import triton as plgpu   # on first use, not with rankjax
  return plgpu.dot(a, b, allow_tf32=False if a.dtype == jnp.float32 else None, **kw)


def _logits(q, k, rows, cols, scale):
  """``S log2(e)`` of a block with the causal mask (hidden entries at MASKED)."""
  s = _dot(q, k, trans_b=True) * (scale * LOG2E)
  return jnp.where(rows[:, None] >= cols[None, :], s, MASKED)


def _forward_kernel(words_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, rate, t,
                    block):
  from jax.experimental import pallas as pl   # on first use, not with rankjax
  i = pl.program_id(0)
  rows = i * block + jnp.arange(block)
  q = q_ref[...]
  d = q.shape[-1]

  def body(j, carry):
    o, m, l = carry
    sl = pl.ds(j * block, block)
    k, v = k_ref[sl, :], v_ref[sl, :]
    s = _logits(q, k, rows, j * block + jnp.arange(block), scale)
    m_next = jnp.maximum(m, jnp.max(s, axis=-1))
    correction = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    l = correction * l + p.sum(axis=-1)          # every visible entry: P before dropout
    if rate:
      p = jnp.where(_keep(words_ref, rows, j * block + jnp.arange(block), t, rate), p, 0.0)
    o = correction[:, None] * o + _dot(p.astype(v.dtype), v)
    return o, m_next, l

  init = (jnp.zeros((block, d), jnp.float32), jnp.full((block,), -jnp.inf, jnp.float32),
          jnp.zeros((block,), jnp.float32))
  o, m, l = lax.fori_loop(0, i + 1, body, init)    # key blocks up to the diagonal
  o_ref[...] = (o / (l * (1.0 - rate))[:, None]).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log2(l)


def _backward_kernel(words_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                     dq_ref, dk_ref, dv_ref, *, scale, rate, t, block):
  from jax.experimental import pallas as pl   # on first use, not with rankjax
  n = q_ref.shape[0] // block
  c = pl.program_id(2)
  inv = 1.0 / (1.0 - rate)
  d = q_ref.shape[-1]

  def probs(q, k, rows, cols, lse):
    """P and (with dropout) the keep mask of a block."""
    p = jnp.exp2(_logits(q, k, rows, cols, scale) - lse[:, None])
    return p, (_keep(words_ref, rows, cols, t, rate) if rate else None)

  def dropped(x, keep):
    return jnp.where(keep, x * inv, 0.0) if rate else x

  # dK, dV of key block c: the query blocks from the diagonal down
  cols = c * block + jnp.arange(block)
  sl = pl.ds(c * block, block)
  k, v = k_ref[sl, :], v_ref[sl, :]

  def dkdv(r, carry):
    dk, dv = carry
    rs = pl.ds(r * block, block)
    q, do = q_ref[rs, :], do_ref[rs, :]
    p, keep = probs(q, k, r * block + jnp.arange(block), cols, lse_ref[rs])
    dv = dv + _dot(dropped(p, keep).astype(do.dtype), do, trans_a=True)
    ds = p * (dropped(_dot(do, v, trans_b=True), keep) - delta_ref[rs][:, None])
    dk = dk + _dot((ds * scale).astype(q.dtype), q, trans_a=True)
    return dk, dv

  zeros = jnp.zeros((block, d), jnp.float32)
  dk, dv = lax.fori_loop(c, n, dkdv, (zeros, zeros))
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)

  # dQ of query block c: the key blocks up to the diagonal
  rows = c * block + jnp.arange(block)
  q, do = q_ref[sl, :], do_ref[sl, :]
  lse, delta = lse_ref[sl], delta_ref[sl]

  def dq_step(j, dq):
    ks = pl.ds(j * block, block)
    k, v = k_ref[ks, :], v_ref[ks, :]
    p, keep = probs(q, k, rows, j * block + jnp.arange(block), lse)
    ds = p * (dropped(_dot(do, v, trans_b=True), keep) - delta[:, None])
    return dq + _dot((ds * scale).astype(k.dtype), k)

  dq = lax.fori_loop(0, c + 1, dq_step, zeros)
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _params(d_head: int):
  from jax.experimental.pallas import triton as plgpu   # on first use, not with rankjax
  return plgpu.CompilerParams(num_warps=4 if d_head <= 64 else 8, num_stages=2)


def _forward(words, q, k, v, scale, rate, t, block, interpret):
  """``(O, lse)`` of padded ``(B, Tp, H, D)`` q, k, v; ``words (2, B, H)``."""
  from jax.experimental import pallas as pl   # on first use, not with rankjax
  from jax.experimental.pallas import triton as plgpu
  b, tp, h, d = q.shape
  row_block = pl.BlockSpec((None, block, None, d), lambda i, j, c: (j, i, c, 0))
  whole = pl.BlockSpec((None, tp, None, d), lambda i, j, c: (j, 0, c, 0))
  return pl.pallas_call(
      functools.partial(_forward_kernel, scale=scale, rate=rate, t=t, block=block),
      grid=(tp // block, b, h),
      in_specs=[pl.BlockSpec((2, None, None), lambda i, j, c: (0, j, c)),
                row_block, whole, whole],
      out_specs=[row_block, pl.BlockSpec((None, None, block), lambda i, j, c: (j, c, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, tp), jnp.float32)],
      compiler_params=_params(d), interpret=interpret, name="flash_dropout_forward",
  )(words, q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _attend(words, q, k, v, scale, rate, t, block, interpret, name):
  return _forward(words, q, k, v, scale, rate, t, block, interpret)[0]


def _attend_fwd(words, q, k, v, scale, rate, t, block, interpret, name):
  o, lse = _forward(words, q, k, v, scale, rate, t, block, interpret)
  res = (words, q, k, v, o, lse)
  return o, (res if name is None else tuple(checkpoint_name(x, name) for x in res))


def _attend_bwd(scale, rate, t, block, interpret, name, res, do):
  from jax.experimental import pallas as pl   # on first use, not with rankjax
  words, q, k, v, o, lse = res
  b, tp, h, d = q.shape
  # delta = rowsum(dO o O) (module docstring), (B, H, Tp) in float32
  delta = jnp.einsum("bthd,bthd->bht", do.astype(jnp.float32), o.astype(jnp.float32))
  whole = pl.BlockSpec((None, tp, None, d), lambda i, j, c: (i, 0, j, 0))
  stats = pl.BlockSpec((None, None, tp), lambda i, j, c: (i, j, 0))
  block_out = pl.BlockSpec((None, block, None, d), lambda i, j, c: (i, c, j, 0))
  dq, dk, dv = pl.pallas_call(
      functools.partial(_backward_kernel, scale=scale, rate=rate, t=t, block=block),
      grid=(b, h, tp // block),
      in_specs=[pl.BlockSpec((2, None, None), lambda i, j, c: (0, i, j)),
                whole, whole, whole, whole, stats, stats],
      out_specs=[block_out, block_out, block_out],
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
      compiler_params=_params(d), interpret=interpret, name="flash_dropout_backward",
  )(words, q, k, v, do.astype(q.dtype), lse, delta)
  return None, dq, dk, dv


_attend.defvjp(_attend_fwd, _attend_bwd)


def causal_attention(q_BxTxHxD: jax.Array, k_BxTxHxD: jax.Array, v_BxTxHxD: jax.Array,
                     scale: float, dropout_rate: float = 0.0, key: jax.Array | None = None,
                     block: int = BLOCK, interpret: bool | None = None,
                     residual_name: str | None = None) -> jax.Array:
  """Causal attention with hash dropout on the probabilities, one fused kernel forward
  and backward (module docstring): ``causal_dropout_attention(q, k, v, scale, 0.0,
  dropout_rate, key)`` up to float rounding. ``interpret``: Pallas' interpreter (default:
  off a GPU backend). ``residual_name``: a ``checkpoint_name`` for what the backward
  reads (q, k, v, the words, O and the log-sum-exp), so a remat policy saving that name
  never runs the forward kernel again (``attention_kernels.ATTENTION_RESIDUALS``)."""
  b, t, h, d = q_BxTxHxD.shape
  if d not in D_HEADS or jnp.dtype(q_BxTxHxD.dtype) not in DTYPES:
    raise UserError(f"flash dropout attention needs d_head in {D_HEADS} and float32, "
                    f"bfloat16 or float16; got {d}, {q_BxTxHxD.dtype}")
  if dropout_rate and key is None:
    raise UserError("flash dropout attention with dropout_rate > 0 needs a dropout key")
  if not 0.0 <= dropout_rate < 1.0:
    raise UserError(f"dropout rate must be in [0, 1); got {dropout_rate}")
  if t > dropout_mask.MAX_SEQ:
    raise UserError(f"hash dropout masks need T <= {dropout_mask.MAX_SEQ}; got {t}")
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  words = (dropout_mask.streams(key, b, h)[..., 0, 0] if dropout_rate
           else jnp.zeros((2, b, h), jnp.uint32))
  block, tp = _blocks(t, block)
  pad = lambda x: jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, 0))) if tp > t else x

  def run(words, q, k, v):
    out = _attend(words, pad(q), pad(k), pad(v), float(scale), float(dropout_rate), t,
                  block, bool(interpret), residual_name)
    return out[:, :t]

  # under the training mesh (rankjax._src.partitioning) each device runs the kernel on its
  # own sequences and their words (a Pallas call is opaque to GSPMD, which would gather
  # the whole batch onto every device), as splash_attention does
  context = partitioning.current()
  if context is None:
    return run(words, q_BxTxHxD, k_BxTxHxD, v_BxTxHxD)
  mesh, rules = context
  axes = tuple(a for a in rules.get("batch", ()) if mesh.shape[a] > 1)
  shards = math.prod(mesh.shape[a] for a in axes)
  if shards == 1 or b % shards:
    return run(words, q_BxTxHxD, k_BxTxHxD, v_BxTxHxD)
  batch = axes if len(axes) > 1 else axes[0]
  return jax.shard_map(run, mesh=mesh, in_specs=(P(None, batch),) + (P(batch),) * 3,
                       out_specs=P(batch), check_vma=False)(
                           words, q_BxTxHxD, k_BxTxHxD, v_BxTxHxD)
