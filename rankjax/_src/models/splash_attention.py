"""Causal attention by Pallas splash attention, the flash-style TPU kernel.

``attention_impl="splash"`` (or ``auto`` on a TPU backend when the sequence length is
a multiple of 128) computes softmax(q k^T * scale) v with the causal mask inside the
kernel, block by block: no (B, H, T, T) scores or probabilities are ever written,
forward or backward. The scale is folded into q (1/(sqrt(d_head) tau), softmax paper
Eq. 1 with temperature), so the kernel's own logits are those of the einsum path.

On other backends the same kernel runs in Pallas' interpreter (``interpret=True``):
slow, but the identical program, which is how the tests compare it with
``jax.nn.dot_product_attention`` on a CPU (forward and gradients), and how a TPU
config can be smoke-tested here. ``jax.export(..., platforms=["tpu"])`` lowers it for
a TPU from any machine (tested: a Mosaic ``tpu_custom_call``, no T x T buffer).

Under the training step's sharding context (``rankjax._src.partitioning``) the kernel runs
inside ``jax.shard_map`` with the batch split as the residual stream is (a Pallas
call is opaque to GSPMD, which would otherwise gather the whole batch onto every
device); each device runs the kernel on its own sequences.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rankjax._src import partitioning

BLOCK_CHOICES = (512, 256, 128)


def supported(seq_len: int) -> bool:
  """Whether the kernel's blocks tile ``seq_len`` (a multiple of 128)."""
  return seq_len % BLOCK_CHOICES[-1] == 0


def _kernel(seq_len: int, heads: int, interpret: bool):
  """The splash kernel for one sequence: (H, T, Dh) q, k, v -> (H, T, Dh), built per
  trace (it holds arrays, which a cache would leak out of the trace). Pallas is imported
  here, on first use, not with rankjax."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as kernel_lib,
      splash_attention_mask as mask_lib,
  )
  block = next(b for b in BLOCK_CHOICES if seq_len % b == 0)
  sizes = kernel_lib.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
      block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq_len, seq_len))] * heads)
  return kernel_lib.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)


def causal_attention(q_BxTxHxD: jax.Array, k_BxTxHxD: jax.Array, v_BxTxHxD: jax.Array,
                     scale: float) -> jax.Array:
  """softmax(q k^T scale, causal) v, by the splash kernel; ``(B, T, H, Dh)`` in and out,
  the inputs' dtype (the kernel accumulates in float32)."""
  _, t, heads, _ = q_BxTxHxD.shape
  if not supported(t):
    raise ValueError(f"attention_impl='splash' needs a sequence length that is a multiple "
                     f"of {BLOCK_CHOICES[-1]}, not {t}")

  def kernel(interpret, q, k, v):
    return jax.vmap(_kernel(t, heads, interpret))(q, k, v)

  def run(q, k, v):
    q = (q * scale).astype(q.dtype)
    qkv = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    # the compiled kernel where the program runs on a TPU (also when lowered for one
    # from elsewhere, jax.export), Pallas' interpreter on every other platform
    out = jax.lax.platform_dependent(*qkv, tpu=functools.partial(kernel, False),
                                     default=functools.partial(kernel, True))
    return jnp.swapaxes(out, 1, 2)

  context = partitioning.current()
  if context is None:
    return run(q_BxTxHxD, k_BxTxHxD, v_BxTxHxD)
  mesh, rules = context
  axes = tuple(a for a in rules.get("batch", ()) if mesh.shape[a] > 1)
  shards = math.prod(mesh.shape[a] for a in axes)
  if shards == 1 or q_BxTxHxD.shape[0] % shards:
    return run(q_BxTxHxD, k_BxTxHxD, v_BxTxHxD)
  spec = P(axes if len(axes) > 1 else axes[0])
  return jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                       check_vma=False)(q_BxTxHxD, k_BxTxHxD, v_BxTxHxD)
