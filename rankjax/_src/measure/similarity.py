"""Token similarity and the prefix-average matrix (Post-Norm collapse paper, Sec 2-3).

Token similarity (Def 2.1, "Why Post-Norm Transformers Collapse") is the fraction of
the squared Frobenius norm of a token matrix ``X`` (``n`` tokens by ``d`` features)
that lies in its shared component, the mean row:

    t_sim(X) = ||Pi_1 X||_F^2 / ||X||_F^2,   Pi_1 = (1/n) 1_n 1_n^T.

``Pi_1 X`` repeats the mean row ``n`` times, so ``||Pi_1 X||_F^2 = n ||mean_i X_i||^2``.
``t_sim = 1`` iff every row is the same; ``t_sim = 0`` iff the rows sum to zero; rows
that are orthogonal with equal norms give ``1/n``.

The prefix-average matrix ``C_n`` (Sec 3.1, Eq. (3), Assumption C.2) is causal
attention with uniform weights over each prefix: ``(C_n)_ij = 1/i`` for ``i >= j``
(1-indexed) and 0 above the diagonal; it is defined with the attention that uses it
(``rankjax._src.models.attention.prefix_average_matrix``) and re-exported here.

``cosine`` and ``cosine_matrix`` are the library's cosines (of rows, of flattened
Jacobians). All functions are pure ``jnp`` functions of arrays, batched over leading axes and
safe under ``jax.jit`` / ``jax.vmap``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from rankjax._src.measure import precision as precision_lib
from rankjax._src.models.attention import prefix_average_matrix  # noqa: F401 (re-export)
from rankjax._src.numerics import as_float

Array = jax.Array


@jax.jit
def token_similarity(x_NxD: Array) -> Array:
  """Token similarity ``t_sim(X) = ||Pi_1 X||_F^2 / ||X||_F^2`` (paper Def 2.1).

  Args:
    x_NxD: array of shape ``(..., n, d)``; the token axis is ``-2``, features ``-1``.

  Returns:
    Array of shape ``(...)`` with values in ``[0, 1]``, accumulated in at least
    float32. The zero matrix has numerator 0 and is given similarity 0 (the ratio
    is undefined there); the gradient stays finite.
  """
  x = as_float(x_NxD)
  n = x.shape[-2]
  mean_D = jnp.mean(x, axis=-2)
  num = n * jnp.sum(mean_D * mean_D, axis=-1)              # ||Pi_1 X||_F^2
  den = jnp.sum(x * x, axis=(-2, -1))                      # ||X||_F^2
  safe_den = jnp.where(den > 0, den, 1.0)
  return jnp.where(den > 0, num / safe_den, 0.0)


def cosine(a: Array, b: Array) -> Array:
  """Cosine similarity ``<a, b> / (||a|| ||b||)`` over the last axis."""
  num = jnp.sum(a * b, axis=-1)
  return num / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1))


@precision_lib.measured
def cosine_matrix(m_LxD: Array) -> Array:
  """All-pairs cosines ``cos(m_l, m_l')`` of the rows, ``(..., L, L)`` (Transforming
  Rank Fig 14 for branch means, Fig 12a for flattened block Jacobians)."""
  unit = m_LxD / jnp.linalg.norm(m_LxD, axis=-1, keepdims=True)
  return unit @ jnp.swapaxes(unit, -1, -2)


def mean_projection(x_NxD: Array) -> Array:
  """``Pi_1 X``: every row replaced by the mean row (paper Sec 2). ``(..., n, d)``."""
  x = jnp.asarray(x_NxD)
  return jnp.broadcast_to(jnp.mean(x, axis=-2, keepdims=True), x.shape)


def batch_mean_token_similarity(x_BxNxD: Array,
                                batch_axis: int | None = -3) -> Array:
  """Token similarity of each sequence, averaged over the batch axis.

  This is the per-layer quantity the paper plots (Sec 4.1, Fig 1-2; "last-layer
  token-similarity mean", Fig 3b): ``t_sim`` is computed for every sequence
  separately, then averaged over the batch (mean of ratios, not ratio of means).

  Args:
    x_BxNxD: captured intermediates, e.g. ``(L, B, n, d)`` for ``L`` layers or
      ``(L, 2, B, n, d)`` for per-sublayer captures; tokens at ``-2``, features
      at ``-1``.
    batch_axis: the axis to average over (default ``-3``: ``(..., B, n, d)``).
      ``None`` averages over nothing.

  Returns:
    The input's shape without the last two axes and without ``batch_axis``, e.g.
    ``(L,)`` for ``(L, B, n, d)``.
  """
  t = token_similarity(x_BxNxD)
  if batch_axis is None:
    return t
  ndim = t.ndim + 2
  if not (-ndim <= batch_axis <= -3 or 0 <= batch_axis < ndim - 2):
    raise ValueError(
        f"batch_axis={batch_axis} is not a batch axis of an array of shape "
        f"{jnp.shape(x_BxNxD)} (tokens at -2, features at -1)")
  return jnp.mean(t, axis=batch_axis + 2 if batch_axis < 0 else batch_axis)


def similarity_by_name(captured: Mapping[str, Any], batch_axis: int | None = -3,
                       names: Iterable[str] | None = None) -> dict[str, Any]:
  """Batch-averaged token similarity of every captured array in a (nested) mapping.

  Works on the ``intermediates`` collection a Flax ``sow`` produces (leaves are
  tuples of arrays), e.g. ``DecoderLM``'s ``{"layers": {"x1": (x_LxBxTxD,), ...}}``,
  or on a flat ``{name: x_LxBxNxD}`` dict. Each kept leaf maps to
  ``batch_mean_token_similarity(leaf, batch_axis)``, e.g. ``(L,)``.

  Args:
    captured: mapping (possibly nested, possibly with tuple leaves) of arrays of
      shape ``(..., B, n, d)``.
    batch_axis: see :func:`batch_mean_token_similarity`.
    names: keep only entries whose key is in ``names`` (at any depth), e.g.
      ``("x1", "y1", "x2", "y2")``; other sown arrays such as attention
      probabilities are not token matrices. ``None`` keeps every array with at
      least three axes.

  Returns:
    Mapping of the same structure; dropped entries and emptied sub-mappings are
    removed.
  """
  keep = None if names is None else set(names)

  def visit(node: Any, key: str | None) -> Any:
    if isinstance(node, Mapping):
      out = {k: visit(v, k) for k, v in node.items()}
      out = {k: v for k, v in out.items() if v is not None}
      return out or None
    if keep is not None and key not in keep:
      return None
    if isinstance(node, (tuple, list)):
      out = [visit(v, key) for v in node]
      out = [v for v in out if v is not None]
      return type(node)(out) if out else None
    if hasattr(node, "ndim") and node.ndim >= 3:
      return batch_mean_token_similarity(node, batch_axis)
    return None
  result = visit(captured, None)
  return result if result is not None else {}
