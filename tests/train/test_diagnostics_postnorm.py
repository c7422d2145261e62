"""The "postnorm" diagnostic inside the jitted diagnostics step (a tiny Post-Norm LM)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import TrainConfig, TransformerConfig
from rankjax._src.measure import gradients as gr
from rankjax._src.train import diagnostics
from rankjax._src.train import diagnostics_postnorm
from rankjax._src.train.state import make_optimizer, make_init, make_step
from rankjax._src.train.tasks import make_task

from tests.measure.test_gradients import _forward_sites, _from


def _cfg() -> TrainConfig:
  # embed_norm=False, final_norm=True: the Post-Norm variant that the direct
  # re-implementation of tests/measure/test_gradients.py mirrors (as its _cfg)
  lm = TransformerConfig(vocab_size=11, num_layers=2, d_model=8, num_heads=2, d_ff=16,
                         max_seq_len=8, norm_position="post", init="paper_collapse",
                         embed_norm=False, final_norm=True)
  return TrainConfig(model=lm, seq_len=8, batch_size=4, total_steps=2,
                     warmup_steps=0, diag_every=1, diagnostics=("postnorm",), diag_examples=3)


@pytest.mark.slow
def test_postnorm_diagnostic_step_matches_direct_grads():
  cfg = _cfg()
  task = make_task(cfg)
  diags = diagnostics.resolve(["postnorm"])
  tx = make_optimizer(cfg, task.stacked_roots)
  state = make_init(task, tx, 0)()
  k1, k2 = jax.random.split(jax.random.PRNGKey(7))
  batch = {"inputs": jax.random.randint(k1, (1, 4, 8), 0, 11, jnp.int32),
           "targets": jax.random.randint(k2, (1, 4, 8), 0, 11, jnp.int32)}
  step = jax.jit(make_step(task, cfg, tx, diags))
  _, _, out = step(state, batch)
  out = jax.device_get(out["postnorm"])
  params = state.params
  tokens, targets = batch["inputs"][0, :3], batch["targets"][0, :3]
  lm = cfg.model
  sites, _ = _forward_sites(lm, params, tokens)

  def ce(logits):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))

  for k in (1, 2):
    want = []
    for l in range(lm.num_layers):
      gx = jax.grad(lambda v: ce(_from(lm, params, l, f"x{k}", v)))(sites[f"x{k}"][l])
      gy = jax.grad(lambda v: ce(_from(lm, params, l, f"y{k}", v)))(sites[f"y{k}"][l])
      want.append(np.linalg.norm(gx) / np.linalg.norm(gy))
    np.testing.assert_allclose(out[f"alpha_{k}"], want, rtol=1e-4)
    mean, _ = gr.rms_factor_stats(sites[f"y{k}"], lm.norm_eps)
    np.testing.assert_allclose(out[f"rms_factor_mean_{k}"], mean, rtol=1e-5)
    np.testing.assert_allclose(out[f"contraction_mean_{k}"], np.array(want) * mean, rtol=1e-4)
    # the bound's factor: alpha * max_j |g_j| * max over the rows of sqrt(d)/||y_i||
    y = np.asarray(sites[f"y{k}"], np.float64)
    row_max = np.max(1 / np.sqrt(np.mean(y * y, -1) + lm.norm_eps), axis=(-2, -1))
    gain = np.asarray(params["layers"][diagnostics_postnorm.NORM_AFTER_Y[k]]["scale"])
    g_max = np.max(np.abs(gain), axis=-1)
    np.testing.assert_allclose(out[f"rms_factor_max_{k}"], row_max, rtol=1e-5)
    np.testing.assert_allclose(out[f"gain_max_{k}"], g_max, rtol=1e-6)
    np.testing.assert_allclose(out[f"contraction_{k}"], np.array(want) * g_max * row_max,
                               rtol=1e-4)
  assert out["grad_norm"].shape == (2,)
  assert out["grad_norm_attn"].shape == (2,) and out["grad_norm_embed"].shape == ()
  from rankjax._src.measure.losses import frequency_loss
  np.testing.assert_allclose(out["freq_loss"], frequency_loss(targets), rtol=1e-6)
  y_last = np.asarray(sites["y2"][-1], np.float64)            # (B, T, d), float64
  tsim = np.mean([y_last.shape[1] * np.sum(yb.mean(0) ** 2) / np.sum(yb ** 2) for yb in y_last])
  np.testing.assert_allclose(out["last_tsim"], tsim, rtol=1e-5)
  assert not any(k.startswith("tsim_") for k in out)        # one series: basic/tsim_*
  assert out["collapse_alarm"] in (0.0, 1.0)


def test_summarize_run_on_synthetic_series():
  steps = np.arange(0, 200, 10)
  n = len(steps)
  sim = np.where(steps >= 100, 0.99, 0.3)
  loss = np.concatenate([np.linspace(5, 2.5, n // 2), np.full(n - n // 2, 3.3)])
  gn = np.ones((n, 4))
  gn[steps >= 100, 0] = 1e-4
  diag = {"postnorm/last_tsim": sim, "postnorm/loss": loss, "postnorm/loss_examples": loss,
          "postnorm/freq_loss": np.full(n, 3.25), "postnorm/grad_norm": gn}
  s = diagnostics_postnorm.summarize_run(diag, steps, stream_freq_loss=3.3)
  assert s["transition_step"] == 100
  assert s["first_alarm_step"] == 100 and s["first_alarm_step_stream"] == 100
  assert s["final_grad_ratio_first_over_last"] == 1e-4


def test_postnorm_collapse_configs_build():
  """experiments/postnorm_collapse/configs parse, build (shapes only) and name
  diagnostics that resolve."""
  import pathlib
  from rankjax._src import config as config_lib
  from rankjax._src.train import state as state_lib
  root = pathlib.Path(__file__).resolve().parents[2]
  paths = sorted((root / "experiments" / "postnorm_collapse" / "configs").glob("*.json"))
  assert {p.stem for p in paths} >= {"collapse_post_quick", "stable_post_quick"}
  for path in paths:
    cfg = config_lib.from_json(TrainConfig, path)
    diagnostics.resolve(cfg.diagnostics)
    task = make_task(cfg)
    tx = state_lib.make_optimizer(cfg, task.stacked_roots)
    jax.eval_shape(state_lib.make_init(task, tx, cfg.seed))
