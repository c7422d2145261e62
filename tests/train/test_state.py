"""Optimizer, schedule, clipping and gradient accumulation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rankjax._src.config import TrainConfig
from rankjax._src.train import state as state_lib
from rankjax._src.train.tasks import make_task
from tests.train.conftest import losses, tiny_lm, tiny_mlp


def test_schedule_warmup_then_cosine_to_min():
  cfg = TrainConfig(learning_rate=1.0, warmup_steps=4, total_steps=12, min_lr_ratio=0.1)
  lr = state_lib.make_schedule(cfg)
  values = [float(lr(count)) for count in range(12)]      # update s = count + 1
  np.testing.assert_allclose(values[:4], [0.25, 0.5, 0.75, 1.0], rtol=1e-6)
  assert all(a >= b for a, b in zip(values[3:], values[4:]))  # non-increasing decay
  np.testing.assert_allclose(values[-1], 0.1, rtol=1e-6)       # min at total_steps
  np.testing.assert_allclose(values[7], 0.1 + 0.45 * (1 + np.cos(np.pi * 0.5)), rtol=1e-6)
  constant = state_lib.make_schedule(dataclasses.replace(cfg, lr_schedule="constant"))
  assert [float(constant(c)) for c in (0, 3, 4, 11)] == [0.25, 1.0, 1.0, 1.0]


def test_weight_decay_mask_skips_vectors_and_the_layer_axis():
  params = {"embed": {"embedding": jnp.zeros((5, 4))}, "norm_final": {"scale": jnp.zeros(4)},
            "layers": {"attn": {"w_q": jnp.zeros((2, 4, 4))}, "norm": {"scale": jnp.zeros((2, 4))}}}
  mask = state_lib.decay_mask(params, ("layers",))
  assert mask == {"embed": {"embedding": True}, "norm_final": {"scale": False},
                  "layers": {"attn": {"w_q": True}, "norm": {"scale": False}}}


def _clip_as_runs_did(grads, norm, max_norm):
  """The step's clipping before it called optax (the hand-written rule earlier runs
  used): ``g`` below the threshold, else ``(g / norm) * max_norm``."""
  return jax.tree.map(lambda g: jnp.where(norm < max_norm, g, (g / norm) * max_norm), grads)


def test_clip_is_optax_and_bit_equal_to_the_rule_earlier_runs_used():
  """300 gradient trees with norms from 1e-3 to 1e3 around the threshold 1: the
  step's clipping (optax.clip_by_global_norm) gives the old rule's bits."""
  clip = state_lib.make_clip(1.0)
  key = jax.random.key(0)
  for _ in range(300):
    k1, k2, k3, key = jax.random.split(key, 4)
    scale = 10.0 ** jax.random.uniform(k3, (), minval=-3.0, maxval=3.0)
    grads = {"w": jax.random.normal(k1, (7, 5)) * scale, "b": {"v": jax.random.normal(k2, (11,))}}
    expected = _clip_as_runs_did(grads, optax.tree.norm(grads), 1.0)
    for ours, old in zip(jax.tree.leaves(clip(grads)), jax.tree.leaves(expected)):
      np.testing.assert_array_equal(ours, old)
  grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([[12.0]])}
  assert float(optax.tree.norm(grads)) == 13.0
  np.testing.assert_allclose(float(optax.tree.norm(clip(grads))), 1.0, rtol=1e-6)
  for big in (state_lib.make_clip(100.0), state_lib.make_clip(0.0)):   # below / off
    assert all(np.array_equal(big(grads)[k], grads[k]) for k in grads)


@pytest.mark.parametrize("warmup,total,ratio", [(100, 600, 0.0), (2000, 40000, 0.0),
                                                (50, 600, 0.1), (0, 600, 0.0), (7, 333, 0.05)])
def test_schedule_is_optax_warmup_cosine_up_to_rounding(warmup, total, ratio):
  """Updates 1..700 (count + 1): optax's warmup-cosine (and warmup-constant) schedule
  is the same function, to 4 float32 ulps of the peak; not its bits (make_schedule says
  why)."""
  peak = 6e-4
  cfg = TrainConfig(learning_rate=peak, warmup_steps=warmup, total_steps=total,
                    min_lr_ratio=ratio)
  counts = jnp.arange(700)
  optax_cosine = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total,
                                                    end_value=peak * ratio)
  optax_constant = optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(warmup, 1)), optax.constant_schedule(peak)],
      [warmup])
  for kind, reference in (("cosine", optax_cosine), ("constant", optax_constant)):
    ours = jax.vmap(state_lib.make_schedule(dataclasses.replace(cfg, lr_schedule=kind)))(counts)
    theirs = jax.vmap(lambda c: reference(c + 1))(counts)
    ulp = float(np.spacing(np.float32(peak)))   # 5.8e-11
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=0, atol=4 * ulp,
                               err_msg=kind)


def test_grad_accumulation_equals_one_large_batch():
  """k=4 micro-batches of 2 vs one batch of 8: loss and gradients, float32 tolerance."""
  cfg = tiny_lm(model=dataclasses.replace(tiny_lm().model, dropout_rate=0.0), batch_size=8)
  task = make_task(cfg)
  params = jax.jit(task.init)(jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (8, cfg.seq_len + 1), 0, 257)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

  @jax.jit
  def both(params, batch):
    one = state_lib.accumulate_grads(task, params, jax.tree.map(lambda x: x[None], batch),
                                     jax.random.PRNGKey(2))
    four = state_lib.accumulate_grads(
        task, params, jax.tree.map(lambda x: x.reshape(4, 2, *x.shape[1:]), batch),
        jax.random.PRNGKey(2))
    return one, four

  (g1, m1), (g4, m4) = both(params, batch)
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-6)
  for path, a in jax.tree_util.tree_leaves_with_path(g1):
    b = dict(jax.tree_util.tree_leaves_with_path(g4))[path]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
  assert float(optax.tree.norm(g1)) > 0


@pytest.mark.parametrize("field,value,match", [
    ("diag_every", -1, "diag_every"), ("mesh_fsdp", 0, "mesh_fsdp"),
    ("compute_dtype", "float16", "compute_dtype"), ("checkpoint_every", 0, "checkpoint_every"),
    ("lr_schedule", "linear", "lr_schedule"), ("warmup_steps", 50000, "warmup_steps"),
    ("diagnostics", "basic", "diagnostics"), ("optimizer", "sgd", "optimizer"),
])
def test_train_config_rejects_bad_fields(field, value, match):
  with pytest.raises(ValueError, match=match):
    TrainConfig(**{field: value})


def test_adam_needs_zero_weight_decay_and_seq_len_fits_model():
  with pytest.raises(ValueError, match="weight_decay=0.1 needs optimizer='adamw'"):
    TrainConfig(optimizer="adam")
  with pytest.raises(ValueError, match=r"seq_len=4096 exceeds the model's model.max_seq_len=2048"):
    TrainConfig(seq_len=4096)


def test_bfloat16_compute_keeps_float32_params_and_grads():
  cfg = tiny_lm(model=dataclasses.replace(tiny_lm().model, dropout_rate=0.0))
  f32, bf16 = make_task(cfg), make_task(dataclasses.replace(cfg, compute_dtype="bfloat16"))
  assert bf16.model.cfg.compute_dtype == "bfloat16"
  params = jax.jit(f32.init)(jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (4, cfg.seq_len + 1), 0, 257)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  grads = jax.eval_shape(jax.grad(lambda p: bf16.loss(p, batch, None)[0]), params)
  assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype("float32")}
  loss = jax.jit(lambda p: (f32.loss(p, batch, None, True)[0], bf16.loss(p, batch, None, True)[0]))
  a, b = loss(params)
  assert b.dtype == jnp.float32 and abs(float(a) - float(b)) < 0.05 * float(a)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  """lr=1e30: update 1 is finite, update 2's loss is not; checkpoint 1 stays the newest."""
  from rankjax._src.train.loop import NonFiniteLossError, train
  from rankjax._src.train.run_reader import load_run
  from tests.train.conftest import tiny_mlp
  cfg = tiny_mlp(learning_rate=1e30, checkpoint_every=1, total_steps=4)
  with pytest.raises(NonFiniteLossError, match=r"at step 2 is not finite: training stopped; "
                     r"the last good checkpoint, step 1, is intact"):
    train(cfg, tmp_path, progress_bar=False)
  run = load_run(tmp_path)
  assert run.step == 1 and all(np.all(np.isfinite(p)) for p in jax.tree.leaves(run.params))
  recorded = losses(tmp_path)                   # the bad step is logged, then nothing
  assert sorted(recorded) == [1, 2] and np.isfinite(recorded[1]) and not np.isfinite(recorded[2])


def test_label_frequency_metrics_are_the_updates_label_entropies():
  """label_frequency=true: the step's label_freq_aggregate / label_freq_per_sequence are
  the entropies (nats) of the update's labels, pooled over all grad_accum x micro
  sequences and per sequence then averaged: against numpy float64 counts."""
  from rankjax._src.train import sharding as shard_lib
  from rankjax._src.train.loop import build
  cfg = tiny_lm(label_frequency=True, diag_every=0, batch_size=8, grad_accum=2)
  c = build(cfg)
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, 12, (cfg.batch_size, cfg.seq_len + 1)).astype(np.int32)  # repeats
  batch = shard_lib.global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]},
                                 cfg.grad_accum, c.batch_sharding)
  _, metrics, _ = c.step(c.init(), batch)

  def entropy(labels):
    p = np.bincount(labels.ravel()).astype(np.float64)
    p = p[p > 0] / p.sum()
    return float(-(p * np.log(p)).sum())

  targets = tokens[:, 1:]
  assert float(metrics["label_freq_aggregate"]) == pytest.approx(entropy(targets), rel=1e-6)
  assert float(metrics["label_freq_per_sequence"]) == pytest.approx(
      np.mean([entropy(row) for row in targets]), rel=1e-6)
  assert float(metrics["label_freq_per_sequence"]) < float(metrics["label_freq_aggregate"])
  assert "label_freq_aggregate" not in build(tiny_lm(diag_every=0)).step(c.init(), batch)[1]
  with pytest.raises(ValueError, match="label_frequency=true needs a transformer model"):
    tiny_mlp(label_frequency=True)
