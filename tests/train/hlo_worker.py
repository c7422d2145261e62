"""Compiles the train step on 8 CPU host devices and counts its collectives.

  python tests/train/hlo_worker.py   -> one JSON line: per mesh, every collective of
                                        the optimized HLO (op, shape, inside which loop)
  python tests/train/hlo_worker.py paper -> the same for the two paper configs
                                        (experiments/configs) at reduced width under
                                        mesh_fsdp=8, training and diagnostics steps
  python tests/train/hlo_worker.py memory -> XLA's memory analysis of the two shrunk paper
                                        configs' training step on 8 and 4 of the devices,
                                        with and without mesh_fsdp (``MEMORY_MESHES``)
  python tests/train/hlo_worker.py reductions DTYPE -> their bf16 training steps'
                                        collectives after SPMD partitioning, with
                                        model.kernels.grad_reduce_dtype=DTYPE (needs --xla_dump_to)
  python tests/train/hlo_worker.py tied -> the optimized HLO's collectives of the shrunk
                                        GPT-2 config's training step (tied embeddings)
                                        under mesh_fsdp=8, per compute dtype and loss
                                        chunking (``TIED_CASES``)

Runs apart from the test process (JAX must see 8 devices before it starts).
"""

from __future__ import annotations

import json
import re

import jax

jax.config.update("jax_num_cpu_devices", 8)

import dataclasses  # noqa: E402

from rankjax._src.train import sharding as shard_lib  # noqa: E402
from rankjax._src.train.loop import build  # noqa: E402
from tests.train.conftest import shrunk_paper_config, tiny_lm  # noqa: E402

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
        typed = re.findall(r"([a-z]+\d*)\[([\d,]*)\]", m.group(1))
        shapes = [[int(d) for d in dims.split(",") if d] for _, dims in typed]
        out.append({"op": m.group(2), "shapes": shapes, "dtypes": [t for t, _ in typed],
                    "loop_depth": depth.get(n, 0)})
  return out


PAPER_CONFIGS = ("postnorm_48l_d512_c4.json", "gpt2_774m.json")


def _compiled_hlo(cfg, mesh, which: str) -> tuple[str, list]:
  c = build(cfg, mesh=mesh)
  state = jax.eval_shape(c.init)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       state, c.state_shardings)
  batch = {k: jax.ShapeDtypeStruct((cfg.grad_accum, cfg.micro_batch_size, *shape), dtype,
                                   sharding=c.batch_sharding)
           for k, (shape, dtype) in c.task.example_spec.items()}
  fn = c.step if which == "step" else c.diag_step
  return fn.lower(state, batch).compile().as_text(), [list(x.shape)
                                                        for x in jax.tree.leaves(state.params)]


def paper() -> None:
  """The shipped paper configs with their sizes shrunk (2 layers, d=64, d_ff=128, vocab
  1000 padded to 1024, 40 tokens (no size equals another), 64 sequences, loss chunks of
  256 tokens) and
  everything else theirs: placement, norm, FFN, positions, dtype, remat, dropout,
  diagnostics and their example count (4: fewer than the 8 devices)."""
  out = {}
  for name in PAPER_CONFIGS:
    cfg = shrunk_paper_config(name)
    lm = cfg.model
    for which in ("step", "diag"):
      hlo, params = _compiled_hlo(cfg, shard_lib.make_mesh(1, 8), which)
      out[f"{name}/{which}"] = collectives(hlo)
    out[f"{name}/params"] = params
    # fused projections: XLA may concatenate a layer's w_q|w_k|w_v (w_1|w_3) slices
    # before gathering them, one gather of the layer's concatenated weight
    fused = [[lm.d_model, (lm.num_heads + 2 * lm.kv_heads) * lm.d_head]]
    fused += [[lm.d_model, 2 * lm.d_ff]] if lm.ffn == "swiglu" else []
    out[f"{name}/fused"] = fused if lm.kernels.fused_projections else []
  print(json.dumps(out))


# (devices, mesh_fsdp) of ``memory``: the memory refusal's fix (fsdp over all the
# devices) against none, on 8 devices, and the fix on 4 (a sub-mesh of the first 4)
MEMORY_MESHES = ((8, 1), (8, 8), (4, 4))


def memory() -> None:
  """For each shrunk paper config (``shrunk_paper_config``, float32 as shipped) and each
  of ``MEMORY_MESHES``: ``loop.compiled_memory`` of the training step, its parameter
  count and the bytes of one global batch."""
  import numpy as np

  from rankjax._src.train import loop, tasks
  from rankjax._src.train import memory as memory_lib
  out = {}
  for name in PAPER_CONFIGS:
    cfg = dataclasses.replace(shrunk_paper_config(name), diag_every=0)
    task_spec = tasks.make_task(cfg).example_spec
    batch = sum(cfg.batch_size * int(np.prod(shape)) * np.dtype(dtype).itemsize
                for shape, dtype in task_spec.values())
    rows = []
    for n, fsdp in MEMORY_MESHES:
      mesh = shard_lib.make_mesh(0, fsdp, jax.devices()[:n])
      run = dataclasses.replace(cfg, mesh_fsdp=fsdp)
      rows.append({"devices": n, "fsdp": fsdp,
                   **loop.compiled_memory(run, mesh)["step"]})
    out[name] = {"params": memory_lib.param_count(cfg), "batch_bytes": batch, "rows": rows}
  print(json.dumps(out))


def reductions(grad_reduce_dtype: str) -> None:
  """The collectives of both paper configs' training step (shrunk as in ``paper``,
  bfloat16 compute, mesh_fsdp=8) right after SPMD partitioning, read from the module
  XLA dumps (the test sets ``--xla_dump_to``): XLA:CPU's later passes turn bfloat16
  collectives into float32 ones, so only this module shows the dtype a GPU or TPU
  reduces in."""
  import glob
  import os
  import re as re_
  dump = re_.search(r"--xla_dump_to=(\S+)", os.environ["XLA_FLAGS"]).group(1)
  out = {}
  for name in PAPER_CONFIGS:
    cfg = dataclasses.replace(shrunk_paper_config(name, grad_reduce_dtype=grad_reduce_dtype),
                              diag_every=0, compute_dtype="bfloat16")
    before = set(glob.glob(os.path.join(dump, "*")))
    _, params = _compiled_hlo(cfg, shard_lib.make_mesh(1, 8), "step")
    (path,) = [f for f in set(glob.glob(os.path.join(dump, "*jit_step*after_spmd-partitioning*")))
               - before]
    out[name] = {"collectives": collectives(open(path).read()), "params": params}
    before = set(glob.glob(os.path.join(dump, "*")))        # the diagnostics step
    _compiled_hlo(dataclasses.replace(cfg, diag_every=1), shard_lib.make_mesh(1, 8), "diag")
    (path,) = [f for f in set(glob.glob(os.path.join(dump, "*jit_step*after_spmd-partitioning*")))
               - before]
    out[name]["diag"] = collectives(open(path).read())
  print(json.dumps(out))


# (compute_dtype, loss_chunk) of ``tied``: the shipped bf16 and a float32 step, each
# with the fused chunked loss (256 tokens a chunk) and with the plain head
TIED_CASES = (("bfloat16", 256), ("bfloat16", 0), ("float32", 256), ("float32", 0))


def tied() -> None:
  """The GPT-2 paper config shrunk as in ``paper`` (tied embeddings: the token table is
  the lookup and the LM head; vocab 1000 padded to 1024, d=64, 2 micro-batches of 32
  sequences) under mesh_fsdp=8: every collective of its compiled training step, for each
  of ``TIED_CASES``, with the padded vocabulary and d_model to find the table's."""
  out = {}
  for dtype, chunk in TIED_CASES:
    cfg = shrunk_paper_config("gpt2_774m.json")
    assert cfg.model.tie_embeddings
    cfg = dataclasses.replace(cfg, diag_every=0, compute_dtype=dtype,
                              model=dataclasses.replace(cfg.model, kernels=dataclasses.replace(
                                  cfg.model.kernels, loss_chunk=chunk)))
    hlo, _ = _compiled_hlo(cfg, shard_lib.make_mesh(1, 8), "step")
    out[f"{dtype}/{chunk}"] = collectives(hlo)
  out["vocab"], out["d_model"] = cfg.model.padded_vocab_size, cfg.model.d_model
  print(json.dumps(out))


def main() -> None:
  assert jax.device_count() == 8, jax.devices()
  lm = dataclasses.replace(tiny_lm().model, num_layers=3, d_model=32, num_heads=2, d_ff=64,
                           max_seq_len=16, dropout_rate=0.0)
  cfg = tiny_lm(model=lm, seq_len=16, batch_size=32, grad_accum=2, diag_every=0)
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
  import sys
  if sys.argv[1:2] == ["reductions"]:
    reductions(sys.argv[2])
  elif sys.argv[1:] == ["memory"]:
    memory()
  elif sys.argv[1:] == ["tied"]:
    tied()
  else:
    paper() if sys.argv[1:] == ["paper"] else main()
