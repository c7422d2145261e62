"""The LM head and its cross-entropy, in the compute dtype with float32 accumulation.

``head_logits`` is ``F(t) = X^H W_lm`` (Post-Norm paper, Thm 3.8) with the padding
columns of a vocabulary rounded up to ``TransformerConfig.kernels.vocab_multiple`` masked to
-inf; ``head_cross_entropy`` is the mean token cross-entropy ``L_CE`` computed from
the head's input, optionally over chunks of tokens so that the B*T*V float32 logits
never exist at once (a fused loss with its own backward).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src import partitioning
from rankjax._src.numerics import float_dtype


@jax.custom_vjp
def _low_precision_matmul(h: jax.Array, w: jax.Array) -> jax.Array:
  """``h @ w`` of a 16-bit ``h`` and ``w`` rounded to ``h``'s dtype, accumulated into
  float32, with a backward pass whose two matmuls also take 16-bit operands (the
  float32 cotangent is rounded to ``h``'s dtype first); jax's own rule would upcast
  both operands to float32. ``w``'s gradient is accumulated in float32 and returned in
  ``w``'s own dtype (float32 for ``matmul.shard_copies``'s copies)."""
  return jnp.matmul(h, w.astype(h.dtype), preferred_element_type=jnp.float32)


def _low_precision_fwd(h, w):
  return _low_precision_matmul(h, w), (h, w)


def _low_precision_bwd(res, g):
  h, w = res
  g = g.astype(h.dtype)
  dh = jnp.matmul(g, w.astype(h.dtype).T, preferred_element_type=jnp.float32).astype(h.dtype)
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
  if jnp.finfo(h.dtype).bits < 32:
    z = _low_precision_matmul(h, w_DxV)
  else:
    z = jnp.matmul(h, w_DxV.astype(h.dtype), preferred_element_type=float_dtype(h.dtype))
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


def _chunk_loss_and_grads(h_CxD, w_DxV, y_C, wt_C, vocab_size, shards: int = 1):
  """One chunk's weighted NLL sum and its gradients with respect to ``h`` and ``W``,
  from one logits matmul: d nll / d z = softmax(z) - onehot(y) (Thm 3.8's
  ``dL_CE/dF``), then dh = dz W^T and dW = h^T dz, both with 16-bit operands under
  mixed precision and float32 accumulation (as ``_low_precision_bwd``). dW comes as
  ``(shards, D, V)``: each batch shard's own partial sum, left unreduced (the caller
  sums the shards once, after every chunk)."""
  h_CxD = partitioning.constrain(h_CxD, ("batch", None))
  y_C, wt_C = (partitioning.constrain(a, ("batch",)) for a in (y_C, wt_C))
  z = head_logits(h_CxD, w_DxV, vocab_size)
  nll = jnp.sum(wt_C * token_nll(z, y_C))
  dz = jax.nn.softmax(z, axis=-1)
  dz = (dz - jax.nn.one_hot(y_C, z.shape[-1], dtype=dz.dtype)) * wt_C[:, None]
  dz = dz.astype(h_CxD.dtype)
  w = w_DxV.astype(h_CxD.dtype)
  dh = jnp.matmul(dz, w.T, preferred_element_type=jnp.float32).astype(h_CxD.dtype)
  c = h_CxD.shape[0]
  dw = jnp.einsum("scd,scv->sdv", h_CxD.reshape(shards, c // shards, -1),
                  dz.reshape(shards, c // shards, -1), preferred_element_type=jnp.float32)
  return nll, dh, partitioning.constrain(dw, ("batch", None, None))


def _strided(a: jax.Array, chunk: int, pad: int) -> jax.Array:
  """(N, ...) -> (N/chunk, chunk, ...) with chunk k = tokens k, k + N/chunk, ...: each
  chunk keeps every batch shard's share of tokens (a contiguous chunk would sit on one
  device, and GSPMD all-reduced its logits)."""
  a = jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1))
  return jnp.swapaxes(a.reshape(chunk, -1, *a.shape[1:]), 0, 1)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunked_nll_mean(h_NxD, w_DxV, labels_N, vocab_size, chunk):
  return _chunked_fwd(h_NxD, w_DxV, labels_N, vocab_size, chunk)[0]


def _chunked_fwd(h_NxD, w_DxV, labels_N, vocab_size, chunk):
  n, acc = h_NxD.shape[0], float_dtype(h_NxD.dtype)
  pad = -n % chunk
  h = partitioning.constrain(_strided(h_NxD, chunk, pad), (None, "batch", None))
  y, wt = _strided(labels_N, chunk, pad), _strided(jnp.ones((n,), acc), chunk, pad)

  # the weight gradient accumulates per batch shard (S partial sums, one per shard,
  # each on its own devices) and is reduced once after the chunks: a (D, V) carry would
  # be all-reduced in every chunk
  shards = partitioning.axis_size("batch")
  shards = shards if chunk % shards == 0 else 1

  def body(dw, xs):
    nll, dh, dw_c = _chunk_loss_and_grads(*xs[:1], w_DxV, *xs[1:], vocab_size, shards)
    return dw + dw_c, (nll, dh)

  dw0 = partitioning.constrain(jnp.zeros((shards, *w_DxV.shape), jnp.float32),
                               ("batch", None, None))
  dw, (nlls, dh) = jax.lax.scan(body, dw0, (h, y, wt))
  dw = jnp.sum(dw, axis=0)
  dh = jnp.swapaxes(dh, 0, 1).reshape(-1, h_NxD.shape[1])[:n]       # back to token order
  return jnp.sum(nlls) / n, (dh, (dw / n).astype(w_DxV.dtype), n, labels_N)


def _chunked_bwd(vocab_size, chunk, res, g):
  dh, dw, n, labels = res
  zero_labels = np.zeros(labels.shape, dtype=jax.dtypes.float0)
  return ((g / n).astype(dh.dtype) * dh, (g * dw.astype(jnp.float32)).astype(dw.dtype),
          zero_labels)


_chunked_nll_mean.defvjp(_chunked_fwd, _chunked_bwd)


def head_cross_entropy(h_NxD: jax.Array, w_DxV: jax.Array, labels_N: jax.Array,
                       vocab_size: int | None = None, chunk: int = 0) -> jax.Array:
  """Mean ``-log softmax(h_n W)[y_n]`` (``L_CE`` of Thm 3.8) from the head's input.

  Equal to ``cross_entropy(head_logits(h, W, vocab_size), labels)``. With ``chunk >
  0`` the N tokens are processed ``chunk`` at a time (``lax.scan``) by a fused
  cross-entropy with its own backward (as levanter's and MaxText's): each chunk's
  logits are computed once, and its gradients with respect to ``h`` and ``W`` are
  formed right there (``_chunk_loss_and_grads``), so at most ``chunk x V`` float32
  logits exist at once, the head's matmul runs 3 times per chunk (autodiff through a
  rematerialized chunk ran it 4), and the weight gradient is reduced once, after the
  chunks. The token count is padded to a multiple of ``chunk`` with zero-weight
  tokens; the chunks are strided (``_strided``) and constrained to the batch axes.
  Differentiable once (a training loss): no higher derivatives through the chunks.

  ``w`` of shape ``(S, D, V)`` is S copies of the head, one per batch shard
  (``matmul.shard_copies``, a tied table): the N tokens are split into S equal blocks,
  block s (shard s's tokens) meets copy s only (``chunk / S`` tokens a chunk), so the
  head's gradient stays a partial sum on each shard, added there to the lookup's, and
  the mean of the blocks' means is the loss.
  """
  if h_NxD.ndim != 2 or labels_N.shape != h_NxD.shape[:1]:
    raise ValueError(f"head_cross_entropy expects h (N, d) and labels (N,); got "
                     f"{h_NxD.shape} and {labels_N.shape}")
  n = h_NxD.shape[0]
  if w_DxV.ndim == 3:
    s = w_DxV.shape[0]
    h_S = partitioning.constrain(h_NxD.reshape(s, n // s, -1), ("batch", None, None))
    y_S = partitioning.constrain(labels_N.reshape(s, n // s), ("batch", None))
    per_shard = max(chunk // s, 1) if chunk > 0 else 0
    with partitioning.activation_sharding(None, {}):     # inside: one shard's tokens
      means = jax.vmap(lambda h, w, y: head_cross_entropy(h, w, y, vocab_size, per_shard))(
          h_S, w_DxV, y_S)
    return jnp.mean(means)
  if chunk <= 0 or chunk >= n:
    weights = jnp.ones((n,), float_dtype(h_NxD.dtype))
    return jnp.sum(weights * token_nll(head_logits(h_NxD, w_DxV, vocab_size), labels_N)) / n
  return _chunked_nll_mean(h_NxD, w_DxV, labels_N, vocab_size, chunk)
