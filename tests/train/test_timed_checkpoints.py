"""When a run saves: Orbax's save-decision policy (``checkpoint.save_policy``): every
``checkpoint_every`` updates, and with checkpoint_minutes (for preemptible pods) when that
many minutes have passed since the newest checkpoint, decided by Orbax's
ContinuousCheckpointingPolicy on process 0 and agreed on by all."""

from __future__ import annotations

import io
import time

import grain
import numpy as np
import pytest

from rankjax._src.data import streams
from rankjax._src.train import checkpoint as ckpt_lib
from tests.train.conftest import tiny_lm


def _checkpointer(workdir, minutes: float) -> ckpt_lib.Checkpointer:
  return ckpt_lib.Checkpointer(workdir, checkpoint_every=4, checkpoint_minutes=minutes,
                               rebuild_data_state=streams.rebuild_data_state,
                               async_save=False)


def _save(c: ckpt_lib.Checkpointer, step: int) -> None:
  data = iter(grain.MapDataset.range(4).to_iter_dataset())
  c.save(step, {"w": np.zeros(2, np.float32)}, data, None, {"step": step})


def test_should_save_follows_the_interval_and_the_clock(tmp_path, monkeypatch):
  """checkpoint_every=4 and checkpoint_minutes=0.025 (1.5 s): with no checkpoint a step
  is due at once; after a save only multiples of 4 until 1.5 s have passed; never a
  timed save over a running one; a resumed run counts from the newest checkpoint on
  disk (its commit time), not from its start; without checkpoint_minutes only the
  multiples of 4."""
  c = _checkpointer(tmp_path / "run", minutes=0.025)
  try:
    assert c.should_save(1)                  # no checkpoint yet
    _save(c, 1)
    assert not c.should_save(1)              # not above the newest saved step
    assert not c.should_save(2)              # 1.5 s have not passed
    assert c.should_save(4)                  # checkpoint_every, whatever the clock
    time.sleep(1.6)
    assert c.should_save(3)
    monkeypatch.setattr(c.manager, "is_saving_in_progress", lambda: True)
    assert not c.should_save(5)              # never a second save over a running one
    assert c.should_save(8)                  # an interval save waits for it instead
  finally:
    c.close()
  resumed = _checkpointer(tmp_path / "run", minutes=10)
  try:
    assert not resumed.should_save(2)        # step 1 was committed < 10 min ago
  finally:
    resumed.close()
  resumed = _checkpointer(tmp_path / "run", minutes=0.025)
  try:
    assert resumed.should_save(2)            # and > 1.5 s ago
  finally:
    resumed.close()
  plain = _checkpointer(tmp_path / "plain", minutes=0)
  try:
    assert [s for s in range(1, 10) if plain.should_save(s)] == [4, 8]
  finally:
    plain.close()


def _saved_steps(workdir) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow   # ~7 s: the default suite keeps within 4 minutes
def test_a_slow_run_saves_between_checkpoint_every_steps(tmp_path, compile_cache):
  """Updates 3 and 6 take 0.7 s more (on_step sleeps): with checkpoint_minutes = 0.01
  (0.6 s) update 1 is saved (no checkpoint yet) and a save comes at each of 3 and 6,
  beside checkpoint_every's 4 and 8, and none at update 2 (0.6 s have not passed since
  update 1's save); without it only 4 and 8 are saved."""
  from rankjax._src.train.loop import train
  sleepy = lambda step: time.sleep(0.7) if step in (3, 6) else None
  base = dict(max_to_keep=10, diag_every=0, eval_every=0, async_checkpointing=False)
  plain = tmp_path / "plain"
  train(tiny_lm(**base), plain, on_step=sleepy, progress_bar=False, stream=io.StringIO())
  assert _saved_steps(plain) == [4, 8]
  timed, log = tmp_path / "timed", io.StringIO()
  train(tiny_lm(checkpoint_minutes=0.01, **base), timed, on_step=sleepy, progress_bar=False,
        stream=log)
  extra = sorted(set(_saved_steps(timed)) - {4, 8})
  assert {1, 3, 6} <= set(extra) and 2 not in extra, (extra, log.getvalue())
  said = log.getvalue()
  assert "update 1: no checkpoint yet; saving (checkpoint_minutes)" in said
  assert ("update 3: 0.01 min since the newest checkpoint (1); saving (checkpoint_minutes)"
          in said)


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
  assert saved[0] == 1 and saved[-1] == 8, saved     # timed saves from update 1 (none yet)
  for step in saved:
    data = sorted(p.name for p in (workdir / "checkpoints" / str(step) / "data").iterdir()
                  if p.suffix == ".json")
    assert data == ["process_0-of-2.json", "process_1-of-2.json"], (step, data)
