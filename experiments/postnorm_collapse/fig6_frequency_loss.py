"""Figure 6 of the Post-Norm collapse paper: loss after collapse vs the frequency loss.

Left panel (no warmup), three label scopes, each with the frequency loss (Def 3.7,
aggregated labels) of the same label collection:
  * full stream: the collapsing run of ``collapse_study`` against the frequency loss
    of ``STREAM_FREQ_BATCHES`` training batches;
  * one batch: the same config trained on one fixed batch, against that batch's
    frequency loss;
  * one sequence: trained on one fixed sequence (batch size 1).
Right panel: Post-Norm runs with warmup at three learning rates, against the stream's
frequency loss. As in the paper (Sec 4.3 and App F.4 both use 1.2e-3 / 1.5e-3 /
1.8e-3), they are the same three runs as Figs 12-20: ``seed_lr_runs.ABLATION_LRS``
(trained once, shared with ``fig12_fig20_lr_ablation``), and the first (preregistered)
set ``seed_lr_runs.ORIGINAL_FIG6_LRS`` beside them. Every scope and every warmup run is
measured at seeds 0, 1, 2 (``collapse_study.seeds``, ``seed_lr_runs.ablation_seeds``;
0-7 at ``--scale quick_seeds8``, ``fig6_quick_seeds8.json``); the figure shows seed 0.

The one-batch / one-sequence runs use the training step ``rankjax.train.make_step`` on
a fixed batch, the same update as ``rankjax train``. At paper / tiny scale the runs are
the paper's (``paper_runs``, :func:`run_paper`).

``CLAIMS``: each scope's loss, and each warmup run's, stays near the frequency loss of
its labels (``common.NEAR``).

Run:  rankjax reproduce postnorm_collapse --only fig6
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

from . import common
from . import collapse_study
from . import paper_runs
from . import seed_lr_runs as sl
from rankjax import studies
from rankjax.studies import Abs, Claim, Qualitative, claims, measured

FIXED_STEPS = 150
WARMUP_STEPS = sl.WARMUP_STEPS
WARMUP_TOTAL = sl.WARMUP_TOTAL
WARMUP_LRS = sl.ABLATION_LRS   # the paper's Fig 6-right LRs are its Figs 12-20 LRs
# Fig 6-right's first LR set (the preregistered one): the headline rows;
# WARMUP_LRS replaced it after its 1e-2 run did not collapse (rows beside, labelled)
ORIGINAL_LRS = sl.ORIGINAL_FIG6_LRS
# the seeds: the full stream (the post_collapse runs), one batch and one sequence at
# collapse_study.seeds(scale); the warmup runs of Fig 6-right (both LR sets) at
# seed_lr_runs.ablation_seeds(scale) (0, 1, 2 at quick; 0-7 at quick_seeds8)
SCALES: dict[str, dict[str, Any]] = {
    **{sc: {"config": collapse_study.RUNS["post_collapse"][0],
            "seeds": list(collapse_study.seeds(sc)), "warmup_lrs": list(WARMUP_LRS),
            "original_lrs": list(ORIGINAL_LRS), "warmup_seeds": list(sl.ablation_seeds(sc))}
       for sc in ("quick", collapse_study.SEEDS8_SCALE)},
    "paper": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.SEEDS),
              "warmup_lrs": list(paper_runs.ABLATION_LRS)},
    "tiny": {"config": paper_runs.CONFIG, "seeds": list(paper_runs.TINY_SEEDS),
             "warmup_lrs": list(paper_runs.ABLATION_LRS)},
}

SCOPES = {"full_stream": "full training stream (256 batches)",
          "one_batch": "one fixed batch (16 x 64)", "one_sequence": "one fixed sequence (64)"}
PAPER_SCOPES = {"full_stream": "full training stream", "one_batch": "one fixed batch",
                "one_sequence": "one fixed sequence"}
_GAP = "(loss, mean of the last 20% of updates - L_freq of the label collection) / L_freq"
NEAR = ("'approach' / 'stay near' the frequency loss has no number: the paper's Figure 6 "
        "(not in our text copy) is what shows it; ours: fig6.png and the relative gap to "
        "L_freq, shown, not judged (5% would be our band, not the paper's)")
CLAIMS = claims(common.words(
    [Claim(f"Fig 6 left, {v}: loss near its L_freq", _GAP, 0.0, Abs(common.NEAR),
           "Sec 4.3: after collapse each loss stays near the frequency loss of its labels")
     for v in SCOPES.values()]
    + [Claim(f"Fig 6 right, LR {lr:g}: loss near L_freq", _GAP, 0.0, Abs(common.NEAR),
             "Fig 6 right: the warmup runs collapse and stay near L_freq; the first "
             "(preregistered) LR set 1e-2, 1.5e-2, 2e-2") for lr in sl.ORIGINAL_FIG6_LRS]
    + [Claim(f"Fig 6 right, swapped set, LR {lr:g}: loss near L_freq", _GAP, 0.0,
             Abs(common.NEAR), "Fig 6 right; " + common.AFTER_OUTCOME + ": LR set swapped to "
             "the Figs 12-20 set after the 1e-2 run did not collapse") for lr in sl.ABLATION_LRS]
    # paper / tiny: the paper's runs (paper_runs)
    + [Claim(f"Fig 6 left (the paper's runs), {v}: loss near its L_freq", _GAP, 0.0,
             Abs(common.NEAR),
             "Sec 4.3: after collapse each loss stays near the frequency loss of its labels")
       for v in PAPER_SCOPES.values()]
    + [Claim(f"Fig 6 right, LR {lr:g}: loss near L_freq", _GAP, 0.0, Abs(common.NEAR),
             "Fig 6 right: the paper's warmup runs at 1.2e-3, 1.5e-3, 1.8e-3 collapse and stay "
             "near L_freq") for lr in paper_runs.ABLATION_LRS], [
    (r"swapped set", {"where": "Fig 6 right", "quote": common.QUOTES["fig6_right"],
                      "paper": None, "rule": Qualitative(NEAR), "kind": "sensitivity",
                      "post_hoc": "LR set swapped to the Figs 12-20 set after the 1e-2 run "
                                  "did not collapse (issue 25 item 5)"}),
    (r"Fig 6 left", {"where": "Fig 6 left", "quote": common.QUOTES["fig6_left"],
                     "paper": None, "rule": Qualitative(NEAR)}),
    (r"Fig 6 right", {"where": "Fig 6 right", "quote": common.QUOTES["fig6_right"],
                      "paper": None, "rule": Qualitative(NEAR)}),
]))


def original_run_name(lr: float, seed: int = 0) -> str:
  """Fig 6-right's first set: the warmup runs. It logged every 10 updates; the
  diagnostics interval does not change training (Figs 10-11's ``diag_interval_check``),
  so 1.5e-2 and 2e-2 read the per-update runs already trained (the Figs 10-11 runs and
  the ablation runs) and only 1e-2 has its own runs, logged every 10."""
  if lr == sl.MAIN_WARMUP_LR or lr in sl.ABLATION_LRS:
    return sl.warmup_run_name(lr, seed)
  return sl.diag10_run_name(lr, seed)


def fixed_batch_run(cfg, batch_size: int, steps: int, seed: int = 0) -> dict[str, Any]:
  """Trains ``cfg`` at ``seed`` (init and the batch drawn) on one fixed batch of
  ``batch_size`` sequences; loss per step."""
  from rankjax.config import override
  from rankjax.measure import frequency_loss
  from rankjax.train import (
      make_data_iterator,
      make_init,
      make_optimizer,
      make_step,
      make_task,
  )
  cfg = override(cfg, [f"batch_size={batch_size}", f"total_steps={steps}",
                       "diag_every=0", f"seed={seed}",
                       f"grad_accum={min(cfg.grad_accum, batch_size)}"])
  task = make_task(cfg)
  batch = next(make_data_iterator(cfg, task))
  batch = jax.tree.map(lambda x: np.asarray(x).reshape(cfg.grad_accum, -1, *x.shape[1:]),
                       batch)                                     # (accum, B / accum, T)
  tx = make_optimizer(cfg, task.stacked_roots)
  state = jax.jit(make_init(task, tx, cfg.seed))()
  step = jax.jit(make_step(task, cfg, tx))
  losses = []
  for _ in range(steps):
    state, metrics, _ = step(state, batch)
    losses.append(metrics["loss"])
  losses = [float(x) for x in jax.device_get(losses)]
  return {"loss": losses, "freq_loss": float(frequency_loss(batch["targets"],
                                                            vocab_size=cfg.model.vocab_size)),
          "tokens": int(np.prod(batch["targets"].shape))}


def warmup_curve(r) -> dict[str, Any]:
  """A loaded run's training loss curve and its last-layer t_sim at the end."""
  h = [x for x in r.history if x.get("kind", "train") == "train"]
  return {"step": [x["step"] for x in h], "loss": [x["loss"] for x in h],
          "last_tsim_final": float(r.diagnostics["postnorm/last_tsim"][-1])}


def stream_gap(curve: dict[str, Any], stream_freq: float) -> dict[str, float]:
  """A warmup run's tail loss against the stream's frequency loss."""
  t = _tail(curve["loss"])
  return {"final_loss_tail_mean": t, "freq_loss": stream_freq, "gap": t - stream_freq,
          "relative_gap": (t - stream_freq) / stream_freq,
          "last_tsim_final": curve["last_tsim_final"]}


def seed_gaps(curves: dict[int, dict[str, Any]], stream_freq: float) -> dict[str, Any]:
  """:func:`stream_gap` of each seed's warmup run, as lists in seed order."""
  gaps = {seed: stream_gap(c, stream_freq) for seed, c in curves.items()}
  return {"seeds": list(gaps), "freq_loss": stream_freq,
          **{k: [g[k] for g in gaps.values()]
             for k in ("final_loss_tail_mean", "gap", "relative_gap", "last_tsim_final")}}


def scope_gaps(by_seed: dict[str, dict[int, Any]]) -> dict[str, Any]:
  """Per label scope (full stream, one batch, one sequence): each seed's tail loss
  against the frequency loss of its own labels."""
  ours: dict[str, Any] = {}
  for k, runs in by_seed.items():
    tails = [_tail(v["loss"]) for v in runs.values()]
    freqs = [v["freq_loss"] for v in runs.values()]
    ours[k] = {"seeds": list(runs), "final_loss_tail_mean": tails, "freq_loss": freqs,
               "gap": [t - f for t, f in zip(tails, freqs)],
               "relative_gap": [(t - f) / f for t, f in zip(tails, freqs)],
               "label_tokens": next(iter(runs.values()))["tokens"]}
  return ours


def figure(left: dict, right: dict, stream_freq: float, path: str, scale: str,
           right_title: str) -> None:
  """Fig 6: left, the no-warmup scopes against their frequency losses (dashed); right,
  the warmup runs against the stream's."""
  plt = common.pyplot()
  fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
  for i, (k, v) in enumerate(left.items()):
    x = v.get("step", np.arange(1, len(v["loss"]) + 1))
    ax[0].plot(x, v["loss"], color=f"C{i}", lw=0.8, label=k)
    ax[0].axhline(v["freq_loss"], color=f"C{i}", ls="--", lw=0.8)
  ax[0].set(title="no warmup: loss vs frequency loss (dashed)", xlabel="step", ylabel="loss")
  ax[0].legend(fontsize=7)
  for i, (lr, v) in enumerate(right.items()):
    ax[1].plot(v["step"], v["loss"], color=f"C{i}", lw=0.8, label=f"lr {lr}")
  ax[1].axhline(stream_freq, color="k", ls="--", lw=0.8, label="stream frequency loss")
  ax[1].set(title=right_title, xlabel="step")
  ax[1].legend(fontsize=7)
  fig.suptitle(f"Fig 6 ({scale})", fontsize=9)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  studies.save_figure(fig, path, dpi=110)
  plt.close(fig)


def _tail(x) -> float:
  x = np.asarray(x)
  return float(x[-max(len(x) // 5, 1):].mean())


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Fig 6 at quick scale (paper / tiny: :func:`run_paper`); writes ``fig6.json`` and
  ``fig6.png`` (quick_seeds8, every seed set 0-7: ``fig6_quick_seeds8.json`` / ``.png``)."""
  if scale in ("paper", "tiny"):
    return run_paper(out_dir, scale)
  if scale not in SCALES:
    raise ValueError(f"fig6 has the scales {list(SCALES)}, not {scale!r}")
  from rankjax.train import load_run
  start = time.time()
  seeds, warmup_seeds = collapse_study.seeds(scale), sl.ablation_seeds(scale)
  tag = "" if scale == "quick" else f"_{scale}"
  base = collapse_study.RUNS["post_collapse"][0]
  cfg = common.load_config(base)
  stream_freq = collapse_study.stream_frequency_loss(cfg)
  by_seed: dict[str, dict[str, Any]] = {"full_stream": {}, "one_batch": {}, "one_sequence": {}}
  for seed in seeds:
    wd = collapse_study.train_run(collapse_study.seeded_name("post_collapse", seed), out_dir)
    hist = [h for h in load_run(wd).history if h.get("kind", "train") == "train"]
    by_seed["full_stream"][seed] = {
        "step": [h["step"] for h in hist], "loss": [h["loss"] for h in hist],
        "freq_loss": stream_freq,
        "tokens": collapse_study.STREAM_FREQ_BATCHES * cfg.batch_size * cfg.seq_len}
    by_seed["one_batch"][seed] = fixed_batch_run(cfg, cfg.batch_size, FIXED_STEPS, seed)
    by_seed["one_sequence"][seed] = fixed_batch_run(cfg, 1, FIXED_STEPS, seed)
  left = {k: v[seeds[0]] for k, v in by_seed.items()}     # the figure shows seed 0
  right, right_original = {}, {}     # lr -> seed -> curve
  ours = scope_gaps(by_seed)
  for lrs, panel, prefix, name_of in (
      (WARMUP_LRS, right, "warmup_lr", sl.warmup_run_name),
      (ORIGINAL_LRS, right_original, "original_warmup_lr", original_run_name)):
    for lr in lrs:
      panel[f"{lr:g}"] = {seed: warmup_curve(load_run(sl.train(name_of(lr, seed), out_dir)))
                          for seed in warmup_seeds}
      ours[f"{prefix}{lr:g}"] = seed_gaps(panel[f"{lr:g}"], stream_freq)
  # the figure and the results file keep seed 0's curves (the gaps above are per seed)
  right, right_original = ({lr: v[warmup_seeds[0]] for lr, v in p.items()}
                           for p in (right, right_original))
  figure(left, right, stream_freq, os.path.join(out_dir, f"fig6{tag}.png"), scale,
         f"warmup {WARMUP_STEPS} steps")
  result = {"figure": "postnorm_collapse Fig 6 (Sec 4.3)", "scale": scale,
            "settings": {"config": base, "fixed_steps": FIXED_STEPS,
                         "warmup_steps": WARMUP_STEPS, "warmup_total": WARMUP_TOTAL,
                         "warmup_lrs": list(WARMUP_LRS), "original_lrs": list(ORIGINAL_LRS),
                         "seeds": list(seeds), "warmup_seeds": list(warmup_seeds),
                         "stream_freq_batches": collapse_study.STREAM_FREQ_BATCHES},
            "paper": {"claim": "after collapse each loss stays near the frequency loss of its "
                               "label collection (aggregated labels)"},
            "ours": ours, "seconds": time.time() - start}
  common.write_json(out_dir, f"fig6{tag}.json", {**result, "left": left, "right": right,
                                           "right_original": right_original})
  result["measured"] = measurements(result)
  return result


# paper / tiny: updates of the one-batch / one-sequence runs (the paper does not say; the
# warmup of the paper's schedule, 2000, fixed before any run), and at tiny the tiny runs'
PAPER_FIXED_STEPS = 2000


def run_paper(out_dir: str, scale: str) -> dict[str, Any]:
  """Fig 6 from the paper's runs (``paper_runs``): left, the no-warmup run on the full
  stream (Post-Norm 8e-4) beside the same config on one fixed batch and on one fixed
  sequence, at every seed, each against the frequency loss of its labels (Sec 4.3: 500M
  tokens of the stream at paper scale); right, the ablation runs at 1.2e-3, 1.5e-3,
  1.8e-3 against the stream's frequency loss."""
  from rankjax.train import load_run
  start = time.time()
  seeds = paper_runs.seeds(scale)
  cfg = paper_runs.config(paper_runs.post_nowarmup(seeds[0]), scale)
  stream_freq, batches = collapse_study.scale_stream_frequency(cfg, scale, out_dir)
  steps = PAPER_FIXED_STEPS if scale == "paper" else studies.TINY_STEPS
  by_seed: dict[str, dict[int, Any]] = {"full_stream": {}, "one_batch": {}, "one_sequence": {}}
  for seed in seeds:
    name = paper_runs.post_nowarmup(seed)
    hist = [h for h in load_run(paper_runs.train(out_dir, name, scale)).history
            if h.get("kind", "train") == "train"]
    by_seed["full_stream"][seed] = {
        "step": [h["step"] for h in hist], "loss": [h["loss"] for h in hist],
        "freq_loss": stream_freq, "tokens": batches * cfg.batch_size * cfg.seq_len}
    seed_cfg = paper_runs.config(name, scale)
    by_seed["one_batch"][seed] = fixed_batch_run(seed_cfg, seed_cfg.batch_size, steps, seed)
    by_seed["one_sequence"][seed] = fixed_batch_run(seed_cfg, 1, steps, seed)
  ours = scope_gaps(by_seed)
  right = {}
  for lr in paper_runs.ABLATION_LRS:
    right[f"{lr:g}"] = warmup_curve(load_run(paper_runs.train(out_dir, paper_runs.ablation(lr),
                                                              scale)))
    ours[f"warmup_lr{lr:g}"] = stream_gap(right[f"{lr:g}"], stream_freq)
  left = {k: v[seeds[0]] for k, v in by_seed.items()}
  figure(left, right, stream_freq, os.path.join(out_dir, f"fig6_{scale}.png"), scale,
         "the paper's warmup")
  result = {"figure": f"postnorm_collapse Fig 6 (Sec 4.3), {scale} scale", "scale": scale,
            "settings": {"config": paper_runs.CONFIG, "fixed_steps": steps,
                         "seeds": list(seeds), "stream_freq_batches": batches,
                         "warmup_lrs": list(paper_runs.ABLATION_LRS),
                         "no_warmup_lr": paper_runs.COLLAPSE_LR},
            "paper": {"claim": "after collapse each loss stays near the frequency loss of its "
                               "label collection (aggregated labels)"},
            "ours": ours, "seconds": time.time() - start}
  common.write_json(out_dir, f"fig6_{scale}.json", {**result, "left": left, "right": right})
  result["measured"] = measurements(result)
  return result


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: each scope's and each warmup run's relative gap to its
  frequency loss (per seed where the run has seeds), the values of ``CLAIMS``."""
  o = res["ours"]
  if res.get("scale", "quick") in ("paper", "tiny"):
    st = res["settings"]
    note = (f"no warmup, LR {st['no_warmup_lr']:g} (the paper does not give it), fixed-label "
            f"runs {st['fixed_steps']} updates; {res['scale']} scale")
    rows = [measured(f"Fig 6 left (the paper's runs), {v}: loss near its L_freq",
                     o[k]["relative_gap"], seeds=o[k]["seeds"], note=note)
            for k, v in PAPER_SCOPES.items()]
    return rows + [measured(
        f"Fig 6 right, LR {lr:g}: loss near L_freq", o[f"warmup_lr{lr:g}"]["relative_gap"],
        note=f"seed 0; last-layer t_sim at the end {o[f'warmup_lr{lr:g}']['last_tsim_final']:.3f}")
        for lr in paper_runs.ABLATION_LRS]
  rows = [measured(f"Fig 6 left, {v}: loss near its L_freq", o[k]["relative_gap"],
                   seeds=o[k]["seeds"], note="no warmup, LR 1e-2, 150 updates")
          for k, v in SCOPES.items()]
  right = [(f"original_warmup_lr{lr:g}", f"Fig 6 right, LR {lr:g}")
           for lr in sl.ORIGINAL_FIG6_LRS]
  right += [(f"warmup_lr{lr:g}", f"Fig 6 right, swapped set, LR {lr:g}")
            for lr in sl.ABLATION_LRS]
  for key, item in right:
    v = o[key]
    tsim = ", ".join(f"{t:.3f}" for t in v["last_tsim_final"])
    rows.append(measured(f"{item}: loss near L_freq", v["relative_gap"], seeds=v["seeds"],
                         note=f"last-layer t_sim at the end, per seed: {tsim}"))
  return rows
