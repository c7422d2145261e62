"""Products with a weight whose gradient is formed in float32 when the operands are
16-bit, so the weight gradient is reduced across devices in float32.

Under FSDP a layer's weight gradient ``dW = X^T G`` is a partial sum on every device
(each holds a part of the batch) and the SPMD partitioner reduces it (all-reduce /
reduce-scatter) right where the dot produces it, in the dot's output dtype. jax's own
transpose of a bfloat16 ``x @ w`` emits a bfloat16 dot, so the partial sums of every
device would be added in bfloat16. Here the weight-gradient dot accumulates and outputs
float32 (``preferred_element_type``), the reduction is float32, and the sum is rounded
to the weight's dtype once. ``TransformerConfig.kernels.grad_reduce_dtype =
"compute"`` keeps jax's rule (half the bytes on the wire). Float32 and float64 operands
take jax's own product and rule unchanged.

``lookup`` is the same for an embedding table: its gradient (a scatter-add of the
looked-up rows' cotangents) is accumulated in float32.

``shard_copies`` gives a table one copy per batch shard, so that a table read twice (a
tied embedding: the lookup and the LM head) has the two uses' gradients added on each
shard and reduced across devices once, not once per use.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankjax._src import partitioning


def _is_16bit(x: jax.Array) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating) and jnp.finfo(x.dtype).bits < 32


@jax.custom_vjp
def _matmul_f32_weight_grad(x: jax.Array, w: jax.Array) -> jax.Array:
  return x @ w


def _fwd(x, w):
  return x @ w, (x, w)


def _bwd(res, g):
  x, w = res
  g = g.astype(x.dtype)
  dx = jnp.matmul(g, w.T, preferred_element_type=jnp.float32).astype(x.dtype)
  dw = jnp.einsum("...d,...n->dn", x, g, preferred_element_type=jnp.float32)
  return dx, dw.astype(w.dtype)


_matmul_f32_weight_grad.defvjp(_fwd, _bwd)


def weight_matmul(x: jax.Array, w: jax.Array, grad_reduce_dtype: str = "float32") -> jax.Array:
  """``x @ w`` for ``x (..., d)`` and a weight ``w (d, n)``; with 16-bit operands and
  ``grad_reduce_dtype="float32"`` the weight's gradient is formed and reduced in
  float32 (module docstring). Values and ``dx`` are those of ``x @ w``."""
  if grad_reduce_dtype == "float32" and _is_16bit(x) and _is_16bit(w):
    return _matmul_f32_weight_grad(x, w)
  return x @ w


def _lookup_f32_grad(table: jax.Array, ids: jax.Array) -> jax.Array:
  shape, dtype = table.shape, table.dtype     # static: closed over, not residuals

  @jax.custom_vjp
  def take(t, i):
    return jnp.take(t, i, axis=0)

  def fwd(t, i):
    return take(t, i), i

  def bwd(i, g):
    grad = jnp.zeros(shape, jnp.float32).at[i].add(g.astype(jnp.float32))
    return grad.astype(dtype), None

  take.defvjp(fwd, bwd)
  return take(table, ids)


def lookup(table: jax.Array, ids: jax.Array, grad_reduce_dtype: str = "float32") -> jax.Array:
  """``table[ids]`` (rows of an embedding); with a 16-bit table and
  ``grad_reduce_dtype="float32"`` its gradient is accumulated (and reduced) in float32.

  A table ``(S, V, D)`` of ``shard_copies`` is S copies of one ``(V, D)`` table: the
  ids ``(B, ...)`` are split into S equal blocks of rows, the batch shards, and block s
  is looked up in copy s (its gradient stays on the shard)."""
  if table.ndim == 3:
    s = table.shape[0]
    ids_S = partitioning.constrain(ids.reshape(s, ids.shape[0] // s, *ids.shape[1:]),
                                   ("batch",) + (None,) * ids.ndim)
    rows = jax.vmap(lambda t, i: lookup(t, i, grad_reduce_dtype))(table, ids_S)
    return rows.reshape(*ids.shape, table.shape[-1])
  if grad_reduce_dtype == "float32" and _is_16bit(table):
    return _lookup_f32_grad(table, ids)
  return jnp.take(table, ids, axis=0)


def shard_copies(table: jax.Array, shards: int, grad_reduce_dtype: str = "float32"
                 ) -> jax.Array:
  """``(shards, *table.shape)``: one copy of ``table`` per batch shard, copy s on shard
  s's devices (the leading axis constrained to the batch axes; a gathered table is
  already on every device, so this moves nothing).

  Shard s reads only copy s (``lookup``, ``lm_head.head_cross_entropy``), so each use's
  gradient is a partial sum left on its shard, the uses' partial sums are added there,
  and the transpose of this broadcast, the sum over the shards, is the table's one
  cross-device reduction. A 16-bit table's copies are float32 under
  ``grad_reduce_dtype="float32"`` (its own values: every use rounds them back to the
  compute dtype), so the partial sums and their reduction are float32."""
  if grad_reduce_dtype == "float32" and _is_16bit(table):
    table = table.astype(jnp.float32)
  copies = jnp.broadcast_to(table[None], (shards, *table.shape))
  return partitioning.constrain(copies, ("batch",) + (None,) * table.ndim)
