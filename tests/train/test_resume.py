"""Exact resume after SIGKILL and SIGTERM, corrupt checkpoints, config changes.

A reference run of 8 updates (checkpoints every 4) runs in the test process. A
second run of the same config is killed with SIGKILL at update 6 in its own process,
after its checkpoint at update 4 is on disk, then resumed here: its loss must equal
the reference bitwise at every update after 4 (slow: a second process; the fast
tests resume in-process after SIGTERM, an error and a corrupt checkpoint, each
against the same reference bitwise). A run SIGKILLed before its first checkpoint
(a worker process too, ~5 s) is rerun from step 0 with each step logged once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal

import numpy as np
import pytest

from rankjax._src.train.loop import train
from rankjax._src.train.run_reader import load_run
from tests.train.conftest import logs_warning, losses, tiny_lm, tiny_mlp

CONFIGS = {"lm": tiny_lm, "mlp": tiny_mlp}


class _References(dict):
  """{kind: the workdir of an uninterrupted run of 8 updates}, each trained in this
  process when first asked for (the fast tests need only the LM's)."""

  def __init__(self, tmp_path_factory):
    super().__init__()
    self.tmp_path_factory = tmp_path_factory

  def __missing__(self, kind):
    full = self.tmp_path_factory.mktemp(f"full_{kind}")
    result = train(CONFIGS[kind](), full, progress_bar=False)
    assert (result.status, result.step) == ("completed", 8)
    self[kind] = full
    return full


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return _References(tmp_path_factory)


@pytest.fixture(scope="module")
def runs(reference, worker, compile_cache, tmp_path_factory):
  """{kind: (reference workdir, killed-then-resumed workdir, resume result)}: a second
  process is SIGKILLed at update 6 (a worker process: slow tests only)."""
  out = {}
  for kind, make in CONFIGS.items():
    cfg = make()
    killed = tmp_path_factory.mktemp(f"killed_{kind}")
    code, _, err = worker(cfg, killed, "--kill-at", "6", "--wait-checkpoint", "4")
    assert code == -signal.SIGKILL, err
    assert not (killed / "checkpoints" / "8").exists()
    resumed = train(cfg, killed, progress_bar=False)
    out[kind] = (reference[kind], killed, resumed)
  return out


@pytest.mark.slow   # a separate process; the in-process SIGTERM resume below is fast
@pytest.mark.parametrize("kind", ["lm", "mlp"])
def test_sigkill_after_checkpoint_then_resume_is_bitwise_exact(kind, runs):
  full, killed, resumed = runs[kind]
  assert (resumed.start_step, resumed.step, resumed.status) == (4, 8, "completed")
  reference, after = losses(full), losses(killed)
  assert sorted(after) == list(range(1, 9))       # lines past the checkpoint rewritten
  for step in range(1, 9):
    assert after[step] == reference[step], (step, after[step], reference[step])


def test_saved_run_has_its_diagnostics_history_and_max_to_keep(reference):
  """LM: diagnostics at updates 1, 2, 4, 6, 8; max_to_keep=1 keeps only step 8."""
  full_dir = reference["lm"]
  assert sorted(p.name for p in (full_dir / "checkpoints").iterdir()) == ["8"]
  full = load_run(full_dir)
  assert full.step == 8 and full.config == tiny_lm()
  assert [int(s) for s in full.diagnostic_steps] == [1, 2, 4, 6, 8]
  for key in ("basic/grad_norm", "basic/param_norm", "basic/tsim_x1", "basic/tsim_y2",
              "basic/act_grad_norm_x2"):
    assert full.diagnostics[key].shape == (5, 1), key          # (diag steps, layers)
    assert np.all(np.isfinite(full.diagnostics[key])), key
  tsim = full.diagnostics["basic/tsim_x1"]
  assert np.all((tsim >= 0) & (tsim <= 1))
  assert full.params["layers"]["attn"]["w_q"].shape[0] == 1
  assert isinstance(full.params["embed"]["embedding"], np.ndarray)
  assert [r["step"] for r in full.history if "kind" not in r] == list(range(1, 9))
  assert [r["step"] for r in full.history if r.get("kind") == "eval"] == [4, 8]
  assert full.metrics["step"] == 8 and full.metrics["diagnostic_steps"] == 5
  assert full.checkpoint_steps == (8,)
  assert repr(full) == (f"Run({str(full_dir)!r}, model='transformer', step=8 of 8, "
                        "checkpoints=1, "
                        f"diagnostics={len(full.diagnostics)} series x 5 steps, "
                        "history=10 rows)")


@pytest.mark.slow   # uses the SIGKILLed run
def test_diagnostics_history_survives_kill(runs):
  """The SIGKILLed-and-resumed run has the uninterrupted run's diagnostics history."""
  full_dir, killed_dir, _ = runs["lm"]
  full = load_run(full_dir)
  resumed = load_run(killed_dir)   # rows before the kill came back from checkpoint 4
  np.testing.assert_array_equal(resumed.diagnostic_steps, full.diagnostic_steps)
  assert resumed.diagnostics.keys() == full.diagnostics.keys()
  for key, value in full.diagnostics.items():
    np.testing.assert_array_equal(resumed.diagnostics[key], value, err_msg=key)


def test_sigterm_saves_exits_cleanly_and_resumes(reference, tmp_path):
  cfg = tiny_lm()

  def on_step(step):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  previous = signal.getsignal(signal.SIGTERM)
  result = train(cfg, tmp_path, on_step=on_step, progress_bar=False)
  assert (result.status, result.step) == ("preempted", 3)
  assert signal.getsignal(signal.SIGTERM) is previous       # handler restored
  assert load_run(tmp_path).step == 3
  result = train(cfg, tmp_path, progress_bar=False)
  assert (result.start_step, result.step) == (3, 8)
  assert losses(tmp_path) == losses(reference["lm"])


@pytest.mark.slow   # needs the MLP reference run; test_restore's corrupt-step tests are fast
def test_corrupt_latest_checkpoint_falls_back_with_warning(reference, tmp_path, caplog):
  workdir = tmp_path / "run"
  shutil.copytree(reference["mlp"], workdir)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4", "8"]
  (workdir / "checkpoints" / "8" / "state" / "_METADATA").write_text("{ half-written")

  with logs_warning(caplog, r"step 8 .*corrupt.*using step 4 instead"):
    assert load_run(workdir).step == 4
  with logs_warning(caplog, r"step 8 .*corrupt.*using step 4 instead"):
    result = train(tiny_mlp(), workdir, progress_bar=False)
  assert (result.start_step, result.step) == (4, 8)
  assert len(list((workdir / "corrupt_checkpoints").iterdir())) == 1   # moved, not deleted
  assert losses(workdir) == losses(reference["mlp"])


def test_workdir_with_other_config_is_refused_naming_fields(reference):
  full = reference["lm"]
  cfg = tiny_lm(learning_rate=5e-3, model=dataclasses.replace(tiny_lm().model, d_model=32))
  before = (full / "metrics.jsonl").read_text()
  with pytest.raises(ValueError, match="different config") as info:
    train(cfg, full)
  assert "learning_rate: 0.01 (saved) vs 0.005 (given)" in str(info.value)
  assert "model.d_model: 16 (saved) vs 32 (given)" in str(info.value)
  assert (full / "metrics.jsonl").read_text() == before            # nothing touched


@pytest.mark.slow   # uses the SIGKILLed run
def test_tensorboard_holds_each_step_once_after_kill_and_resume(runs):
  """The killed run wrote steps 1-6 (its TB flushes lag), the resume rewrote 5-8:
  every tag has each step once, the same steps and values as the uninterrupted run,
  and the diagnostics reach TensorBoard per layer at the diagnostics steps."""
  from rankjax._src.train import tensorboard as tb
  pytest.importorskip("tensorboardX")
  full_dir, killed_dir, _ = runs["lm"]
  full = tb.read_scalars(str(full_dir / "tensorboard"))
  resumed = tb.read_scalars(str(killed_dir / "tensorboard"))
  assert [s for s, _ in full["train/loss"]] == list(range(1, 9))   # log_every=1
  assert resumed.keys() == full.keys()
  for tag, series in resumed.items():
    steps = [s for s, _ in series]
    assert len(steps) == len(set(steps)), (tag, steps)
    if "time" in tag or "_per_s" in tag:   # timings differ; a window of compile steps
      continue                             # alone (update 1, the resumed 5) has no mean
    assert sorted(steps) == sorted(s for s, _ in full[tag]), tag
    assert sorted(series) == sorted(full[tag]), tag
  run = load_run(full_dir)
  for key, values in run.diagnostics.items():   # (diag steps, layers)
    if values.ndim == 2:
      series = full[f"diagnostics/{key}/layer_00"]
      assert [s for s, _ in series] == [int(s) for s in run.diagnostic_steps], key
      np.testing.assert_allclose([v for _, v in series], values[:, 0], rtol=1e-6, err_msg=key)


@pytest.mark.slow
def test_profile_images_once_per_diagnostics_step_after_kill_and_resume(worker, tmp_path):
  """MLP, diagnostics at 1, 2, 4, 6, 8: SIGKILL after update 6 (checkpoint 4), resume.
  The per-layer profile image (``image_every=1``: at every diagnostics step) is in the
  event files once at each diagnostics step, as in the uninterrupted run."""
  from rankjax._src.train import tensorboard as tb
  pytest.importorskip("tensorboardX")
  cfg = tiny_mlp(diag_every=2, diag_examples=4, image_every=1)
  full = train(cfg, tmp_path / "full", progress_bar=False)
  assert full.step == 8
  code, _, err = worker(cfg, tmp_path / "killed", "--kill-at", "6", "--wait-checkpoint", "4")
  assert code == -signal.SIGKILL, err
  resumed = train(cfg, tmp_path / "killed", progress_bar=False)
  assert (resumed.start_step, resumed.step) == (4, 8)
  tag = "diagnostics/basic/per_layer"
  for run in ("full", "killed"):
    images = tb.read_images(str(tmp_path / run / "tensorboard"))
    assert list(images) == [tag], (run, list(images))
    assert sorted(s for s, _ in images[tag]) == [1, 2, 4, 6, 8], run


@pytest.mark.slow   # a killed worker process and its rerun (about 11 s on 2 cores)
def test_sigkill_before_the_first_checkpoint_then_rerun_holds_each_step_once(worker, tmp_path):
  """No checkpoint yet (checkpoint_every=100) when update 10 is SIGKILLed: the rerun
  starts over at step 0, and the event files and metrics.jsonl hold each step once."""
  from rankjax._src.train import tensorboard as tb
  pytest.importorskip("tensorboardX")
  cfg = tiny_lm(total_steps=12, checkpoint_every=100, eval_every=0)
  workdir, logdir = tmp_path / "killed", str(tmp_path / "killed" / "tensorboard")
  code, _, err = worker(cfg, workdir, "--kill-at", "10")
  assert code == -signal.SIGKILL, err
  assert not any((workdir / "checkpoints").glob("*/commit_success.txt"))
  assert any(e.step for e in tb.read_events(logdir) if e.summary.value)  # steps to drop
  rerun = train(cfg, workdir, progress_bar=False)
  assert (rerun.start_step, rerun.step, rerun.status) == (0, 12, "completed")
  written = [(v.tag, int(e.step)) for e in tb.read_events(logdir) for v in e.summary.value]
  assert len(written) == len(set(written)), sorted(written)
  assert sorted(s for s, _ in tb.read_scalars(logdir)["train/loss"]) == list(range(1, 13))
  assert sorted(losses(workdir)) == list(range(1, 13))
  steps = [json.loads(line)["step"] for line in
           (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps == list(range(1, 13))


@pytest.mark.slow   # an end-to-end training run (the default suite keeps its others)
def test_error_after_training_started_saves_the_latest_step(reference, tmp_path):
  """An exception at update 3 (not a checkpoint step) leaves checkpoint 3; the rerun
  continues from it and matches the uninterrupted run."""
  def fail_at_3(step):
    if step == 3:
      raise OSError("disk full (simulated)")

  with pytest.raises(OSError, match="simulated"):
    train(tiny_lm(), tmp_path, on_step=fail_at_3, progress_bar=False)
  assert load_run(tmp_path).step == 3
  result = train(tiny_lm(), tmp_path, progress_bar=False)
  assert (result.start_step, result.step) == (3, 8)
  assert losses(tmp_path) == losses(reference["lm"])


def test_nonfinite_state_is_not_saved_on_the_way_out(tmp_path):
  """Update 2 diverges (lr 1e30): the error saves nothing, checkpoint 1 stays newest."""
  cfg = tiny_mlp(learning_rate=1e30, total_steps=6, checkpoint_every=1)
  from rankjax._src.train.loop import NonFiniteLossError
  with pytest.raises(NonFiniteLossError, match="at step 2"):
    train(cfg, tmp_path, progress_bar=False)
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert saved == [1]
  assert np.isfinite(load_run(tmp_path).metrics["loss"])


def test_eval_split_smaller_than_a_batch_is_evaluated_whole(tmp_path):
  """digits' validation split has 179 images (every 10th of 1797): with a batch of
  256 evaluation uses one short batch of all 179, weighted by its size."""
  from rankjax._src.config import MLPConfig
  cfg = tiny_mlp(dataset="digits", model=MLPConfig(depth=2, width=16, expansion=2.0,
                                                   input_dim=64, num_classes=10),
                 batch_size=256, total_steps=2, eval_every=2, eval_batches=4)
  result = train(cfg, tmp_path, progress_bar=False)
  assert result.status == "completed"
  evals = [r for r in load_run(tmp_path).history if r.get("kind") == "eval"]
  assert [r["step"] for r in evals] == [2]
  assert evals[0]["eval_examples"] == 179.0 and 0 <= evals[0]["eval_accuracy"] <= 1


def test_finished_run_is_already_complete_and_writes_nothing(reference, capsys):
  full_dir = reference["lm"]
  before = sorted(p.name for p in (full_dir / "tensorboard").iterdir())
  lines = (full_dir / "metrics.jsonl").read_text()
  result = train(tiny_lm(), full_dir, progress_bar=False)
  assert (result.status, result.step) == ("already_complete", 8)
  assert "is already complete: step 8 of total_steps=8" in capsys.readouterr().out
  assert sorted(p.name for p in (full_dir / "tensorboard").iterdir()) == before
  assert (full_dir / "metrics.jsonl").read_text() == lines


def test_float64_parameters_without_x64_are_refused_and_dtype_is_recorded(reference, tmp_path):
  import dataclasses as dc
  import jax
  cfg = tiny_mlp()
  if not jax.config.jax_enable_x64:
    with pytest.raises(ValueError, match="param_dtype=float64 needs JAX's x64 mode"):
      train(dc.replace(cfg, model=dc.replace(cfg.model, param_dtype="float64")), tmp_path / "x")
    assert not (tmp_path / "x").exists()
  assert load_run(reference["lm"]).metrics["param_dtype"] == "float32"


def test_classifier_with_the_wrong_input_dim_is_refused_before_training(tmp_path):
  import dataclasses

  from rankjax._src.train import loop
  from tests.train.conftest import tiny_mlp

  cfg = tiny_mlp()
  bad = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                           input_dim=cfg.model.input_dim + 1))
  with pytest.raises(ValueError, match=f"model input_dim={bad.model.input_dim} does not match"):
    loop.train(bad, tmp_path / "run", progress_bar=False)
  assert not (tmp_path / "run" / "checkpoints").exists()
