"""Every config under experiments/configs parses and builds (shapes only, no compile)."""

from __future__ import annotations

import jax
import pytest

from rankjax import config as config_lib
from rankjax.config import TrainConfig
from rankjax.train import state as state_lib
from rankjax.train.tasks import count_params, make_task
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
