"""The quick-scale collapse study: Post-Norm collapses, Pre-Norm at the same LR trains.

Trains (through ``rankjax.train.train``, the same code as ``rankjax train``)
three runs from ``configs/``:

  post_collapse   configs/collapse_post_quick.json   Post-Norm, no warmup, high LR
  pre_same_lr     the same with ``lm.norm_position=pre``
  post_stable     configs/stable_post_quick.json     Post-Norm, lower LR + warmup

each with the ``basic`` and ``postnorm`` diagnostics
(registered by ``rankjax.train``), and summarises each run: final loss vs the
frequency loss of the training stream (Def 3.7, aggregated labels), last-layer token
similarity, the first/last per-layer gradient-norm ratio, the transition step
(``rankjax.measure.detect_transition``) and the first collapse-alarm step.

``CLAIMS``: Post-Norm at the high LR collapses (loss near L_freq, last layer collapsed,
early-layer gradients vanished), Pre-Norm at the same LR and Post-Norm at the lower LR
do not (the policy: ``common``).

``--scale quick_deep`` (issue 53 item 4): the same three runs, seeds, updates, LRs and
diagnostics at the paper's depth, 48 layers (``model.num_layers=48``, d=64 as quick), in
workdirs ``runs/<name>_L48`` beside quick's; the same claims. The study's only path at
that scale (the other experiments are missing there).

Run:  rankjax reproduce postnorm_collapse --only collapse [--scale quick_deep]
Figs 3-6 (``fig3_fig5_transition.py``, ``fig6_frequency_loss.py``) reuse these runs.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from . import common, paper_runs
from rankjax.studies import Abs, Bound, Claim, Qualitative, claims, measured

RUNS: dict[str, tuple[str, list[str]]] = {
    "post_collapse": ("collapse_post_quick", []),
    "pre_same_lr": ("collapse_post_quick", ["model.norm_position=pre"]),
    "post_stable": ("stable_post_quick", []),
}
# seeds of the three runs (at least 3 for every trained result). Seed 0 is RUNS itself;
# seed s > 0 is ``seeded_name(name, s)`` (diagnostics every 5, as seed 0).
SEEDS = (0, 1, 2)
SEED_ALIASES: dict[tuple[str, int], str] = {}


def seeded_name(name: str, seed: int) -> str:
  """The workdir name of run ``name`` (a key of RUNS) at ``seed``."""
  if seed == 0:
    return name
  return SEED_ALIASES.get((name, seed), f"{name}_seed{seed}")


# quick_seeds8 (issue 53 item 4): the quick runs at seeds 0-7; its seeds 0-2 are quick's
# (they can be shared because every run trains alone: a vmapped run's floats depend on
# the run count; this config, 12 updates: seed 0 of `rankjax train --seeds 0-2` and of
# `--seeds 0-7` differ at 9 of 12 losses, up to 2e-7 relative; 2026-12-06)
SEEDS8 = tuple(range(8))
SEED_RUNS: dict[str, tuple[str, list[str]]] = {
    seeded_name(n, s): (cfg, [*extra, f"seed={s}"]) for n, (cfg, extra) in RUNS.items()
    for s in sorted(set(SEEDS) | set(SEEDS8)) if s and (n, s) not in SEED_ALIASES}
# the first steps of the collapsing run with diagnostics at every step (Figs 4-5)
WINDOW_RUNS: dict[str, tuple[str, list[str]]] = {
    "post_collapse_window": ("collapse_post_quick", ["total_steps=30", "diag_every=1"]),
}
STREAM_FREQ_BATCHES = 256
# Sec 4.3: the full-training frequency reference reads 500M tokens of the stream
PAPER_FREQ_TOKENS = 500_000_000
# what each seed's row reads (summarize's keys)
SEED_KEYS = ("final_loss_last10pct_mean", "loss_minus_stream_freq", "final_last_tsim",
             "final_grad_ratio_first_over_last", "min_loss", "max_last_tsim")
# the scales and what each trains: the quick runs above at SEEDS; quick_seeds8 the same
# runs at SEEDS8 (issue 53 item 4; fixed before its runs), in quick's workdirs (its seeds
# 0-2 are quick's runs); quick_deep the same runs at the paper's depth, 48 layers (issue
# 53 item 4; fixed before its runs: every other setting is quick's), in workdirs of their
# own (the name + "suffix"); paper / tiny the paper's three roles (paper_runs.ROLES) at
# its seeds
DEEP = "quick_deep"
SEEDS8_SCALE = "quick_seeds8"
QUICK_MODEL_SCALES = ("quick", SEEDS8_SCALE, DEEP)   # the quick runs' scales


def seeds(scale: str = "quick") -> tuple[int, ...]:
  """The seeds of the quick runs at a quick-model scale: ``SEEDS``, ``SEEDS8`` at
  quick_seeds8 (the one place the quick trained experiments take their seeds from:
  ``seed_lr_runs.ablation_seeds`` / ``warmup_seeds`` read it)."""
  if scale not in QUICK_MODEL_SCALES:
    raise ValueError(f"the quick runs have the scales {list(QUICK_MODEL_SCALES)}, not {scale!r}")
  return SEEDS8 if scale == SEEDS8_SCALE else SEEDS


SCALES: dict[str, dict[str, Any]] = {
    **{sc: {"runs": {n: [c, *o] for n, (c, o) in RUNS.items()}, "seeds": list(seeds(sc))}
       for sc in ("quick", SEEDS8_SCALE)},
    DEEP: {"runs": {n: [c, *o] for n, (c, o) in RUNS.items()}, "seeds": list(seeds(DEEP)),
           "num_layers": 48, "suffix": "_L48"},
    "paper": {"config": paper_runs.CONFIG, "roles": list(paper_runs.ROLES),
              "seeds": list(paper_runs.SEEDS)},
    "tiny": {"config": paper_runs.CONFIG, "roles": list(paper_runs.ROLES),
             "seeds": list(paper_runs.TINY_SEEDS)},
}


def _collapse_claims(lr: str = "1e-2", low: str = "5e-3"):
  """The collapse study's claims with its learning rates in the items: the quick runs'
  (1e-2, 5e-3) by default, the paper's (8e-4, 6e-4: ``paper_runs``) at paper / tiny."""
  freq = ("(loss, mean of the last 10% of updates - stream L_freq) / L_freq", 0.0,
          Abs(common.NEAR))
  return [
      Claim(f"Post-Norm LR {lr}: loss near L_freq", *freq[:2], freq[2],
            "Sec 4.3: once collapse occurs the loss stays near the frequency loss"),
      Claim(f"Post-Norm LR {lr}: last layer collapsed", "last-layer t_sim at the last update",
            common.ONSET_SIM, Bound(">=", every_seed=True),
            "Sec 4.2: t_sim of the last layer ~1"),
      Claim(f"Post-Norm LR {lr}: early-layer gradients vanish", "||g_1|| / ||g_L|| at the "
            "last update", common.GRAD_COLLAPSE_RATIO, Bound("<", every_seed=True),
            "Sec 4.2 / Fig 5: early-layer gradients orders of magnitude smaller"),
      Claim("Pre-Norm, same LR: no collapse", "last-layer t_sim at the last update",
            common.ONSET_SIM, Bound("<", every_seed=True),
            "Sec 1, 5: Post-Norm is more prone to collapse than Pre-Norm"),
      Claim("Pre-Norm, same LR: loss below the frequency loss", freq[0], -common.NEAR,
            Bound("<"), "Sec 1, 5: Pre-Norm trains where Post-Norm collapses"),
      Claim(f"Post-Norm, lower LR {low}: no collapse (App F.5)", "last-layer t_sim at the "
            "last update", common.ONSET_SIM, Bound("<", every_seed=True),
            "App F.5: at a lower LR Post-Norm trains without collapse"),
      Claim(f"Post-Norm, lower LR {low}: loss below the frequency loss", freq[0], -common.NEAR,
            Bound("<"), "App F.5: trains stably"),
      Claim(f"Post-Norm, lower LR {low}: no early-layer gradient vanishing (App F.5)",
            "||g_1|| / ||g_L|| at the last update", common.GRAD_COLLAPSE_RATIO,
            Bound(">", every_seed=True),
            "App F.5: the control run's 'backward-side quantities also remain stable' "
            "(Figs 21-22 plot gradient contributions, sqrt(d)/||y|| and c; this "
            "layer-gradient ratio is ours)"),
  ]


PAPER_LRS = ("8e-4", "6e-4")     # paper_runs.COLLAPSE_LR, STABLE_LR as the items write them
NEAR_FREQ = ("'stays near' has no number: the paper's Figure 6 (not in our text copy) "
             "is what shows it; ours: the relative gap to L_freq, shown, not judged (the "
             "5% of the collapse alarm would be our band, not the paper's)")
WORDS = [
    ("loss near L_freq", {"where": "Abstract: collapsed runs stay near L_freq",
                          "quote": common.QUOTES["freq_after"], "paper": None,
                          "rule": Qualitative(NEAR_FREQ)}),
    ("Post-Norm LR [^:]*: last layer collapsed", {
        "where": "Sec 4.2: the LR decides collapse", "quote": common.QUOTES["lr_8e4"],
        "ours": True, "note": "'collapses' = last-layer t_sim >= 0.99 at the last update, ours"}),
    ("Post-Norm LR [^:]*: early-layer gradients vanish", {
        "where": "Fig 5", "quote": common.QUOTES["grad_left"], "ours": True,
        "note": "'little gradient' = ||g_1|| / ||g_L|| below 1/100, ours"}),
    ("Pre-Norm, same LR", {"where": "Sec 1: Pre-Norm less prone to collapse",
                           "quote": common.QUOTES["pre_vs_post"], "ours": True}),
    ("lower LR [^:]*: no collapse", {"where": "Sec 4.2: the LR decides collapse",
                                     "quote": common.QUOTES["lr_8e4"], "ours": True}),
    ("lower LR", {"where": "Figs 21-22 (App F.5)", "quote": common.QUOTES["f5_control"],
                  "ours": True}),
]
_QUICK_COLLAPSE = common.words(_collapse_claims(), WORDS)
CLAIMS = claims(_QUICK_COLLAPSE + [c for c in common.words(_collapse_claims(*PAPER_LRS), WORDS)
                                   if c not in _QUICK_COLLAPSE])


def deep_overrides(scale: str) -> list[str]:
  """The overrides a quick-model scale adds to every run (quick_deep: its depth)."""
  layers = SCALES.get(scale, {}).get("num_layers")
  return [f"model.num_layers={layers}"] if layers else []


def train_run(name: str, out_dir: str, overrides: list[str] | None = None,
              config: str | None = None, scale: str = "quick") -> str:
  """Trains run ``name`` (resumes/skips when its workdir already finished); returns
  the workdir. ``scale`` quick_deep: at its ``num_layers``, in ``runs/<name><suffix>``."""
  from rankjax.train import train   # (registers "postnorm", "postnorm_sublayer_norms")
  cfg_name, extra = {**RUNS, **SEED_RUNS, **WINDOW_RUNS}.get(name, (config, []))
  cfg = common.load_config(cfg_name, extra + list(overrides or []) + deep_overrides(scale))
  workdir = os.path.join(out_dir, "runs", name + SCALES.get(scale, {}).get("suffix", ""))
  done = os.path.join(workdir, "checkpoints", str(cfg.total_steps))
  saved = os.path.join(workdir, "config.json")
  if os.path.isdir(done) and os.path.isfile(saved):
    from rankjax.config import TrainConfig, from_json
    if from_json(TrainConfig, saved) == cfg:
      return workdir    # finished with this config: skip building and compiling the step
  train(cfg, workdir, progress_bar=False)
  return workdir


def stream_frequency_loss(cfg, num_batches: int = STREAM_FREQ_BATCHES) -> float:
  """Frequency loss of the labels of ``num_batches`` training batches (Def 3.7,
  aggregated; Sec 4.3's "full training" reference at quick scale)."""
  from rankjax.measure import frequency_loss
  from rankjax.train import make_data_iterator, make_task
  task = make_task(cfg)
  it = make_data_iterator(cfg, task)
  labels = np.concatenate([np.asarray(next(it)["targets"]).reshape(-1)
                           for _ in range(num_batches)])
  return float(frequency_loss(labels, vocab_size=cfg.model.vocab_size))


def scale_stream_frequency(cfg, scale: str, out_dir: str) -> tuple[float, int]:
  """(stream frequency loss, batches pooled) at paper / tiny scale: Sec 4.3's 500M tokens
  of the stream (``PAPER_FREQ_TOKENS``) at paper, ``STREAM_FREQ_BATCHES`` batches at tiny.
  Computed once per output folder (``stream_freq_SCALE.json``): collapse, fig6 and sec43
  share it, and at paper it reads and tokenizes 500M tokens of C4."""
  import json
  batches = (-(-PAPER_FREQ_TOKENS // (cfg.batch_size * cfg.seq_len)) if scale == "paper"
             else STREAM_FREQ_BATCHES)
  key = {"dataset": cfg.dataset, "data_dir": cfg.data_dir, "tokenizer": cfg.tokenizer,
         "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "seed": cfg.seed,
         "batches": batches}
  path = os.path.join(out_dir, f"stream_freq_{scale}.json")
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved["key"] == key:
      return saved["stream_freq_loss"], batches
  freq = stream_frequency_loss(cfg, batches)
  os.makedirs(out_dir, exist_ok=True)
  with open(path, "w") as f:
    json.dump({"key": key, "stream_freq_loss": freq}, f)
  return freq, batches


def summarize(workdir: str, stream_freq: float) -> dict[str, Any]:
  from rankjax.train import load_run, summarize_run
  r = load_run(workdir)
  s = summarize_run(r.diagnostics, r.diagnostic_steps, stream_freq_loss=stream_freq)
  losses = np.array([h["loss"] for h in r.history if "loss" in h and h.get("kind", "train") == "train"])
  tail = losses[-max(len(losses) // 10, 1):]
  s["final_loss_last10pct_mean"] = float(tail.mean())
  s["min_loss"] = float(losses.min())
  s["loss_minus_stream_freq"] = float(tail.mean() - stream_freq)
  gn = r.diagnostics["postnorm/grad_norm"]
  s["grad_ratio_first_over_last_at_start"] = float(gn[0, 0] / gn[0, -1])
  s["max_last_tsim"] = float(np.max(r.diagnostics["postnorm/last_tsim"]))
  s["learning_rate"] = r.config.learning_rate
  s["warmup_steps"] = r.config.warmup_steps
  s["norm_position"] = r.config.model.norm_position
  return s


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Trains (or reuses) the three runs at every seed and writes ``collapse_study.json``
  (quick_deep: ``collapse_study_quick_deep.json``, its runs ``SCALES[DEEP]``; paper /
  tiny: the paper's runs, ``paper_runs``)."""
  if scale in ("paper", "tiny"):
    return run_paper(out_dir, scale)
  if scale not in QUICK_MODEL_SCALES:
    raise ValueError(f"collapse_study has the scales {list(SCALES)}, not {scale!r}")
  start = time.time()
  seeds_at = seeds(scale)
  out: dict[str, Any] = {"figure": "postnorm_collapse quick collapse study (Sec 4.2-4.3)"
                                   + {DEEP: ", 48 layers", SEEDS8_SCALE: ", 8 seeds"
                                      }.get(scale, ""),
                         "scale": scale, "runs": {}}
  if scale != "quick":
    out["settings"] = {**SCALES[scale], "overrides": deep_overrides(scale)}
  freq = None
  for name in RUNS:
    t0 = time.time()
    wd = train_run(name, out_dir, scale=scale)
    if freq is None:
      freq = stream_frequency_loss(common.load_config(RUNS[name][0]))
    out["runs"][name] = {**summarize(wd, freq), "workdir": wd, "seconds": time.time() - t0}
  # the same three runs at the other seeds (the rows judge all of the scale's seeds)
  out["seeds"] = list(seeds_at)
  out["by_seed"] = {name: {"0": {k: out["runs"][name][k] for k in SEED_KEYS}} for name in RUNS}
  for name in RUNS:
    for seed in seeds_at[1:]:
      s = summarize(train_run(seeded_name(name, seed), out_dir, scale=scale), freq)
      out["by_seed"][name][str(seed)] = {k: s[k] for k in SEED_KEYS}
  out["stream_freq_loss"] = freq
  out["seconds"] = time.time() - start
  common.write_json(out_dir, "collapse_study.json" if scale == "quick"
                    else f"collapse_study_{scale}.json", out)
  out["measured"] = measurements(out)
  return out


def run_paper(out_dir: str, scale: str) -> dict[str, Any]:
  """The three roles at the paper's learning rates (``paper_runs.ROLES``: Post-Norm 8e-4,
  Pre-Norm 8e-4, Post-Norm 6e-4) and ``paper_runs.SEEDS``, against the frequency loss of
  the stream's labels (Sec 4.3: 500M tokens at paper scale, ``STREAM_FREQ_BATCHES``
  batches at tiny); the result has the quick run's shape (``by_seed[role][seed]``)."""
  start = time.time()
  seeds = paper_runs.seeds(scale)
  cfg = paper_runs.config(paper_runs.post_collapse(seeds[0]), scale)
  freq, batches = scale_stream_frequency(cfg, scale, out_dir)
  out: dict[str, Any] = {"figure": f"postnorm_collapse collapse study (Sec 4.2-4.3, App F.5), "
                                   f"{scale} scale", "scale": scale, "runs": {},
                         "seeds": list(seeds), "by_seed": {}, "stream_freq_loss": freq,
                         "stream_freq_batches": batches,
                         "settings": {"config": paper_runs.CONFIG,
                                      "runs": {n: list(o) for n, o in paper_runs.RUNS.items()}}}
  for role, name_of in paper_runs.ROLES.items():
    out["by_seed"][role] = {}
    for seed in seeds:
      wd = paper_runs.train(out_dir, name_of(seed), scale)
      s = summarize(wd, freq)
      if seed == seeds[0]:
        out["runs"][role] = {**s, "workdir": wd}
      out["by_seed"][role][str(seed)] = {k: s[k] for k in SEED_KEYS}
  out["seconds"] = time.time() - start
  common.write_json(out_dir, "collapse_study.json", out)
  out["measured"] = measurements(out)
  return out


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: every seed's value of each claim of ``CLAIMS`` (the quick
  LRs' items at quick and quick_deep, the paper's at paper / tiny)."""
  by, freq = res["by_seed"], res["stream_freq_loss"]
  lr, low = ("1e-2", "5e-3") if res.get("scale", "quick") in QUICK_MODEL_SCALES else PAPER_LRS
  seeds = [int(s) for s in by["post_collapse"]]
  note = f"seeds {seeds}; stream L_freq {freq:.4f}"
  get = lambda run, key: [common.num(by[run][str(s)][key]) for s in seeds]
  rel = lambda run: [g / freq for g in get(run, "loss_minus_stream_freq")]
  spec = [(f"Post-Norm LR {lr}: loss near L_freq", rel("post_collapse")),
          (f"Post-Norm LR {lr}: last layer collapsed", get("post_collapse", "final_last_tsim")),
          (f"Post-Norm LR {lr}: early-layer gradients vanish",
           get("post_collapse", "final_grad_ratio_first_over_last")),
          ("Pre-Norm, same LR: no collapse", get("pre_same_lr", "final_last_tsim")),
          ("Pre-Norm, same LR: loss below the frequency loss", rel("pre_same_lr")),
          (f"Post-Norm, lower LR {low}: no collapse (App F.5)",
           get("post_stable", "final_last_tsim")),
          (f"Post-Norm, lower LR {low}: loss below the frequency loss", rel("post_stable")),
          (f"Post-Norm, lower LR {low}: no early-layer gradient vanishing (App F.5)",
           get("post_stable", "final_grad_ratio_first_over_last"))]
  return [measured(item, v, seeds=seeds, note=note) for item, v in spec]
