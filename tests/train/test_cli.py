"""``rankjax train``: end to end, resume by re-running, one clear line on bad input."""

from __future__ import annotations

import json

import pytest

import rankjax._src.cli
from rankjax._src import config as config_lib
from rankjax._src.train.loop import train
from tests.train.conftest import tiny_lm


@pytest.fixture
def cli(monkeypatch):
  monkeypatch.setattr(rankjax._src.cli, "SUBCOMMAND_MODULES", ("rankjax._src.train.cli",))
  return rankjax._src.cli.main


@pytest.fixture
def config_file(tmp_path):
  path = tmp_path / "tiny.json"
  config_lib.to_json(tiny_lm(), path)
  return path


@pytest.mark.slow
def test_train_then_rerun_resumes(cli, config_file, tmp_path, capsys, compile_cache):
  """The tiny LM of test_resume (compiled once per session), through the command."""
  workdir = tmp_path / "run"
  args = ["train", "--config", str(config_file), "--workdir", str(workdir)]
  assert cli(args) == 0
  out = capsys.readouterr().out
  assert f"started {workdir} at step 0: transformer on shakespeare" in out and "step 8  loss" in out
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train_rows = [r for r in rows if r.get("kind", "train") == "train"]
  assert [r["step"] for r in train_rows] == list(range(1, 9))
  assert {"loss", "grad_norm", "lr", "tokens_per_s", "step_time_s"} <= train_rows[0].keys()
  evals = [r for r in rows if r.get("kind") == "eval"]          # eval_every=4
  assert [r["step"] for r in evals] == [4, 8] and all(r["eval_loss"] > 0 for r in evals)
  assert config_lib.from_json(type(tiny_lm()), workdir / "config.json") == tiny_lm()
  # the same command again finds the run complete: nothing is run or written
  events = sorted((workdir / "tensorboard").iterdir())
  assert cli(args) == 0
  assert f"{workdir} is already complete: step 8 of total_steps=8" in capsys.readouterr().out
  assert sorted((workdir / "tensorboard").iterdir()) == events      # no empty event file
  # a different config is a different run: refused, one line, fields named
  assert cli(args + ["--set", "total_steps=9", "--set", "log_every=5"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and "total_steps: 8 (saved) vs 9 (given)" in err
  assert "log_every" not in err          # run-control fields may change on resume


@pytest.mark.parametrize("override,message", [
    ("model.depth=3", "--set model.depth: model kind 'transformer' has no field 'depth'"),
    ("seq_len=64", "seq_len=64 exceeds the model's model.max_seq_len=16"),
    ("diagnostics=[\"nope\"]", "unknown diagnostics ['nope']"),
    ("mesh_data=3", "mesh data=3 x fsdp=1 = 3 devices, but 1 are available"),
])
def test_bad_input_is_one_line_and_writes_nothing(cli, config_file, tmp_path, capsys,
                                                  override, message):
  workdir = tmp_path / "run"
  code = cli(["train", "--config", str(config_file), "--workdir", str(workdir),
              "--set", override])
  err = capsys.readouterr().err.strip()
  assert code == 2
  assert err.count("\n") == 0 and err.startswith("rankjax train: error:"), err
  assert message in err
  assert not workdir.exists()


def test_missing_data_set_names_data_dir(tmp_path):
  data_dir = tmp_path / "tfds"
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as info:
    train(tiny_lm(dataset="c4/en", data_dir=str(data_dir)), workdir)
  assert str(data_dir) in str(info.value) and "\n" not in str(info.value).strip()
  assert not workdir.exists()


def test_mlp_needs_input_and_class_counts(tmp_path):
  from rankjax._src.config import MLPConfig, TrainConfig
  cfg = TrainConfig(model=MLPConfig(depth=2, width=8), optimizer="adam",
                    weight_decay=0.0, batch_size=4, warmup_steps=0)
  with pytest.raises(ValueError, match="set model.input_dim and model.num_classes"):
    train(cfg, tmp_path / "run")


@pytest.mark.slow   # a training run in a second process
def test_compilation_cache_dir_is_filled_by_a_run(worker, tmp_path):
  from tests.train.conftest import tiny_mlp
  cache = tmp_path / "xla_cache"
  code, result, err = worker(tiny_mlp(total_steps=2, compilation_cache_dir=str(cache)),
                             tmp_path / "run")
  assert code == 0, err[-2000:]
  assert result["step"] == 2
  assert any(cache.iterdir())            # compiled programs stored for the next start


def test_gs_workdir_without_gcsfs_and_unreadable_checkpoints_are_one_line(
    cli, config_file, tmp_path, capsys, monkeypatch):
  import importlib.util as iu
  real = iu.find_spec
  monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a))
  assert cli(["train", "--config", str(config_file), "--workdir", "gs://bucket/run"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["rankjax train: error: workdir gs://bucket/run needs the gcsfs package "
                 "(pip install gcsfs)"], err
  monkeypatch.undo()

  from rankjax._src.train import checkpoint as ckpt_lib

  def refuse(*a, **k):
    raise ckpt_lib.RestoreError("no checkpoint in X could be read (step 8: bad); nothing was moved")

  monkeypatch.setattr(ckpt_lib, "restore_with_fallback", refuse)
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "8").mkdir(parents=True)
  assert cli(["train", "--config", str(config_file), "--workdir", str(workdir),
              "--set", "total_steps=8"]) == 3
  assert capsys.readouterr().err.strip().splitlines() == [
      "rankjax train: no checkpoint in X could be read (step 8: bad); nothing was moved"]


def test_workdir_that_is_a_file_is_one_line(cli, config_file, tmp_path, capsys):
  workdir = tmp_path / "run.txt"
  workdir.write_text("keep me")
  assert cli(["train", "--config", str(config_file), "--workdir", str(workdir)]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      f"rankjax train: error: workdir {workdir} is a file, not a directory"]
  assert workdir.read_text() == "keep me"


@pytest.mark.slow
def test_sigterm_exit_status_is_75_then_resume_exits_0(cli, config_file, tmp_path, capsys,
                                                      monkeypatch, compile_cache):
  """A SLURM requeue script tells "saved and stopped" (75) from "finished" (0)."""
  import functools
  import os
  import signal
  from rankjax._src.train import loop
  from rankjax._src.train.cli import EXIT_PREEMPTED

  def term_at_3(step):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  args = ["train", "--config", str(config_file), "--workdir", str(tmp_path / "run")]
  real = loop.train
  monkeypatch.setattr(loop, "train", functools.partial(real, on_step=term_at_3))
  assert cli(args) == EXIT_PREEMPTED == 75
  assert "stopped (SIGTERM or Ctrl-C) at step 3" in capsys.readouterr().err
  monkeypatch.setattr(loop, "train", real)
  assert cli(args) == 0


def test_sigterm_before_training_started_exits_75(cli, config_file, tmp_path, capsys,
                                                  monkeypatch):
  """In the first instant (here: where jax.distributed would start) as later: 75."""
  import os
  import signal
  from rankjax._src import distributed
  monkeypatch.setattr(distributed, "maybe_initialize_distributed",
                      lambda: os.kill(os.getpid(), signal.SIGTERM))
  workdir = tmp_path / "run"
  assert cli(["train", "--config", str(config_file), "--workdir", str(workdir)]) == 75
  assert capsys.readouterr().err.strip().splitlines() == [
      "rankjax train: stopped (SIGTERM) before training started; nothing to save: run the "
      "same command to start (exit 75)"]
  assert not workdir.exists()
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL      # restored


def test_sigterm_while_the_run_is_set_up_exits_75_before_the_first_update(
    cli, tmp_path, capsys, monkeypatch, compile_cache):
  import os
  import signal
  from rankjax._src.train import loop
  from tests.train.conftest import tiny_mlp
  real = loop.check_workdir_config

  def check_then_term(*a):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*a)

  monkeypatch.setattr(loop, "check_workdir_config", check_then_term)
  config = tmp_path / "mlp.json"
  config_lib.to_json(tiny_mlp(), config)
  workdir = tmp_path / "run"
  assert cli(["train", "--config", str(config), "--workdir", str(workdir)]) == 75
  captured = capsys.readouterr()
  assert "SIGTERM before update 1: nothing new to save" in captured.out
  assert captured.err.strip().splitlines() == [
      "rankjax train: stopped (SIGTERM or Ctrl-C) at step 0; nothing new to save; run the "
      "same command to resume (exit 75)"]
  assert not (workdir / "checkpoints").exists() or not any((workdir / "checkpoints").iterdir())


def test_a_finished_run_ends_with_one_line_saying_where_its_results_are(tmp_path,
                                                                       compile_cache):
  import io
  from tests.train.conftest import tiny_mlp
  out = io.StringIO()
  workdir = tmp_path / "run"
  train(tiny_mlp(total_steps=2, checkpoint_every=2), workdir, stream=out, progress_bar=False)
  last = out.getvalue().strip().splitlines()[-1]
  assert last.startswith(f"done: step 2 of {workdir} (2 updates in "), last
  assert last.endswith(f" s); metrics.jsonl and checkpoints/ are there, "
                       f"`rankjax report {workdir}` draws them")


@pytest.mark.slow   # ~7 s: the default suite keeps within 4 minutes
def test_stop_at_trains_the_first_updates_of_the_schedule_then_continues_exactly(
    tmp_path, compile_cache):
  """``stop_at=3`` of the 8-update schedule saves update 3 and stops ("stopped"; the
  learning rates are the full schedule's); the same run without it continues to 8 with
  the losses of an uninterrupted run (bitwise: one process, the same compiled step)."""
  from tests.train.conftest import losses
  whole = tmp_path / "whole"
  assert train(tiny_lm(), whole, progress_bar=False).status == "completed"
  part = tmp_path / "part"
  first = train(tiny_lm(stop_at=3), part, progress_bar=False)
  assert (first.status, first.step) == ("stopped", 3)
  assert (part / "checkpoints" / "3").is_dir() and not (part / "checkpoints" / "8").exists()
  again = train(tiny_lm(stop_at=3), part, progress_bar=False)
  assert again.status == "already_complete" and again.step == 3
  rest = train(tiny_lm(), part, progress_bar=False)
  assert (rest.status, rest.start_step, rest.step) == ("completed", 3, 8)
  assert losses(part) == losses(whole)
  lr = lambda w: {json.loads(x)["step"]: json.loads(x)["lr"] for x in
                  (w / "metrics.jsonl").read_text().splitlines() if '"lr"' in x}
  assert lr(part) == lr(whole)


def test_stop_on_collapse_saves_says_why_and_stays_stopped(tmp_path, compile_cache,
                                                           monkeypatch):
  """With the collapse threshold at 0 every layer counts as collapsed from the first
  diagnostics step (updates 1, 2, 4, ...: diag_every=2), so stop_on_collapse=2 stops
  after the second one (update 2), saving the update in hand (3: the loop reads each
  step's outputs one step behind): status "collapsed", stopped.json and load_run say
  why; the same command again trains nothing; without stop_on_collapse it trains on and
  the stop is forgotten. At the real threshold the tiny LM never stops."""
  from rankjax import load_run
  from rankjax._src.train import loop
  from tests.train.conftest import losses
  whole = tmp_path / "whole"
  assert train(tiny_lm(stop_on_collapse=2), whole, progress_bar=False).status == "completed"
  monkeypatch.setattr(loop, "COLLAPSED_SIM", 0.0)
  run = tmp_path / "run"
  first = train(tiny_lm(stop_on_collapse=2), run, progress_bar=False)
  assert (first.status, first.step) == ("collapsed", 3)
  stopped = json.loads((run / "stopped.json").read_text())
  assert stopped["step"] == 3 and "layers 0" in stopped["reason"]
  assert "at the last 2 diagnostics steps (to update 2)" in stopped["reason"]
  assert load_run(run).stopped == stopped and load_run(run).step == 3
  again = train(tiny_lm(stop_on_collapse=2), run, progress_bar=False)
  assert (again.status, again.step) == ("already_complete", 3)
  monkeypatch.setattr(loop, "COLLAPSED_SIM", 0.95)
  rest = train(tiny_lm(), run, progress_bar=False)
  assert (rest.status, rest.start_step, rest.step) == ("completed", 3, 8)
  assert not (run / "stopped.json").exists() and load_run(run).stopped is None
  assert losses(run) == losses(whole)


def test_a_collapse_found_at_a_checkpoint_step_saves_it_once(tmp_path, compile_cache,
                                                               monkeypatch):
  """checkpoint_every=3: the collapse of the test above is found while update 3 is
  checked for its save; that save is the collapse's, not a second one of step 3."""
  from rankjax._src.train import loop
  monkeypatch.setattr(loop, "COLLAPSED_SIM", 0.0)
  run = tmp_path / "run"
  result = train(tiny_lm(stop_on_collapse=2, checkpoint_every=3), run, progress_bar=False)
  assert (result.status, result.step) == ("collapsed", 3)
  assert json.loads((run / "stopped.json").read_text())["step"] == 3
  assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()
                if p.name.isdigit()) == [3]


def test_stop_on_collapse_needs_the_basic_diagnostic():
  with pytest.raises(ValueError, match="stop_on_collapse=3 reads the basic diagnostic"):
    tiny_lm(stop_on_collapse=3, diag_every=0)
