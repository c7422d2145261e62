"""The Post-Norm collapse paper's own training runs (Sec 4, App F.3, F.5): ``--scale paper``
and its laptop-size twin ``--scale tiny`` (``rankjax.studies.at_scale`` of the same
configs).

The model and optimizer are ``experiments/configs/postnorm_48l_d512_c4.json`` (Sec 4: 48
layers, d=512, d_ff=1536, 4 heads, SwiGLU, RMSNorm, Llama-2 tokenizer, C4, T=2048, batch
256, AdamW (0.9, 0.95), wd 0.1, 2000 warmup of 40000 updates with cosine decay, clip
1.0). The learning rates are the paper's:

  post_lr8e-4_seed{s}   Post-Norm at 8e-4: "collapses within a few thousand steps" (Sec 4.2;
                        Figs 3-5 are seed 0, "another collapsing run" of Figs 10-11 a second
                        seed); diagnostics at every update (Fig 5 resolves steps 2640-2650),
                        with the sublayer gradient norms App F.4's masking reads
  pre_lr8e-4_seed{s}    Pre-Norm at 8e-4, everything else matched (Sec 4: "all architectural
                        and optimization settings are matched except for normalization")
  post_lr6e-4_seed{s}   Post-Norm at 6e-4: "trains stably for 40000 steps" (App F.5)
  post_nowarmup_lr8e-4_seed{s}  Fig 6 left's no-warmup run (the paper does not give its
                        rate: ours is the collapsing 8e-4, fixed before any run)
  post_lr{lr}_seed0     Post-Norm at the App F.4 ablation rates 1.2e-3, 1.5e-3, 1.8e-3 (Figs
                        12-20; one run each, as the paper and the quick ablation), with the
                        diagnostics of the collapsing run; each stops itself once a layer
                        has stayed collapsed for ``ABLATION_STOP`` diagnostics updates
                        (``stop_on_collapse``; the paper's gradient windows are 10
                        updates at the transition, 3123-3133, 1699-1709, 1754-1764, but
                        its other panels may read later updates), so its rows are
                        proxies marked "partial";
                        ``--set stop_on_collapse=0`` trains the whole 40000

at seeds ``SEEDS`` (the paper shows one run each; a trained result takes at least 3;
``TINY_SEEDS`` at tiny).
The Post-Norm runs Sec 4.3 reads (the collapsing, no-warmup and ablation runs) log the
frequency loss of every update's labels in the step (``label_frequency``), so ``sec43``
compares the loss with them without re-reading 21B tokens of C4.
"""
from __future__ import annotations

import pathlib
from typing import Any

from rankjax import studies

CONFIG = "experiments/configs/postnorm_48l_d512_c4.json"   # from the checkout's root
_CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
COLLAPSE_LR = 8e-4      # Sec 4.2: the collapsing run
STABLE_LR = 6e-4        # App F.5: 40000 updates without collapse
ABLATION_LRS = (1.2e-3, 1.5e-3, 1.8e-3)   # App F.4 (Figs 12-20) and Fig 6 right
SEEDS = (0, 1, 2)
TINY_SEEDS = (0, 1)
DIAGS = 'diagnostics=["basic","postnorm","postnorm_sublayer_norms"]'
LABELS = "label_frequency=true"   # Sec 4.3's per-update references, logged in the step
ABLATION_STOP = 2000   # diagnostics updates (every update) a layer stays collapsed: stop


def post_collapse(seed: int) -> str:
  return f"post_lr8e-4_seed{seed}"


def pre_same_lr(seed: int) -> str:
  return f"pre_lr8e-4_seed{seed}"


def post_stable(seed: int) -> str:
  return f"post_lr6e-4_seed{seed}"


def post_nowarmup(seed: int) -> str:
  return f"post_nowarmup_lr8e-4_seed{seed}"


def ablation(lr: float) -> str:
  return f"post_lr{lr:g}_seed0"


# name -> overrides of CONFIG
RUNS: dict[str, tuple[str, ...]] = {
    **{post_collapse(s): (f"learning_rate={COLLAPSE_LR}", f"seed={s}", "diag_every=1", DIAGS,
                          LABELS) for s in SEEDS},
    **{pre_same_lr(s): (f"learning_rate={COLLAPSE_LR}", f"seed={s}", "model.norm_position=pre")
       for s in SEEDS},
    **{post_stable(s): (f"learning_rate={STABLE_LR}", f"seed={s}") for s in SEEDS},
    **{ablation(lr): (f"learning_rate={lr}", "seed=0", "diag_every=1", DIAGS, LABELS,
                      f"stop_on_collapse={ABLATION_STOP}")
       for lr in ABLATION_LRS},
    **{post_nowarmup(s): (f"learning_rate={COLLAPSE_LR}", "warmup_steps=0", f"seed={s}", LABELS)
       for s in SEEDS},
}
# the roles of collapse_study.RUNS (the quick runs) at this scale
ROLES = {"post_collapse": post_collapse, "pre_same_lr": pre_same_lr,
         "post_stable": post_stable}


def config(name: str, scale: str):
  """Run ``name``'s TrainConfig at ``scale`` (paper: as the paper; tiny: shrunk)."""
  if scale not in ("paper", "tiny"):
    raise ValueError(f"paper_runs has the paper and tiny scales, not {scale!r}")
  return studies.at_scale(studies.load_config(_CHECKOUT / CONFIG, RUNS[name]), scale)


def seeds(scale: str) -> tuple[int, ...]:
  return TINY_SEEDS if scale == "tiny" else SEEDS


def runs_of(*roles, names: tuple[str, ...] = ()):
  """``Experiment.runs`` for the runs of ``roles`` (functions seed -> run name, e.g.
  :func:`post_collapse`) at the scale's seeds and the runs ``names``; {} at quick (its
  scripts train their own)."""
  def runs(scale: str) -> dict[str, Any]:
    if scale not in ("paper", "tiny"):
      return {}
    wanted = [role(s) for role in roles for s in seeds(scale)] + list(names)
    return {n: config(n, scale) for n in wanted}
  return runs


def train(out_dir: str, name: str, scale: str) -> str:
  """The workdir of run ``name`` under ``out_dir`` (trained unless finished)."""
  return studies.train_run(studies.workdir(out_dir, name), config(name, scale))
