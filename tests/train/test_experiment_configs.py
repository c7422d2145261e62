"""Every config under experiments/configs parses and builds (shapes only, no compile)."""

from __future__ import annotations

import jax
import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src.train import state as state_lib
from rankjax._src.train.tasks import count_params, make_task
from tests.train.conftest import ROOT

CONFIGS = sorted((ROOT / "experiments" / "configs").glob("*.json"))


def test_configs_exist():
  names = {p.stem for p in CONFIGS}
  assert {"lm_tiny_shakespeare", "postnorm_48l_d512_c4", "gpt2_774m", "mlp_classifier"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_builds(path):
  cfg = config_lib.from_json(TrainConfig, path)
  task = make_task(cfg)
  tx = state_lib.make_optimizer(cfg, task.stacked_roots)
  state = jax.eval_shape(state_lib.make_init(task, tx, cfg.seed))
  n = count_params(state.params)
  expected = {"postnorm_48l_d512_c4": (1.7e8, 2.0e8),   # "about 180M" (postnorm Sec 4)
              "gpt2_774m": (7.7e8, 7.8e8)}              # 774M (softmax App D)
  if path.stem in expected:
    lo, hi = expected[path.stem]
    assert lo < n < hi, n


# each shipped config records its paper's diagnostics (the report's figures need them)
PAPER_DIAGNOSTICS = {"lm_tiny_shakespeare": ("basic", "postnorm", "attention"),
                     "postnorm_48l_d512_c4": ("basic", "postnorm"),   # postnorm paper
                     "gpt2_774m": ("basic", "attention"),             # softmax paper
                     "mlp_classifier": ("basic",),                    # the MLP's only one
                     "mlp_classifier_fashion_mnist": ("basic",)}


def test_shipped_configs_record_their_papers_diagnostics():
  got = {p.stem: config_lib.from_json(TrainConfig, p) for p in CONFIGS}
  assert {n: c.diagnostics for n, c in got.items()} == PAPER_DIAGNOSTICS
  assert all(c.diag_every > 0 for c in got.values())


def test_softmax_quick_sharpen_config():
  """experiments/softmax_sensitivity/configs/quick_sharpen.json: ``quick`` run for 800
  updates instead of 200, warmup still a quarter (App D.1 protocol otherwise unchanged;
  the run length under which Pre-LN attention sharpens, Fig 3)."""
  base = ROOT / "experiments" / "softmax_sensitivity" / "configs"
  quick = config_lib.from_json(TrainConfig, base / "quick.json")
  sharp = config_lib.from_json(TrainConfig, base / "quick_sharpen.json")
  assert config_lib.diff(quick, sharp) == {
      "warmup_steps": (50, 200), "total_steps": (200, 800), "checkpoint_every": (200, 800)}
  paper_lr = config_lib.from_json(TrainConfig, base / "quick_paper_lr.json")
  assert config_lib.diff(quick, paper_lr) == {"learning_rate": (1e-3, 3e-4)}   # App D.1
  assert sharp.warmup_steps * 4 == sharp.total_steps
  assert sharp.diagnostics == ("basic", "attention") and sharp.diag_every == 10
  task = make_task(sharp)
  tx = state_lib.make_optimizer(sharp, task.stacked_roots)
  jax.eval_shape(state_lib.make_init(task, tx, sharp.seed))


def test_softmax_issue53_scales():
  """quick_seeds8 and quick_deep (issue 53, fixed before their runs): ``quick`` at 8
  seeds, and ``quick`` at the paper model's 36 layers (App D.1) with every other field
  of quick; 1.8M parameters."""
  from experiments.softmax_sensitivity import prepost_training as pt, trained_bounds as tb
  assert pt.SCALES["quick_seeds8"]["seeds"] == (42, 123, 456, 7, 99, 1000, 2024, 31337)
  assert tb.SCALES["quick_seeds8"]["seeds"] == pt.SCALES["quick_seeds8"]["seeds"]
  assert pt.SCALES["quick_deep"]["seeds"] == pt.SEEDS == (42, 123, 456)
  assert "quick_deep" not in tb.SCALES
  for seed in (42, 31337):
    quick, wide = (pt.make_config(s, "post", seed) for s in ("quick", "quick_seeds8"))
    assert config_lib.diff(quick, wide) == {}
  quick, deep = (pt.make_config(s, "pre", 42) for s in ("quick", "quick_deep"))
  assert config_lib.diff(quick, deep) == {"model.num_layers": (6, 36)} == {
      "model.num_layers": (6, pt.DEEP_LAYERS)}
  task = make_task(deep)
  tx = state_lib.make_optimizer(deep, task.stacked_roots)
  n = count_params(jax.eval_shape(state_lib.make_init(task, tx, 42)).params)
  assert 1.75e6 < n < 1.85e6, n
