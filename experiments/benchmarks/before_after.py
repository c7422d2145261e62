"""A refactor is no slower: the training step and the Jacobian study at a commit
against this tree, in the same run on the same machine.

* **Training step**: the compiled plain step and diagnostics step (the built-in
  ``basic`` diagnostic: X_k / Y_k and their gradients) of
  ``experiments/configs/lm_tiny_shakespeare.json`` (``rankjax._src.train.loop.build``, each
  side reading its own tree's config), on one synthetic token batch; median seconds
  per call over ``--steps`` calls after two warm-up calls. The first plain step's loss
  and the first diagnostics step's values are compared bit for bit.
* **Jacobian study**: ``jacobian_engine.py``'s ``make_study_fn`` (L=48, d=256, 4x,
  8 seeds, float32, Pre-Norm; best of ``--reps`` calls after compilation).

Each side runs in its own process (the commit in a temporary git worktree), the two
sides alternating for ``--rounds`` rounds (``common.before_after``); the verdict is
the median over rounds of after / before. Writes the section
``## Before / after a refactor`` of RESULTS.md.

Run:  python experiments/benchmarks/before_after.py REF [--rounds 3] [--steps 10]
"""
from __future__ import annotations

import argparse
import os

import jax

import common
import jacobian_engine

SECTION = "## Before / after a refactor"

TRAIN_CHILD = r"""
import dataclasses, hashlib, json, os, statistics, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import jax, numpy as np
config_lib = importlib.import_module(P + ".config")
TrainConfig = config_lib.TrainConfig
shard_lib = importlib.import_module(P + ".train.sharding")
build = importlib.import_module(P + ".train.loop").build
steps = int(sys.argv[1])
cfg = config_lib.from_json(TrainConfig, "experiments/configs/lm_tiny_shakespeare.json")
cfg = dataclasses.replace(cfg, diag_every=1, diagnostics=("basic",))
c = build(cfg)
tokens = np.random.default_rng(0).integers(0, 257, (cfg.batch_size, cfg.seq_len + 1))
batch = shard_lib.global_batch({"inputs": tokens[:, :-1].astype(np.int32),
                                "targets": tokens[:, 1:].astype(np.int32)},
                               cfg.grad_accum, c.batch_sharding)
out, marks = {}, {}
for name, fn in (("plain", c.step), ("diag", c.diag_step)):
  state = c.init()     # the step donates its state: each variant starts from a fresh init
  first = jax.block_until_ready(fn(state, batch))
  marks[name] = hashlib.sha256(b"".join(
      np.asarray(x).tobytes() for x in jax.tree.leaves(first[1:]))).hexdigest()
  state = first[0]
  state = jax.block_until_ready(fn(state, batch))[0]
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    state = jax.block_until_ready(fn(state, batch))[0]
    times.append(time.perf_counter() - t)
  out[name] = statistics.median(times)
print(json.dumps({"times": out, "outputs": marks}))
"""


def run(ref: str, rounds: int, steps: int, reps: int) -> dict:
  train = common.before_after(ref, TRAIN_CHILD, [str(steps)], rounds)
  study = common.before_after(ref, jacobian_engine.STUDY_CHILD,
                              ["48", "256", "8", str(reps)], rounds)
  rows = {}
  for part in ("plain", "diag"):
    rows[part] = {side: [r["times"][part] for r in train[side]] for side in train}
  rows["study"] = {side: [r["best"] for r in study[side]] for side in study}
  same = {"plain": all(train["before"][-1]["outputs"]["plain"] == r["outputs"]["plain"]
                       for r in train["after"]),
          "diag": all(train["before"][-1]["outputs"]["diag"] == r["outputs"]["diag"]
                      for r in train["after"]),
          "study": study["before"][-1]["outputs"] == study["after"][-1]["outputs"]}
  return {"ref": common.git_commit(ref)[:10], "head": common.git_commit("HEAD")[:10],
          "rows": rows, "same": same, "rounds": rounds, "steps": steps, "reps": reps,
          "machine": common.machine_name(), "jax": jax.__version__,
          "load": common.load_average()}


def markdown(r: dict) -> str:
  names = {"plain": "training step, plain (`lm_tiny_shakespeare.json`)",
           "diag": "training step, diagnostics (`basic`)",
           "study": "Jacobian study (`make_study_fn`, L=48, d=256, 8 seeds)"}
  lines = [SECTION, "",
           f"`python experiments/benchmarks/before_after.py {r['ref']}` on {r['machine']}, "
           f"jax {r['jax']}, load average {r['load']:.2f} at the end. Before: {r['ref']}; "
           f"after: {r['head']} (the tree, uncommitted changes included). Each side in its "
           f"own process, {r['rounds']} alternating rounds; a step is the median of "
           f"{r['steps']} calls, the study the best of {r['reps']}, compilation excluded.",
           "", "| | before (s, per round) | after (s, per round) | after / before: median "
           "(min, max) | outputs bit for bit equal |", "|---|---|---|---|---|"]
  for part, label in names.items():
    b, a = r["rows"][part]["before"], r["rows"][part]["after"]
    ratios = sorted(x / y for x, y in zip(a, b))
    lines.append(f"| {label} | {', '.join(f'{x:.4f}' for x in b)} | "
                 f"{', '.join(f'{x:.4f}' for x in a)} | {ratios[len(ratios) // 2]:.3f} "
                 f"({ratios[0]:.3f}, {ratios[-1]:.3f}) | {r['same'][part]} |")
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("ref", help="the git commit to compare this tree against")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=10, help="timed calls per step and round")
  parser.add_argument("--reps", type=int, default=2, help="study calls per round (best kept)")
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args()
  text = markdown(run(args.ref, args.rounds, args.steps, args.reps))
  print(text)
  if not args.no_write:
    common.write_section(SECTION, text)


if __name__ == "__main__":
  os.chdir(common.ROOT)
  main()
