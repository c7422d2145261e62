"""Mesh, shardings, multi-host detection; the 8-device step runs in its own process."""

from __future__ import annotations

import os

import jax
import pytest
from jax.sharding import PartitionSpec as P

from rankjax._src import distributed
from rankjax._src.train import sharding as shard_lib
from tests.train.conftest import run_json_worker


def test_spec_shards_largest_divisible_dim_never_the_layer_axis():
  assert shard_lib.spec_for((257, 16), 4, stacked=False) == P(None, "fsdp")
  assert shard_lib.spec_for((64, 256), 4, stacked=False) == P(None, "fsdp")
  assert shard_lib.spec_for((256, 64), 4, stacked=False) == P("fsdp", None)
  assert shard_lib.spec_for((8, 16, 32), 4, stacked=True) == P(None, None, "fsdp")
  assert shard_lib.spec_for((8, 3), 4, stacked=True) == P()          # nothing divides
  assert shard_lib.spec_for((7,), 4, stacked=False) == P()
  assert shard_lib.spec_for((), 4, stacked=False) == P()
  assert shard_lib.spec_for((64, 64), 1, stacked=False) == P()


def test_multi_host_detection(monkeypatch):
  for var in ("RANKJAX_DISTRIBUTED", "JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "SLURM_PROCID",
              "TPU_WORKER_HOSTNAMES", "OMPI_COMM_WORLD_SIZE"):
    monkeypatch.delenv(var, raising=False)
  assert distributed.multi_host_env() is None
  assert distributed.maybe_initialize_distributed() is False
  monkeypatch.setenv("SLURM_NTASKS", "1")
  monkeypatch.setenv("SLURM_PROCID", "0")
  assert distributed.multi_host_env() is None
  monkeypatch.setenv("SLURM_NTASKS", "16")
  assert distributed.multi_host_env() == "SLURM with 16 tasks"
  monkeypatch.delenv("SLURM_NTASKS")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4")
  assert distributed.multi_host_env() == "TPU slice with 4 workers"


def test_mesh_shape_errors():
  with pytest.raises(ValueError, match=r"mesh data=2 x fsdp=1 = 2 devices, but 1 are available"):
    shard_lib.make_mesh(2, 1)
  with pytest.raises(ValueError, match="mesh_fsdp=4 does not divide the 1 devices"):
    shard_lib.make_mesh(0, 4)


@pytest.mark.slow   # 8 devices in a second process (~14 s); mesh and spec rules are fast above
def test_step_on_1_and_8_devices_agrees():
  """data=2 x fsdp=4 (sharded init) and data=8: same init, loss, grad norm, params."""
  out = run_json_worker("multidevice_worker.py", timeout=600, XLA_FLAGS=(
      os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip())
  for key in ("2x4", "8x1", "2x4_zero1"):
    assert out[f"init_max_diff_{key}"] == 0.0
    assert out[f"loss_{key}"] == pytest.approx(out["loss_1"], rel=1e-6)
    assert out[f"grad_norm_{key}"] == pytest.approx(out["grad_norm_1"], rel=1e-5)
    assert out[f"param_max_rel_diff_{key}"] < 1e-5
    assert out[f"step_{key}"] == 1
  one, eight = out["loss_chunked"]                    # the chunked loss on 1 and 8 devices
  assert eight == pytest.approx(one, rel=1e-6) and one == pytest.approx(out["loss_1"], rel=1e-5)
  assert out["grad_norm_chunked"][1] == pytest.approx(out["grad_norm_chunked"][0], rel=1e-5)
  assert out["param_max_rel_diff_chunked"] < 1e-5
  for key in ("tied_16_1x8", "tied_16_2x4", "tied_0_1x8", "tied_0_2x4"):  # shard copies
    one, many = out[f"loss_{key}"]
    assert many == pytest.approx(one, rel=1e-6), key
    assert out[f"grad_norm_{key}"][1] == pytest.approx(out[f"grad_norm_{key}"][0], rel=1e-5)
    assert out[f"param_max_rel_diff_{key}"] < 1e-5, key
  specs = out["specs_2x4"]
  assert specs[".params['layers']['ffn']['w_1']"] == "P(None, 'fsdp', None)"  # (L, d=16, 32)
  assert specs[".params['embed']['embedding']"] == "P(None, 'fsdp')"          # (257, 16)
  assert specs[".opt_state[0].mu['layers']['ffn']['w_1']"] == "P(None, 'fsdp', None)"
  assert set(out["specs_8x1"].values()) == {"P()"}
  zero1 = out["specs_2x4_zero1"]    # moments also over data, parameters as without
  assert zero1[".opt_state[0].mu['layers']['ffn']['w_1']"] == "P(None, 'fsdp', 'data')"
  assert zero1[".params['layers']['ffn']['w_1']"] == "P(None, 'fsdp', None)"
  assert out["batch_error"] == ("batch_size=12 / grad_accum=1 = 12 examples per micro-batch "
                                "is not divisible by the 8 devices (mesh data=8 x fsdp=1)")


@pytest.mark.slow   # 8 devices in a second process, HLO read; test_step_on_1_and_8 is fast
def test_compiled_step_collectives_fsdp_and_data_parallel():
  """The optimized HLO of one update (3 layers, d=32, d_ff=64, vocab 257, micro-batch
  16 x 16 tokens, grad_accum=2) on 8 CPU devices.

  fsdp=8: every all-gather is of a weight: one layer's (32, 32) / (32, 64) / (64, 32)
  slice inside the layer scan (forward and backward), or the unstacked embedding /
  LM head; never a whole stacked weight, never an activation; no all-to-all.
  data=8: no all-gather; all-reduces only outside every loop (one reduction per
  update, after the micro-batch scan), of exactly the gradients plus a few scalars.
  """
  out = run_json_worker("hlo_worker.py", timeout=600)
  params = [tuple(s) for s in out["param_shapes"]]
  per_layer = {s[1:] for s in params if len(s) == 3 and s[0] == 3}
  unstacked = {s for s in params if len(s) == 2 and s[0] != 3}   # (3, 32): stacked gains
  assert per_layer == {(32, 32), (32, 64), (64, 32)} and unstacked == {(257, 32), (32, 257)}

  fsdp = out["1x8"]
  gathers = [c for c in fsdp if c["op"] == "all-gather"]
  assert not [c for c in fsdp if c["op"] in ("all-to-all", "collective-permute")]
  for c in gathers:
    for shape in map(tuple, c["shapes"]):
      assert shape in per_layer | unstacked, c                  # weights only
      if shape in per_layer:
        assert c["loop_depth"] == 2, c       # inside the micro-batch and layer scans
  in_layer_scan = [c for c in gathers if c["loop_depth"] == 2]
  assert len(in_layer_scan) >= 2 * 7          # forward and backward, 7 matrices per layer
  for c in fsdp:                              # no collective moves an activation
    for shape in c["shapes"]:
      assert len(shape) <= 2, c

  data = out["8x1"]
  assert {c["op"] for c in data} == {"all-reduce"}
  assert all(c["loop_depth"] == 0 for c in data), data
  reduced = sorted(tuple(s) for c in data for s in c["shapes"] if s)
  assert reduced == sorted(params)                           # each gradient exactly once


@pytest.mark.slow   # 8 devices in a second process, 4 programs compiled and read
def test_paper_configs_step_and_diagnostics_move_no_activation():
  """Both paper configs (experiments/configs, sizes shrunk, mesh_fsdp=8, chunked loss,
  4 diagnostics examples on 8 devices): every floating-point collective of the
  training step and of the diagnostics step moves a weight (a parameter, one layer's
  slice of a stacked one, or its gradient), a scalar or a per-layer vector; integer
  ones move only token ids. Before: the loss chunks all-reduced (chunk, vocab) logits
  and the diagnostics split activations along d_model. With fused projections a
  gathered weight may be a layer's concatenated w_q|w_k|w_v (w_1|w_3)."""
  out = run_json_worker("hlo_worker.py", "paper")
  for name in ("postnorm_48l_d512_c4.json", "gpt2_774m.json"):
    params = [tuple(s) for s in out[f"{name}/params"]]
    layers = 2
    weights = set(params) | {s[1:] for s in params if len(s) >= 2 and s[0] == layers}
    weights |= {tuple(s) for s in out[f"{name}/fused"]}       # a layer's w_q|w_k|w_v
    weights |= {s[::-1] for s in weights if len(s) == 2}     # a tied head is embed^T
    for which in ("step", "diag"):
      seen = out[f"{name}/{which}"]
      assert any(c["op"] == "all-gather" for c in seen), (name, which)   # FSDP gathers
      for c in seen:
        for dtype, shape in zip(c["dtypes"], map(tuple, c["shapes"])):
          if dtype.startswith("s") or dtype.startswith("u") or dtype == "pred":
            assert len(shape) <= 3 and (not shape or shape[-1] == 40), (name, which, c)
            continue                                   # token ids of the examples
          small = len(shape) == 0 or shape in ((layers,), (1,))
          assert small or shape in weights, (name, which, c)
    # the LM head's gradient (d=64 x vocab 1024) is reduced once per micro-batch (loop
    # depth 1: the micro-batch scan), never inside the loss-chunk scan (depth 2: five
    # chunks of 256 tokens); before, every chunk all-reduced it
    head = [c for c in out[f"{name}/step"] if c["op"] in ("all-reduce", "reduce-scatter")
            and any(tuple(s) in ((64, 1024), (1024, 64)) for s in c["shapes"])]
    assert head and all(c["loop_depth"] <= 1 for c in head), (name, head)


@pytest.mark.slow   # two 8-device processes, 4 bf16 steps compiled and dumped
@pytest.mark.parametrize("grad_reduce_dtype", ["float32", "compute"])
def test_paper_configs_gather_bf16_and_reduce_gradients_in_float32(tmp_path,
                                                                  grad_reduce_dtype):
  """The bfloat16 training steps of both paper configs (shrunk, mesh_fsdp=8) right after
  SPMD partitioning, where the dtypes are those a GPU / TPU runs (XLA:CPU's later passes
  widen bf16 collectives): every weight all-gather, the embedding table's and the
  learned positions' included, moves bfloat16 (cast on the shards, then gathered), and
  with grad_reduce_dtype="float32" every gradient reduction is float32. "compute"
  (jax's own rule) reduces the layers' weight gradients in bfloat16: what the check
  would see without models/matmul.py."""
  dump = tmp_path / "dump"
  out = run_json_worker("hlo_worker.py", "reductions", grad_reduce_dtype, XLA_FLAGS=(
      f"--xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"))
  for name in ("postnorm_48l_d512_c4.json", "gpt2_774m.json"):
    seen = out[name]["collectives"]
    gathers = [c for c in seen if c["op"] == "all-gather"]
    assert gathers and all(c["dtypes"] == ["bf16"] for c in gathers), (name, gathers)
    reduced = [(c["dtypes"][0], tuple(c["shapes"][0])) for c in seen
               if c["op"] in ("all-reduce", "reduce-scatter")]
    matrices = [r for r in reduced if len(r[1]) == 2]
    assert len(matrices) >= 6, (name, reduced)              # the layers' weight gradients
    if grad_reduce_dtype == "float32":
      assert {dtype for dtype, _ in reduced} == {"f32"}, (name, reduced)
    else:
      assert sum(dtype == "bf16" for dtype, _ in matrices) >= 5, (name, reduced)
    # the diagnostics step gathers its replicated copy of the weights in bfloat16 by the
    # training step's rule (cast on the shards, numerics.compute_copy): the token
    # embedding (vocab 1024 x d) and the learned positions (40 x d) too; float32 only
    # norm gains and biases
    diag = [(c["dtypes"][0], tuple(c["shapes"][0])) for c in out[name]["diag"]
            if c["op"] == "all-gather"]
    assert any(dtype == "bf16" for dtype, _ in diag), (name, diag)
    assert {(1024, 64)} <= {shape for dtype, shape in diag if dtype == "bf16"}, (name, diag)
    assert all(len(shape) == 1 for dtype, shape in diag if dtype == "f32"), (name, diag)


@pytest.mark.slow   # 8 devices in a second process, 4 steps compiled and read
def test_tied_embedding_gradient_is_reduced_once_per_micro_batch():
  """The shrunk GPT-2 config (tied embeddings: the token table is both the lookup and
  the LM head; vocab 1024 padded, d=64) under mesh_fsdp=8, 2 micro-batches: in the
  compiled training step, bf16 and float32, chunked loss and plain head, exactly one
  all-reduce / reduce-scatter of a vocabulary-sized array per micro-batch (inside the
  micro-batch scan; XLA combines reductions into one op, so operands are counted): the
  table's gradient, its lookup's and its head's parts added on each device first
  (matmul.shard_copies). Before, each use reduced its own: two per micro-batch, (1024,
  64) and (64, 1024), in one combined all-reduce."""
  out = run_json_worker("hlo_worker.py", "tied")
  v, d = out["vocab"], out["d_model"]
  table = {(v, d), (d, v)}                          # all-reduced whole (XLA:CPU) ...
  shard = {(v // 8, d), (d, v // 8)}                # ... or reduce-scattered to the shards
  for case in ("bfloat16/256", "bfloat16/0", "float32/256", "float32/0"):
    # XLA combines reductions into one op of several operands: count the operands
    vocab_sized = [(c["loop_depth"], tuple(s)) for c in out[case]
                   if c["op"] in ("all-reduce", "reduce-scatter") for s in c["shapes"]
                   if tuple(s) in table or (c["op"] == "reduce-scatter" and tuple(s) in shard)]
    per_micro_batch = [s for depth, s in vocab_sized if depth >= 1]
    assert len(per_micro_batch) == 1, (case, vocab_sized)


def test_every_parameter_is_annotated_and_shards_d_model():
  from rankjax._src.train import tasks
  from tests.train.conftest import tiny_lm, tiny_mlp
  mesh = {"data": 2, "fsdp": 4}
  for cfg in (tiny_lm(), tiny_mlp()):
    task = tasks.make_task(cfg)
    params = jax.eval_shape(task.init, jax.random.PRNGKey(0))
    for (path, x), axes in zip(jax.tree_util.tree_leaves_with_path(params),
                               jax.tree.leaves(task.param_axes())):
      assert "unannotated" not in axes, jax.tree_util.keystr(path)     # no fallback here
      assert (tuple(axes)[:1] == ("layers",)) == (path[0].key in task.stacked_roots)
      spec = shard_lib.param_spec(axes, x.shape, mesh)
      want = tuple("fsdp" if a == "embed" else None for a in axes)
      assert spec == (P(*want) if any(want) else P()), (jax.tree_util.keystr(path), spec)
  # a dimension fsdp does not divide stays whole; an unannotated leaf (a plug-in's
  # opt-in) falls back to its largest divisible dimension
  assert shard_lib.param_spec(P("embed", "heads"), (18, 16), {"data": 1, "fsdp": 4}) == P()
  assert shard_lib.param_spec(P("unannotated", "unannotated"), (8, 64),
                              {"data": 1, "fsdp": 4}) == P(None, "fsdp")


def test_zero1_adds_data_to_a_free_dimension():
  assert shard_lib.zero1_spec(P("fsdp", None), (16, 64), 2, 4, False) == P("fsdp", "data")
  assert shard_lib.zero1_spec(P(None, "fsdp", None), (3, 16, 5), 2, 4, True) == \
      P(None, ("data", "fsdp"), None)
  assert shard_lib.zero1_spec(P(), (7,), 2, 1, False) == P()
  assert shard_lib.zero1_spec(P(), (8,), 1, 1, False) == P()


def test_slurm_local_device_ids_in_both_launcher_modes():
  ids = distributed.slurm_local_device_ids
  per_gpu = {"SLURM_PROCID": "11", "SLURM_LOCALID": "3", "SLURM_NTASKS_PER_NODE": "8"}
  assert ids({**per_gpu, "CUDA_VISIBLE_DEVICES": "3"}) == [0]            # --gpus-per-task=1
  assert ids({**per_gpu, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}) == [3]
  assert ids({**per_gpu, "SLURM_GPUS_ON_NODE": "8"}) == [3]
  per_node = {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1(x2)"}
  assert ids({**per_node, "SLURM_GPUS_ON_NODE": "8"}) == list(range(8))
  assert ids({**per_node, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == [0, 1, 2, 3]
  two_per_node = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x4)",
                  "SLURM_GPUS_ON_NODE": "8"}
  assert ids(two_per_node) == [4, 5, 6, 7]
  # --gpus-per-task=4, 2 tasks per node: each task sees its own 4 GPUs and drives all
  four = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
          "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
  assert ids({**four, "SLURM_GPUS_PER_TASK": "4"}) == [0, 1, 2, 3]
  assert ids({**four, "SLURM_GPUS_ON_NODE": "8"}) == [0, 1, 2, 3]
  assert ids({**four, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
              "SLURM_GPUS_ON_NODE": "8"}) == [4, 5, 6, 7]      # all visible: its block
  assert ids({**per_gpu, "RANKJAX_LOCAL_DEVICE_IDS": "0,1"}) == [0, 1]
  assert ids({}) is None and ids({"SLURM_PROCID": "0"}) is None


def test_tpu_vm_detected_without_launcher_variables(monkeypatch):
  for var in ("RANKJAX_DISTRIBUTED", "JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "SLURM_PROCID",
              "TPU_WORKER_HOSTNAMES", "OMPI_COMM_WORLD_SIZE", "JAX_PLATFORMS"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setattr(distributed, "_tpu_chips", lambda: 4)
  assert distributed.multi_host_env().startswith("Cloud TPU VM")
  monkeypatch.setattr(distributed, "_tpu_chips", lambda: 0)
  assert distributed.multi_host_env() is None
