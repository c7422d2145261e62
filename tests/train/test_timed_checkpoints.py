"""checkpoint_minutes: a save every N minutes of wall time (for preemptible pods),
decided by Orbax's ContinuousCheckpointingPolicy on process 0 and agreed on by all."""

from __future__ import annotations

import datetime
import io
import time

import pytest

from rankjax.train import checkpoint as ckpt_lib
from tests.train.conftest import tiny_lm


def test_time_to_save_follows_the_clock_and_waits_for_a_running_save(tmp_path, monkeypatch):
  t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
  clock = {"now": t0}
  monkeypatch.setattr(ckpt_lib, "_now", lambda: clock["now"])
  c = ckpt_lib.Checkpointer(tmp_path / "run", async_save=False)
  try:
    at = lambda seconds: clock.update(now=t0 + datetime.timedelta(seconds=seconds))
    at(59)
    assert not c.time_to_save(1, minutes=1)
    at(60)
    assert c.time_to_save(2, minutes=1)
    c.last_save_time = clock["now"]        # what save() records
    at(100)
    assert not c.time_to_save(3, minutes=1)
    c.start_clock()                         # the loop's start: from here, not the save
    at(159)
    assert not c.time_to_save(4, minutes=1)
    at(161)
    assert c.time_to_save(5, minutes=1)
    monkeypatch.setattr(c.manager, "is_saving_in_progress", lambda: True)
    assert not c.time_to_save(6, minutes=1)  # never a second save over a running one
  finally:
    c.close()


def _saved_steps(workdir) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def test_a_slow_run_saves_between_checkpoint_every_steps(tmp_path, compile_cache):
  """Updates 3 and 6 take 0.4 s more (on_step sleeps): with checkpoint_minutes = 0.005
  (0.3 s) a save comes at or after each, beside checkpoint_every's 4 and 8; without
  it only 4 and 8 are saved."""
  from rankjax.train.loop import train
  sleepy = lambda step: time.sleep(0.4) if step in (3, 6) else None
  base = dict(max_to_keep=10, diag_every=0, eval_every=0, async_checkpointing=False)
  plain = tmp_path / "plain"
  train(tiny_lm(**base), plain, on_step=sleepy, progress_bar=False, stream=io.StringIO())
  assert _saved_steps(plain) == [4, 8]
  timed, log = tmp_path / "timed", io.StringIO()
  train(tiny_lm(checkpoint_minutes=0.005, **base), timed, on_step=sleepy, progress_bar=False,
        stream=log)
  extra = sorted(set(_saved_steps(timed)) - {4, 8})
  assert 3 in extra and 6 in extra, (extra, log.getvalue())
  assert "since the last save; saving (checkpoint_minutes)" in log.getvalue()


def test_checkpoint_minutes_is_checked():
  with pytest.raises(ValueError, match="checkpoint_minutes=-1 must be a non-negative number"):
    tiny_lm(checkpoint_minutes=-1)


@pytest.mark.slow   # two jax.distributed processes (about 30 s)
def test_two_processes_agree_on_every_timed_save(worker_env, tmp_path):
  """2 processes x 2 devices, checkpoint_minutes = 1e-4 (6 ms: nearly every update is
  due): both finish, and every step either saved is complete with both processes'
  iterator files. A step one process decided alone would hang the run in Orbax's
  save (its collective barrier) or leave a step with one iterator file."""
  from tests.train.test_multiprocess import launch
  cfg = tiny_lm(batch_size=8, grad_accum=2, checkpoint_every=1000, checkpoint_minutes=1e-4,
                max_to_keep=100, diag_every=0, eval_every=0)
  workdir = tmp_path / "timed"
  results = launch(worker_env, cfg, workdir, tmp_path, processes=2, devices=2)
  for code, result, err in results:
    assert code == 0, err[-3000:]
    assert (result["status"], result["step"]) == ("completed", 8)
  saved = _saved_steps(workdir)
  assert saved[-1] == 8 and len(saved) >= 2, saved          # timed saves before the end
  for step in saved:
    data = sorted(p.name for p in (workdir / "checkpoints" / str(step) / "data").iterdir()
                  if p.suffix == ".json")
    assert data == ["process_0-of-2.json", "process_1-of-2.json"], (step, data)
