"""Gradient transport in Post-Norm Transformers (Post-Norm collapse paper, Sec 3.2-3.3).

Notation of the paper (Eq. 1): per layer ``l`` and sublayer ``k`` (1 = attention,
2 = FFN), ``X_k^l`` is the sublayer input and ``Y_k^l`` the residual sum before the
next RMSNorm. ``rankjax._src.models.transformer.intermediate_grads`` returns both and the
loss gradients with respect to them as ``(L, B, T, d)`` arrays.

* Definition 3.5: the sublayer gradient contribution
  ``alpha_k^l = ||dL/dX_k^l||_F / ||dL/dY_k^l||_F``.
* Sec 3.2 / Theorem 3.6: the RMSNorm Jacobian at a row ``y`` is
  ``sqrt(d)/||y|| (I - y y^T/||y||^2)``; its prefactor ``sqrt(d)/||y||`` is the
  "RMSNorm factor", and the contraction ``c(y, alpha) = alpha sqrt(d)/||y||`` bounds
  ``||dL/dX_k^l||_F <= c ||dL/dX_{k+1}^l||_F`` under exact collapse (App D.1). Off
  exact collapse the bound takes the largest row factor and the norm's learned gain,
  ``contraction_bound`` (App D.1's row sum, Prop D.1); ``contraction`` is the token
  mean, a separately named statistic.
* Sec 4.2 (Figs 3-5): the transition window, where last-layer token similarity and
  the training loss rise sharply; ``detect_transition`` makes it a precise rule.
* Definition 3.7 / Theorem 3.8: a collapsed network's loss is bounded below by the
  frequency loss (``collapsed_loss_lower_bound``); ``collapse_alarm`` flags a run whose
  loss sits at the frequency loss while its last-layer similarity is near 1.

Everything here is a pure function of arrays (``jit``-able) except the two series
functions (``detect_transition``, ``collapse_alarm``), which are numpy functions of
logged series.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.measure.losses import frequency_loss
from rankjax._src.measure.similarity import mean_projection
from rankjax._src.numerics import as_float

Array = jax.Array


def sq_norm(x: Array, axes: tuple[int, ...]) -> Array:
  """Sum of squares over ``axes``, accumulated in ``numerics.float_dtype`` (the
  squared Frobenius norms of this module and of the training diagnostics)."""
  x = as_float(x)
  return jnp.sum(x * x, axis=axes)


def _safe_div(num: Array, den: Array) -> Array:
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def sublayer_grad_contribution(dx_LxBxTxD: Array, dy_LxBxTxD: Array,
                               per_example: bool = False) -> Array:
  """``alpha_k^l = ||dL/dX_k^l||_F / ||dL/dY_k^l||_F`` (paper Def 3.5).

  Args:
    dx_LxBxTxD: loss gradient w.r.t. the sublayer inputs ``X_k^l``, ``(..., B, T, d)``.
    dy_LxBxTxD: loss gradient w.r.t. the residual sums ``Y_k^l``, same shape.
    per_example: False (default) takes the Frobenius norms over the whole batch
      (``B, T, d`` together: the batch as one long token matrix, which is what a
      batch-mean loss backpropagates); True returns one ratio per example
      ``(..., B)``.

  Returns:
    ``(...)`` (e.g. ``(L,)``), or ``(..., B)`` with ``per_example``. A zero
    denominator gives 0.
  """
  axes = (-2, -1) if per_example else (-3, -2, -1)
  return _safe_div(jnp.sqrt(sq_norm(dx_LxBxTxD, axes)), jnp.sqrt(sq_norm(dy_LxBxTxD, axes)))


def rms_factor(y_TxD: Array, eps: Array | float = 0.0) -> Array:
  """Per-token RMSNorm factor ``sqrt(d)/||y_i||`` (Sec 3.2, Thm 3.6), ``(..., T)``.

  It is the spectral norm of the RMSNorm Jacobian at row ``y_i`` (without gain);
  ``eps`` adds RMSNorm's stabilizer: ``1/sqrt(||y||^2/d + eps)``. The library's one
  RMS factor: also the diagonal ``T_ii`` of the Post-Norm paper's App C.5 (Thm C.6,
  ``theory.rms_spread``). A zero row gives 0 at ``eps = 0``; ``eps`` may be traced.
  """
  d = jnp.shape(y_TxD)[-1]
  ms = sq_norm(y_TxD, (-1,)) / d
  if isinstance(eps, (int, float)) and eps == 0:
    return _safe_div(1.0, jnp.sqrt(ms))
  return jax.lax.rsqrt(ms + as_float(eps))


def rms_factor_stats(y_LxBxTxD: Array, eps: float = 0.0) -> tuple[Array, Array]:
  """Mean and standard deviation of ``sqrt(d)/||y||`` over the tokens of a batch.

  Args:
    y_LxBxTxD: residual sums ``Y_k^l`` ``(..., B, T, d)``.

  Returns:
    ``(mean, std)``, each ``(...)`` (e.g. ``(L,)``): the paper reports the factor
    of the (collapsed, identical) rows; we report its mean over the ``B*T`` tokens
    and their spread (Fig 4).
  """
  f = rms_factor(y_LxBxTxD, eps)
  return jnp.mean(f, axis=(-2, -1)), jnp.std(f, axis=(-2, -1))


def contraction(alpha: Array, rms_factor_mean: Array) -> Array:
  """``alpha * mean_i sqrt(d)/||y_i||``: Thm 3.6's ``c(y, alpha) = alpha sqrt(d)/||y||``
  with the token mean of the RMSNorm factor and no gain. Equal to the bound only under
  exact collapse (identical rows, unit gains); a descriptive statistic otherwise, not a
  bound (see ``contraction_bound``)."""
  return jnp.asarray(alpha) * jnp.asarray(rms_factor_mean)


def rms_factor_max(y_LxBxTxD: Array, eps: float = 0.0) -> Array:
  """``max_i sqrt(d)/||y_i||`` over the ``B*T`` rows of a batch, ``(...)`` (e.g. ``(L,)``).

  It is the largest spectral norm of the gain-free RMSNorm Jacobian over the rows
  (with ``eps``: ``1/sqrt(||y_i||^2/d + eps)``, still the exact spectral norm)."""
  return jnp.max(rms_factor(y_LxBxTxD, eps), axis=(-2, -1))


def contraction_bound(alpha: Array, y_LxBxTxD: Array, gain_LxD: Array | None = None,
                      eps: float = 0.0) -> Array:
  """The contraction factor that bounds the backward step (Thm 3.6, App D.1, Prop D.1):

  ``c = alpha * max_j |g_j| * max_i sqrt(d)/||y_i||``, so that
  ``||dL/dX_k||_F <= c ||dL/dX_{k+1}||_F`` for any rows, collapsed or not.

  App D.1 bounds each row by ``||J_RMS(y_i)||_2 ||dL/d(X_{k+1})_i||_2`` and sums the
  squares over rows; without exact collapse the rows differ, so the row factor that
  bounds the sum is its maximum (Prop D.1 bounds that maximum by
  ``c_0 (1 + 2 sqrt(n delta/(1-delta)))`` near collapse). A learned gain ``g``
  multiplies the Jacobian, ``diag(g) J``, whose norm is at most ``max_j |g_j|`` times
  ``J``'s. ``alpha`` is Def 3.5's batch ratio.

  Args:
    alpha: ``(...)`` sublayer gradient contribution (``sublayer_grad_contribution``).
    y_LxBxTxD: the residual sums ``Y_k^l`` that the norm reads.
    gain_LxD: that norm's gains ``(..., d)``, or None for a gain-free norm.
    eps: the norm's stabilizer.
  """
  factor = rms_factor_max(y_LxBxTxD, eps)
  if gain_LxD is not None:
    factor = factor * jnp.max(jnp.abs(jnp.asarray(gain_LxD, jnp.float32)), axis=-1)
  return jnp.asarray(alpha) * factor


def _leaf_name(path: tuple[Any, ...]) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def layer_sq_norms(tree: Any, stacked_roots: Sequence[str] = ("layers",)) -> Array | None:
  """Per-layer sum of squares of every leaf under the stacked roots, ``(L,)``; None
  when ``tree`` has none of them (``layer_grad_norms`` squared, for any tree)."""
  total = None
  for root in stacked_roots:
    if not isinstance(tree, Mapping) or root not in tree:
      continue
    for leaf in jax.tree.leaves(tree[root]):
      sq = sq_norm(leaf, tuple(range(1, jnp.ndim(leaf))))
      total = sq if total is None else total + sq
  return total


def layer_grad_norms(grads: Any, stacked_roots: Sequence[str] = ("layers",)) -> Array:
  """Per-layer Frobenius norm of all parameter gradients of a layer, ``(L,)``.

  ``grads`` is a params-shaped tree whose subtrees under ``stacked_roots`` carry a
  leading layer axis (``nn.scan``); everything of layer ``l`` counts together
  (paper Sec 4.2, Fig 5).
  """
  total = layer_sq_norms(grads, stacked_roots)
  if total is None:
    raise ValueError(f"no stacked root {tuple(stacked_roots)} in the gradient tree")
  return jnp.sqrt(total)


def block_grad_norms(grads: Any, stacked_roots: Sequence[str] = ("layers",)) -> dict[str, Array]:
  """Per-layer gradient norms of each block (first-level submodule) of a layer.

  Returns ``{block: (L,)}``, e.g. ``attn``, ``ffn``, ``norm_attn_r``, ``norm_ffn_r``
  (Post-Norm) for ``DecoderLM``; and ``{name: ()}`` for every unstacked top-level
  entry (``embed``, ``lm_head``, ``norm_final``). The attention and FFN entries are the
  per-sublayer parameter gradients whose vanishing Theorem 3.8 (ii) predicts.
  """
  out: dict[str, Array] = {}
  for name, sub in grads.items():
    stacked = name in stacked_roots
    if stacked and isinstance(sub, Mapping):
      for block, tree in sub.items():
        sq = sum(sq_norm(x, tuple(range(1, jnp.ndim(x)))) for x in jax.tree.leaves(tree))
        out[str(block)] = jnp.sqrt(sq)
    else:
      sq = sum(sq_norm(x, tuple(range(jnp.ndim(x)))) for x in jax.tree.leaves(sub))
      out[str(name)] = jnp.sqrt(sq)
  return out


def collapse_distance(x_NxD: Array) -> Array:
  """``||X - Pi_1 X||_F`` (the epsilon of Thm 3.8 (i)), ``(...)``."""
  x = jnp.asarray(x_NxD)
  return jnp.sqrt(sq_norm(x - mean_projection(x), (-2, -1)))


def collapsed_loss_lower_bound(labels_N: Array, w_lm_DxV: Array, eps: Array) -> Array:
  """Thm 3.8 (i): ``L_freq(y) - 2/sqrt(n) ||W_lm||_2 eps`` for one sequence.

  If the pre-head hidden state satisfies ``||X^H - Pi_1 X^H||_F <= eps``, the mean
  cross-entropy of ``X^H W_lm`` on ``labels_N`` is at least this value (App E.2).
  """
  n = jnp.shape(labels_N)[-1]
  spec = jnp.linalg.norm(jnp.asarray(w_lm_DxV, jnp.float32), ord=2)
  return frequency_loss(labels_N) - 2.0 / jnp.sqrt(n) * spec * eps


# ---------------------------------------------------------------------------
# logged series (numpy)


@dataclasses.dataclass(frozen=True)
class Transition:
  """Result of ``detect_transition``: ``found``; the step (None if not found) and
  its index into the series; the rises that triggered it."""

  found: bool
  step: int | None
  index: int | None
  sim_rise: float
  loss_rise: float


def detect_transition(steps: Sequence[int], last_sim: Sequence[float], loss: Sequence[float],
                      *, sim_rise: float = 0.2, loss_rise: float = 0.1,
                      sim_high: float = 0.9, window: int = 5) -> Transition:
  """The transition step of Sec 4.2: "where last-layer similarity and loss rise sharply".

  Rule (ours; the paper reads it off its plots). Over logged points ``i`` (ordered
  by step), point ``i`` is a transition candidate when all three hold:

  1. similarity rise: ``last_sim[i] - min(last_sim[i-window : i]) >= sim_rise``
     (it rose by ``sim_rise`` within the last ``window`` logged points);
  2. loss rise: ``loss[i] - min(loss[:i]) >= loss_rise * min(loss[:i])`` (the loss
     is at least ``loss_rise`` (relative) above the best loss seen so far);
  3. ``last_sim[i] >= sim_high``.

  The transition is the first candidate; its reported step is that of the logged
  point, so its resolution is the logging interval. Point 0 is never a candidate
  (there is no history), so a run that starts collapsed has no transition.

  Args:
    steps, last_sim, loss: aligned series (the last-layer token similarity and the
      training loss at the same steps).
    sim_rise, loss_rise, sim_high, window: thresholds above.

  Returns:
    ``Transition``; ``found=False`` and ``step=None`` when no point qualifies.
  """
  steps_a = np.asarray(steps)
  sim = np.asarray(last_sim, np.float64)
  lo = np.asarray(loss, np.float64)
  if not (len(steps_a) == len(sim) == len(lo)):
    raise ValueError(f"series lengths differ: {len(steps_a)}, {len(sim)}, {len(lo)}")
  order = np.argsort(steps_a, kind="stable")
  steps_a, sim, lo = steps_a[order], sim[order], lo[order]
  for i in range(1, len(sim)):
    d_sim = sim[i] - np.min(sim[max(0, i - window):i])
    best = np.min(lo[:i])
    d_loss = lo[i] - best
    if d_sim >= sim_rise and d_loss >= loss_rise * abs(best) and sim[i] >= sim_high:
      return Transition(True, int(steps_a[i]), int(order[i]), float(d_sim), float(d_loss))
  return Transition(False, None, None, 0.0, 0.0)


# the collapse alarm's tolerances: the loss within 5% of the frequency loss, the last
# layer's token similarity at least 0.95 (a run "collapsed": the report, stop_on_collapse)
ALARM_REL_TOL = 0.05
ALARM_SIM_MIN = 0.95


def collapse_alarm(loss: Any, freq_loss: Any, last_sim: Any, *,
                   rel_tol: float = ALARM_REL_TOL, sim_min: float = ALARM_SIM_MIN
                   ) -> np.ndarray:
  """The collapse alarm (Sec 4.3, Thm 3.8): loss at the frequency loss, similarity ~1.

  True where ``|loss - freq_loss| <= rel_tol * freq_loss`` and
  ``last_sim >= sim_min``. Elementwise over aligned series (or scalars); use the
  frequency loss of the same label collection as the loss (Def 3.7, "aggregate").
  jax arrays in give a jax bool array (usable inside a jitted diagnostic); anything
  else gives a numpy bool array.
  """
  loss_a, f, s = (jnp.asarray(v) if isinstance(v, jax.Array) else np.asarray(v)
                  for v in (loss, freq_loss, last_sim))
  return (abs(loss_a - f) <= rel_tol * abs(f)) & (s >= sim_min)
