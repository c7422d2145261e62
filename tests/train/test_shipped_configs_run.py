"""Every config in experiments/configs runs out of the box, at tiny size.

Each config is shrunk by ``--set``-style overrides (model sizes, batch, 2 updates)
that keep every other choice of the file (placement, norm, positions, FFN, remat,
compute dtype, loss chunking, optimizer, schedule, diagnostics). A config naming a
tokenizer file or data set that is absent must stop before training with one line
saying what to provide; the test then runs it on what this machine has (byte
tokenizer / Shakespeare, the bundled image set), which is what that line suggests.

Fashion-MNIST is hidden from every run here (``RANKJAX_FASHION_MNIST`` points at an
empty folder), as on a fresh machine without Debian's ``dataset-fashion-mnist``:
``mlp_classifier.json`` (scikit-learn's digits, a core dependency) must run as
shipped, ``mlp_classifier_fashion_mnist.json`` must stop with the one line.
"""

from __future__ import annotations

import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src.data import images as images_lib
from rankjax._src.train.loop import train
from rankjax._src.train.run_reader import load_run
from tests.train.conftest import ROOT

CONFIGS_DIR = ROOT / "experiments" / "configs"
CONFIGS = sorted(CONFIGS_DIR.glob("*.json"))
RUN = ["total_steps=2", "warmup_steps=0", "batch_size=4", "grad_accum=2", "checkpoint_every=2",
       "eval_every=2", "eval_batches=1", "diag_every=1", "diag_examples=2", "log_every=1"]
TINY_LM = ["model.num_layers=2", "model.d_model=16", "model.num_heads=2", "model.d_ff=32",
           "model.max_seq_len=24", "seq_len=20"]   # the attention diagnostic reads t >= 16
TINY_MLP = ["model.depth=2", "model.width=16"]
OFFLINE_TEXT = ["tokenizer=byte", "dataset=null", "data_dir=null"]


RUNS_AS_SHIPPED = {"mlp_classifier", "lm_tiny_shakespeare"}   # no data to prepare
FASHION_LINE = "apt-get install dataset-fashion-mnist"


@pytest.fixture(autouse=True)
def no_fashion_mnist(tmp_path, monkeypatch):
  """A machine without Debian's Fashion-MNIST package (what a fresh install has)."""
  empty = tmp_path / "no_fashion_mnist"
  empty.mkdir()
  monkeypatch.setenv("RANKJAX_FASHION_MNIST", str(empty))
  assert not images_lib.fashion_mnist_available()


def _tiny(path) -> TrainConfig:
  cfg = config_lib.from_json(TrainConfig, path)
  return config_lib.override(cfg, (TINY_LM if cfg.model.kind == "transformer" else TINY_MLP) + RUN)


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
  cfg = _tiny(path)
  result, line = _run_or_one_line(cfg, tmp_path / "run")
  if path.stem in RUNS_AS_SHIPPED:
    assert line is None, line
  if line is not None:
    if cfg.model.kind == "transformer":
      assert "does not exist" in line or "not prepared" in line, line
      cfg = config_lib.override(cfg, OFFLINE_TEXT)
    else:
      assert FASHION_LINE in line, line
      cfg = config_lib.override(cfg, ["dataset=digits", "model.input_dim=64"])
    result = train(cfg, tmp_path / "run", progress_bar=False)
  assert (result.status, result.step) == ("completed", 2)
  run = load_run(tmp_path / "run")
  assert [r["step"] for r in run.history if r.get("kind") == "eval"] == [2]
  assert run.diagnostics and list(run.diagnostic_steps) == [1, 2]
  if cfg.model.kind == "mlp":
    assert run.metrics["data"] == cfg.dataset    # the set used is named, never a fallback


def test_mlp_classifier_config_reads_a_set_every_install_has():
  """The shipped MLP config names the digits (no Debian package, no test extra) and
  its input layer fits them; the Fashion-MNIST variant keeps the paper-sized input."""
  from rankjax._src import data
  shipped = config_lib.from_json(TrainConfig, CONFIGS_DIR / "mlp_classifier.json")
  fashion = config_lib.from_json(TrainConfig, CONFIGS_DIR / "mlp_classifier_fashion_mnist.json")
  assert (shipped.dataset, shipped.model.input_dim) == ("digits", 64)
  info = data.dataset_info("images", dataset=shipped.dataset)
  assert info.name == "digits"
  data.check_model_fits(info, input_dim=shipped.model.input_dim,
                        num_classes=shipped.model.num_classes)
  assert (fashion.dataset, fashion.model.input_dim) == ("fashion_mnist", 784)
  assert config_lib.diff(shipped, fashion) == {
      "dataset": ("digits", "fashion_mnist"), "model.input_dim": (64, 784)}


def test_fashion_mnist_config_without_its_files_stops_with_one_line(tmp_path):
  """Before training, nothing written: one line naming the apt package."""
  cfg = _tiny(CONFIGS_DIR / "mlp_classifier_fashion_mnist.json")
  result, line = _run_or_one_line(cfg, tmp_path / "run")
  assert result is None
  assert FASHION_LINE in line and "RANKJAX_FASHION_MNIST" in line, line
