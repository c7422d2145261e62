"""The LM head and its cross-entropy, in the compute dtype with float32 accumulation.

``head_logits`` is ``F(t) = X^H W_lm`` (Post-Norm paper, Thm 3.8) with the padding
columns of a vocabulary rounded up to ``TransformerConfig.vocab_multiple`` masked to
-inf; ``head_cross_entropy`` is the mean token cross-entropy ``L_CE`` computed from
the head's input, optionally over chunks of tokens so that the B*T*V float32 logits
never exist at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankjax import partitioning
from rankjax.numerics import float_dtype


@jax.custom_vjp
def _low_precision_matmul(h: jax.Array, w: jax.Array) -> jax.Array:
  """``h @ w`` of 16-bit operands accumulated into float32, with a backward pass whose
  two matmuls also take 16-bit operands (the float32 cotangent is rounded to ``h``'s
  dtype first); jax's own rule would upcast both operands to float32."""
  return jnp.matmul(h, w, preferred_element_type=jnp.float32)


def _low_precision_fwd(h, w):
  return _low_precision_matmul(h, w), (h, w)


def _low_precision_bwd(res, g):
  h, w = res
  g = g.astype(h.dtype)
  dh = jnp.matmul(g, w.T, preferred_element_type=jnp.float32).astype(h.dtype)
  dw = jnp.einsum("...d,...v->dv", h, g, preferred_element_type=jnp.float32).astype(w.dtype)
  return dh, dw


_low_precision_matmul.defvjp(_low_precision_fwd, _low_precision_bwd)


def head_logits(h: jax.Array, w_DxV: jax.Array, vocab_size: int | None = None) -> jax.Array:
  """LM-head logits ``h W`` (Post-Norm paper Thm 3.8: ``F(t) = X^H W_lm``).

  The matmul takes ``h``'s dtype for both operands (bfloat16 under mixed precision)
  and accumulates into at least float32; under a 16-bit dtype its backward matmuls
  are 16-bit too (``_low_precision_matmul``). Columns from ``vocab_size`` on (the
  padding of ``W``) are -inf, so softmax, log-sum-exp and cross-entropy see exactly
  the ``vocab_size`` real classes.
  """
  w_DxV = w_DxV.astype(h.dtype)
  if jnp.finfo(h.dtype).bits < 32:
    z = _low_precision_matmul(h, w_DxV)
  else:
    z = jnp.matmul(h, w_DxV, preferred_element_type=float_dtype(h.dtype))
  v = z.shape[-1] if vocab_size is None else vocab_size
  if v < z.shape[-1]:
    z = jnp.where(jnp.arange(z.shape[-1]) < v, z, -jnp.inf)
  return z


def token_nll(z: jax.Array, labels: jax.Array) -> jax.Array:
  """``-log softmax(z)[y] = logsumexp(z) - z_y`` per token (the terms of Thm 3.8's
  ``L_CE``), ``z`` of shape ``(..., V)``, ``labels`` ``z.shape[:-1]``: the one
  cross-entropy formula (``head_cross_entropy`` and ``measure.losses.cross_entropy``)."""
  z_y = jnp.take_along_axis(z, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return jax.nn.logsumexp(z, axis=-1) - z_y


def head_cross_entropy(h_NxD: jax.Array, w_DxV: jax.Array, labels_N: jax.Array,
                       vocab_size: int | None = None, chunk: int = 0) -> jax.Array:
  """Mean ``-log softmax(h_n W)[y_n]`` (``L_CE`` of Thm 3.8) from the head's input.

  Equal to ``cross_entropy(head_logits(h, W, vocab_size), labels)``. With ``chunk >
  0`` the N tokens are processed ``chunk`` at a time (``lax.map``) and each chunk is
  rematerialized in the backward pass, so at most ``chunk x V`` float32 logits exist
  at once instead of ``N x V``; the token count is padded to a multiple of ``chunk``
  with zero-weight tokens. The chunks are strided (chunk k holds tokens k, k + N/chunk,
  k + 2N/chunk, ...), so under the training step's batch sharding every chunk holds
  each device's share of tokens and stays sharded (``partitioning.constrain``): a
  contiguous chunk lives on one device, and GSPMD all-reduced its logits.
  """
  if h_NxD.ndim != 2 or labels_N.shape != h_NxD.shape[:1]:
    raise ValueError(f"head_cross_entropy expects h (N, d) and labels (N,); got "
                     f"{h_NxD.shape} and {labels_N.shape}")

  def nll_sum(h_CxD, y_C, w_C):
    h_CxD = partitioning.constrain(h_CxD, ("batch", None))
    y_C, w_C = (partitioning.constrain(a, ("batch",)) for a in (y_C, w_C))
    return jnp.sum(w_C * token_nll(head_logits(h_CxD, w_DxV, vocab_size), y_C))

  n = h_NxD.shape[0]
  acc = float_dtype(h_NxD.dtype)
  if chunk <= 0 or chunk >= n:
    return nll_sum(h_NxD, labels_N, jnp.ones((n,), acc)) / n
  pad = -n % chunk
  strided = lambda a: jnp.swapaxes(jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1))
                                   .reshape(chunk, -1, *a.shape[1:]), 0, 1)
  h, y, wt = strided(h_NxD), strided(labels_N), strided(jnp.ones((n,), acc))
  h = partitioning.constrain(h, (None, "batch", None))
  sums = jax.lax.map(lambda a: jax.checkpoint(nll_sum)(*a), (h, y, wt))
  return jnp.sum(sums) / n
