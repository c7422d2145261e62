"""Figures 3-5 (and 10-21 at quick scale) of the Post-Norm collapse paper: the
backward diagnostics across the transition window of a collapsing Post-Norm run.

From the ``postnorm`` diagnostics of a run (``rankjax.train.diagnostics_postnorm``):

  Fig 3: (a) training loss, (b) last-layer token similarity, (c) alpha_1^l and
         (d) alpha_2^l (Def 3.5) over the whole run;
  Fig 4: sqrt(d)/||y_k^l|| and c(y_k^l, alpha_k^l) (Thm 3.6) in the transition window;
  Fig 5: per-layer parameter-gradient norms at the logged steps of the window.

The transition step is ``rankjax.measure.gradients.detect_transition`` on the
logged (last-layer similarity, loss) series. ``run`` trains the quick-scale
collapsing run (``collapse_study.RUNS["post_collapse"]``) when it is missing; pass
``--run NAME`` to plot another (``post_stable`` gives the non-collapsed control,
Figs 21-22).

Run:  python experiments/postnorm_collapse/fig3_fig5_transition.py --out runs/collapse
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

if __package__ in (None, ""):
  sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from experiments.postnorm_collapse import common  # noqa: E402
from experiments.postnorm_collapse import collapse_study  # noqa: E402
from rankjax.measure import gradients as gr  # noqa: E402

WINDOW = 30   # steps on each side of the transition for Figs 4-5
ONSET_SIM = 0.99


def _layers_to_show(num_layers: int) -> list[int]:
  """0-based indices: the paper's 1, 5, 10, ..., L pattern scaled to the depth."""
  step = max(num_layers // 6, 1)
  return sorted({0, *range(step - 1, num_layers, step), num_layers - 1})


def analyze(workdir: str) -> dict[str, Any]:
  from rankjax.train.run_reader import load_run
  r = load_run(workdir)
  d = {k.split("/", 1)[1]: np.asarray(v) for k, v in r.diagnostics.items()
       if k.startswith("postnorm/")}
  steps = np.asarray(r.diagnostic_steps)
  tr = gr.detect_transition(steps, d["last_tsim"], d["loss"])
  L = d["alpha_1"].shape[1]
  out: dict[str, Any] = {"workdir": workdir, "num_layers": L, "steps_logged": len(steps),
                         "transition_step": tr.step, "transition_found": tr.found}
  high = np.flatnonzero(d["last_tsim"] >= ONSET_SIM)
  out["onset_step"] = int(steps[high[0]]) if len(high) else None
  if not tr.found and len(high) and high[0] > 0:
    # no loss rise (the run collapsed while the loss was still falling from ln V):
    # centre the window on the collapse onset instead, and say so
    tr = gr.Transition(True, int(steps[high[0]]), int(high[0]), 0.0, 0.0)
    out["window_centre"] = "onset (first logged step with last-layer t_sim >= 0.99)"
  else:
    out["window_centre"] = "detect_transition"
  out["alpha_max"] = float(max(d["alpha_1"].max(), d["alpha_2"].max()))
  out["alpha_1_layer1_max"] = float(d["alpha_1"][:, 0].max())
  if tr.found:
    i = int(np.searchsorted(steps, tr.step))
    pre = (steps >= tr.step - WINDOW) & (steps < tr.step)
    post = (steps > tr.step) & (steps <= tr.step + WINDOW)
    if not pre.any():
      pre = steps < tr.step
    for k in (1, 2):
      out[f"rms_factor_{k}_pre_mean"] = float(d[f"rms_factor_mean_{k}"][pre].mean())
      out[f"rms_factor_{k}_post_mean"] = float(d[f"rms_factor_mean_{k}"][post].mean())
      out[f"contraction_{k}_frac_below1_pre"] = float(np.mean(d[f"contraction_{k}"][pre] < 1))
      out[f"contraction_{k}_frac_below1_post"] = float(np.mean(d[f"contraction_{k}"][post] < 1))
      out[f"contraction_{k}_layer1_post_mean"] = float(d[f"contraction_{k}"][post, 0].mean())
    gn = d["grad_norm"]
    out["grad_first_over_last_before"] = float(gn[i - 1, 0] / gn[i - 1, -1])
    out["grad_first_over_last_after"] = float(gn[post, 0].mean() / gn[post, -1].mean())
    out["grad_first_layer_drop"] = float(gn[i - 1, 0] / max(gn[post, 0].mean(), 1e-30))
    out["grad_last_layer_drop"] = float(gn[i - 1, -1] / max(gn[post, -1].mean(), 1e-30))
  out["_series"] = (steps, d, tr)
  return out


def plot(a: dict[str, Any], out_dir: str, tag: str) -> list[str]:
  plt = common.pyplot()
  steps, d, tr = a["_series"]
  L = a["num_layers"]
  show = _layers_to_show(L)
  files = []

  def vline(ax):
    if tr.found:
      ax.axvline(tr.step, color="k", ls="--", lw=0.8)

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
  fig.suptitle(f"Fig 3 ({tag})", fontsize=9)
  fig.tight_layout()
  files.append(os.path.join(out_dir, f"fig3_{tag}.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  if tr.found:
    win = (steps >= tr.step - WINDOW) & (steps <= tr.step + WINDOW)
  else:
    win = np.ones_like(steps, bool)
  fig, ax = plt.subplots(2, 2, figsize=(11, 7))
  for j, k in ((0, 1), (1, 2)):
    for l in show:
      ax[0, j].plot(steps[win], d[f"rms_factor_mean_{k}"][win, l], lw=0.9, label=f"layer {l + 1}")
      ax[1, j].plot(steps[win], d[f"contraction_{k}"][win, l], lw=0.9, label=f"layer {l + 1}")
    ax[0, j].set(title=f"sqrt(d)/||y_{k}^l||", yscale="log", xlabel="step")
    ax[1, j].set(title=f"c(y_{k}^l, alpha_{k}^l)", yscale="log", xlabel="step")
    ax[1, j].axhline(1.0, color="gray", lw=0.5)
  ax[0, 0].legend(fontsize=6)
  for x in ax.flat:
    vline(x)
  fig.suptitle(f"Fig 4 ({tag}): transition window", fontsize=9)
  fig.tight_layout()
  files.append(os.path.join(out_dir, f"fig4_{tag}.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(6, 4))
  idx = np.flatnonzero(win)
  cmap = plt.get_cmap("viridis")
  for n_, i in enumerate(idx):
    ax.semilogy(np.arange(1, L + 1), d["grad_norm"][i], color=cmap(n_ / max(len(idx) - 1, 1)),
                lw=0.9, label=f"step {steps[i]}" if n_ in (0, len(idx) - 1) else None)
  ax.set(xlabel="layer", ylabel="parameter-gradient norm",
         title=f"Fig 5 ({tag}): per-layer gradient norms, steps {steps[idx[0]]}-{steps[idx[-1]]}")
  ax.legend(fontsize=7)
  fig.tight_layout()
  files.append(os.path.join(out_dir, f"fig5_{tag}.png"))
  fig.savefig(files[-1], dpi=110)
  plt.close(fig)
  return files


def run(out_dir: str, scale: str = "quick", run_name: str = "post_collapse") -> dict[str, Any]:
  """Trains (or reuses) ``run_name`` and writes ``fig3_fig5_<run>.json`` and PNGs."""
  if scale != "quick":
    raise ValueError("only the quick scale runs here (see collapse_study.py)")
  start = time.time()
  wd = collapse_study.train_run(run_name, out_dir)
  a = analyze(wd)
  files = plot(a, out_dir, run_name)
  a.pop("_series")
  if run_name == "post_collapse":
    # the same run's first steps with diagnostics at every step (Figs 4-5 resolution)
    wdw = collapse_study.train_run("post_collapse_window", out_dir)
    aw = analyze(wdw)
    files += plot(aw, out_dir, "post_collapse_window")
    aw.pop("_series")
    a["window_run"] = aw
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
  common.write_json(out_dir, f"fig3_fig5_{run_name}.json", result)
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="runs/postnorm_collapse/collapse")
  parser.add_argument("--scale", choices=["quick"], default="quick")
  parser.add_argument("--run", default="post_collapse", choices=sorted(collapse_study.RUNS))
  args = parser.parse_args()
  print(json.dumps(run(args.out, args.scale, args.run)["ours"], indent=2))


if __name__ == "__main__":
  main()
