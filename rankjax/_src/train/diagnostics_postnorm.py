"""The Post-Norm collapse diagnostics (paper Sec 4.2-4.3, Figs 3-6, 10-21).

The diagnostic ``"postnorm"`` (LM runs only; needs the capture; listed in
``rankjax._src.train.diagnostics.BUILTIN``). Train with
``--set 'diagnostics=["basic","postnorm"]' --set diag_every=N``; read the series back
with ``rankjax.load_run`` as ``"postnorm/<key>"`` and summarise them with
``summarize_run``. Keys (``L`` = layers; k = 1 attention, k = 2 FFN):

  last_tsim                           ()   token similarity of Y_2 of the last layer,
                                      mean over the diagnostic examples (Def 2.1)

The per-layer token similarities of X_k^l / Y_k^l are one series, ``basic/tsim_x1``
... ``basic/tsim_y2`` (``"basic"``, in the default ``diagnostics``, shares this capture).
  alpha_1, alpha_2                    (L,) ||dL/dX_k^l||_F / ||dL/dY_k^l||_F (Def 3.5)
  rms_factor_mean_k, rms_factor_std_k (L,) sqrt(d)/||y_k^l|| over the tokens (Thm 3.6)
  rms_factor_max_k                    (L,) max over the tokens of sqrt(d)/||y_k^l||
  gain_max_k                          (L,) max_j |g_j| of the norm reading Y_k^l
                                      (Post-Norm; 1 for other placements)
  contraction_1, contraction_2        (L,) the bound's factor alpha_k^l * gain_max_k *
                                      rms_factor_max_k (Thm 3.6 / App D.1 / Prop D.1:
                                      ||dL/dX_k|| <= c ||dL/dX_{k+1}|| for any rows)
  contraction_mean_1, _2              (L,) alpha_k^l * rms_factor_mean_k: the token
                                      mean without gain (a statistic, not a bound)
  grad_norm                           (L,) per-layer parameter-gradient norm (Fig 5)
  grad_norm_<block>                   (L,) per block (attn, ffn, norm_*), and () for
                                      embed / lm_head / norm_final
  loss                                ()   the update's training loss
  loss_examples                       ()   cross-entropy on the diagnostic examples
  freq_loss, freq_loss_per_sequence   ()   frequency loss of the diagnostic examples'
                                      targets, aggregated / per sequence (Def 3.7)
  collapse_alarm                      ()   1.0 when loss_examples is within 5% of
                                      freq_loss and last_tsim >= 0.95

``alpha`` and the activation gradients come from ``Task.capture`` on the diagnostic
examples (their mean loss), not from the update's full batch; parameter-gradient
norms come from the update's gradients.

Also ``"postnorm_sublayer_norms"`` (LM runs; shares the capture), the parts
of alpha that App F.4's masking rule needs ("when the submodule's input and output
gradient norm fall below 1e-10", Figs 12-20), read back as
``"postnorm_sublayer_norms/<key>"``:

  dx_norm_1, dx_norm_2                (L,) ||dL/dX_k^l||_F over the diagnostic batch
                                      (numerator of alpha_k^l, Def 3.5)
  dy_norm_1, dy_norm_2                (L,) ||dL/dY_k^l||_F (its denominator)
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.measure import gradients as gr
from rankjax._src.measure.gradients import ALARM_REL_TOL, ALARM_SIM_MIN
from rankjax._src.measure.losses import cross_entropy, frequency_loss
from rankjax._src.measure.similarity import token_similarity
from rankjax._src.train import diagnostics
from rankjax._src.errors import UserError

Array = jax.Array


def postnorm(d: diagnostics.DiagInputs) -> dict[str, Array]:
  """Sublayer gradient factors, RMSNorm factors, contraction, frequency loss."""
  if d.kind != "transformer" or d.activations is None or d.activation_grads is None:
    raise UserError("the 'postnorm' diagnostic needs a transformer model")
  acts, grads = d.activations, d.activation_grads
  out: dict[str, Array] = {}
  out["last_tsim"] = jnp.mean(token_similarity(acts["y2"][-1]), axis=-1)
  gains = {k: _norm_gain(d, k) for k in (1, 2)}
  out.update(sublayer_factors(acts, grads, float(d.model.cfg.norm_eps), gains))
  out["grad_norm"] = gr.layer_grad_norms(d.grads, d.stacked_roots)
  for name, v in gr.block_grad_norms(d.grads, d.stacked_roots).items():
    out[f"grad_norm_{name}"] = v
  targets = d.batch["targets"]
  logits = d.model.apply({"params": d.params}, d.batch["inputs"])
  out["loss"] = jnp.asarray(d.loss, jnp.float32)
  out["loss_examples"] = cross_entropy(logits, targets)
  vocab = int(d.model.cfg.vocab_size)
  out["freq_loss"] = frequency_loss(targets, "aggregate", vocab_size=vocab)
  out["freq_loss_per_sequence"] = frequency_loss(targets, "per_sequence", vocab_size=vocab)
  out["collapse_alarm"] = gr.collapse_alarm(
      out["loss_examples"], out["freq_loss"], out["last_tsim"], rel_tol=ALARM_REL_TOL,
      sim_min=ALARM_SIM_MIN).astype(jnp.float32)
  return out


def sublayer_factors(acts: dict[str, Array], grads: dict[str, Array], eps: float,
                     gains: dict[int, Array | None]) -> dict[str, Array]:
  """Per layer (L,), k = 1 (attention), 2 (FFN), from X_k, Y_k (L, B, T, d) and their
  gradients: ``alpha_k`` (Def 3.5), the RMS factor sqrt(d)/||y|| of Y_k (mean, std,
  max; Sec 4.2), the gain max, Thm 3.6's contraction bound ``contraction_k`` (with the
  gain of the norm that reads Y_k, ``gains[k]``; None: no such norm) and the token-mean
  factor ``contraction_mean_k``. The training diagnostic and ``rankjax analyze`` both
  use it."""
  out: dict[str, Array] = {}
  for k in (1, 2):
    alpha = gr.sublayer_grad_contribution(grads[f"x{k}"], grads[f"y{k}"])
    mean, std = gr.rms_factor_stats(acts[f"y{k}"], eps)
    gain = gains.get(k)
    out[f"alpha_{k}"] = alpha
    out[f"rms_factor_mean_{k}"] = mean
    out[f"rms_factor_std_{k}"] = std
    out[f"rms_factor_max_{k}"] = gr.rms_factor_max(acts[f"y{k}"], eps)
    out[f"gain_max_{k}"] = (jnp.max(jnp.abs(gain.astype(jnp.float32)), axis=-1)
                            if gain is not None else jnp.ones_like(alpha))
    out[f"contraction_{k}"] = gr.contraction_bound(alpha, acts[f"y{k}"], gain, eps)
    out[f"contraction_mean_{k}"] = gr.contraction(alpha, mean)
  return out


# the norm that reads Y_k^l in a Post-Norm layer (k = 1: before the FFN; k = 2: the
# layer's output norm, whose output is X_1^{l+1})
NORM_AFTER_Y = {1: "norm_attn_r", 2: "norm_ffn_r"}


def _norm_gain(d: diagnostics.DiagInputs, k: int) -> Array | None:
  """The (L, d) gains of the norm that reads ``Y_k`` (Post-Norm), else None: in the
  other placements no norm sits on the skip path and Thm 3.6 does not apply."""
  if d.model.cfg.norm_position != "post":
    return None
  for root in d.stacked_roots:
    scale = d.params.get(root, {}).get(NORM_AFTER_Y[k], {}).get("scale")
    if scale is not None:
      return jnp.asarray(scale)
  return None


SUBLAYER_NORMS = "postnorm_sublayer_norms"


def sublayer_norms(d: diagnostics.DiagInputs) -> dict[str, Array]:
  """||dL/dX_k^l||_F and ||dL/dY_k^l||_F per layer (the parts of Def 3.5's alpha)."""
  if d.kind != "transformer" or d.activation_grads is None:
    raise UserError(f"the {SUBLAYER_NORMS!r} diagnostic needs a transformer model")
  g = d.activation_grads
  return {f"d{s}_norm_{k}": jnp.sqrt(gr.sq_norm(g[f"{s}{k}"], (-3, -2, -1)))
          for k in (1, 2) for s in ("x", "y")}


def summarize_run(diag: dict[str, np.ndarray], steps: np.ndarray, *,
                  stream_freq_loss: float | None = None, **transition_kw: Any) -> dict[str, Any]:
  """The transition and the alarm from a run's saved ``postnorm/*`` series.

  Args:
    diag: ``rankjax.load_run(...).diagnostics``.
    steps: ``load_run(...).diagnostic_steps``.
    stream_freq_loss: the frequency loss of the training stream (many batches); when
      given, the alarm also compares the update's loss with it (``alarm_stream``).
    transition_kw: thresholds of ``rankjax._src.measure.gradients.detect_transition``.

  Returns:
    JSON-able dict: transition step (or None), first alarm step, and the final
    values of loss, frequency loss, last-layer similarity and the first/last
    per-layer gradient-norm ratio.
  """
  sim = np.asarray(diag["postnorm/last_tsim"])
  loss = np.asarray(diag["postnorm/loss"])
  tr = gr.detect_transition(steps, sim, loss, **transition_kw)
  alarm = gr.collapse_alarm(np.asarray(diag["postnorm/loss_examples"]),
                            np.asarray(diag["postnorm/freq_loss"]), sim,
                            rel_tol=ALARM_REL_TOL, sim_min=ALARM_SIM_MIN)
  gn = np.asarray(diag["postnorm/grad_norm"])
  out = {
      "transition_step": tr.step,
      "first_alarm_step": int(steps[np.argmax(alarm)]) if alarm.any() else None,
      "final_step": int(steps[-1]),
      "final_loss": float(loss[-1]),
      "final_loss_examples": float(diag["postnorm/loss_examples"][-1]),
      "final_freq_loss_examples": float(diag["postnorm/freq_loss"][-1]),
      "final_last_tsim": float(sim[-1]),
      "final_grad_ratio_first_over_last": float(gn[-1, 0] / max(gn[-1, -1], 1e-30)),
  }
  if stream_freq_loss is not None:
    s_alarm = gr.collapse_alarm(loss, stream_freq_loss, sim, rel_tol=ALARM_REL_TOL,
                                sim_min=ALARM_SIM_MIN)
    out["stream_freq_loss"] = float(stream_freq_loss)
    out["first_alarm_step_stream"] = int(steps[np.argmax(s_alarm)]) if s_alarm.any() else None
  return out
