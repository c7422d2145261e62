"""The quick-scale runs behind App F.3 (Figs 10-11, another seed) and App F.4 (Figs
12-20, learning-rate ablation), all with diagnostics at every update.

Every run here logs ``basic``, ``postnorm`` and ``postnorm_sublayer_norms`` (the
gradient norms App F.4's masking rule needs) at every update (``diag_every=1``), so
the transition window is resolved to one update (Fig 6-right and Sec 4.3 read the same
ablation runs, at ``ablation_seeds(scale)``: quick's ``ABLATION_SEEDS``, 0-7 at
quick_seeds8). Training is deterministic given the seed: ``diag_every`` does not
change the trajectory, so ``post_warmup_lr0.015_seed0_diag1`` is ``DIAG10_RUN``
(``post_warmup_lr0.015``, diagnostics every 10, basic + postnorm) with finer
diagnostics (``fig10_fig11_second_seed`` checks this).

Settings (see EXPECTED.md, "Figures 10-11" and "Figures 12-20" for the reasons):

  warmup ("learns then collapses", the paper-like setting): configs/collapse_post_quick.json
    + learning_rate, warmup_steps=20 (linear), then constant, total_steps=60
  no warmup: configs/collapse_post_quick.json as is (LR 1e-2, 150 updates)

The experiments that read these runs (``rankjax reproduce postnorm_collapse --only
fig3_fig5,fig6,fig10,fig12,sec43``) train any that are missing (a 60-update run takes
about 30 s on 2 cores).
"""
from __future__ import annotations

from . import collapse_study

CONFIG = "collapse_post_quick"
DIAGS = 'diagnostics=["basic","postnorm","postnorm_sublayer_norms"]'
WARMUP_STEPS = 20
WARMUP_TOTAL = 60
# the paper's ablation LRs 1.2e-3, 1.5e-3, 1.8e-3 are 2.0x, 2.5x, 3.0x its stable 6e-4
# (App F.5) and 1.5x-2.25x its main collapsing 8e-4; ours are 2.0x, 2.5x, 3.0x our
# highest stable warmup LR (1e-2) and 1.33x-2x our main warmup collapse LR (1.5e-2)
ABLATION_LRS = (0.02, 0.025, 0.03)
# the seeds of every LR-ablation run (Figs 12-20, Fig 6-right, Sec 4.3's warmup rows) and of
# Fig 6-right's first LR set (at least 3 per trained result), fixed before the
# seed-1 and seed-2 runs were trained; quick's (ablation_seeds(scale))
ABLATION_SEEDS = (0, 1, 2)
MAIN_WARMUP_LR = 0.015
# the seeds of the main warmup setting (Figs 3-5 at 60 updates, Figs 10-11); quick's
# (warmup_seeds(scale))
WARMUP_SEEDS = (0, 1, 2)


def _seeds(scale: str, quick: tuple[int, ...]) -> tuple[int, ...]:
  if scale not in ("quick", collapse_study.SEEDS8_SCALE):
    raise ValueError(f"the warmup runs have the scales quick and "
                     f"{collapse_study.SEEDS8_SCALE}, not {scale!r}")
  return collapse_study.seeds(scale) if scale != "quick" else quick


def ablation_seeds(scale: str = "quick") -> tuple[int, ...]:
  """The LR-ablation runs' seeds (and Fig 6-right's first set's) at ``scale``:
  ``ABLATION_SEEDS`` at quick, ``collapse_study.seeds`` (0-7) at quick_seeds8."""
  return _seeds(scale, ABLATION_SEEDS)


def warmup_seeds(scale: str = "quick") -> tuple[int, ...]:
  """The main warmup setting's seeds (Figs 3-5 at 60 updates, Figs 10-11) at ``scale``:
  ``WARMUP_SEEDS`` at quick, ``collapse_study.seeds`` (0-7) at quick_seeds8."""
  return _seeds(scale, WARMUP_SEEDS)


# every seed a scale trains (the names of RUNS)
_ALL_SEEDS = sorted({s for sc in ("quick", collapse_study.SEEDS8_SCALE)
                     for s in ablation_seeds(sc) + warmup_seeds(sc)})
# Fig 6-right's first (preregistered) LR set, diagnostics every 10 (EXPECTED.md, Fig 6):
# replaced by ABLATION_LRS after its 1e-2 run did not collapse; the headline Fig 6-right row
ORIGINAL_FIG6_LRS = (0.01, 0.015, 0.02)


# the headline Figs 3-5 run: the main warmup run continued to HEADLINE_TOTAL updates, so
# that the phase after its collapse (onset ~48) is 70 updates long, not 12 (EXPECTED.md,
# Figs 3-5); constant LR after warmup, so its first WARMUP_TOTAL updates are the 60-update run's
HEADLINE_TOTAL = 120


def _warmup(lr: float, seed: int = 0, total: int = WARMUP_TOTAL) -> list[str]:
  return [f"seed={seed}", f"learning_rate={lr}", f"warmup_steps={WARMUP_STEPS}",
          f"total_steps={total}", "diag_every=1", DIAGS]


DIAG10_RUN = f"post_warmup_lr{MAIN_WARMUP_LR}"


def warmup_run_name(lr: float, seed: int = 0) -> str:
  return f"post_warmup_lr{lr}_seed{seed}_diag1"


def diag10_run_name(lr: float, seed: int = 0) -> str:
  """A warmup run with diagnostics every 10 (Fig 6-right's first LR set)."""
  return f"post_warmup_lr{lr}" + (f"_seed{seed}" if seed else "")


HEADLINE_RUN = f"post_warmup_lr{MAIN_WARMUP_LR}_seed0_diag1_t{HEADLINE_TOTAL}"


# name -> (config, overrides)
RUNS: dict[str, tuple[str, list[str]]] = {
    # Figs 3-5 (60 updates) and Figs 10-11: the main warmup run at every seed
    **{warmup_run_name(MAIN_WARMUP_LR, s): (CONFIG, _warmup(MAIN_WARMUP_LR, s))
       for s in _ALL_SEEDS},
    # Figs 10-11 for the no-warmup collapse config (collapse_study's post_collapse), seed 1
    "post_collapse_seed1_diag1": (CONFIG, ["seed=1", "diag_every=1", DIAGS]),
    # Figs 12-20, Fig 6-right and Sec 4.3's warmup rows: the LR ablation at every seed
    **{warmup_run_name(lr, s): (CONFIG, _warmup(lr, s)) for lr in ABLATION_LRS
       for s in _ALL_SEEDS},
    # Figs 10-11's check that the diagnostics interval leaves training unchanged: the
    # main warmup run with diagnostics every 10 updates
    DIAG10_RUN: (CONFIG, [*_warmup(MAIN_WARMUP_LR, 0)[:-2], "diag_every=10"]),
    # Fig 6-right's first LR set: 1e-2 at every seed (2e-2 reads the ablation runs and
    # 1.5e-2 the Figs 10-11 runs, whose trajectories are the same)
    **{diag10_run_name(0.01, s): (CONFIG, [*_warmup(0.01, s)[:-2], "diag_every=10"])
       for s in _ALL_SEEDS},
    # Figs 3-5 headline: the main warmup run (seed 0) for HEADLINE_TOTAL updates
    HEADLINE_RUN: (CONFIG, _warmup(MAIN_WARMUP_LR, 0, HEADLINE_TOTAL)),
}


def train(name: str, out_dir: str) -> str:
  """Trains (or reuses) run ``name`` under ``out_dir/runs/name``; returns the workdir."""
  cfg, overrides = RUNS[name]
  return collapse_study.train_run(name, out_dir, overrides=overrides, config=cfg)

