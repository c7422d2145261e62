"""Cross-entropy and the frequency loss of a collapsed network (Post-Norm paper, Sec 3.3).

Definition 3.7 ("Why Post-Norm Transformers Collapse"): for target labels
``y in [v]^n`` with counts ``c_i``, the frequency distribution is
``p_freq(y) = c / n`` and the frequency loss is its entropy
``L_freq(y) = H(p_freq(y)) = -sum_i p_i log p_i``. Theorem 3.8 / App E.1: a network
whose output distribution is the same at every position (exact rank collapse)
attains at best ``L_freq``, reached by predicting ``p_freq`` everywhere.

Several sequences (Sec 4.3): "aggregate" pools the labels of all sequences into one
collection and takes the entropy of the pooled histogram (the paper's choice for
Fig 6); "per_sequence" computes each sequence's own frequency loss and averages
them. The pooled entropy is never smaller (concavity of entropy).

Natural logarithms throughout (nats), as in the paper's cross-entropy.
"""
from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp

from rankjax._src.models.lm_head import token_nll
from rankjax._src.numerics import float_dtype

Array = jax.Array
FrequencyMode = Literal["aggregate", "per_sequence"]


@jax.jit
def cross_entropy(logits: Array, labels: Array, mask: Array | None = None) -> Array:
  """Mean token cross-entropy ``-(1/N) sum_t log softmax(z_t)[y_t]`` (Thm 3.8, ``L_CE``).

  Args:
    logits: ``(..., V)`` unnormalized scores (any float dtype; accumulated in at
      least float32 via a max-shifted log-sum-exp, so large logits do not
      overflow). Entries of ``-inf`` (impossible classes) are allowed as long as
      the label's own logit is finite.
    labels: integer array ``logits.shape[:-1]``.
    mask: optional weights broadcastable to ``labels.shape`` (1 = count the
      token, 0 = ignore it). The result is ``sum(mask * nll) / sum(mask)``, and 0
      when the mask is all zero.

  Returns:
    Scalar mean negative log-likelihood in nats.
  """
  z = jnp.asarray(logits)
  z = z.astype(float_dtype(z))
  labels = jnp.asarray(labels)
  nll = token_nll(z, labels)
  if mask is None:
    return jnp.mean(nll)
  w = jnp.broadcast_to(jnp.asarray(mask).astype(nll.dtype), nll.shape)
  total = jnp.sum(w)
  num = jnp.sum(jnp.where(w != 0, w * nll, 0.0))
  return jnp.where(total > 0, num / jnp.where(total > 0, total, 1.0), 0.0)


@jax.jit
def _entropy_of_labels(labels_N: Array) -> Array:
  """Entropy of the histogram of a 1-D label array, without a vocabulary size.

  ``H = log N - (1/N) sum_i c_i log c_i`` and ``sum_i c_i log c_i = sum_j log c_{y_j}``
  (each label ``i`` occurs ``c_i`` times), with ``c_{y_j}`` found by binary search
  in the sorted labels. Jit-able; ``O(N log N)``.
  """
  srt = jnp.sort(labels_N)
  counts = (jnp.searchsorted(srt, srt, side="right")
            - jnp.searchsorted(srt, srt, side="left")).astype(jnp.result_type(float))
  n = labels_N.shape[0]
  return jnp.mean(jnp.log(n / counts))       # every term >= 0, exactly 0 for one label


@jax.jit
def _entropy_of_counts(counts_V: Array) -> Array:
  """``-sum_i p_i log p_i`` with ``p = c / sum(c)`` and ``0 log 0 = 0``."""
  total = jnp.sum(counts_V, axis=-1, keepdims=True)
  p = counts_V / total
  return jnp.sum(jax.scipy.special.entr(p), axis=-1)


@functools.partial(jax.jit, static_argnames=("vocab_size", "mode"))
def label_counts(labels: Array, vocab_size: int,
                 mode: FrequencyMode = "aggregate") -> Array:
  """Label histogram ``c_i = sum_j [y_j = i]`` (Def 3.7).

  ``mode="aggregate"``: counts over every label in the array, shape ``(V,)``.
  ``mode="per_sequence"``: one histogram per sequence (last axis), shape
  ``labels.shape[:-1] + (V,)``. Labels outside ``[0, V)`` are dropped. Counts are
  int32 (exact up to 2^31 labels).
  """
  labels = jnp.asarray(labels).astype(jnp.int32)

  def hist(y_N: Array) -> Array:
    # segment_sum drops indices outside [0, V); memory O(N + V), not O(N V).
    return jax.ops.segment_sum(jnp.ones(y_N.shape, jnp.int32), y_N,
                               num_segments=vocab_size)
  if mode == "aggregate":
    return hist(labels.reshape(-1))
  if mode == "per_sequence":
    flat = labels.reshape(-1, labels.shape[-1])
    return jax.vmap(hist)(flat).reshape(labels.shape[:-1] + (vocab_size,))
  raise ValueError(f"mode must be 'aggregate' or 'per_sequence', got {mode!r}")


@functools.partial(jax.jit, static_argnames=("mode", "vocab_size"))
def frequency_loss(labels: Array, mode: FrequencyMode = "aggregate",
                   vocab_size: int | None = None) -> Array:
  """Frequency loss ``L_freq = H(p_freq(y))``, the entropy of the label histogram (Def 3.7).

  Args:
    labels: integer labels ``(..., n)``; the last axis is the sequence.
    mode: ``"aggregate"`` pools all labels into one histogram (Sec 4.3, the
      paper's reference for Fig 6); ``"per_sequence"`` averages the frequency
      loss of each sequence (last axis) over the leading axes. For a 1-D array
      both are the same.
    vocab_size: optional; when given, counts are taken with a ``(V,)``
      histogram (labels outside ``[0, V)`` are dropped); when ``None``, the
      entropy is computed by sorting, which needs no vocabulary size. Both are
      jit-able and give the same value.

  Returns:
    Scalar frequency loss in nats (float32, or float64 under x64).
  """
  labels = jnp.asarray(labels)
  if labels.ndim == 0:
    raise ValueError("labels must have at least one axis (the sequence)")
  dtype = jnp.result_type(float)
  if mode not in ("aggregate", "per_sequence"):
    raise ValueError(f"mode must be 'aggregate' or 'per_sequence', got {mode!r}")
  if vocab_size is not None:
    counts = label_counts(labels, vocab_size, mode).astype(dtype)
    return jnp.mean(_entropy_of_counts(counts))
  if mode == "aggregate":
    return _entropy_of_labels(labels.reshape(-1))
  flat = labels.reshape(-1, labels.shape[-1])
  return jnp.mean(jax.vmap(_entropy_of_labels)(flat))


@functools.partial(jax.jit, static_argnames=("vocab_size", "mode"))
def frequency_logits(labels: Array, vocab_size: int,
                     mode: FrequencyMode = "aggregate") -> Array:
  """Log frequencies ``log p_freq(y)`` (Def 3.7), the collapsed-optimal logits (Thm 3.8).

  Using these logits at every position gives ``cross_entropy == frequency_loss``
  (App E.1). Labels that never occur get ``-inf`` (probability 0); a network with
  finite logits can only approach them (remark after Thm 3.8).

  Returns:
    ``(V,)`` for ``mode="aggregate"``; ``labels.shape[:-1] + (V,)`` for
    ``mode="per_sequence"`` (broadcast against ``(..., n, V)`` with
    ``[..., None, :]``).
  """
  counts = label_counts(labels, vocab_size, mode).astype(jnp.result_type(float))
  p = counts / jnp.sum(counts, axis=-1, keepdims=True)
  return jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf)
