"""Figures 3-5 (and 10-21 at quick scale) of the Post-Norm collapse paper: the
backward diagnostics across the transition window of a collapsing Post-Norm run.

From the ``postnorm`` diagnostics of a run (read back by ``rankjax.train.load_run``):

  Fig 3: (a) training loss, (b) last-layer token similarity, (c) alpha_1^l and
         (d) alpha_2^l (Def 3.5) over the whole run;
  Fig 4: sqrt(d)/||y_k^l|| and c(y_k^l, alpha_k^l) (Thm 3.6) in the transition window;
  Fig 5: per-layer parameter-gradient norms at the logged steps of the window.

The transition step is ``rankjax.measure.detect_transition`` on the
logged (last-layer similarity, loss) series. ``run`` analyses, by default, the run
that first learns and then collapses, as the paper's (``HEADLINE_RUN`` =
``seed_lr_runs.HEADLINE_RUN``: ``configs/collapse_post_quick.json`` at LR 1.5e-2 after
20 linear warmup updates, constant after, seed 0, 120 updates, diagnostics at every
update, so Fig 5's window [t-4, t+6] has one row per update), and as the secondary
runs the immediate collapse without warmup (``collapse_study``'s ``post_collapse``,
LR 1e-2, onset at update ~5, and its per-update twin ``post_collapse_window``),
training whatever is missing.

``run_dir`` analyses any finished run directory instead (no training), e.g. the
non-collapsed control ``post_stable`` (Figs 21-22: ``<out>/collapse/runs/post_stable``) or
the Fig 6 warmup run ``post_warmup_lr0.015``; ``tag`` names its outputs,
``mask_threshold=1e-10`` applies App F.4's masking (needs the ``postnorm_sublayer_norms``
diagnostic of ``rankjax train``) and ``grad_window=(4, 6)`` plots the
per-layer gradient norms over the 11 updates [t-4, t+6] around the transition t (the
paper's Fig 5 window 2640-2650 around 2644) instead of the +-30-update window.

``CLAIMS``: the transition and its backward-side signatures (``transition_spec``, shared
with Figs 10-11 and 12-20), on the preregistered 60-update runs at every seed, the
120-update run beside them, and the paper's run at paper / tiny (the policy: ``common``).

Run:  rankjax reproduce postnorm_collapse --only fig3_fig5
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import numpy as np

from . import common
from . import collapse_study
from . import seed_lr_runs
from . import paper_runs
from .common import ALPHA_PAPER_MAX, GRAD_COLLAPSE_RATIO, ONSET_SIM
from rankjax import measure, studies
from rankjax.studies import Bound, Claim, claims, measured

WINDOW = 30   # steps on each side of the transition for Figs 4-5
MASK_THRESHOLD = 1e-10   # App F.4: alpha and c masked below this gradient norm
GRAD_WINDOW = (4, 6)     # Fig 5: steps 2640-2650 around the transition ~2644
SUBLAYER_NORMS = "postnorm_sublayer_norms"
MASK_SWEEP = (1e-10, 1e-8, 1e-6, 1e-4, 1e-3)   # thresholds for the alpha-max sensitivity
VANISHED_REL = 1e-4   # ||dL/dY_k^l|| below this x its run median: a vanished gradient
SENSITIVITY_SIM_RISE = (0.1, 0.2, 0.3)    # detect_transition's sim_rise (default 0.2)
SENSITIVITY_LOSS_RISE = (0.05, 0.1, 0.2)  # and loss_rise (default 0.1)


def mask_vanishing(values_SxL: np.ndarray, dx_norm_SxL: np.ndarray, dy_norm_SxL: np.ndarray,
                   threshold: float = MASK_THRESHOLD, rule: str = "both") -> np.ndarray:
  """App F.4's masking rule: NaN where the sublayer's gradients have vanished.

  The paper masks alpha_k^l and c(y_k^l, alpha_k^l) "when the submodule's input and
  output gradient norm fall below 1e-10" (Figs 12-20). ``rule="both"`` (default, the
  literal reading) masks where ||dL/dX_k^l|| < threshold and ||dL/dY_k^l|| <
  threshold; ``rule="either"`` where at least one is.

  Args:
    values_SxL: alpha_k or c_k, (logged steps, layers).
    dx_norm_SxL, dy_norm_SxL: ||dL/dX_k^l||_F and ||dL/dY_k^l||_F, same shape.
    threshold: the norm below which a gradient counts as vanished.
    rule: "both" or "either".

  Returns:
    float64 copy of ``values_SxL`` with NaN at the masked entries.
  """
  if rule not in ("both", "either"):
    raise ValueError(f"rule must be 'both' or 'either', got {rule!r}")
  small_x = np.asarray(dx_norm_SxL) < threshold
  small_y = np.asarray(dy_norm_SxL) < threshold
  masked = (small_x & small_y) if rule == "both" else (small_x | small_y)
  out = np.array(values_SxL, np.float64)
  out[masked] = np.nan
  return out


def contraction_bound_check(d: dict[str, np.ndarray], norms: dict[str, np.ndarray]
                            ) -> dict[str, float]:
  """How often the measured one-step ratio ``||dL/dX_k|| / ||dL/dX_{k+1}||`` exceeds the
  logged factor: Thm 3.6's bound ``contraction_k`` (never, up to float error) and the
  token mean ``contraction_mean_k`` (it is no bound). ``X_3^l = X_1^{l+1}``: for k = 2
  the last layer has no next input and is left out. Fractions of (step, layer) entries
  whose ratio is defined (nonzero denominator) and whose factor is below 1."""
  out = {}
  dx1, dx2 = norms["dx_norm_1"], norms["dx_norm_2"]
  ratios = {1: (dx1, dx2), 2: (dx2[:, :-1], dx1[:, 1:])}
  for k, (num, den) in ratios.items():
    ok = den > MASK_THRESHOLD
    ratio = np.where(ok, num / np.where(ok, den, 1.0), np.nan)
    for key in (f"contraction_{k}", f"contraction_mean_{k}"):
      if key not in d:
        continue
      c = d[key][:, :ratio.shape[1]]
      below = ok & np.isfinite(c) & (c < 1)
      out[f"{key}_below1_but_ratio_above1"] = (float(np.mean(ratio[below] > 1))
                                               if below.any() else None)
      valid = ok & np.isfinite(c)
      out[f"{key}_ratio_exceeds_c"] = (float(np.mean(ratio[valid] > c[valid] * (1 + 1e-4)))
                                       if valid.any() else None)
  return out


def collapse_onset(last_sim_S: np.ndarray, threshold: float = ONSET_SIM) -> int | None:
  """Index of the first logged point from which the last-layer similarity stays >=
  ``threshold`` to the end of the run (the collapse onset); None if it does not end
  there. A transient near-collapse that recovers (e.g. update 8 of the LR 3e-2 warmup
  run) is not the onset."""
  return first_sustained(np.asarray(last_sim_S) >= threshold)


def first_sustained(cond_S: np.ndarray) -> int | None:
  """Index of the first point from which ``cond_S`` holds to the end; None if it does
  not hold at the last point."""
  cond_S = np.asarray(cond_S, bool)
  if not len(cond_S) or not cond_S[-1]:
    return None
  off = np.flatnonzero(~cond_S)
  return int(off[-1] + 1) if len(off) else 0


def gradient_window(steps_S: np.ndarray, centre: int, before: int = GRAD_WINDOW[0],
                    after: int = GRAD_WINDOW[1]) -> np.ndarray:
  """Boolean mask of the logged steps in [centre - before, centre + after] (Fig 5's
  ~10-update window; the paper's 2640-2650 around the transition ~2644)."""
  steps_S = np.asarray(steps_S)
  return (steps_S >= centre - before) & (steps_S <= centre + after)


def alpha_peak(alpha_SxL: np.ndarray, steps_S: np.ndarray, *, neighbours: int = 1,
               paper_max: float = ALPHA_PAPER_MAX) -> dict[str, Any]:
  """Where alpha_k^l peaks, and whether one layer or one update drives the peak.

  Args:
    alpha_SxL: alpha_k (logged steps, layers); NaN (masked) entries are ignored.
    steps_S: the logged steps.
    neighbours: logged points on each side used for the same-layer comparison.
    paper_max: the paper's bound (Sec 4.2: alpha stays below 2.5).

  Returns:
    ``max``, ``step``, ``layer`` (1-based); ``same_layer_neighbour_max`` (the peak
    layer's largest value at the ``neighbours`` logged points on each side) and
    ``spike_ratio`` = max / that (>> 1: a one-update spike); ``other_layers_max_same_step``
    and ``second_layer`` / ``second_layer_max`` (the largest value of any other
    layer over the run: close to ``max`` means the peak is not one layer's);
    ``entries_above_paper_max`` and ``layers_above_paper_max`` (count of layers with
    any value above ``paper_max``); ``steps_above_paper_max`` (logged steps where any
    layer is above it).
  """
  a = np.asarray(alpha_SxL, np.float64)
  steps_S = np.asarray(steps_S)
  if not np.isfinite(a).any():
    return {"max": None}
  i, l = np.unravel_index(np.nanargmax(a), a.shape)
  nb = np.r_[a[max(0, i - neighbours):i, l], a[i + 1:i + 1 + neighbours, l]]
  nb_max = float(np.nanmax(nb)) if np.isfinite(nb).any() else float("nan")
  others = np.delete(a, l, axis=1)
  per_layer_max = np.nanmax(np.where(np.isfinite(others), others, -np.inf), axis=0)
  j = int(np.argmax(per_layer_max))
  second_layer = j + (1 if j >= l else 0) + 1
  above = np.nan_to_num(a, nan=-np.inf) > paper_max
  return {
      "max": float(a[i, l]), "step": int(steps_S[i]), "layer": int(l) + 1,
      "same_layer_neighbour_max": nb_max,
      "spike_ratio": float(a[i, l] / nb_max) if nb_max > 0 else None,
      "other_layers_max_same_step": float(np.nanmax(np.delete(a[i], l)))
      if np.isfinite(np.delete(a[i], l)).any() else None,
      "second_layer": int(second_layer), "second_layer_max": float(per_layer_max[j]),
      "entries_above_paper_max": int(above.sum()),
      "layers_above_paper_max": int(above.any(axis=0).sum()),
      "steps_above_paper_max": [int(x) for x in steps_S[above.any(axis=1)]],
  }


def _layers_to_show(num_layers: int) -> list[int]:
  """0-based indices: the paper's 1, 5, 10, ..., L pattern scaled to the depth."""
  step = max(num_layers // 6, 1)
  return sorted({0, *range(step - 1, num_layers, step), num_layers - 1})


def load_diagnostics(workdir: str
                     ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray], Any]:
  """(steps, postnorm series, sublayer-norm series or {}, run) of a run directory."""
  from rankjax.train import load_run
  r = load_run(workdir)
  d = {k.split("/", 1)[1]: np.asarray(v) for k, v in r.diagnostics.items()
       if k.startswith("postnorm/")}
  norms = {k.split("/", 1)[1]: np.asarray(v) for k, v in r.diagnostics.items()
           if k.startswith(SUBLAYER_NORMS + "/")}
  return np.asarray(r.diagnostic_steps), d, norms, r


def _finite_max(x: np.ndarray) -> float | None:
  """Max over the finite (unmasked) entries; None when there are none."""
  x = np.asarray(x, np.float64)
  return float(np.max(x[np.isfinite(x)])) if np.isfinite(x).any() else None


def _finite_mean(x: np.ndarray, where: np.ndarray) -> float | None:
  """Mean of ``x`` over the entries where ``where`` is finite (unmasked); None if none."""
  ok = np.isfinite(np.asarray(where, np.float64))
  return float(np.mean(np.asarray(x, np.float64)[ok])) if ok.any() else None


def _grad_window_stats(gn_SxL: np.ndarray, steps_S: np.ndarray, centre: int,
                       grad_window: tuple[int, int], prefix: str) -> dict[str, Any]:
  """First/last-layer gradient norms at the ends of ``gradient_window`` (Fig 5)."""
  w = np.flatnonzero(gradient_window(steps_S, centre, *grad_window))
  if not len(w):
    return {}
  a, b = w[0], w[-1]
  return {f"{prefix}_steps": [int(steps_S[a]), int(steps_S[b])],
          f"{prefix}_layer1": [float(gn_SxL[a, 0]), float(gn_SxL[b, 0])],
          f"{prefix}_last_layer": [float(gn_SxL[a, -1]), float(gn_SxL[b, -1])],
          f"{prefix}_layer1_drop": float(gn_SxL[a, 0] / max(gn_SxL[b, 0], 1e-30)),
          f"{prefix}_last_layer_drop": float(gn_SxL[a, -1] / max(gn_SxL[b, -1], 1e-30)),
          f"{prefix}_first_over_last": [float(gn_SxL[a, 0] / gn_SxL[a, -1]),
                                        float(gn_SxL[b, 0] / gn_SxL[b, -1])]}


def analyze(workdir: str, mask_threshold: float | None = None,
            grad_window: tuple[int, int] | None = None) -> dict[str, Any]:
  """The Figs 3-5 numbers of one run (Figs 10-11 / 12-20 / 21-22 for other runs).

  Args:
    workdir: a finished run with the ``postnorm`` diagnostic.
    mask_threshold: App F.4's masking of alpha and c (``mask_vanishing``, rule
      "both") before any statistic; needs the ``postnorm_sublayer_norms`` diagnostic.
      None: no masking (Figs 3-5, 10-11, 21-22 in the paper are unmasked).
    grad_window: (before, after) updates around the transition for the Fig 5-style
      per-layer gradient-norm window (``gradient_window``); None: +-``WINDOW``.
  """
  steps, d, norms, r = load_diagnostics(workdir)
  tr = measure.detect_transition(steps, d["last_tsim"], d["loss"])
  L = d["alpha_1"].shape[1]
  out: dict[str, Any] = {"workdir": workdir, "num_layers": L, "steps_logged": len(steps),
                         "log_interval": int(np.median(np.diff(steps))) if len(steps) > 1
                         else None,
                         "transition_step": tr.step, "transition_found": tr.found,
                         "learning_rate": r.config.learning_rate,
                         "warmup_steps": r.config.warmup_steps, "seed": r.config.seed}
  for k in (1, 2):
    if norms:
      # the fraction of (step, layer) entries whose gradients vanished (App F.4)
      small_x = norms[f"dx_norm_{k}"] < MASK_THRESHOLD
      small_y = norms[f"dy_norm_{k}"] < MASK_THRESHOLD
      out[f"frac_vanished_{k}"] = float((small_x & small_y).mean())
      out[f"frac_vanished_either_{k}"] = float((small_x | small_y).mean())
      out[f"min_dy_norm_{k}"] = float(norms[f"dy_norm_{k}"].min())
    if mask_threshold is not None:
      if not norms:
        raise ValueError(f"{workdir}: masking needs the {SUBLAYER_NORMS!r} diagnostic")
      for key in (f"alpha_{k}", f"contraction_{k}", f"contraction_mean_{k}"):
        if key not in d:    # contraction_mean_k: runs logged after the bound's fix
          continue
        d[key] = mask_vanishing(d[key], norms[f"dx_norm_{k}"], norms[f"dy_norm_{k}"],
                                mask_threshold)
  out["mask_threshold"] = mask_threshold
  if norms:
    out.update(contraction_bound_check(d, norms))
  high = np.flatnonzero(d["last_tsim"] >= ONSET_SIM)
  out["first_high_sim_step"] = int(steps[high[0]]) if len(high) else None
  onset = collapse_onset(d["last_tsim"])
  out["onset_step"] = int(steps[onset]) if onset is not None else None
  if not tr.found and onset is not None and onset > 0:
    # no loss rise (the run collapsed while the loss was still falling from ln V):
    # centre the window on the collapse onset instead, and say so
    tr = measure.Transition(True, int(steps[onset]), int(onset), 0.0, 0.0)
    out["window_centre"] = ("onset (first logged step from which last-layer t_sim stays "
                            ">= 0.99)")
  else:
    out["window_centre"] = "detect_transition"
  loss = d["loss"]
  out["min_loss"] = float(loss.min())
  out["min_loss_step"] = int(steps[np.argmin(loss)])
  out["final_loss"] = float(loss[-1])
  out["final_freq_loss_batch"] = float(d["freq_loss"][-1])
  out["final_last_tsim"] = float(d["last_tsim"][-1])
  out["final_grad_first_over_last"] = float(d["grad_norm"][-1, 0] / d["grad_norm"][-1, -1])
  # the update from which the layer-1 gradient stays GRAD_COLLAPSE_RATIO below the last
  # layer's (Fig 5's early-layer vanishing, as one step)
  g = first_sustained(d["grad_norm"][:, 0] < GRAD_COLLAPSE_RATIO * d["grad_norm"][:, -1])
  out["grad_collapse_step"] = int(steps[g]) if g is not None else None
  out["alpha_max"] = _finite_max(np.concatenate([d["alpha_1"], d["alpha_2"]], axis=1))
  out["alpha_1_layer1_max"] = _finite_max(d["alpha_1"][:, 0])
  for k in (1, 2):
    out[f"alpha_{k}_peak"] = alpha_peak(d[f"alpha_{k}"], steps)
    if norms and out[f"alpha_{k}_peak"]["max"] is not None:
      i_, l_ = out[f"alpha_{k}_peak"]["step"], out[f"alpha_{k}_peak"]["layer"] - 1
      i_ = int(np.searchsorted(steps, i_))
      out[f"alpha_{k}_peak"]["dx_norm"] = float(norms[f"dx_norm_{k}"][i_, l_])
      out[f"alpha_{k}_peak"]["dy_norm"] = float(norms[f"dy_norm_{k}"][i_, l_])
      out[f"alpha_{k}_max_masked_either"] = _finite_max(mask_vanishing(
          d[f"alpha_{k}"], norms[f"dx_norm_{k}"], norms[f"dy_norm_{k}"], MASK_THRESHOLD,
          rule="either"))
      # how the maximum depends on the masking threshold (App F.4 uses 1e-10)
      out[f"alpha_{k}_max_vs_mask"] = {
          f"{t:g}": _finite_max(mask_vanishing(d[f"alpha_{k}"], norms[f"dx_norm_{k}"],
                                               norms[f"dy_norm_{k}"], t))
          for t in MASK_SWEEP}
  if norms:
    # alpha is a ratio of gradient norms; where the sublayer's output gradient has
    # vanished (below VANISHED_REL x its median over the run's (update, layer) entries)
    # the ratio is of two near-zero numbers: its maximum without those entries
    vals = []
    for k in (1, 2):
      dy = norms[f"dy_norm_{k}"]
      keep = dy >= VANISHED_REL * np.median(dy)
      vals.append(np.where(keep, d[f"alpha_{k}"], np.nan))
      out[f"frac_vanished_rel_{k}"] = float(1.0 - keep.mean())
    out["alpha_max_excluding_vanished"] = _finite_max(np.concatenate(vals, axis=1))
  # the transition detector's thresholds: found or not on a 3 x 3 grid around the default
  out["transition_sensitivity"] = {
      f"sim_rise={a:g},loss_rise={b:g}": measure.detect_transition(
          steps, d["last_tsim"], d["loss"], sim_rise=a, loss_rise=b).found
      for a in SENSITIVITY_SIM_RISE for b in SENSITIVITY_LOSS_RISE}
  if tr.found:
    i = int(np.searchsorted(steps, tr.step))
    pre = (steps >= tr.step - WINDOW) & (steps < tr.step)
    post = (steps > tr.step) & (steps <= tr.step + WINDOW)
    if not pre.any():
      pre = steps < tr.step
    for k in (1, 2):
      c = d[f"contraction_{k}"]
      out[f"alpha_{k}_max_pre"] = _finite_max(d[f"alpha_{k}"][pre])
      out[f"alpha_{k}_max_post"] = _finite_max(d[f"alpha_{k}"][post])
      out[f"rms_factor_{k}_pre_mean"] = float(d[f"rms_factor_mean_{k}"][pre].mean())
      out[f"rms_factor_{k}_post_mean"] = float(d[f"rms_factor_mean_{k}"][post].mean())
      out[f"contraction_{k}_frac_below1_pre"] = _finite_mean(c[pre] < 1, c[pre])
      out[f"contraction_{k}_frac_below1_post"] = _finite_mean(c[post] < 1, c[post])
      out[f"contraction_{k}_layer1_post_mean"] = _finite_mean(c[post, 0], c[post, 0])
      if f"contraction_mean_{k}" in d:   # the token-mean statistic, named apart
        cm = d[f"contraction_mean_{k}"]
        out[f"contraction_mean_{k}_frac_below1_post"] = _finite_mean(cm[post] < 1, cm[post])
    gn = d["grad_norm"]
    out["grad_first_over_last_before"] = float(gn[i - 1, 0] / gn[i - 1, -1])
    out["grad_first_over_last_after"] = float(gn[post, 0].mean() / gn[post, -1].mean())
    out["grad_first_layer_drop"] = float(gn[i - 1, 0] / max(gn[post, 0].mean(), 1e-30))
    out["grad_last_layer_drop"] = float(gn[i - 1, -1] / max(gn[post, -1].mean(), 1e-30))
    if grad_window is not None:
      out.update(_grad_window_stats(gn, steps, tr.step, grad_window, "grad_window"))
  if grad_window is not None and out["onset_step"] is not None:
    # the same window centred on the collapse onset (t_sim >= 0.99), which can come
    # several updates after the detected transition
    out.update(_grad_window_stats(d["grad_norm"], steps, out["onset_step"], grad_window,
                                  "grad_window_onset"))
  out["_series"] = (steps, d, tr)
  return out


def plot(a: dict[str, Any], out_dir: str, tag: str,
         names: tuple[str, str, str] = ("fig3", "fig4", "fig5"),
         grad_window: tuple[int, int] | None = None) -> list[str]:
  """Writes the three figures of one run: ``<names[i]>_<tag>.png``.

  names: file prefixes for the Fig 3 (alpha over the run), Fig 4 (sqrt(d)/||y|| and c
  in the window) and Fig 5 (per-layer gradient norms) panels, e.g. ("fig12", "fig13",
  "fig14") for the LR ablation. grad_window: as in ``analyze``.
  """
  os.makedirs(out_dir, exist_ok=True)
  plt = common.pyplot()
  steps, d, tr = a["_series"]
  L = a["num_layers"]
  show = _layers_to_show(L)
  files = []
  masked = a.get("mask_threshold") is not None
  mask_note = f", alpha/c masked where grad norms < {a['mask_threshold']:g}" if masked else ""

  def vline(ax, shade=False):
    if tr.found:
      ax.axvline(tr.step, color="k", ls="--", lw=0.8)
      if shade:   # the paper's pre/post-transition windows (Figs 4, 11)
        ax.axvspan(max(tr.step - WINDOW, steps[0]), tr.step, color="tab:blue", alpha=0.07)
        ax.axvspan(tr.step, min(tr.step + WINDOW, steps[-1]), color="gray", alpha=0.12)

  fig, ax = plt.subplots(2, 2, figsize=(11, 7))
  ax[0, 0].plot(steps, d["loss"], label="loss")
  ax[0, 0].plot(steps, d["freq_loss"], ":", label="batch frequency loss")
  ax[0, 0].legend(fontsize=7)
  ax[0, 0].set(title="(a) training loss", xlabel="step")
  ax[0, 1].plot(steps, d["last_tsim"])
  ax[0, 1].set(title="(b) last-layer token similarity", xlabel="step")
  for j, k in ((0, 1), (1, 2)):
    for l in show:
      ax[1, j].plot(steps, d[f"alpha_{k}"][:, l], lw=0.9, label=f"layer {l + 1}")
    ax[1, j].set(title=f"({'cd'[j]}) alpha_{k}^l ({'attention' if k == 1 else 'FFN'})",
                 xlabel="step")
  ax[1, 0].legend(fontsize=6)
  for x in ax.flat:
    vline(x)
  fig.suptitle(f"{names[0]} ({tag}){mask_note}", fontsize=9)
  fig.tight_layout()
  files.append(os.path.join(out_dir, f"{names[0]}_{tag}.png"))
  studies.save_figure(fig, files[-1], dpi=110)
  plt.close(fig)

  if tr.found:
    win = (steps >= tr.step - WINDOW) & (steps <= tr.step + WINDOW)
  else:
    win = np.ones_like(steps, bool)
  fig, ax = plt.subplots(2, 2, figsize=(11, 7))
  for j, k in ((0, 1), (1, 2)):
    for l in show:
      ax[0, j].plot(steps[win], d[f"rms_factor_mean_{k}"][win, l], lw=0.9, label=f"layer {l + 1}")
      # the paper's c(y, alpha) = alpha sqrt(d)/||y|| (Thm 3.6; token mean of the factor,
      # no gains) beside its sqrt(d)/||y||; the stricter Prop D.1 bound dotted
      cm = d.get(f"contraction_mean_{k}", d[f"contraction_{k}"])
      line, = ax[1, j].plot(steps[win], cm[win, l], lw=0.9, label=f"layer {l + 1}")
      ax[1, j].plot(steps[win], d[f"contraction_{k}"][win, l], ":", lw=0.7,
                    color=line.get_color())
    ax[0, j].set(title=f"sqrt(d)/||y_{k}^l||", yscale="log", xlabel="step")
    ax[1, j].set(title=f"c(y_{k}^l, alpha_{k}^l) = alpha sqrt(d)/||y|| (dotted: bound, "
                 "max row x gain)", yscale="log", xlabel="step")
    ax[1, j].axhline(1.0, color="gray", lw=0.5)
  ax[0, 0].legend(fontsize=6)
  for x in ax.flat:
    vline(x, shade=True)
  fig.suptitle(f"{names[1]} ({tag}): transition window{mask_note}", fontsize=9)
  fig.tight_layout()
  files.append(os.path.join(out_dir, f"{names[1]}_{tag}.png"))
  studies.save_figure(fig, files[-1], dpi=110)
  plt.close(fig)

  if grad_window is not None and tr.found:
    gwin = gradient_window(steps, tr.step, *grad_window)
  else:
    gwin = win
  fig, ax = plt.subplots(figsize=(6, 4))
  idx = np.flatnonzero(gwin)
  cmap = plt.get_cmap("viridis")
  for n_, i in enumerate(idx):
    ax.semilogy(np.arange(1, L + 1), d["grad_norm"][i], color=cmap(n_ / max(len(idx) - 1, 1)),
                lw=0.9, label=f"step {steps[i]}" if n_ in (0, len(idx) - 1) else None)
  ax.set(xlabel="layer", ylabel="parameter-gradient norm",
         title=f"{names[2]} ({tag}): per-layer gradient norms, steps "
               f"{steps[idx[0]]}-{steps[idx[-1]]}")
  ax.title.set_fontsize(8)
  ax.legend(fontsize=7)
  fig.tight_layout()
  files.append(os.path.join(out_dir, f"{names[2]}_{tag}.png"))
  studies.save_figure(fig, files[-1], dpi=110)
  plt.close(fig)
  return files


def transition_table(a: dict[str, Any], centre_key: str = "transition_step",
                     window: tuple[int, int] = GRAD_WINDOW) -> list[dict[str, float]]:
  """Per logged update in [t - window[0], t + window[1]] around ``a[centre_key]``: loss,
  last-layer t_sim and ||g_1|| / ||g_L|| (Fig 5's window, one row per update when the
  run logs every update); [] when there is no such step."""
  steps, d, _ = a["_series"]
  t = a.get(centre_key)
  if t is None:
    return []
  gn = d["grad_norm"]
  return [{"step": int(steps[i]), "loss": float(d["loss"][i]),
           "last_tsim": float(d["last_tsim"][i]),
           "grad_first_over_last": float(gn[i, 0] / gn[i, -1])}
          for i in np.flatnonzero(gradient_window(steps, t, *window))]


def _train(name: str, out_dir: str) -> str:
  if name in seed_lr_runs.RUNS:
    return seed_lr_runs.train(name, out_dir)
  return collapse_study.train_run(name, out_dir)


def _analyze_run(name: str, out_dir: str, files: list[str],
                 grad_window: tuple[int, int] | None) -> dict[str, Any]:
  a = analyze(_train(name, out_dir), grad_window=grad_window)
  files += plot(a, out_dir, name, grad_window=grad_window)
  a["transition_table"] = transition_table(a)
  a["onset_table"] = transition_table(a, "onset_step")
  a.pop("_series")
  return a


# the default run of Figs 3-5: the warmup run that learns, then collapses (LR 1.5e-2
# after 20 linear warmup updates, seed 0, 120 updates, diagnostics at every update)
HEADLINE_RUN = seed_lr_runs.HEADLINE_RUN
SECONDARY_RUNS = ("post_collapse", "post_collapse_window")   # no warmup: collapse at update ~5
# the scales and the runs each analyses (paper / tiny: paper_runs.post_collapse at its seeds)
# quick_seeds8: the 60-update runs at seeds 0-7, the single-seed runs as quick's
SCALES: dict[str, dict[str, Any]] = {
    **{sc: {"run": HEADLINE_RUN, "secondary": list(SECONDARY_RUNS),
            "preregistered": [seed_lr_runs.warmup_run_name(seed_lr_runs.MAIN_WARMUP_LR, s)
                              for s in seed_lr_runs.warmup_seeds(sc)]}
       for sc in ("quick", collapse_study.SEEDS8_SCALE)},
    "paper": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.SEEDS)},
    "tiny": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.TINY_SEEDS)},
}


# ---------------------------------------------------------------- the claims
# (item suffix, quantity, paper, rule, paper's words, function of one analysis): the
# transition's claims, shared with Figs 10-11 and 12-20 (``transition_claims``)
def transition_spec(every_seed: bool = True):
  e = every_seed
  ratio = lambda a, k: (common.num(a.get(f"rms_factor_{k}_post_mean"))
                        / common.num(a.get(f"rms_factor_{k}_pre_mean")))
  return [
      ("a transition", "transition detected (1) or not (0)", 1.0, Bound(">=", e),
       "Sec 4.2: learns, then loss and last-layer t_sim rise (detect_transition)",
       lambda a: 1.0 if a.get("transition_found") else 0.0),
      ("alpha stays below 2.5", "max of alpha_k^l over updates, layers, k = 1, 2",
       ALPHA_PAPER_MAX, Bound("<", e), "Sec 4.2: the contribution factor stays below 2.5",
       lambda a: common.num(a.get("alpha_max"))),
      ("sqrt(d)/||y_1|| drops", "attention sqrt(d)/||y_1|| (layer mean), 30 updates after /"
       " before the transition", 1.0, Bound("<", e), "Sec 4.2, Fig 4(a): drops sharply",
       lambda a: ratio(a, 1)),
      ("sqrt(d)/||y_2|| drops", "FFN sqrt(d)/||y_2|| (layer mean), after / before", 1.0,
       Bound("<", e), "Fig 4(c): drops sharply", lambda a: ratio(a, 2)),
      ("most attention c < 1 after", "share of (update, layer) with the paper's c_1 = "
       "alpha_1 x mean_i sqrt(d)/||y_i|| < 1, 30 updates after the transition", 0.5,
       Bound(">"), "Fig 4(b): most curves cross below 1; c as Thm 3.6 writes it, "
       "alpha sqrt(d)/||y|| (the token mean of sqrt(d)/||y_i||: the rows differ before "
       "exact collapse)",
       lambda a: common.num(a.get("contraction_mean_1_frac_below1_post"))),
      ("most FFN c < 1 after", "share of (update, layer) with the paper's c_2 < 1 after",
       0.5, Bound(">"), "Fig 4(d): most curves cross below 1; c = alpha sqrt(d)/||y||",
       lambda a: common.num(a.get("contraction_mean_2_frac_below1_post"))),
      (STRICT_1, "share of (update, layer) with our stricter bound c_1 (Prop D.1's, every "
       "row's factor) < 1, 30 updates after the transition", 0.5, Bound(">"),
       "ours, beside the paper's c: the bound that holds before exact collapse",
       lambda a: common.num(a.get("contraction_1_frac_below1_post"))),
      (STRICT_2, "share of (update, layer) with our stricter bound c_2 < 1 after", 0.5,
       Bound(">"), "ours, beside the paper's c",
       lambda a: common.num(a.get("contraction_2_frac_below1_post"))),
      ("attention layer-1 c the exception", "attention layer-1 bound c_1, mean after the "
       "transition", 1.0, Bound(">"), "Sec 4.2: attention layer 1 does not show the drop",
       lambda a: common.num(a.get("contraction_1_layer1_post_mean"))),
      ("layer-1 gradient drops by orders", "log10 of the layer-1 gradient norm drop "
       "factor over [t-4, t+6]", math.log10(common.ORDERS), Bound(">="), "Fig 5: early "
       "layers decrease by orders of magnitude in the window",
       lambda a: common.log10(a.get("grad_window_layer1_drop"))),
      ("last-layer gradient changes much less", "log10 of the last-layer gradient norm "
       "drop factor over [t-4, t+6]", math.log10(common.MUCH_LESS), Bound("<"),
       "Fig 5: later layers change much less",
       lambda a: common.log10(a.get("grad_window_last_layer_drop"))),
  ]


STRICT_1 = "most attention c < 1 after, our stricter bound"
STRICT_2 = "most FFN c < 1 after, our stricter bound"
# each transition claim: the panel it tests and the paper's words (common.QUOTES); the
# thresholds the paper does not print are ours (Bound limit): "a transition" (an
# indicator), "drops" (a ratio below 1), "most" (1/2), "orders of magnitude" (100),
# "much less" (10); 2.5 and c's 1 are the paper's
SPEC_WORDS = {
    "a transition": ("Fig 3", ("transition", "collapses_8e4"), True),
    "alpha stays below 2.5": ("Fig 3", ("alpha",), False),
    "sqrt(d)/||y_1|| drops": ("Fig 4", ("rms_drop",), True),
    "sqrt(d)/||y_2|| drops": ("Fig 4", ("rms_drop",), True),
    "most attention c < 1 after": ("Fig 4", ("c_below",), True),
    "most FFN c < 1 after": ("Fig 4", ("c_below",), True),
    STRICT_1: ("Fig 4", ("c_below",), True),
    STRICT_2: ("Fig 4", ("c_below",), True),
    "attention layer-1 c the exception": ("Fig 4", ("c_layer1",), False),
    "layer-1 gradient drops by orders": ("Fig 5", ("grad_orders",), True),
    "last-layer gradient changes much less": ("Fig 5", ("grad_orders",), True),
}


def spec_words(suffix: str, where: str | None = None, lead: str = "") -> dict[str, Any]:
  """The where / quote / kind of a transition claim by its suffix (``where`` replaces the
  panel for the other runs' figures; ``lead``: a quote key put before the claim's)."""
  panel, keys, ours = SPEC_WORDS[suffix]
  quote = " ... ".join(common.QUOTES[k] for k in ((lead,) if lead else ()) + keys)
  return {"where": where or panel, "quote": quote, "ours": ours,
          "kind": "sensitivity" if suffix in (STRICT_1, STRICT_2) else "experiment"}


def transition_claims(prefix: str, every_seed: bool = True, where: str | None = None,
                      lead: str = "") -> list[Claim]:
  """The claims of ``transition_spec``, their items ``"<prefix>: <suffix>"``, with the
  paper's words (:func:`spec_words`)."""
  out = []
  for s, q, p, r, w, _ in transition_spec(every_seed):
    f = spec_words(s, where, lead)
    ours = f.pop("ours")
    c = Claim(f"{prefix}: {s}", q, p, r, w, **f)
    out.append(common.ours_limit(c) if ours else c)
  return out


def transition_measured(prefix: str, analyses: dict[str, dict], note: str,
                        only: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
  """The values of ``transition_claims(prefix)`` (those whose suffix is in ``only``), one
  per seed: ``analyses`` maps each seed to its run's :func:`analyze`."""
  seeds = [int(s) for s in analyses]
  rows = []
  for s, *_, fn in transition_spec():
    if only is not None and s not in only:
      continue
    rows.append(measured(f"{prefix}: {s}", [fn(a) for a in analyses.values()],
                         seeds=seeds, note=note))
  return rows


F35 = "Figs 3-5, warmup LR 1.5e-2, 60 updates"
F35_LONG = "Figs 3-5, the same run for 120 updates"
# (Prop D.1's bound, ||dL/dX_1|| / ||dL/dX_2|| <= c, is no row: alpha comes from the same
# gradients, so it holds for any network by the chain rule; the results keep the share
# of entries above it, contraction_*_ratio_exceeds_c, and a unit test checks it)
_VANISH = {"where": "Fig 5", "quote": common.QUOTES["grad_left"]}
F35_EXTRA = [
    common.ours_limit(Claim(
        f"{F35}: early layers vanish after the transition", "||g_1|| / ||g_L|| at the "
        "last update (60)", GRAD_COLLAPSE_RATIO, Bound("<", every_seed=True),
        "Sec 4.2: little gradient is left in earlier layers after the transition; 'little' "
        "= below 1/100 of the last layer's (ours)", **_VANISH)),
    common.ours_limit(Claim(
        f"{F35_LONG}: early layers vanish after the transition", "||g_1|| / ||g_L|| at "
        "the last update (120), seed 0", GRAD_COLLAPSE_RATIO, Bound("<"), "Sec 4.2",
        kind="sensitivity", post_hoc="run extended 60 -> 120 updates after the 60-update "
        "run showed no early-layer vanishing (issue 25 item 5); the 60-update row is the "
        "headline", **_VANISH)),
    Claim(f"{F35_LONG}: alpha stays below 2.5", "max of alpha_k^l over the 120 updates, "
          "seed 0", ALPHA_PAPER_MAX, Bound("<"), "Sec 4.2", where="Fig 3",
          quote=common.QUOTES["alpha"], kind="sensitivity",
          post_hoc="the 120-update run was added after the 60-update outcome (issue 25 "
          "item 5); the 60-update row is the headline"),
    common.ours_limit(Claim(
        f"{F35}, window on the onset: layer-1 gradient drops by orders", "log10 of the "
        "layer-1 gradient drop factor over [onset-4, onset+6]", math.log10(common.ORDERS),
        Bound(">="), "Fig 5", where="Fig 5", quote=common.QUOTES["grad_orders"],
        kind="sensitivity", post_hoc="window centred on the collapse onset after the "
        "planned [t-4, t+6] one failed (issue 25 item 5); the planned window is the "
        "headline")),
]
# alpha without the ratios of vanished gradients (VANISHED_REL), and the transition
# detector's sensitivity (the paper's c is the headline of "most c < 1": transition_spec)
F35_ITEM6 = [
    Claim(f"{F35}: alpha stays below 2.5, vanished gradients excluded", "max of alpha_k^l "
          "over the entries whose ||dL/dY_k^l|| >= 1e-4 x its run median", ALPHA_PAPER_MAX,
          Bound("<", every_seed=True), "Sec 4.2; a ratio of two vanished norms excluded "
          "(App F.4 masks below 1e-10 for its plots)", where="Fig 3",
          quote=common.QUOTES["alpha"], kind="sensitivity"),
    common.ours_limit(Claim(
        f"{F35}: a transition under every detector setting", "share of the 9 settings "
        "(sim_rise 0.1/0.2/0.3 x loss_rise 5/10/20%) that find a transition", 1.0,
        Bound(">=", every_seed=True), "Sec 4.2's transition; our detector's thresholds",
        where="Fig 3", quote=common.QUOTES["transition"], kind="sensitivity")),
]
# --scale paper / tiny: the paper's run (paper_runs.post_collapse at its seeds), the same
# claims without the quick-only extended run; the onset-window claim keeps its note
F35_PAPER = "Figs 3-5, Post-Norm LR 8e-4 (the paper's run)"
F35_PAPER_EXTRA = [dataclasses.replace(c, item=c.item.replace(F35, F35_PAPER),
                                       quantity=c.quantity.replace(" (60)", ""))
                   for c in (F35_EXTRA[0], F35_EXTRA[3], *F35_ITEM6)]
CLAIMS = claims(transition_claims(F35) + F35_EXTRA + F35_ITEM6
                + transition_claims(F35_PAPER) + F35_PAPER_EXTRA)


def _sensitivity(a: dict[str, Any]) -> float:
  found = list((a.get("transition_sensitivity") or {}).values())
  return float(sum(found)) / len(found) if found else math.nan


def _paper_measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  pre = res["ours"]["preregistered"]
  seeds = [int(s) for s in pre]
  note = (f"seeds {seeds}; {res['scale']} scale: the paper's schedule (2000 warmup, cosine "
          "to 40000) shrunk by rankjax.studies.at_scale at tiny; diagnostics every update")
  rows = transition_measured(F35_PAPER, pre, note)
  fns = (lambda a: common.num(a["final_grad_first_over_last"]),
         lambda a: common.log10(a.get("grad_window_onset_layer1_drop")),
         lambda a: common.num(a.get("alpha_max_excluding_vanished")), _sensitivity)
  return rows + [measured(c.item, [fn(a) for a in pre.values()], seeds=seeds, note=note)
                 for c, fn in zip(F35_PAPER_EXTRA, fns)]


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: the values of ``CLAIMS`` (the preregistered 60-update runs
  at every seed and the 120-update run at quick; the paper's run at paper / tiny)."""
  if res.get("scale", "quick") in ("paper", "tiny"):
    return _paper_measurements(res)
  o = res["ours"]
  pre = o.get("preregistered_60", {})
  seeds = [int(s) for s in pre]
  note = (f"seeds {seeds}; 20 linear warmup updates then constant; diagnostics every "
          "update; unmasked (as the paper's Figs 3-5)")
  rows = transition_measured(F35, pre, note)
  vals = lambda fn: [fn(a) for a in pre.values()]
  rows += [measured(F35_EXTRA[0].item,
                    vals(lambda a: common.num(a["final_grad_first_over_last"])),
                    seeds=seeds, note=note)]
  rows += [measured(F35_EXTRA[1].item, common.num(o.get("final_grad_first_over_last")),
                    note=f"run {res.get('run')}"),
           measured(F35_EXTRA[2].item, common.num(o.get("alpha_max")),
                    note=f"run {res.get('run')}")]
  rows += [measured(F35_EXTRA[3].item, vals(
      lambda a: common.log10(a.get("grad_window_onset_layer1_drop"))), seeds=seeds, note=note)]
  item6 = (lambda a: common.num(a.get("alpha_max_excluding_vanished")), _sensitivity)
  rows += [measured(c.item, vals(fn), seeds=seeds, note=note)
           for c, fn in zip(F35_ITEM6, item6)]
  return rows


# ---------------------------------------------------------------- the runs
def same_trajectory(workdir_a: str, workdir_b: str) -> dict[str, Any]:
  """Max |loss difference| at the diagnostic steps two runs share (training must not
  depend on the diagnostics interval)."""
  sa, da, _, _ = load_diagnostics(workdir_a)
  sb, db, _, _ = load_diagnostics(workdir_b)
  common_steps, ia, ib = np.intersect1d(sa, sb, return_indices=True)
  diff = np.abs(da["loss"][ia] - db["loss"][ib])
  return {"steps": [int(s) for s in common_steps], "max_abs_loss_diff": float(diff.max()),
          "max_abs_alpha_2_diff": float(np.abs(da["alpha_2"][ia] - db["alpha_2"][ib]).max())}


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Trains (or reuses) ``HEADLINE_RUN`` and writes ``fig3_fig5_<run>.json`` and the PNGs;
  it also analyses the immediate-collapse runs ``SECONDARY_RUNS`` (``ours["secondary"]``)
  and the preregistered 60-update runs (``ours["preregistered_60"]``). Paper / tiny: the
  paper's collapsing run at every seed (:func:`run_paper`). quick_seeds8: the 60-update
  runs at seeds 0-7 (``seed_lr_runs.warmup_seeds``); the 120-update run and the
  immediate-collapse runs are single-seed by design, quick's; the result file is
  ``fig3_fig5_<run>_quick_seeds8.json``."""
  if scale in ("paper", "tiny"):
    return run_paper(out_dir, scale)
  if scale not in SCALES:
    raise ValueError(f"fig3_fig5 has the scales {list(SCALES)}, not {scale!r}")
  start = time.time()
  run_name = HEADLINE_RUN
  files: list[str] = []
  per_update = "_diag1" in run_name or run_name.endswith("_window")
  a = _analyze_run(run_name, out_dir, files, GRAD_WINDOW if per_update else None)
  a["secondary"] = {n: _analyze_run(n, out_dir, files, GRAD_WINDOW if n.endswith("_window")
                                    else None) for n in SECONDARY_RUNS}
  # the preregistered protocol: the same setting at its planned 60
  # updates, at seeds warmup_seeds(scale); the headline rows read these, the 120-update run
  # (extended after the 60-update run showed no early-layer vanishing) stands beside
  a["preregistered_60"] = {
      str(seed): _analyze_run(seed_lr_runs.warmup_run_name(seed_lr_runs.MAIN_WARMUP_LR,
                                                           seed), out_dir, files, GRAD_WINDOW)
      for seed in seed_lr_runs.warmup_seeds(scale)}
  # its first 60 updates are the seed-0 60-update run's
  a["same_trajectory_as_60_update_run"] = same_trajectory(
      os.path.join(out_dir, "runs", run_name), os.path.join(
          out_dir, "runs", seed_lr_runs.warmup_run_name(seed_lr_runs.MAIN_WARMUP_LR, 0)))
  result = {
      "figure": "postnorm_collapse Figs 3-5 (Sec 4.2), 10-22 at quick scale",
      "scale": scale, "run": run_name,
      "paper": {"transition_step": 2644, "alpha": "stays below 2.5",
                "c": "most layers cross below 1 shortly after the transition; attention "
                     "layer 1 is an exception",
                "grads": "early-layer gradients drop by orders of magnitude in steps "
                         "2640-2650; later layers change much less"},
      "ours": a, "files": files, "seconds": time.time() - start,
  }
  common.write_json(out_dir, f"fig3_fig5_{run_name}"
                    + ("" if scale == "quick" else f"_{scale}") + ".json", result)
  result["measured"] = measurements(result)
  return result


def run_paper(out_dir: str, scale: str) -> dict[str, Any]:
  """Figs 3-5 of the paper's collapsing run (Post-Norm at 8e-4, ``paper_runs``) at each
  of its seeds, diagnostics at every update; ``ours["preregistered"][seed]``."""
  start = time.time()
  files: list[str] = []
  pre = {}
  for seed in paper_runs.seeds(scale):
    name = paper_runs.post_collapse(seed)
    paper_runs.train(out_dir, name, scale)
    a = analyze(studies.workdir(out_dir, name), grad_window=GRAD_WINDOW)
    files += plot(a, out_dir, name, grad_window=GRAD_WINDOW)
    a["transition_table"] = transition_table(a)
    a["onset_table"] = transition_table(a, "onset_step")
    a.pop("_series")
    pre[str(seed)] = a
  result = {
      "figure": f"postnorm_collapse Figs 3-5 (Sec 4.2), {scale} scale",
      "scale": scale, "run": paper_runs.post_collapse(0),
      "paper": {"transition_step": 2644, "alpha": "stays below 2.5"},
      "ours": {"preregistered": pre}, "files": files, "seconds": time.time() - start,
      "settings": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.seeds(scale)),
                   "overrides": list(paper_runs.RUNS[paper_runs.post_collapse(0)])}}
  common.write_json(out_dir, f"fig3_fig5_{scale}.json", result)
  result["measured"] = measurements(result)
  return result


def run_dir(workdir: str, out_dir: str, tag: str | None = None,
            mask_threshold: float | None = None, grad_window: tuple[int, int] | None = None,
            names: tuple[str, str, str] = ("fig3", "fig4", "fig5")) -> dict[str, Any]:
  """Analyses and plots an existing run directory (no training); writes
  ``fig3_fig5_<tag>.json`` (tag defaults to the directory's name) and the PNGs."""
  tag = tag or os.path.basename(os.path.normpath(workdir))
  a = analyze(workdir, mask_threshold, grad_window)
  files = plot(a, out_dir, tag, names, grad_window)
  a.pop("_series")
  result = {"figure": "postnorm_collapse Figs 3-5 analysis of one run", "run": tag,
            "ours": a, "files": files}
  common.write_json(out_dir, f"fig3_fig5_{tag}.json", result)
  return result

