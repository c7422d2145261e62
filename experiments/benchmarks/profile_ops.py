"""Where each side's loss gradient spends its time, op by op (rankjax's CPU gap to plain flax).

Traces rankjax's and the plain flax loss gradient (``ablate_plain.loss_gradients``, the
same tokens) with ``jax.profiler`` and XLA's per-thunk trace events
(``--xla_cpu_enable_xprof_traceme``), then prints, per side: the wall time per step,
the time summed over ops by kind (dots, transposing copies, the layer scan's
bookkeeping, other fusions), and the costliest ops with the jax operation they come
from (the compiled HLO's ``op_name``). Times are per step, summed over layers. On two
cores XLA runs some independent ops side by side, so the op sums exceed the wall time
by 10-20%: compare kinds and ops, not the sums with the wall time.

This is how the largest single cost of that gap was found: the GELU derivative
fused into a strided transposing copy (``models/activations.py``).

Run:  python experiments/benchmarks/profile_ops.py [--shape 128,4,8,512,128,16]
      [--steps 5] [--top 12]
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_enable_xprof_traceme=true").strip()

import argparse  # noqa: E402
import collections  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

from ablate_plain import loss_gradients  # noqa: E402
from train_throughput import step_pair  # noqa: E402

CONTAINERS = ("while", "conditional", "call")   # thunks that run other thunks


def op_kind(name: str, op_name: str) -> str:
  """A coarse kind for one compiled op, from its HLO name and jax op_name."""
  if name.startswith(("ynn_fusion", "dot", "custom-call")):
    return "dot"
  if "dynamic" in name or (name.startswith("wrapped_broadcast") and not op_name):
    return "layer-scan bookkeeping"      # stacked buffers: fill, update-slice, slice
  if "copy" in name or "transpose" in name:
    return "copy / transpose"
  return "other fusion"


def trace_ops(fn, args, steps: int, names: dict) -> tuple[list[float], dict[str, float]]:
  """Wall time of each of ``steps`` runs (s) and the summed duration (ms/step) of each
  compiled op in ``names`` (loops and calls are left out: their bodies' ops count)."""
  walls = []
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(steps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        walls.append(time.perf_counter() - t)
    path = next(pathlib.Path(d).rglob("perfetto_trace.json.gz"))
    events = json.loads(gzip.decompress(path.read_bytes()))
  events = events["traceEvents"] if isinstance(events, dict) else events
  ops = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") == "X" and name in names and not name.startswith(CONTAINERS):
      ops[name] += e["dur"] / 1e3 / steps
  return walls, ops


def op_names(hlo_text: str) -> dict[str, tuple[str, str]]:
  """HLO instruction name -> (result shape, jax op_name) of a compiled module."""
  out = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ", line)
    if m:
      on = re.search(r'op_name="([^"]*)"', line)
      out[m.group(1)] = (m.group(2), on.group(1) if on else "")
  return out


def report(side: str, walls: list[float], ops: dict[str, float], names: dict, top: int) -> None:
  kinds = collections.Counter()
  for n, ms in ops.items():
    kinds[op_kind(n, names.get(n, ("", ""))[1])] += ms
  print(f"\n== {side}: wall per step {1e3 * min(walls):.1f} ms (best of {len(walls)}), "
        f"op sum {sum(ops.values()):.1f} ms")
  for k, ms in kinds.most_common():
    print(f"   {k:24s} {ms:8.1f} ms")
  print(f"   costliest ops (ms per step, all layers):")
  for n, ms in sorted(ops.items(), key=lambda kv: -kv[1])[:top]:
    shape, on = names.get(n, ("?", ""))
    print(f"   {ms:7.2f}  {n[:28]:28s} {shape[:30]:30s} {on[-70:]}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--shape", default="128,4,8,512,128,16", help="D,H,N,F,T,B")
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--top", type=int, default=12)
  args = ap.parse_args()
  shape = tuple(int(v) for v in args.shape.split(","))
  grads = loss_gradients(step_pair(shape))
  for fn, a in grads.values():                    # compile and warm up both first
    for _ in range(2):
      jax.block_until_ready(fn(*a()))
  for side, (fn, a) in grads.items():
    a = a()
    names = op_names(fn.lower(*a).compile().as_text())
    walls, ops = trace_ops(fn, a, args.steps, names)
    report(side, walls, ops, names, args.top)


if __name__ == "__main__":
  main()
