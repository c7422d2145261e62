"""The ``attention`` diagnostic (softmax-sensitivity paper Sec 5) against a direct
computation on the probabilities captured by ``DecoderLM.apply(capture_probs=True)``."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig, TransformerConfig
from rankjax._src.measure import sensitivity as sens
from rankjax._src.models.transformer import DecoderLM
from rankjax._src.train import diagnostics as diag_lib
from rankjax._src.train import diagnostics_attention as da
from rankjax._src.train import tasks as task_lib
from rankjax._src.train.state import make_optimizer, make_step, make_init

NUM_ROWS = 24


def _cfg(norm_position: str) -> TrainConfig:
  lm = TransformerConfig(vocab_size=257, num_layers=3, d_model=16, num_heads=2, d_ff=32,
                         max_seq_len=24, norm_position=norm_position, norm_op="layer",
                         ffn="gelu", init="gpt2", pos_embedding="learned", tie_embeddings=True,
                         dropout_rate=0.1, attn_dropout_rate=0.1)
  return TrainConfig(model=lm, seq_len=24, batch_size=4, grad_accum=2,
                     warmup_steps=1, total_steps=4, diag_every=1, diag_examples=2, seed=3)


def test_default_layers():
  assert da.default_layers(36) == (0, 18, 35)
  assert da.default_layers(1) == (0,)
  assert da.default_layers(2) == (0, 1)


@pytest.mark.parametrize("norm_position", ["pre", pytest.param("post", marks=pytest.mark.slow)])
def test_layer_probs_match_captured_stack(norm_position):
  cfg = _cfg(norm_position).model
  model = DecoderLM(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 24), 0, 257)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
  capture = jax.jit(lambda p, x: model.apply({"params": p}, x, capture_probs=True,
                                             mutable=["intermediates"])[1])
  stack = capture(params, tokens)["intermediates"]["layers"]["attn"]["attn_probs"][0]
  got = jax.jit(lambda p, x: da.layer_probs(model, p, x, (2, 0)))(params, tokens)
  np.testing.assert_allclose(got[0], stack[2], atol=1e-6)
  np.testing.assert_allclose(got[1], stack[0], atol=1e-6)


@pytest.mark.slow
def test_diagnostics_step_equals_direct_computation():
  """Statistics from the jitted diagnostics step == attention_statistics on the
  probabilities captured from the same parameters and examples (same rows)."""
  diag_lib.register("attention_test")(
      lambda d: da.attention_diagnostic(d, None, NUM_ROWS, min_query=16))
  cfg = _cfg("pre")
  task = task_lib.make_task(cfg)
  tx = make_optimizer(cfg, task.stacked_roots)
  state = jax.jit(make_init(task, tx, cfg.seed))()
  diags = diag_lib.resolve(("attention_test",))
  step = jax.jit(make_step(task, cfg, tx, diags))
  tokens = jax.random.randint(jax.random.PRNGKey(7), (cfg.grad_accum, 2, 25), 0, 257)
  batch = {"inputs": tokens[..., :-1], "targets": tokens[..., 1:]}
  params_before = state.params
  _, _, out = step(state, batch)
  out = jax.device_get(out)
  got = out["attention_test"]

  examples = batch["inputs"][-1, :cfg.diag_examples]
  captured = jax.jit(lambda p, x: task.model.apply({"params": p}, x, capture_probs=True,
                                                    mutable=["intermediates"])[1])
  stack = captured(params_before, examples)["intermediates"]["layers"]["attn"]["attn_probs"][0]
  layers = da.default_layers(cfg.model.num_layers)
  np.testing.assert_array_equal(got["layers"], layers)
  for i, layer in enumerate(layers):
    key = da.row_key(1, i)                  # the step's update number is 1
    for method, name in (("greedy_prefix", "theta_cert"), ("balance", "theta_balance")):
      direct = sens.attention_statistics(stack[layer], key, num_rows=NUM_ROWS, min_query=16,
                                         percentiles=da.PERCENTILES, method=method)
      for stat in ("p5", "p25", "p50", "p75", "p95", "mean"):
        np.testing.assert_allclose(got[f"{name}_{stat}"][i], direct["theta_cert"][stat],
                                   rtol=1e-5, atol=1e-6, err_msg=f"{name}_{stat} layer {layer}")
        if method == "greedy_prefix":
          for other in ("p_max", "entropy_norm"):
            np.testing.assert_allclose(got[f"{other}_{stat}"][i], direct[other][stat],
                                       rtol=1e-5, atol=1e-6)
    t = np.asarray(direct["rows"]["t"])
    assert t.min() >= 16
    np.testing.assert_allclose(got["p_max_uniform_mean"][i], np.mean(1.0 / (t + 1)), rtol=1e-5)
  # an independent numpy check of one statistic on the same rows (greedy prefix, Sec 5)
  rows = sens.attention_statistics(stack[0], da.row_key(1, 0), num_rows=NUM_ROWS)["rows"]
  p = np.asarray(stack[0])[np.asarray(rows["b"]), np.asarray(rows["h"]), np.asarray(rows["t"])]
  p = p / p.sum(-1, keepdims=True)
  c = np.cumsum(-np.sort(-p, axis=-1), axis=-1)
  k = np.argmin(np.abs(c - 0.5), axis=-1)
  cert = 4 * c[np.arange(len(k)), k] * (1 - c[np.arange(len(k)), k])
  np.testing.assert_allclose(got["theta_cert_p50"][0], np.median(cert), rtol=1e-5)
  np.testing.assert_allclose(got["p_max_mean"][0], p.max(-1).mean(), rtol=1e-5)


def test_registered_and_config_parses():
  assert "attention" in diag_lib.available()
  cfg = config_lib.override(_cfg("pre"), ['diagnostics=["basic","attention"]'])
  assert cfg.diagnostics == ("basic", "attention")


@pytest.mark.parametrize("scale", ["quick", "quick_paper_lr", "paper"])
def test_experiment_configs_build(scale):
  """The softmax study's configs parse and build (shapes only) with the paper's model
  (App D.1): LayerNorm with gain and bias, Post-LN without an embedding LayerNorm,
  attention-probability dropout 0.1; paper scale is the project's one 774M config."""
  from experiments.softmax_sensitivity import prepost_training as pt
  from rankjax._src.train.tasks import count_params
  cfg = pt.make_config(scale, "post", 42)
  assert cfg.model.norm_bias and not cfg.model.uses_embed_norm and not cfg.model.uses_final_norm
  assert cfg.model.attn_dropout_rate == 0.1 and cfg.model.dropout_rate == 0.1
  assert cfg.diagnostics == ("basic", "attention") and cfg.diag_every == 10
  assert cfg.learning_rate == (1e-3 if scale == "quick" else 3e-4)
  task = task_lib.make_task(cfg)
  tx = make_optimizer(cfg, task.stacked_roots)
  n = count_params(jax.eval_shape(make_init(task, tx, cfg.seed)).params)
  if scale == "paper":
    assert pt.CONFIGS["paper"].endswith("experiments/configs/gpt2_774m.json")
    assert 7.7e8 < n < 7.8e8, n                       # 774M (App D.1)
