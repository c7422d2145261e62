"""Several runs of one shape as one program (``rankjax._src.train.runs``) against the same runs
one after another (``rankjax._src.train.loop.train`` each, the code of ``rankjax train``).

For each config and each run count R (4 and 8 seeds; a sweep config: its R points, seed
0), in one process, alternating:

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
* ``tr_grid_alpha`` / ``tr_grid_beta``: a cell of Fig 6's quick grid
  (``transforming_rank/fig6_trainability.py``: width 16, two d x d ReLU matrices, depth 12,
  Pre-RMSNorm with eps 1e-6, Adam at 1e-3, batch 32, 200 updates) at 4 points of
  ``model.alpha`` (the grid's 0.5, 1, 2, 4: init only, so the single runs' steps are one
  HLO, loaded from the persistent cache) or of ``model.beta`` (0.25, 0.5, 1, 2: each
  single run's step is another program): ``--sweep model.alpha=...`` against 4 runs.

Writes the section ``## Runs as one program`` of ``experiments/benchmarks/RESULTS.md``.

Run:  python experiments/benchmarks/runs_as_one_program.py [--counts 4,8] [--only NAMES]
      [--no-write]
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
from rankjax._src import config as config_lib
from rankjax._src.config import MLPConfig, TrainConfig
from rankjax._src.train import loop as loop_lib
from rankjax._src.train import runs as runs_lib

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
  from rankjax._src.data import dataset_info
  info = dataset_info("images")
  mlp = MLPConfig(depth=8, width=16, expansion=1.0, input_dim=info.input_dim,
                  num_classes=info.num_classes, norm_position="pre")
  tr = TrainConfig(model=mlp, optimizer="adam", weight_decay=0.0, b2=0.999,
                   lr_schedule="constant", warmup_steps=0, learning_rate=1e-3,
                   batch_size=32, total_steps=200, log_every=50, checkpoint_every=200,
                   max_to_keep=1, diag_every=0, async_checkpointing=False)
  grid = dataclasses.replace(tr, model=dataclasses.replace(
      mlp, depth=12, norm_eps=1e-6))
  return {"postnorm_quick": post, "softmax_quick": soft, "tr_mlp": tr,
          "tr_grid_alpha": grid, "tr_grid_beta": grid}


# configs whose runs are points of a model scalar (seed 0) rather than seeds
SWEEPS = {"tr_grid_alpha": ("model.alpha", ("0.5", "1", "2", "4")),
          "tr_grid_beta": ("model.beta", ("0.25", "0.5", "1", "2"))}


def variants(cfg: TrainConfig, runs: int, sweep: tuple[str, tuple[str, ...]] | None
             ) -> list[TrainConfig]:
  """The R runs: seeds 0..R-1, or the first R points of ``sweep`` at seed 0."""
  if sweep is None:
    return [dataclasses.replace(cfg, seed=s) for s in range(runs)]
  field, values = sweep
  return [config_lib.override(cfg, [f"{field}={v}"]) for v in values[:runs]]


def step_times(workdir: pathlib.Path) -> list[float]:
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return [r["step_time_s"] for r in rows if "step_time_s" in r and not r.get("compile_step")]


def measure(cfg: TrainConfig, runs: int, root: pathlib.Path,
            sweep: tuple[str, tuple[str, ...]] | None = None) -> dict[str, float]:
  cfgs = variants(cfg, runs, sweep)
  many_runs = {str(root / "many" / f"run_{i}"): c for i, c in enumerate(cfgs)}
  sink = open(os.devnull, "w")
  t0 = time.perf_counter()
  runs_lib.train_runs(many_runs, stream=sink, progress_bar=False)
  many = time.perf_counter() - t0
  many_step = statistics.median(step_times(root / "many" / "run_0"))
  t0 = time.perf_counter()
  for i, c in enumerate(cfgs):
    loop_lib.train(c, root / "one" / f"run_{i}", stream=sink, progress_bar=False)
  single = time.perf_counter() - t0
  single_step = statistics.median(t for i in range(len(cfgs))
                                  for t in step_times(root / "one" / f"run_{i}"))
  shutil.rmtree(root)
  return {"many_s": many, "single_s": single, "many_step_s": many_step,
          "single_step_s": single_step}


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--counts", default="4,8")
  ap.add_argument("--only", default="")
  ap.add_argument("--no-write", action="store_true")
  ap.add_argument("--warmup", action="store_true",
                  help="first an untimed 2-update run of the first config measured (seed "
                       "99), so that the first row's program does not pay the process's "
                       "start-up (data, backend)")
  args = ap.parse_args()
  cache = tempfile.mkdtemp(prefix="rankjax_bench_cache_")
  loop_lib.enable_compilation_cache(cache)
  chosen = [n for n in configs() if not args.only or n in args.only.split(",")]
  if args.warmup and chosen:
    root = pathlib.Path(tempfile.mkdtemp(prefix="rankjax_bench_warmup_"))
    loop_lib.train(dataclasses.replace(configs()[chosen[0]], seed=99, total_steps=2),
                   root, stream=open(os.devnull, "w"), progress_bar=False)
    shutil.rmtree(root)
  load0 = common.load_average()
  rows = []
  for name, cfg in configs().items():
    if args.only and name not in args.only.split(","):
      continue
    sweep = SWEEPS.get(name)
    for r in map(int, args.counts.split(",")):
      if sweep is not None and r > len(sweep[1]):
        continue
      m = measure(cfg, r, pathlib.Path(tempfile.mkdtemp(prefix="rankjax_bench_")), sweep)
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
