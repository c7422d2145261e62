"""The spec-peak table and MFU arithmetic (rankjax._src.train.mfu)."""

import jax.numpy as jnp
import pytest

from rankjax._src.train import mfu


@pytest.mark.parametrize("kind, dtype, peak", [
    ("NVIDIA H200", jnp.bfloat16, 989e12),
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
    ("NVIDIA H100 PCIe", "bfloat16", 756e12),
    ("NVIDIA A100-SXM4-80GB", jnp.float32, 19.5e12),
    ("TPU v4", "bfloat16", 275e12),
    ("TPU v5 lite", "bfloat16", 197e12),
    ("TPU v5", "bfloat16", 459e12),
    ("TPU v5p", "bfloat16", 459e12),
    ("TPU v6 lite", "bfloat16", 918e12),
])
def test_spec_peak_per_device_kind(kind, dtype, peak):
  assert mfu.spec_peak(kind, dtype) == peak


@pytest.mark.parametrize("kind, dtype", [
    ("cpu", "float32"), ("TPU v5 lite", "float32"), ("TPU v4 lite", "bfloat16"),
    ("Some Future GPU", "bfloat16")])
def test_no_peak_gives_no_mfu(kind, dtype):
  peak = mfu.spec_peak(kind, dtype)
  assert peak is None
  assert mfu.mfu(1e12, 1.0, 1, peak) is None


def test_mfu_arithmetic():
  # 8 H200s doing 3.956e15 model FLOPs per step in 1 s: half the bf16 peak.
  peak = mfu.spec_peak("NVIDIA H200", "bfloat16")
  assert mfu.mfu(0.5 * 8 * 989e12, 1.0, 8, peak) == pytest.approx(0.5)
  assert mfu.mfu(1e12, 0.0, 1, peak) is None


@pytest.mark.slow   # a training run; the MFU arithmetic and peaks are tested fast above
def test_training_logs_mfu_against_the_spec_peak(tmp_path, monkeypatch):
  """With a spec peak (faked for the CPU), every log step records mfu = model FLOPs /
  mean step time / (devices * peak); without one (the CPU) no mfu is logged."""
  import json

  import jax

  from rankjax._src.train import loop
  from tests.train.conftest import tiny_lm

  cfg = tiny_lm(log_every=2, total_steps=4, diag_every=0, eval_every=0)
  monkeypatch.setattr(mfu, "local_spec_peak", lambda dtype: 1e9)
  loop.train(cfg, tmp_path / "run", progress_bar=False)
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
  train_rows = [r for r in rows if r.get("kind", "train") == "train"]
  compiled = loop.build_for_run(cfg)
  flops = compiled.task.flops_per_example() * cfg.batch_size
  logged = [r for r in train_rows if "mfu" in r]
  assert [r["step"] for r in logged] == [2, 4]
  for r in logged:
    # the mean step time of the window is tokens_per_step / tokens_per_s_avg
    mean_dt = cfg.batch_size * cfg.seq_len / r["tokens_per_s_avg"]
    assert r["mfu"] == pytest.approx(flops / mean_dt / (jax.device_count() * 1e9), rel=1e-6)
    full = compiled.task.flops_per_example(causal=False) * cfg.batch_size
    assert r["mfu_full_attention"] == pytest.approx(r["mfu"] * full / flops, rel=1e-9)

  monkeypatch.undo()
  loop.train(cfg, tmp_path / "cpu", progress_bar=False)
  rows = [json.loads(line) for line in (tmp_path / "cpu" / "metrics.jsonl").open()]
  assert not any("mfu" in r for r in rows)


@pytest.mark.parametrize("ffn, tie, pos", [("swiglu", False, "none"), ("gelu", True, "learned")])
def test_lm_flops_equal_a_count_of_every_matmul(ffn, tie, pos):
  """The model FLOPs against a count written matmul by matmul (not from the parameter
  count): per token and layer the Q, K, V, O projections (4 d^2 multiply-adds), the
  FFN (3 or 2 d d_ff), the head (d V); per sequence and layer the scores Q K^T and the
  values P V (T^2 d each, full; T(T+1)/2 d causal, ~half); x2 for multiply-add, x3 for
  forward + backward."""
  from rankjax._src.config import TrainConfig, TransformerConfig
  from rankjax._src.train import tasks
  lm = TransformerConfig(vocab_size=50, num_layers=3, d_model=16, num_heads=2, d_ff=40,
                         max_seq_len=12, ffn=ffn, tie_embeddings=tie, pos_embedding=pos,
                         norm_position="pre")
  cfg = TrainConfig(model=lm, seq_len=12, batch_size=2)
  task = tasks.make_task(cfg)
  T, d, f, V, L = 12, 16, 40, 50, 3
  per_token = L * (4 * d * d + (3 if ffn == "swiglu" else 2) * d * f) + d * V
  full = 3 * 2 * (T * per_token + L * 2 * T * T * d)
  causal = 3 * 2 * (T * per_token + L * 2 * (T * T / 2) * d)
  assert task.flops_per_example(causal=False) == pytest.approx(full, rel=1e-12)
  assert task.flops_per_example() == pytest.approx(causal, rel=1e-12)


def test_mlp_flops_count_the_matmuls_not_the_gains():
  """6 per matmul weight: input layer, each block's up and down matrices, output layer;
  the learned norm gains (``norm_gain``) multiply elementwise and do not count."""
  from rankjax._src.config import MLPConfig, TrainConfig
  from rankjax._src.train import tasks
  mlp = MLPConfig(depth=3, width=8, expansion=2.0, input_dim=5, num_classes=4,
                  norm_position="peri", norm_gain=True)
  task = tasks.make_task(TrainConfig(model=mlp))
  assert task.flops_per_example() == 6 * (5 * 8 + 3 * (8 * 16 + 16 * 8) + 8 * 4)


@pytest.mark.parametrize("ffn, tie", [("swiglu", False), ("gelu", True)])
def test_lm_flops_equal_xla_count_of_the_compiled_gradient(ffn, tie):
  """Against an independent count: XLA's cost analysis of the compiled gradient of the
  training loss (``Compiled.cost_analysis``: 2 FLOPs per multiply-add of every dot, plus
  the elementwise ops, which the model count leaves out). XLA computes the attention
  scores whole, so the comparison is with ``causal=False``; the layers are unrolled
  (``kernels.scan_unroll``) because the analysis counts a loop body once, not per iteration."""
  import jax
  import jax.numpy as jnp

  from rankjax._src.config import KernelConfig, TrainConfig, TransformerConfig
  from rankjax._src.train import tasks
  lm = TransformerConfig(vocab_size=512, num_layers=2, d_model=256, num_heads=4, d_ff=768,
                         max_seq_len=64, ffn=ffn, tie_embeddings=tie, norm_position="pre",
                         kernels=KernelConfig(attention_impl="xla", scan_unroll=2))
  cfg = TrainConfig(model=lm, seq_len=64, batch_size=2)
  task = tasks.make_task(cfg)
  params = jax.jit(task.init)(jax.random.key(0))       # one compile, not eager ops
  batch = {"inputs": jnp.zeros((2, 64), jnp.int32), "targets": jnp.zeros((2, 64), jnp.int32)}
  grad = jax.jit(jax.grad(lambda p: task.loss(p, batch, None, deterministic=True)[0]))
  cost = grad.lower(params).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  ratio = cost["flops"] / (cfg.batch_size * task.flops_per_example(causal=False))
  assert 1.0 <= ratio < 1.04, ratio      # the elementwise ops: 0.6% (swiglu), 1.8% (gelu)
