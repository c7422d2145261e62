"""Normalization operations, as pure functions and as one linen module.

Transforming Rank, App B.1 and Table 2, at gain one (``x_hat = x/||x||``):

  rms           N(x) = sqrt(d) x / ||x||            J = sqrt(d)/||x|| (I - x_hat x_hat^T)   (Eq. 19)
  detached_rms  x / sg(rms(x))                      J = sqrt(d)/||x|| I                     (Eq. 20)
  mean          x - mean(x) 1                       J = I - 1 1^T / d
  layer         sqrt(d) (x - mu) / ||x - mu||       J = sqrt(d)/||x-mu|| (I - xc xc^T)(I - 1 1^T/d)
  none          x                                   J = I

With ``eps > 0`` the RMS is ``sqrt(mean(x^2) + eps)`` (the training form); the theory
uses ``eps = 0``. All functions normalize over the last axis.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankjax.numerics import as_float


def rms(x: jax.Array, eps: float = 0.0) -> jax.Array:
  """Root mean square over the last axis, keepdims."""
  return jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def normalize(x: jax.Array, op: str, eps: float = 0.0) -> jax.Array:
  """Applies normalization ``op`` over the last axis (no gain)."""
  if op == "none":
    return x
  if op == "rms":
    return x / rms(x, eps)
  if op == "detached_rms":
    return x / jax.lax.stop_gradient(rms(x, eps))
  if op == "mean":
    return x - jnp.mean(x, axis=-1, keepdims=True)
  if op == "layer":
    centered = x - jnp.mean(x, axis=-1, keepdims=True)
    return centered / rms(centered, eps)
  raise ValueError(f"norm op {op!r} is not allowed; choose one of "
                   "['rms', 'layer', 'mean', 'detached_rms', 'none']")


def has_gain(op: str) -> bool:
  """Whether a learned gain makes sense for ``op`` (the rescaling operations)."""
  return op in ("rms", "layer", "detached_rms")


class Norm(nn.Module):
  """``normalize`` with an optional learned gain (initialized to one) and bias (zero).

  Both exist only for the rescaling ops (``has_gain``): ``y = N(x) * scale + bias``,
  computed in at least float32 and returned in ``x``'s dtype.
  """

  op: str
  gain: bool = True
  eps: float = 1e-6
  param_dtype: jnp.dtype = jnp.float32
  bias: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    y = normalize(as_float(x), self.op, self.eps)
    if self.gain and has_gain(self.op):
      scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
      y = y * scale
    if self.bias and has_gain(self.op):
      y = y + self.param("bias", nn.initializers.zeros, (x.shape[-1],), self.param_dtype)
    return y.astype(x.dtype)
