"""Normalization operations, as pure functions and as one linen module.

Transforming Rank, App B.1 and Table 2, at gain one (``x_hat = x/||x||``):

  rms           N(x) = sqrt(d) x / ||x||            J = sqrt(d)/||x|| (I - x_hat x_hat^T)   (Eq. 19)
  detached_rms  x / sg(rms(x))                      J = sqrt(d)/||x|| I                     (Eq. 20)
  mean          x - mean(x) 1                       J = I - 1 1^T / d
  layer         sqrt(d) (x - mu) / ||x - mu||       J = sqrt(d)/||x-mu|| (I - xc xc^T)(I - 1 1^T/d)
  none          x                                   J = I

With ``eps > 0`` the RMS is ``sqrt(mean(x^2) + eps)`` (the training form); the theory
uses ``eps = 0``. All functions normalize over the last axis.

The Jacobians live here too, next to the operations they differentiate, and are the
only closed-form norm Jacobians of the library (the MLP Jacobian engine, the GPT-2 and
Llama FFN Jacobians use them). Convention: ``J[i, j] = d N(x)_i / d x_j`` (rows are
outputs); ``jacobian_left(M, x) = J M`` and ``jacobian_right(M, x) = M J`` apply it in
O(d^2) per column as the rank-one/two update above, with the ``eps`` form
``J = (1/r)(I - v v^T)``, ``r = rms(x, eps)``, ``v = x / (sqrt(d) r)`` (App B.1), and a
gain ``g`` as ``diag(g) J``.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax.linen import with_logical_partitioning as logical

from rankjax._src.models.annotated import PlainInit
from rankjax._src.numerics import NORM, as_float


def rms(x: jax.Array, eps: float = 0.0) -> jax.Array:
  """Root mean square over the last axis, keepdims."""
  return jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def rescale(x: jax.Array, eps: float = 0.0) -> jax.Array:
  """``x / rms(x, eps)`` over the last axis, differentiated by its closed form.

  The tangent is ``J dx = (dx - y mean(y dx)) / r`` with ``y = x / r``, ``r = rms(x,
  eps)`` (Eq. 19 with eps, App B.1; the J that ``jacobian_left`` applies to a
  matrix, here batched over the leading axes): the same Jacobian autodiff would build, in fewer
  operations, so a training step's norm backward (its transpose) is one pass of
  elementwise work and two reductions. The value is computed exactly as without the
  rule. Forward mode (jacfwd, jvp) and higher derivatives use the same rule.
  """
  return x / rms(x, eps)


@rescale.defjvp
def _rescale_jvp(eps, primals, tangents):
  (x,), (dx,) = primals, tangents
  r = rms(x, eps)
  y = x / r
  return y, (dx - y * jnp.mean(y * dx, axis=-1, keepdims=True)) / r


def normalize(x: jax.Array, op: str, eps: float = 0.0) -> jax.Array:
  """Applies normalization ``op`` over the last axis (no gain)."""
  if op == "none":
    return x
  if op == "rms":
    return rescale(x, eps)
  if op == "detached_rms":
    return x / jax.lax.stop_gradient(rms(x, eps))
  if op == "mean":
    return x - jnp.mean(x, axis=-1, keepdims=True)
  if op == "layer":
    return rescale(x - jnp.mean(x, axis=-1, keepdims=True), eps)
  raise ValueError(f"norm op {op!r} is not allowed; choose one of "
                   "['rms', 'layer', 'mean', 'detached_rms', 'none']")


def _rms_parts(x_D: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
  """``(r, v)`` of the rms Jacobian ``(1/r)(I - v v^T)`` at a single vector ``x_D``."""
  r = rms(x_D, eps)[..., 0]
  return r, x_D / (jnp.sqrt(jnp.asarray(x_D.shape[-1], x_D.dtype)) * r)


def jacobian_left(m_DxK: jax.Array, x_D: jax.Array, op: str, eps: float,
                  scale_D: jax.Array | None = None) -> jax.Array:
  """``J_op(x) @ M`` without forming J_op (J of ``normalize(x, op) * scale``), ``(d, K)``."""
  if op == "none":
    out = m_DxK
  elif op == "detached_rms":
    out = m_DxK / rms(x_D, eps)[..., 0]
  elif op == "mean":
    out = m_DxK - jnp.mean(m_DxK, axis=0, keepdims=True)
  elif op in ("rms", "layer"):
    if op == "layer":
      m_DxK = m_DxK - jnp.mean(m_DxK, axis=0, keepdims=True)
      x_D = x_D - jnp.mean(x_D)
    r, v = _rms_parts(x_D, eps)              # J = (1/r)(I - v v^T)
    out = (m_DxK - v[:, None] * (v @ m_DxK)[None, :]) / r
  else:
    raise ValueError(f"unknown norm op {op!r}")
  return out if scale_D is None else scale_D[:, None] * out


def jacobian_right(m_KxD: jax.Array, x_D: jax.Array, op: str, eps: float,
                   scale_D: jax.Array | None = None) -> jax.Array:
  """``M @ J_op(x)`` without forming J_op, ``(K, d)``."""
  if scale_D is not None:
    m_KxD = m_KxD * scale_D[None, :]
  if op == "none":
    return m_KxD
  if op == "detached_rms":
    return m_KxD / rms(x_D, eps)[..., 0]
  if op == "mean":
    return m_KxD - jnp.mean(m_KxD, axis=1, keepdims=True)
  if op in ("rms", "layer"):
    xc = x_D - jnp.mean(x_D) if op == "layer" else x_D
    r, v = _rms_parts(xc, eps)
    out = (m_KxD - (m_KxD @ v)[:, None] * v[None, :]) / r
    if op == "layer":
      out = out - jnp.mean(out, axis=1, keepdims=True)
    return out
  raise ValueError(f"unknown norm op {op!r}")


def has_gain(op: str) -> bool:
  """Whether a learned gain makes sense for ``op`` (the rescaling operations)."""
  return op in ("rms", "layer", "detached_rms")


class Norm(PlainInit, nn.Module):
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
      scale = self.param("scale", logical(nn.initializers.ones, (NORM,)), (x.shape[-1],),
                         self.param_dtype)
      y = y * scale
    if self.bias and has_gain(self.op):
      y = y + self.param("bias", logical(nn.initializers.zeros, (NORM,)), (x.shape[-1],),
                         self.param_dtype)
    return y.astype(x.dtype)
