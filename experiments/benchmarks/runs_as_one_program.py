"""Several runs of one shape as one program (``rankjax.train.runs``) against the same runs
one after another (``rankjax.train.loop.train`` each, the code of ``rankjax train``).

For each config and each run count R (4 and 8 seeds), in one process, alternating:

* ``one after another``: R single runs, each in a fresh workdir; JAX's persistent
  compilation cache on, as ``rankjax reproduce`` trains a study's runs (runs that
  differ only in seed then load the step instead of compiling it again; the init, whose
  seed is a constant of its program, compiles per run);
* ``one program``: the R runs as one program (``train_runs``), one compile.

Wall time includes everything a user waits for (build, compile, data, the updates,
metrics, checkpoints); per-step time is the median of the measured step times (the
updates without a compile) that ``metrics.jsonl`` records, per run (the program's step
time is the time of one step of all R runs). Configs:

* ``postnorm_quick``: ``postnorm_collapse/configs/collapse_post_quick.json`` as its LR
  ablation runs it (12 layers, d = 64, 60 updates at LR 0.02, diagnostics at every update);
* ``softmax_quick``: ``softmax_sensitivity/configs/quick.json`` (6 layers, d = 64,
  dropout, diagnostics every 10), 60 updates;
* ``tr_mlp``: a residual MLP of the Transforming Rank trainability grid (width 16,
  depth 8, Pre-RMSNorm, Adam, batch 32), 200 updates.

Writes the section ``## Runs as one program`` of ``experiments/benchmarks/RESULTS.md``.

Run:  python experiments/benchmarks/runs_as_one_program.py [--counts 4,8] [--no-write]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import statistics
import tempfile
import time

import jax

import common
from rankjax import config as config_lib
from rankjax.config import MLPConfig, TrainConfig
from rankjax.train import loop as loop_lib
from rankjax.train import runs as runs_lib
import rankjax.train.diagnostics_postnorm  # noqa: F401  (registers "postnorm")

HERE = pathlib.Path(__file__).resolve().parent
EXPERIMENTS = HERE.parent
SECTION = "## Runs as one program"


def configs() -> dict[str, TrainConfig]:
  load = lambda rel, sets: config_lib.override(
      config_lib.from_json(TrainConfig, EXPERIMENTS / rel), sets)
  post = load("postnorm_collapse/configs/collapse_post_quick.json",
              ["learning_rate=0.02", "warmup_steps=20", "total_steps=60", "diag_every=1",
               'diagnostics=["basic","postnorm","postnorm_sublayer_norms"]'])
  soft = load("softmax_sensitivity/configs/quick.json",
              ["total_steps=60", "warmup_steps=15", "checkpoint_every=60"])
  from rankjax.data import dataset_info
  info = dataset_info("images")
  mlp = MLPConfig(depth=8, width=16, expansion=1.0, input_dim=info.input_dim,
                  num_classes=info.num_classes, norm_position="pre")
  tr = TrainConfig(model=mlp, optimizer="adam", weight_decay=0.0, b2=0.999,
                   lr_schedule="constant", warmup_steps=0, learning_rate=1e-3,
                   batch_size=32, total_steps=200, log_every=50, checkpoint_every=200,
                   max_to_keep=1, diag_every=0, async_checkpointing=False)
  return {"postnorm_quick": post, "softmax_quick": soft, "tr_mlp": tr}


def step_times(workdir: pathlib.Path) -> list[float]:
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return [r["step_time_s"] for r in rows if "step_time_s" in r and not r.get("compile_step")]


def measure(cfg: TrainConfig, runs: int, root: pathlib.Path) -> dict[str, float]:
  seeds = {str(root / "many" / f"seed_{s}"): dataclasses.replace(cfg, seed=s)
           for s in range(runs)}
  sink = open(os.devnull, "w")
  t0 = time.perf_counter()
  runs_lib.train_runs(seeds, stream=sink, progress_bar=False)
  many = time.perf_counter() - t0
  many_step = statistics.median(step_times(root / "many" / "seed_0"))
  t0 = time.perf_counter()
  for s in range(runs):
    loop_lib.train(dataclasses.replace(cfg, seed=s), root / "one" / f"seed_{s}",
                   stream=sink, progress_bar=False)
  single = time.perf_counter() - t0
  single_step = statistics.median(t for s in range(runs)
                                  for t in step_times(root / "one" / f"seed_{s}"))
  shutil.rmtree(root)
  return {"many_s": many, "single_s": single, "many_step_s": many_step,
          "single_step_s": single_step}


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--counts", default="4,8")
  ap.add_argument("--only", default="")
  ap.add_argument("--no-write", action="store_true")
  args = ap.parse_args()
  cache = tempfile.mkdtemp(prefix="rankjax_bench_cache_")
  loop_lib.enable_compilation_cache(cache)
  load0 = common.load_average()
  rows = []
  for name, cfg in configs().items():
    if args.only and name not in args.only.split(","):
      continue
    for r in map(int, args.counts.split(",")):
      m = measure(cfg, r, pathlib.Path(tempfile.mkdtemp(prefix="rankjax_bench_")))
      rows.append((name, r, m))
      print(f"{name} R={r}: one program {m['many_s']:.1f} s (step {m['many_step_s'] * 1e3:.0f} "
            f"ms for all R), one after another {m['single_s']:.1f} s (step "
            f"{m['single_step_s'] * 1e3:.0f} ms per run): wall ratio "
            f"{m['single_s'] / m['many_s']:.2f}x", flush=True)
  load1 = common.load_average()
  lines = [
      SECTION, "",
      f"Machine: {common.machine_name()}, "
      f"jax {jax.__version__}; 1-minute load average at the start / end {load0:.1f} / {load1:.1f}.",
      "Command: `python experiments/benchmarks/runs_as_one_program.py`.", "",
      "| config | runs | one program: wall | one after another: wall | wall ratio | "
      "program step (all runs) | single step (one run) | step ratio (R x single / program) |",
      "|---|---|---|---|---|---|---|---|"]
  for name, r, m in rows:
    lines.append(
        f"| {name} | {r} | {m['many_s']:.1f} s | {m['single_s']:.1f} s | "
        f"{m['single_s'] / m['many_s']:.2f}x | {m['many_step_s'] * 1e3:.1f} ms | "
        f"{m['single_step_s'] * 1e3:.1f} ms | "
        f"{r * m['single_step_s'] / m['many_step_s']:.2f}x |")
  text = "\n".join(lines)
  print(text)
  if not args.no_write:
    common.write_section(SECTION, text)


if __name__ == "__main__":
  main()
