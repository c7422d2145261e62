"""One training step on 1 device and on 8 CPU host devices, in its own process.

  python tests/train/multidevice_worker.py   -> one JSON line of results

JAX must see 8 devices before it starts, so this runs apart from the test process.
"""

from __future__ import annotations

import json

import jax

jax.config.update("jax_num_cpu_devices", 8)

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402

from rankjax._src.train import sharding as shard_lib  # noqa: E402
from rankjax._src.train.loop import build  # noqa: E402
from tests.train.conftest import tiny_lm  # noqa: E402


def main() -> None:
  assert jax.device_count() == 8, jax.devices()
  lm = dataclasses.replace(tiny_lm().model, dropout_rate=0.0)
  cfg = tiny_lm(model=lm, batch_size=16, grad_accum=2, diag_every=0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 257, size=(16, cfg.seq_len + 1)).astype(np.int32)
  host_batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

  def run(mesh, sharded_init: bool, init_host=None, zero1=False, loss_chunk=0, **lm_fields):
    c = build(dataclasses.replace(cfg, zero1=zero1, model=dataclasses.replace(
        cfg.model, kernels=dataclasses.replace(cfg.model.kernels, loss_chunk=loss_chunk),
        **lm_fields)), mesh=mesh)
    if sharded_init:
      state = c.init()
    else:
      state = jax.device_put(init_host, c.state_shardings)
    init = jax.device_get(state)
    batch = shard_lib.global_batch(host_batch, cfg.grad_accum, c.batch_sharding)
    state, metrics, _ = c.step(state, batch)
    specs = {jax.tree_util.keystr(p): str(s.spec) for p, s in
             jax.tree_util.tree_leaves_with_path(c.state_shardings)}
    return init, jax.device_get(state), jax.device_get(metrics), specs

  devices = jax.devices()
  init1, state1, metrics1, _ = run(shard_lib.make_mesh(1, 1, devices[:1]), True)
  out = {"loss_1": float(metrics1["loss"]), "grad_norm_1": float(metrics1["grad_norm"])}
  for data, fsdp, sharded_init, zero1 in ((2, 4, True, False), (8, 1, False, False),
                                          (2, 4, True, True)):
    init, state, metrics, specs = run(shard_lib.make_mesh(data, fsdp), sharded_init, init1,
                                      zero1)
    key = f"{data}x{fsdp}" + ("_zero1" if zero1 else "")
    out[f"init_max_diff_{key}"] = max(float(np.max(np.abs(a - b))) for a, b in
                                      zip(jax.tree.leaves(init1), jax.tree.leaves(init)))
    out[f"loss_{key}"] = float(metrics["loss"])
    out[f"grad_norm_{key}"] = float(metrics["grad_norm"])
    out[f"param_max_rel_diff_{key}"] = max(
        float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-12))
        for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state.params)))
    out[f"step_{key}"] = int(state.step)
    out[f"specs_{key}"] = specs
  # the chunked loss (4 chunks of 16 tokens a micro-batch): per-shard partial sums of the
  # head gradient, reduced once, against one device
  _, chunk1, chunk_m1, _ = run(shard_lib.make_mesh(1, 1, devices[:1]), True, loss_chunk=16)
  _, chunk8, chunk_m8, _ = run(shard_lib.make_mesh(2, 4), False, init1, loss_chunk=16)
  out["loss_chunked"] = [float(chunk_m1["loss"]), float(chunk_m8["loss"])]
  out["grad_norm_chunked"] = [float(chunk_m1["grad_norm"]), float(chunk_m8["grad_norm"])]
  out["param_max_rel_diff_chunked"] = max(
      float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-12))
      for a, b in zip(jax.tree.leaves(chunk1.params), jax.tree.leaves(chunk8.params)))
  # tied embeddings, chunked and not: the table read as one copy per batch shard by the
  # lookup and the head (their gradients added there, reduced once), against one device;
  # fsdp=8 (8 shards) and data=2 x fsdp=4 (4 shards in each data group)
  for chunk in (16, 0):
    tied1_init, tied1, tied_m1, _ = run(shard_lib.make_mesh(1, 1, devices[:1]), True,
                                        loss_chunk=chunk, tie_embeddings=True)
    for data, fsdp in ((1, 8), (2, 4)):
      _, tied, tied_m, _ = run(shard_lib.make_mesh(data, fsdp), False, tied1_init,
                               loss_chunk=chunk, tie_embeddings=True)
      key = f"tied_{chunk}_{data}x{fsdp}"
      out[f"loss_{key}"] = [float(tied_m1["loss"]), float(tied_m["loss"])]
      out[f"grad_norm_{key}"] = [float(tied_m1["grad_norm"]), float(tied_m["grad_norm"])]
      out[f"param_max_rel_diff_{key}"] = max(
          float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-12))
          for a, b in zip(jax.tree.leaves(tied1.params), jax.tree.leaves(tied.params)))
  try:
    build(dataclasses.replace(cfg, batch_size=12, grad_accum=1))
    out["batch_error"] = None
  except ValueError as e:
    out["batch_error"] = str(e)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
