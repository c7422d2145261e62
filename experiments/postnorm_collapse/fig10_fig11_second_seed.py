"""Figures 10-11 of the Post-Norm collapse paper (App F.3): the backward-side
measurements of Figs 3-5 repeated on another collapsing seed, quick scale.

The paper repeats Figs 3-4 on a second collapsing run (same setup, another seed;
transition ~1979 vs ~2644 for the main run). Here, with diagnostics at every update
(``seed_lr_runs``):

  post_warmup_lr0.015_seed1_diag1   the paper-like "learns then collapses" setting
                                    (LR 1.5e-2, 20 warmup updates, 60 updates), seed 1
  post_warmup_lr0.015_seed0_diag1   the same, seed 0: the reference at the same
                                    resolution (the Fig 6 run logged every 10 updates)
  post_collapse_seed1_diag1         the no-warmup collapse config (LR 1e-2), seed 1;
                                    the seed-0 reference is collapse_study's
                                    ``post_collapse`` (logged every 5 updates)

For each run: ``fig10_<run>.png`` (Fig 10 = Fig 3: loss, last-layer similarity,
alpha_1^l, alpha_2^l), ``fig11_<run>.png`` (Fig 11 = Fig 4: sqrt(d)/||y_k^l|| and c
around the transition, pre/post windows shaded) and ``fig11grad_<run>.png`` (the
Fig 5 per-layer gradient norms over updates [t-4, t+6]); ``fig10_fig11.json`` holds
every number, the seed-0 vs seed-1 comparison, where alpha peaks (``alpha_peak``:
one layer? one update?), and a check that per-update diagnostics do not change the
trajectory (the seed-0 run vs its twin logged every 10 updates, ``post_warmup_lr0.015``).
At paper / tiny scale: the paper's collapsing run (``paper_runs``) at its seeds after 0.

``CLAIMS``: Figs 3-5's transition claims (``fig3_fig5_transition.transition_claims``)
on the other seeds of the warmup run (seed 0 is the Figs 3-5 row).

Run:  rankjax reproduce postnorm_collapse --only fig10
(trains the runs if missing: about 30 s each on 2 cores, the 150-update one longer).
"""
from __future__ import annotations

import time
from typing import Any


from . import collapse_study
from . import common
from . import fig3_fig5_transition as f35
from . import paper_runs
from . import seed_lr_runs as sl
from rankjax import studies
from rankjax.studies import claims

WARMUP_SEED0 = sl.warmup_run_name(sl.MAIN_WARMUP_LR, 0)
WARMUP_SEED1 = sl.warmup_run_name(sl.MAIN_WARMUP_LR, 1)
WARMUP_SEED2 = sl.warmup_run_name(sl.MAIN_WARMUP_LR, 2)   # a third seed
NOWARMUP_SEED1 = "post_collapse_seed1_diag1"
NOWARMUP_SEED0 = "post_collapse"          # collapse_study.RUNS, diagnostics every 5
DIAG10_SEED0 = sl.DIAG10_RUN   # the seed-0 warmup run, diagnostics every 10
PAPER = {
    "main_transition_step": 2644, "second_seed_transition_step": 1979,
    "alpha": "stays below 2.5 (main run, Sec 4.2)",
    "c": "most layers cross below 1 shortly after the transition; attention layer 1 "
         "is an exception",
    "claim": "the transition pattern is not specific to a single random seed",
}
COMPARE_KEYS = (
    "transition_step", "onset_step", "first_high_sim_step", "grad_collapse_step", "min_loss",
    "min_loss_step", "final_loss", "final_last_tsim", "alpha_max", "alpha_1_layer1_max",
    "alpha_1_max_pre",
    "alpha_1_max_post", "alpha_2_max_pre", "alpha_2_max_post", "rms_factor_1_pre_mean",
    "rms_factor_1_post_mean", "rms_factor_2_pre_mean", "rms_factor_2_post_mean",
    "contraction_1_frac_below1_post", "contraction_2_frac_below1_post",
    "contraction_1_layer1_post_mean", "contraction_2_layer1_post_mean",
    "grad_first_over_last_before", "grad_first_over_last_after", "grad_window_layer1_drop",
    "grad_window_last_layer_drop", "final_grad_first_over_last")
SCALES: dict[str, dict[str, Any]] = {
    "quick": {"runs": [WARMUP_SEED0, WARMUP_SEED1, WARMUP_SEED2, NOWARMUP_SEED1,
                       NOWARMUP_SEED0], "diag_interval_check": DIAG10_SEED0},
    # the warmup runs at seeds 0-7; the no-warmup pair and the diagnostics-interval
    # check are single-seed checks by design, quick's only
    collapse_study.SEEDS8_SCALE: {"runs": [
        sl.warmup_run_name(sl.MAIN_WARMUP_LR, s)
        for s in sl.warmup_seeds(collapse_study.SEEDS8_SCALE)]},
    "paper": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.SEEDS[1:])},
    "tiny": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.TINY_SEEDS[1:])},
}
F10 = "Figs 10-11, another seed (warmup LR 1.5e-2)"
FIG10_ITEMS = ("a transition", "alpha stays below 2.5", "most attention c < 1 after",
               "most FFN c < 1 after", f35.STRICT_1, f35.STRICT_2,
               "layer-1 gradient drops by orders")
F10_PAPER = "Figs 10-11, another seed (Post-Norm LR 8e-4)"
CLAIMS = claims([c for prefix in (F10, F10_PAPER)
                 for c in f35.transition_claims(prefix, where="Figs 10-11", lead="f10")
                 if c.item.split(": ", 1)[1] in FIG10_ITEMS])


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Trains (or reuses) the runs and writes ``fig10_fig11.json`` and the PNGs (paper /
  tiny: :func:`run_paper`). quick_seeds8: the warmup runs at seeds 0-7 only
  (``SCALES``), ``fig10_fig11_quick_seeds8.json``."""
  if scale in ("paper", "tiny"):
    return run_paper(out_dir, scale)
  if scale not in SCALES:
    raise ValueError(f"fig10 has the scales {list(SCALES)}, not {scale!r}")
  start = time.time()
  ours: dict[str, Any] = {}
  files: list[str] = []
  workdirs: dict[str, str] = {}
  for name in SCALES[scale]["runs"]:
    wd = (collapse_study.train_run(name, out_dir) if name == NOWARMUP_SEED0
          else sl.train(name, out_dir))
    workdirs[name] = wd
    gw = f35.GRAD_WINDOW if name != NOWARMUP_SEED0 else None   # every 5: keep +-30
    a = f35.analyze(wd, grad_window=gw)
    files += f35.plot(a, out_dir, name, ("fig10", "fig11", "fig11grad"), gw)
    a.pop("_series")
    ours[name] = a
  if scale != "quick":
    result = {"figure": f"postnorm_collapse Figs 10-11 (App F.3), {scale} scale",
              "scale": scale, "paper": PAPER, "ours": ours, "files": files,
              "settings": {"seeds": list(sl.warmup_seeds(scale))},
              "seconds": time.time() - start}
    common.write_json(out_dir, f"fig10_fig11_{scale}.json", result)
    result["measured"] = measurements(result)
    return result
  comparison = {
      "warmup_lr0.015": {k: [ours[WARMUP_SEED0].get(k), ours[WARMUP_SEED1].get(k)]
                         for k in COMPARE_KEYS},
      "no_warmup_lr0.01": {k: [ours[NOWARMUP_SEED0].get(k), ours[NOWARMUP_SEED1].get(k)]
                           for k in COMPARE_KEYS},
      "order": "[seed 0, seed 1]",
  }
  # the diagnostics-interval check: the every-10 twin of the seed-0 run
  check = f35.same_trajectory(workdirs[WARMUP_SEED0], sl.train(DIAG10_SEED0, out_dir))
  result = {"figure": "postnorm_collapse Figs 10-11 (App F.3), quick scale", "scale": scale,
            "paper": PAPER, "ours": ours, "seed_comparison": comparison,
            "diag_interval_check": check, "files": files, "seconds": time.time() - start}
  common.write_json(out_dir, "fig10_fig11.json", result)
  result["measured"] = measurements(result)
  return result


def run_paper(out_dir: str, scale: str) -> dict[str, Any]:
  """Figs 10-11: Figs 3-5's analysis of the paper's collapsing run (Post-Norm 8e-4,
  ``paper_runs``) at its other seeds (seed 0 is Figs 3-5's); ``ours[run name]``."""
  start = time.time()
  ours: dict[str, Any] = {}
  files: list[str] = []
  for seed in paper_runs.seeds(scale)[1:]:
    name = paper_runs.post_collapse(seed)
    paper_runs.train(out_dir, name, scale)
    a = f35.analyze(studies.workdir(out_dir, name), grad_window=f35.GRAD_WINDOW)
    files += f35.plot(a, out_dir, name, ("fig10", "fig11", "fig11grad"), f35.GRAD_WINDOW)
    a.pop("_series")
    ours[name] = a
  result = {"figure": f"postnorm_collapse Figs 10-11 (App F.3), {scale} scale", "scale": scale,
            "paper": PAPER, "ours": ours, "files": files, "seconds": time.time() - start,
            "settings": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.seeds(scale)[1:])}}
  common.write_json(out_dir, f"fig10_fig11_{scale}.json", result)
  result["measured"] = measurements(result)
  return result


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: the values of ``CLAIMS``, one per seed after 0."""
  o = res["ours"]
  if res.get("scale", "quick") in ("paper", "tiny"):      # the paper's runs: seeds after 0
    others = {name.rsplit("seed", 1)[1]: a for name, a in o.items()}
    note = (f"the paper's collapsing run at seeds {list(others)} (seed 0 is the Figs 3-5 "
            f"row), {res['scale']} scale; unmasked")
    return f35.transition_measured(F10_PAPER, others, note, FIG10_ITEMS)
  others = {str(s): o[sl.warmup_run_name(sl.MAIN_WARMUP_LR, s)]
            for s in sl.warmup_seeds(res.get("scale", "quick"))[1:]}
  note = ("the paper's Figs 10-11 repeat Figs 3-5 on one other seed; ours: seeds "
          f"{list(others)} (seed 0 is the Figs 3-5 row); unmasked")
  return f35.transition_measured(F10, others, note, FIG10_ITEMS)
