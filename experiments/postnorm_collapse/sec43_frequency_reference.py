"""Sec 4.3 of the Post-Norm collapse paper: which frequency loss the collapsed loss meets.

Theorem 3.8's frequency loss (Def 3.7) is for one label collection. For many sequences
the paper considers (Sec 4.3) "aggregate": pool the labels of all sequences and take
the entropy of the pooled histogram; "per sequence": each sequence's own frequency
loss, averaged. "In our experiments, the first one matches the post-collapse training
loss more closely". We measure both against the training loss of every update after
the collapse onset, for the collapse study's ``post_collapse`` run (no warmup) and the
three warmup runs of Fig 6-right / Figs 12-20. The training loss of update ``t`` is the
loss of batch ``t`` (16 sequences x 64 labels), replayed from the data iterator, so
per update there are three references:

* ``aggregate_stream``: labels of ``collapse_study.STREAM_FREQ_BATCHES`` batches pooled
  (the Fig 6 reference; constant);
* ``aggregate_batch``: the labels of batch ``t`` pooled (1024 labels);
* ``per_sequence_batch``: the mean of the 16 per-sequence frequency losses of batch ``t``
  (64 labels each; never above ``aggregate_batch``, concavity of entropy).

A network that collapses every sequence to one vector of its own could reach
``per_sequence_batch``; one whose output ignores the input reaches at best
``aggregate_batch`` on batch ``t``, and ``aggregate_stream`` on average.

At ``--scale paper`` / ``tiny`` the runs are the paper's (``paper_runs``: Post-Norm 8e-4
at its seeds, the no-warmup run at its seeds, the App F.4 ablation rates), and the
per-batch references come from the step itself (``label_frequency``: each update's
labels pooled and per sequence, in metrics.jsonl) instead of replaying 40000 batches of
C4; ``aggregate_stream`` pools ``collapse_study.PAPER_FREQ_TOKENS`` of the stream (Fig 6's
reference at that scale).

``CLAIMS``: for each run (every seed), the aggregate stream reference is closer to the
loss after the onset than the per-sequence one.

Run:  rankjax reproduce postnorm_collapse --only sec43
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from . import collapse_study, common, fig3_fig5_transition, paper_runs
from . import seed_lr_runs as sl
from rankjax.studies import Bound, Claim, claims, measured

REFERENCES = ("aggregate_stream", "aggregate_batch", "per_sequence_batch")


def batch_references(cfg, num_updates: int) -> dict[str, np.ndarray]:
  """Per update ``t = 1..num_updates``: aggregate and per-sequence frequency loss of
  the batch the run trained on at ``t`` (the data iterator replayed from the start)."""
  from rankjax.measure import frequency_loss
  from rankjax.train import make_data_iterator, make_task
  it = make_data_iterator(cfg, make_task(cfg))
  agg, per = [], []
  for _ in range(num_updates):
    y = np.asarray(next(it)["targets"])
    agg.append(float(frequency_loss(y, vocab_size=cfg.model.vocab_size)))
    per.append(float(frequency_loss(y, mode="per_sequence", vocab_size=cfg.model.vocab_size)))
  return {"aggregate_batch": np.asarray(agg), "per_sequence_batch": np.asarray(per)}


LOGGED = {"aggregate_batch": "label_freq_aggregate",
          "per_sequence_batch": "label_freq_per_sequence"}   # label_frequency's metrics


def compare(workdir: str, stream_freq: float) -> dict[str, Any]:
  """Training loss after the collapse onset against the three references; the
  per-batch ones from the run's metrics when it logged them (``label_frequency``), else
  from its data iterator replayed."""
  from rankjax.train import load_run
  r = load_run(workdir)
  hist = [h for h in r.history if h.get("kind", "train") == "train" and "loss" in h]
  steps = np.asarray([h["step"] for h in hist])
  loss = np.asarray([h["loss"] for h in hist])
  idx = fig3_fig5_transition.collapse_onset(np.ravel(r.diagnostics["postnorm/last_tsim"]))
  onset = None if idx is None else int(r.diagnostic_steps[idx])
  if r.config.label_frequency:
    refs = {ref: np.asarray([h[key] for h in hist]) for ref, key in LOGGED.items()}
  else:
    refs = batch_references(r.config, int(steps.max()))
    refs = {k: v[steps - 1] for k, v in refs.items()}
  refs["aggregate_stream"] = np.full(loss.shape, stream_freq)
  after = steps >= onset if onset is not None else np.zeros(loss.shape, bool)
  out: dict[str, Any] = {"onset_step": onset, "updates_after_onset": int(after.sum())}
  if not after.any():
    return out
  for name in REFERENCES:
    gap = loss[after] - refs[name][after]
    out[name] = {"mean_gap": float(gap.mean()), "mean_abs_gap": float(np.abs(gap).mean()),
                 "mean_reference": float(refs[name][after].mean())}
  out["mean_loss_after_onset"] = float(loss[after].mean())
  out["closest"] = min(REFERENCES, key=lambda n: out[n]["mean_abs_gap"])
  return out


def paper_run_groups(scale: str) -> dict[str, tuple[str, ...]]:
  """Sec 4.3's runs at paper / tiny scale, by role: ``paper_runs`` names per seed."""
  seeds = paper_runs.seeds(scale)
  return {"post_collapse": tuple(map(paper_runs.post_collapse, seeds)),
          "post_nowarmup": tuple(map(paper_runs.post_nowarmup, seeds)),
          **{f"warmup_lr{lr:g}": (paper_runs.ablation(lr),) for lr in paper_runs.ABLATION_LRS}}


def row_runs(scale: str = "quick") -> dict[str, tuple[str, tuple[str, ...]]]:
  """role -> (label, the runs (one per seed)) of each Sec 4.3 row: the quick runs (at
  ``collapse_study.seeds`` and ``seed_lr_runs.ablation_seeds``: 0, 1, 2 at quick, 0-7 at
  quick_seeds8), or the paper's (:func:`paper_run_groups`) at paper / tiny."""
  if scale in ("paper", "tiny"):
    groups = paper_run_groups(scale)
    labels = {"post_collapse": f"Post-Norm LR {collapse_study.PAPER_LRS[0]} (the paper's run)",
              "post_nowarmup": f"no warmup, LR {collapse_study.PAPER_LRS[0]}",
              **{f"warmup_lr{lr:g}": f"warmup, LR {lr:g}" for lr in paper_runs.ABLATION_LRS}}
    return {role: (labels[role], names) for role, names in groups.items()}
  return {"post_collapse": ("no warmup, LR 1e-2", tuple(
      collapse_study.seeded_name("post_collapse", s) for s in collapse_study.seeds(scale))),
          **{f"warmup_lr{lr:g}": (f"warmup, LR {lr:g}", tuple(
              collapse_study.seeded_name(f"warmup_lr{lr:g}", s)
              for s in sl.ablation_seeds(scale)))
             for lr in sl.ABLATION_LRS}}


SCALES: dict[str, dict[str, Any]] = {
    scale: {"runs": {role: list(names) for role, (_, names) in row_runs(scale).items()}}
    for scale in ("quick", collapse_study.SEEDS8_SCALE, "paper", "tiny")}
CLAIMS = claims(
    [Claim(f"Sec 4.3, {label}: the aggregate reference is the closer one",
           "mean |loss - aggregate stream L_freq| - mean |loss - per-sequence L_freq|, "
           "updates after the onset", 0.0, Bound("<", every_seed=True),
           "Sec 4.3: the aggregate frequency loss matches the post-collapse loss more "
           "closely than the mean per-sequence one; an ordering in every run",
           where="Sec 4.3", quote=common.QUOTES["sec43"])
     for label in dict.fromkeys(label for scale in ("quick", "paper")
                                for label, _ in row_runs(scale).values())])


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: per row of :func:`row_runs`, each seed's mean |gap| to the
  aggregate stream reference minus that to the per-sequence one (NaN: no onset)."""
  o, rows = res["ours"], []
  for label, names in row_runs(res.get("scale", "quick")).values():
    vals = []
    for n in names:
      v = o.get(n, {})
      vals.append(v["aggregate_stream"]["mean_abs_gap"] - v["per_sequence_batch"]["mean_abs_gap"]
                  if "aggregate_stream" in v else math.nan)
    seeds = list(range(len(names))) if len(names) > 1 else None
    rows.append(measured(f"Sec 4.3, {label}: the aggregate reference is the closer one",
                         vals, seeds=seeds,
                         note="seed 0 only" if seeds is None else f"seeds {seeds}"))
  return rows


def run_paper(out_dir: str, scale: str) -> dict[str, Any]:
  """The comparison on the paper's runs (trained by the runner first); ``sec43_SCALE.json``."""
  start = time.time()
  groups = paper_run_groups(scale)
  cfg = paper_runs.config(groups["post_nowarmup"][0], scale)
  stream_freq, batches = collapse_study.scale_stream_frequency(cfg, scale, out_dir)
  ours = {name: compare(paper_runs.train(out_dir, name, scale), stream_freq)
          for names in groups.values() for name in names}
  result = {"figure": f"postnorm_collapse Sec 4.3 aggregate vs per-sequence frequency loss, "
                      f"{scale} scale", "scale": scale,
            "paper": {"claim": "the aggregate frequency loss matches the post-collapse "
                               "training loss more closely than the per-sequence one"},
            "settings": {"config": paper_runs.CONFIG, "runs": groups,
                         "stream_freq_batches": batches, "stream_freq_loss": stream_freq,
                         "per_batch_references": "logged in the step (label_frequency)",
                         "onset": "first logged update from which last-layer t_sim stays "
                                  ">= 0.99 (fig3_fig5_transition.collapse_onset)"},
            "ours": ours, "seconds": time.time() - start}
  common.write_json(out_dir, f"sec43_{scale}.json", result)
  result["measured"] = measurements(result)
  return result


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """The comparison for ``post_collapse`` and the three warmup runs, each at three seeds
  (eight at quick_seeds8); ``sec43.json`` (``sec43_quick_seeds8.json``; paper / tiny:
  :func:`run_paper`)."""
  if scale in ("paper", "tiny"):
    return run_paper(out_dir, scale)
  if scale not in SCALES:
    raise ValueError(f"sec43 has the scales {list(SCALES)}, not {scale!r}")
  start = time.time()
  cfg = common.load_config(collapse_study.RUNS["post_collapse"][0])
  stream_freq = collapse_study.stream_frequency_loss(cfg)
  # the no-warmup collapse (collapse_study.seeds) and the three ablation runs
  # (seed_lr_runs.ablation_seeds) at the scale's seeds
  runs = {collapse_study.seeded_name("post_collapse", seed): collapse_study.train_run(
      collapse_study.seeded_name("post_collapse", seed), out_dir)
      for seed in collapse_study.seeds(scale)}
  for lr in sl.ABLATION_LRS:
    for seed in sl.ablation_seeds(scale):
      runs[collapse_study.seeded_name(f"warmup_lr{lr:g}", seed)] = sl.train(
          sl.warmup_run_name(lr, seed), out_dir)
  ours = {name: compare(wd, stream_freq) for name, wd in runs.items()}
  result = {"figure": "postnorm_collapse Sec 4.3 aggregate vs per-sequence frequency loss",
            "scale": scale,
            "paper": {"claim": "the aggregate frequency loss matches the post-collapse "
                               "training loss more closely than the per-sequence one"},
            "settings": {"stream_freq_batches": collapse_study.STREAM_FREQ_BATCHES,
                         "stream_freq_loss": stream_freq,
                         "onset": "first logged update from which last-layer t_sim stays "
                                  ">= 0.99 (fig3_fig5_transition.collapse_onset)"},
            "ours": ours, "seconds": time.time() - start}
  common.write_json(out_dir, "sec43.json" if scale == "quick" else f"sec43_{scale}.json",
                    result)
  result["measured"] = measurements(result)
  return result
