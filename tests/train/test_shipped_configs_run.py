"""Every config in experiments/configs runs out of the box, at tiny size.

Each config is shrunk by ``--set``-style overrides (model sizes, batch, 2 updates)
that keep every other choice of the file (placement, norm, positions, FFN, remat,
compute dtype, loss chunking, optimizer, schedule, diagnostics). A config naming a
tokenizer file or data set that is absent must stop before training with one line
saying what to provide; the test then runs it on what this machine has (byte
tokenizer / Shakespeare, the bundled image set), which is what that line suggests.
"""

from __future__ import annotations

import pytest

from rankjax import config as config_lib
from rankjax.config import TrainConfig
from rankjax.data import images as images_lib
from rankjax.train.loop import train
from rankjax.train.run_reader import load_run
from tests.train.conftest import ROOT

CONFIGS = sorted((ROOT / "experiments" / "configs").glob("*.json"))
RUN = ["total_steps=2", "warmup_steps=0", "batch_size=4", "grad_accum=2", "checkpoint_every=2",
       "eval_every=2", "eval_batches=1", "diag_every=1", "diag_examples=2", "log_every=1"]
TINY_LM = ["lm.num_layers=2", "lm.d_model=16", "lm.num_heads=2", "lm.d_ff=32",
           "lm.max_seq_len=16", "seq_len=8"]
TINY_MLP = ["mlp.depth=2", "mlp.width=16"]
OFFLINE_TEXT = ["tokenizer=byte", "dataset=null", "data_dir=null"]


def _run_or_one_line(cfg: TrainConfig, workdir):
  """(TrainResult, None), or (None, the one-line error) when its data is absent."""
  try:
    return train(cfg, workdir, progress_bar=False), None
  except ValueError as e:
    assert "\n" not in str(e).strip(), str(e)
    assert not workdir.exists()            # refused before anything was written
    return None, str(e)


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_runs_at_tiny_size(path, tmp_path, compile_cache):
  cfg = config_lib.from_json(TrainConfig, path)
  tiny = TINY_LM if cfg.model == "lm" else TINY_MLP
  cfg = config_lib.override(cfg, tiny + RUN)
  result, line = _run_or_one_line(cfg, tmp_path / "run")
  if line is not None:
    if cfg.model == "lm":
      assert "does not exist" in line or "not prepared" in line, line
      cfg = config_lib.override(cfg, OFFLINE_TEXT)
    else:
      assert "apt-get install dataset-fashion-mnist" in line, line
      if not images_lib.digits_available():
        pytest.skip("no image set on this machine: " + line)
      cfg = config_lib.override(cfg, ["dataset=digits", "mlp.input_dim=64"])
    result = train(cfg, tmp_path / "run", progress_bar=False)
  assert (result.status, result.step) == ("completed", 2)
  run = load_run(tmp_path / "run")
  assert [r["step"] for r in run.history if r.get("kind") == "eval"] == [2]
  assert run.diagnostics and list(run.diagnostic_steps) == [1, 2]
