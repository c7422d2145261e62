"""Products with a weight whose gradient is formed in float32 when the operands are
16-bit, so the weight gradient is reduced across devices in float32.

Under FSDP a layer's weight gradient ``dW = X^T G`` is a partial sum on every device
(each holds a part of the batch) and the SPMD partitioner reduces it (all-reduce /
reduce-scatter) right where the dot produces it, in the dot's output dtype. jax's own
transpose of a bfloat16 ``x @ w`` emits a bfloat16 dot, so the partial sums of every
device would be added in bfloat16. Here the weight-gradient dot accumulates and outputs
float32 (``preferred_element_type``), the reduction is float32, and the sum is rounded
to the weight's dtype once. ``TransformerConfig.grad_reduce_dtype =
"compute"`` keeps jax's rule (half the bytes on the wire). Float32 and float64 operands
take jax's own product and rule unchanged.

``lookup`` is the same for an embedding table: its gradient (a scatter-add of the
looked-up rows' cotangents) is accumulated in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
  ``grad_reduce_dtype="float32"`` its gradient is accumulated (and reduced) in float32."""
  if grad_reduce_dtype == "float32" and _is_16bit(table):
    return _lookup_f32_grad(table, ids)
  return jnp.take(table, ids, axis=0)
