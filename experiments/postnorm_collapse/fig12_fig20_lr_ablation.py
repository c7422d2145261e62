"""Figures 12-20 of the Post-Norm collapse paper (App F.4): the backward-incapacity
diagnostics of Figs 3-5 for collapsed Post-Norm runs at three learning rates, quick
scale.

The paper: LR 1.2e-3, 1.5e-3, 1.8e-3 (its main collapsing run is 8e-4, its stable
control 6e-4), with warmup; per LR three figures: the sublayer gradient contribution
(Fig 3 layout: loss, last-layer similarity, alpha_1^l, alpha_2^l), the backward-side
diagnostic (Fig 4 layout: sqrt(d)/||y_k^l|| and c) and the per-layer gradient norms
over an ~10-update window (steps 3123-3133, 1699-1709, 1754-1764), with alpha and c
masked where the sublayer's input and output gradient norms are below 1e-10.

Ours (``seed_lr_runs``): the warmup setting of the paper-like transition run
(configs/collapse_post_quick.json, 20 linear warmup updates, 60 updates, seeds
``seed_lr_runs.ablation_seeds``: 0, 1, 2 at quick, 0-7 at quick_seeds8; the paper has
one run per LR) at
``seed_lr_runs.ABLATION_LRS`` = 2e-2, 2.5e-2, 3e-2 = 2.0x, 2.5x, 3.0x our highest stable
warmup LR (1e-2), the paper's ratios to its stable 6e-4; diagnostics at every update
including ``postnorm_sublayer_norms`` for the mask (``fig3_fig5_transition.mask_vanishing``,
rule "both", threshold 1e-10). The gradient window is [t-4, t+6] around the transition
t (``gradient_window``; the paper's Fig 5 window 2640-2650 around 2644).

Writes per LR (seed 0) ``fig12/13/14_lr0.02.png``, ``fig15/16/17_lr0.025.png``,
``fig18/19/20_lr0.03.png``, an overview ``fig12_fig20_overview.png`` (loss and
last-layer similarity of the three runs and the main 1.5e-2 run) and
``fig12_fig20.json``. At paper / tiny scale: the paper's ablation runs (``paper_runs``).

``CLAIMS``: per LR, the run collapses, and Figs 3-5's claims
(``fig3_fig5_transition.transition_claims``) on the masked diagnostics, at every seed.

Run:  rankjax reproduce postnorm_collapse --only fig12
(trains the 9 runs of 60 updates if missing: about 30 s each on 2 cores).
"""
from __future__ import annotations

import os
import time
from typing import Any


from . import collapse_study, common, paper_runs
from . import fig3_fig5_transition as f35
from . import seed_lr_runs as sl
from rankjax import studies
from rankjax.studies import Bound, Claim, claims, measured

FIG_NAMES: dict[float, tuple[str, str, str]] = {
    lr: (f"fig{12 + 3 * i}", f"fig{13 + 3 * i}", f"fig{14 + 3 * i}")
    for i, lr in enumerate(sl.ABLATION_LRS)}
PAPER = {
    "learning_rates": [1.2e-3, 1.5e-3, 1.8e-3], "main_lr": 8e-4, "stable_lr": 6e-4,
    "warmup_steps": 2000, "total_steps": 40000,
    "gradient_windows": {"1.2e-3": [3123, 3133], "1.5e-3": [1699, 1709],
                         "1.8e-3": [1754, 1764]},
    "main_transition_step": 2644, "mask": "alpha and c masked where the submodule's input "
                                          "and output gradient norms are below 1e-10",
}
SUMMARY_KEYS = (
    "transition_step", "onset_step", "first_high_sim_step", "grad_collapse_step", "min_loss",
    "min_loss_step", "final_loss", "final_freq_loss_batch", "final_last_tsim", "alpha_max",
    "alpha_1_layer1_max", "alpha_1_max_masked_either", "alpha_2_max_masked_either",
    "alpha_1_max_post", "alpha_2_max_post", "frac_vanished_1", "frac_vanished_2",
    "frac_vanished_either_1", "frac_vanished_either_2",
    "rms_factor_1_pre_mean", "rms_factor_1_post_mean", "rms_factor_2_pre_mean",
    "rms_factor_2_post_mean", "contraction_1_frac_below1_post",
    "contraction_2_frac_below1_post", "contraction_1_layer1_post_mean",
    "grad_window_steps", "grad_window_layer1_drop", "grad_window_last_layer_drop",
    "grad_window_first_over_last", "final_grad_first_over_last")
SCALES: dict[str, dict[str, Any]] = {
    **{sc: {"learning_rates": list(sl.ABLATION_LRS), "seeds": list(sl.ablation_seeds(sc))}
       for sc in ("quick", collapse_study.SEEDS8_SCALE)},
    "paper": {"config": paper_runs.CONFIG, "learning_rates": list(paper_runs.ABLATION_LRS),
              "seeds": [0]},
    "tiny": {"config": paper_runs.CONFIG, "learning_rates": list(paper_runs.ABLATION_LRS),
             "seeds": [0]},
}


def _f12(lr: float) -> str:
  return f"Figs 12-20, LR {lr:g}"


FIG12_ITEMS = ("alpha stays below 2.5", "most attention c < 1 after", "most FFN c < 1 after",
               f35.STRICT_1, f35.STRICT_2,
               "layer-1 gradient drops by orders", "last-layer gradient changes much less")
PAPER_ABLATION_LRS = paper_runs.ABLATION_LRS     # App F.4: 1.2e-3, 1.5e-3, 1.8e-3
CLAIMS = claims(
    [Claim(f"{_f12(lr)}: alpha stays below 2.5, vanished gradients excluded", "max of "
           "alpha_k^l (masked) over the entries whose ||dL/dY_k^l|| >= 1e-4 x its run "
           "median", common.ALPHA_PAPER_MAX, Bound("<", every_seed=True),
           "issue 25 item 6: ours, beside the unmasked headline (App F.4 masks below 1e-10 "
           "for its plots only)", where="Figs 12-20",
           quote=common.QUOTES["f12"] + " ... " + common.QUOTES["f12_mask"] + " ... "
           + common.QUOTES["alpha"], kind="sensitivity")
     for lr in sl.ABLATION_LRS + PAPER_ABLATION_LRS]
    + [common.ours_limit(Claim(
        f"{_f12(lr)}: collapses", "collapse onset found (1) or not (0): last-layer t_sim "
        "stays >= 0.99", 1.0, Bound(">=", every_seed=True),
        "App F.4: the run collapses at each LR; 'collapsed' = last-layer t_sim >= 0.99, ours",
        where="Figs 12-20", quote=common.QUOTES["f12"]))
     for lr in sl.ABLATION_LRS + PAPER_ABLATION_LRS]
    + [c for lr in sl.ABLATION_LRS + PAPER_ABLATION_LRS for c in f35.transition_claims(
        _f12(lr), where="Figs 12-20", lead="f12")
       if c.item.split(": ", 1)[1] in FIG12_ITEMS])


def _overview(out_dir: str, workdirs: dict[str, str]) -> str:
  plt = common.pyplot()
  fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
  for label, wd in workdirs.items():
    steps, d, _, _ = f35.load_diagnostics(wd)
    ax[0].plot(steps, d["loss"], lw=0.9, label=label)
    ax[1].plot(steps, d["last_tsim"], lw=0.9, label=label)
  ax[0].set(title="training loss", xlabel="update")
  ax[1].set(title="last-layer token similarity", xlabel="update")
  ax[0].legend(fontsize=7)
  fig.suptitle("Figs 12-20 overview: Post-Norm with warmup, seed 0", fontsize=9)
  fig.tight_layout()
  path = os.path.join(out_dir, "fig12_fig20_overview.png")
  studies.save_figure(fig, path, dpi=110)
  plt.close(fig)
  return path


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Trains (or reuses) the ablation runs at every seed (``seed_lr_runs.ablation_seeds``:
  0-2 at quick, 0-7 at quick_seeds8) and writes ``fig12_fig20.json``
  (``fig12_fig20_quick_seeds8.json``) and seed 0's PNGs (paper / tiny:
  :func:`run_paper`)."""
  if scale in ("paper", "tiny"):
    return run_paper(out_dir, scale)
  if scale not in SCALES:
    raise ValueError(f"fig12 has the scales {list(SCALES)}, not {scale!r}")
  start = time.time()
  seeds = sl.ablation_seeds(scale)
  ours: dict[str, Any] = {}
  files: list[str] = []
  workdirs: dict[str, str] = {}
  for lr in sl.ABLATION_LRS:
    for seed in seeds:
      wd = sl.train(sl.warmup_run_name(lr, seed), out_dir)
      a = f35.analyze(wd, mask_threshold=f35.MASK_THRESHOLD, grad_window=f35.GRAD_WINDOW)
      if seed == seeds[0]:      # the figures show seed 0
        workdirs[f"lr {lr}"] = wd
        files += f35.plot(a, out_dir, f"lr{lr}", FIG_NAMES[lr], f35.GRAD_WINDOW)
      a.pop("_series")
      ours[collapse_study.seeded_name(f"lr{lr}", seed)] = a   # seed 0 plain, as at paper
  main = sl.train(sl.warmup_run_name(sl.MAIN_WARMUP_LR, 0), out_dir)   # fig10's seed-0 run
  workdirs[f"lr {sl.MAIN_WARMUP_LR} (main)"] = main
  a = f35.analyze(main, mask_threshold=f35.MASK_THRESHOLD, grad_window=f35.GRAD_WINDOW)
  a.pop("_series")
  ours[f"lr{sl.MAIN_WARMUP_LR}_main"] = a
  files.append(_overview(out_dir, workdirs))
  table = {k: {lr: v.get(k) for lr, v in ours.items()} for k in SUMMARY_KEYS}
  result = {"figure": "postnorm_collapse Figs 12-20 (App F.4), quick scale", "scale": scale,
            "paper": PAPER,
            "settings": {"learning_rates": list(sl.ABLATION_LRS),
                         "warmup_steps": sl.WARMUP_STEPS, "total_steps": sl.WARMUP_TOTAL,
                         "mask_threshold": f35.MASK_THRESHOLD, "mask_rule": "both",
                         "grad_window": list(f35.GRAD_WINDOW),
                         "seeds": list(seeds)},
            "summary": table, "ours": ours, "files": files, "seconds": time.time() - start}
  common.write_json(out_dir, "fig12_fig20.json" if scale == "quick"
                    else f"fig12_fig20_{scale}.json", result)
  result["measured"] = measurements(result)
  return result


def run_paper(out_dir: str, scale: str) -> dict[str, Any]:
  """Figs 12-20 of the paper's ablation runs (Post-Norm at 1.2e-3, 1.5e-3, 1.8e-3 with the
  paper's warmup, ``paper_runs``), masked as App F.4, beside the main 8e-4 run."""
  start = time.time()
  ours: dict[str, Any] = {}
  files: list[str] = []
  workdirs: dict[str, str] = {}
  names = [(f"lr {lr:g}", f"lr{lr}", paper_runs.ablation(lr)) for lr in paper_runs.ABLATION_LRS]
  names.append((f"lr {paper_runs.COLLAPSE_LR:g} (main)", f"lr{paper_runs.COLLAPSE_LR}_main",
                paper_runs.post_collapse(0)))
  for i, (label, key, name) in enumerate(names):
    wd = paper_runs.train(out_dir, name, scale)
    workdirs[label] = wd
    a = f35.analyze(studies.workdir(out_dir, name), mask_threshold=f35.MASK_THRESHOLD,
                    grad_window=f35.GRAD_WINDOW)
    if i < len(paper_runs.ABLATION_LRS):
      figs = (f"fig{12 + 3 * i}", f"fig{13 + 3 * i}", f"fig{14 + 3 * i}")
      files += f35.plot(a, out_dir, key, figs, f35.GRAD_WINDOW)
    a.pop("_series")
    ours[key] = a
  files.append(_overview(out_dir, workdirs))
  result = {"figure": f"postnorm_collapse Figs 12-20 (App F.4), {scale} scale", "scale": scale,
            "paper": PAPER,
            "settings": {"learning_rates": list(paper_runs.ABLATION_LRS),
                         "config": paper_runs.CONFIG, "mask_threshold": f35.MASK_THRESHOLD,
                         "mask_rule": "both", "grad_window": list(f35.GRAD_WINDOW), "seed": 0},
            "summary": {k: {lr: v.get(k) for lr, v in ours.items()} for k in SUMMARY_KEYS},
            "ours": ours, "files": files, "seconds": time.time() - start}
  common.write_json(out_dir, f"fig12_fig20_{scale}.json", result)
  result["measured"] = measurements(result)
  return result


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: per LR, every seed's values of ``CLAIMS``:
  ``ours["lr<lr>"]`` is seed 0, ``ours["lr<lr>_seed<s>"]`` seed s
  (``collapse_study.seeded_name``)."""
  rows = []
  paper = res.get("scale", "quick") in ("paper", "tiny")
  for lr in PAPER_ABLATION_LRS if paper else sl.ABLATION_LRS:
    seeds = [0] if paper else list(sl.ablation_seeds(res.get("scale", "quick")))
    runs = {str(s): res["ours"][collapse_study.seeded_name(f"lr{lr}", s)] for s in seeds}
    window = sorted({"transition" if a.get("transition_found") else "onset"
                     for a in runs.values()})
    note = (("seed 0 (one run per LR, as the paper's App F.4);" if paper else
             f"seeds {seeds} (the paper: one run per LR);")
            + " alpha and c masked where both gradient norms < 1e-10 (App F.4); window centred"
            f" on the {' / '.join(window)}")
    rows.append(measured(f"{_f12(lr)}: collapses",
                         [1.0 if a.get("onset_step") is not None else 0.0 for a in runs.values()],
                         seeds=seeds, note=note))
    rows += f35.transition_measured(_f12(lr), runs, note, FIG12_ITEMS)
    rows.append(measured(f"{_f12(lr)}: alpha stays below 2.5, vanished gradients excluded",
                         [common.num(a.get("alpha_max_excluding_vanished"))
                          for a in runs.values()], seeds=seeds, note=note))
  return rows
