"""Restore never destroys a run: what is skipped, moved, refused or re-sharded."""

from __future__ import annotations

import json
import shutil

import pytest

from rankjax._src.train import checkpoint as ckpt_lib
from rankjax._src.train.loop import train
from rankjax._src.train.run_reader import load_run
from tests.train.conftest import logs_warning, losses, tiny_mlp


@pytest.fixture(scope="module")
def reference(compile_cache, tmp_path_factory):
  """An 8-update MLP run with checkpoints at 4 and 8."""
  workdir = tmp_path_factory.mktemp("restore_ref")
  result = train(tiny_mlp(), workdir, progress_bar=False)
  assert result.step == 8
  return workdir


def _copy(reference, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  return workdir


def _listing(workdir):
  return sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))


def test_incomplete_step_is_moved_aside_and_the_run_resumes(reference, tmp_path, caplog):
  workdir = _copy(reference, tmp_path)
  (workdir / "checkpoints" / "8" / "state" / "commit_success.txt").unlink()
  with logs_warning(caplog, r"step 8 .* is incomplete .*commit_success.*"
                              r"using step 4 instead"):
    result = train(tiny_mlp(), workdir, progress_bar=False)
  assert (result.start_step, result.step) == (4, 8)
  moved = list((workdir / "corrupt_checkpoints").iterdir())
  assert len(moved) == 1 and moved[0].name.startswith("8-incomplete-")
  assert (moved[0] / "state").is_dir()                      # kept whole
  assert losses(workdir) == losses(reference)


def test_non_integrity_error_skips_and_moves_nothing(reference, tmp_path, monkeypatch):
  """A transient storage error must not make a resume fall back or move a step."""
  workdir = _copy(reference, tmp_path)
  before = _listing(workdir)
  metrics_before = (workdir / "metrics.jsonl").read_text()
  import orbax.checkpoint as ocp

  def unavailable(self, *a, **k):
    raise ValueError("UNAVAILABLE: Error reading \"state\" from gs://bucket: 503")

  monkeypatch.setattr(ocp.CheckpointManager, "restore", unavailable)
  with pytest.raises(ValueError, match="UNAVAILABLE"):
    train(tiny_mlp(), workdir, progress_bar=False)
  monkeypatch.undo()
  assert _listing(workdir) == before
  assert (workdir / "metrics.jsonl").read_text() == metrics_before


def test_other_exception_is_one_line_and_nothing_moved(reference, tmp_path, monkeypatch):
  workdir = _copy(reference, tmp_path)
  before = _listing(workdir)
  import orbax.checkpoint as ocp

  def denied(self, *a, **k):
    raise PermissionError("403 Forbidden")

  monkeypatch.setattr(ocp.CheckpointManager, "restore", denied)
  with pytest.raises(ckpt_lib.RestoreError, match=r"could not read checkpoint step 8 .*"
                                                  r"nothing was skipped or moved"):
    train(tiny_mlp(), workdir, progress_bar=False)
  monkeypatch.undo()
  assert _listing(workdir) == before


def test_every_step_unreadable_refuses_and_moves_nothing(reference, tmp_path, caplog):
  workdir = _copy(reference, tmp_path)
  for step in ("4", "8"):
    (workdir / "checkpoints" / step / "state" / "_METADATA").write_text("{ half")
  before = _listing(workdir)
  metrics_before = (workdir / "metrics.jsonl").read_text()
  caplog.clear()
  with pytest.raises(ckpt_lib.RestoreError, match=r"no checkpoint in .* could be read: every "
                                                  r"step is corrupt \(step 8: .*; step 4: "
                                                  r".*nothing was moved"):
    train(tiny_mlp(), workdir, progress_bar=False)
  assert "rankjax._src.train" not in {r.name for r in caplog.records}   # the error says it all
  assert _listing(workdir) == before
  assert (workdir / "metrics.jsonl").read_text() == metrics_before


def test_corrupt_step_is_one_warning_naming_the_storage_error(reference, tmp_path, caplog):
  """A truncated array chunk: one logged line (no RuntimeWarning as well, no asyncio
  "Task exception was never retrieved" for each of orbax's other failed reads), with
  TensorStore's own error rather than the pybind repr of the outer error."""
  import gc
  import warnings
  workdir = _copy(reference, tmp_path)
  chunks = list((workdir / "checkpoints" / "8" / "state").glob("ocdbt.process_0/d/*"))
  assert chunks
  for chunk in chunks:         # the arrays' data files (the OCDBT manifest stays whole)
    chunk.write_bytes(chunk.read_bytes()[:20])
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with logs_warning(caplog, r"step 8 .* is unreadable \(ValueError: OUT_OF_RANGE: .*\); "
                              r"using step 4 instead"):
      assert load_run(workdir).step == 4
    gc.collect()   # orbax's abandoned reads, collected now: asyncio would log each as an ERROR
  assert [r.levelname for r in caplog.records] == ["WARNING"]
  assert "pybind" not in caplog.text and "<bound method" not in caplog.text
  assert not [w for w in caught if "checkpoint" in str(w.message)]


def test_report_on_a_run_whose_checkpoints_are_all_corrupt_says_corrupt(reference, tmp_path,
                                                                        capsys):
  from rankjax._src import cli
  workdir = _copy(reference, tmp_path)
  for step in ("4", "8"):
    (workdir / "checkpoints" / step / "state" / "_METADATA").write_text("{ half")
  assert cli.main(["report", str(workdir)]) == 3
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "could be read: every step is corrupt (step 8" in err[0], err
  assert "half-written" not in err[0]


def _as_if_written_by(workdir, step: int, count: int, state=None):
  data = workdir / "checkpoints" / str(step) / "data"
  saved = json.loads((data / "process_0-of-1.json").read_text())
  (data / "process_0-of-1.json").unlink()
  for i in range(count):
    (data / f"process_{i}-of-{count}.json").write_text(json.dumps(state or saved))
  return saved


def test_checkpoint_of_another_process_count_restores_and_reshards(reference, tmp_path):
  """A step written by 2 processes resumes on 1: state bitwise, data iterator at the
  same position (with one process the shard is the whole set, so the losses match)."""
  workdir = _copy(reference, tmp_path)
  shutil.rmtree(workdir / "checkpoints" / "8")
  saved = _as_if_written_by(workdir, 4, 2)
  assert saved == {"next_index": 4}
  result = train(tiny_mlp(), workdir, progress_bar=False)
  assert (result.start_step, result.step) == (4, 8)
  assert not (workdir / "corrupt_checkpoints").exists()
  assert losses(workdir) == losses(reference)


def test_unreshardable_iterator_is_refused_naming_both_counts(reference, tmp_path):
  """A per-host state (a finite pass's document shard, or the streamed order before
  ``rankjax._src.data.streams``) cannot be re-sharded: one line, nothing moved."""
  workdir = _copy(reference, tmp_path)
  _as_if_written_by(workdir, 8, 2, state={"parent": {"next_index": 3}, "buffer": []})
  before = _listing(workdir)
  with pytest.raises(ValueError, match=r"^checkpoint step 8 was written by 2 process\(es\) "
                                       r"and this run has 1; .*resume with 2 process"):
    train(tiny_mlp(), workdir, progress_bar=False)
  assert _listing(workdir) == before


def test_truncation_keeps_replaced_lines(reference, tmp_path):
  workdir = _copy(reference, tmp_path)
  shutil.rmtree(workdir / "checkpoints" / "8")
  original = (workdir / "metrics.jsonl").read_text().splitlines()
  train(tiny_mlp(total_steps=8), workdir, progress_bar=False)
  replaced = (workdir / "metrics_replaced.jsonl").read_text().splitlines()
  assert replaced == [l for l in original if json.loads(l)["step"] > 4]
  assert load_run(workdir).step == 8


def test_integrity_classification():
  assert ckpt_lib.is_integrity_failure(json.JSONDecodeError("x", "{", 1))
  assert ckpt_lib.is_integrity_failure(ValueError(
      'OUT_OF_RANGE: Error reading "params.w_in/0.0" in OCDBT database'))
  assert not ckpt_lib.is_integrity_failure(ValueError("UNAVAILABLE: Error reading x: 503"))
  assert not ckpt_lib.is_integrity_failure(PermissionError("denied"))
  assert not ckpt_lib.is_integrity_failure(ValueError("shape (4, 16) does not match (8, 16)"))
  # by type and by the status code tensorstore states, never by a message's wording
  assert ckpt_lib.is_integrity_failure(FileNotFoundError("state/_METADATA"))
  assert not ckpt_lib.is_integrity_failure(ValueError("the data looks corrupt: truncated"))
  assert not ckpt_lib.is_integrity_failure(RuntimeError("OUT_OF_RANGE: not a status here"))
  try:        # the chain a real cut-short chunk gives (Orbax wraps tensorstore's error)
    try:
      raise ValueError('OUT_OF_RANGE: Error reading "params.w_in/0.0": byte range')
    except ValueError as inner:
      raise Exception("Encountered error while reading array index") from inner
  except Exception as e:  # noqa: BLE001
    assert ckpt_lib.is_integrity_failure(e)
    assert ckpt_lib.status_code(e.__cause__) == "OUT_OF_RANGE"
  transient = ValueError("UNAVAILABLE: 503")
  transient.__cause__ = ValueError("DATA_LOSS: checksum")   # transient wins: skip nothing
  assert not ckpt_lib.is_integrity_failure(transient)


def test_missing_iterator_file_is_incomplete(reference, tmp_path, caplog):
  workdir = _copy(reference, tmp_path)
  (workdir / "checkpoints" / "8" / "data" / "process_0-of-1.json").unlink()
  with logs_warning(caplog, r"step 8 .* is incomplete \(data/ holds no "
                              r"iterator state\); using step 4"):
    result = train(tiny_mlp(), workdir, progress_bar=False)
  assert (result.start_step, result.step) == (4, 8)
  assert losses(workdir) == losses(reference)


def test_bad_input_touches_nothing(reference, tmp_path, monkeypatch):
  """A mesh that does not match the devices, a batch the devices do not divide:
  one line each, before anything is moved, truncated or written."""
  workdir = _copy(reference, tmp_path)
  (workdir / "checkpoints" / "8" / "state" / "_METADATA").write_text("{ half")
  before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  with pytest.raises(ValueError, match=r"^mesh data=2 x fsdp=1 = 2 devices, but 1 are "
                                       r"available; set mesh_data=0 to use all of them$"):
    train(tiny_mlp(mesh_data=2), workdir, progress_bar=False)
  import jax
  monkeypatch.setattr(jax, "process_count", lambda: 3)     # as if 3 hosts had started
  with pytest.raises(ValueError, match=r"^batch_size=16 is not divisible by the 3 hosts$"):
    train(tiny_mlp(), workdir, progress_bar=False)
  monkeypatch.undo()
  after = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  assert after == before


def test_only_orbax_abandoned_reads_are_kept_out_of_the_log(caplog):
  import logging
  from rankjax._src.train import checkpoint as ckpt
  log = logging.getLogger("asyncio")
  ckpt.quiet_abandoned_reads()
  ckpt.quiet_abandoned_reads()           # once
  assert log.filters.count(ckpt.ABANDONED_READS_FILTER) == 1
  abandoned = ("Task exception was never retrieved\nfuture: <Task finished name='Task-7' "
               "coro=<async_deserialize() done, defined at /x/orbax/checkpoint/_src/"
               "serialization/serialization.py:394> exception=Exception('read')>")
  with caplog.at_level(logging.ERROR, logger="asyncio"):
    log.error(abandoned)
    log.error("Task exception was never retrieved\nfuture: <Task finished coro=<mine()>>")
  assert ckpt.ABANDONED_READS_FILTER in log.filters
  assert [r.getMessage()[-8:] for r in caplog.records] == ["mine()>>"]
