"""Compiles the train step on 8 CPU host devices and counts its collectives.

  python tests/train/hlo_worker.py   -> one JSON line: per mesh, every collective of
                                        the optimized HLO (op, shape, inside which loop)

Runs apart from the test process (JAX must see 8 devices before it starts).
"""

from __future__ import annotations

import json
import re

import jax

jax.config.update("jax_num_cpu_devices", 8)

import dataclasses  # noqa: E402

from rankjax.train import sharding as shard_lib  # noqa: E402
from rankjax.train.loop import build  # noqa: E402
from tests.train.conftest import tiny_lm  # noqa: E402

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_OP = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_WHILE = re.compile(r"\bwhile\(.*?body=%?([\w.\-]+)")
_CALLS = re.compile(
    r"(?:to_apply|calls|body|condition|branch_computations)=\{?%?([\w.\-]+(?:,\s*%[\w.\-]+)*)")


def collectives(hlo: str) -> list[dict]:
  """[{op, shape, loop_depth}] for every collective; loop_depth counts the while
  bodies (layer scan, micro-batch scan) the op sits in."""
  comps: dict[str, list[str]] = {}
  name = entry = None
  for line in hlo.splitlines():
    m = _COMP.match(line)
    if m and not line.startswith(" "):
      name = m.group(1)
      comps[name] = []
      if line.startswith("ENTRY"):
        entry = name
    elif name is not None:
      comps[name].append(line)
  bodies: dict[str, set[str]] = {n: set() for n in comps}   # computation -> while bodies it calls
  callees: dict[str, set[str]] = {n: set() for n in comps}
  for n, lines in comps.items():
    for line in lines:
      for w in _WHILE.findall(line):
        bodies[n].add(w)
      for group in _CALLS.findall(line):
        for c in re.split(r"[,\s%]+", group):
          if c in comps:
            callees[n].add(c)
  depth = {}

  def visit(n, d):
    if depth.get(n, -1) >= d:
      return
    depth[n] = d
    for c in callees[n]:
      visit(c, d + (1 if c in bodies[n] else 0))

  visit(entry, 0)
  out = []
  for n, lines in comps.items():
    for line in lines:
      line = re.sub(r"/\*index=\d+\*/", "", line)
      m = _OP.search(line)
      if m:
        shapes = [[int(d) for d in dims.split(",") if d]
                  for dims in re.findall(r"[a-z]+\d*\[([\d,]*)\]", m.group(1))]
        out.append({"op": m.group(2), "shapes": shapes, "loop_depth": depth.get(n, 0)})
  return out


def main() -> None:
  assert jax.device_count() == 8, jax.devices()
  lm = dataclasses.replace(tiny_lm().lm, num_layers=3, d_model=32, num_heads=2, d_ff=64,
                           max_seq_len=16, dropout_rate=0.0)
  cfg = tiny_lm(lm=lm, seq_len=16, batch_size=32, grad_accum=2, diag_every=0)
  out = {}
  for data, fsdp in ((1, 8), (8, 1)):
    c = build(cfg, mesh=shard_lib.make_mesh(data, fsdp))
    state = jax.eval_shape(c.init)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         state, c.state_shardings)
    spec = c.task.example_spec
    batch = {k: jax.ShapeDtypeStruct((cfg.grad_accum, cfg.micro_batch_size, *shape), dtype,
                                     sharding=c.batch_sharding)
             for k, (shape, dtype) in spec.items()}
    hlo = c.step.lower(state, batch).compile().as_text()
    out[f"{data}x{fsdp}"] = collectives(hlo)
    out["param_shapes"] = [list(x.shape) for x in jax.tree.leaves(state.params)]
  print(json.dumps(out))


if __name__ == "__main__":
  main()
