"""Each hook of ``rankjax._src.train.hooks`` alone, on a stand-in run (no model, no device
work): what it records, saves, writes and returns, and the order they run in.
``test_cli.py``, ``test_resume.py`` and ``test_runs.py`` train real runs through them."""

from __future__ import annotations

import json
import signal
import types

import numpy as np

from rankjax._src import preemption
from rankjax._src.train import hooks
from rankjax._src.train.checkpoint import read_stopped
from rankjax._src.train.hooks import RunStatus


class _Ckpt:
  def __init__(self, workdir, due=(), latest=None):
    self.workdir, self.directory = workdir, workdir / "checkpoints"
    self.due, self.latest, self.asked, self.waits = set(due), latest, [], 0

  def should_save(self, step):
    self.asked.append(step)
    return step in self.due

  def latest_step(self):
    return self.latest

  def wait(self):
    self.waits += 1


class _Writer:
  def __init__(self):
    self.lines = []

  def message(self, text):
    self.lines.append(text)


class _Run:
  """A ``hooks.RunContext`` that logs what the hooks call; ``fail``: the pending
  update's loss was NaN/Inf (a run of a program: ``finish`` says FAILED)."""

  def __init__(self, tmp_path, *, total_steps=8, stop_at=0, eval_every=0,
               checkpoint_every=4, due=(), signal_name=None, reason=None, fail=False):
    self.cfg = types.SimpleNamespace(total_steps=total_steps, stop_at=stop_at,
                                     eval_every=eval_every, checkpoint_every=checkpoint_every,
                                     checkpoint_minutes=0.5)
    self.ckpt, self.writer = _Ckpt(tmp_path, due), _Writer()
    self.signal_name, self.collapse_reason, self.fail = signal_name, reason, fail
    self.state_step, self.saved_step, self.calls = 0, 0, []

  def finish(self):
    self.calls.append("finish")
    return RunStatus.FAILED if self.fail else None

  def evaluate(self, step):
    self.calls.append(("evaluate", step))

  def save(self, step):
    self.calls.append(("save", step))
    self.saved_step = step

  def preempted(self, step):
    return self.signal_name


def test_the_status_is_its_string_in_comparisons_json_and_text():
  assert RunStatus.COMPLETED == "completed" and RunStatus("preempted") is RunStatus.PREEMPTED
  assert json.dumps({"status": RunStatus.COLLAPSED}) == '{"status": "collapsed"}'
  assert f"{RunStatus.FAILED}" == str(RunStatus.FAILED) == "failed"
  assert [s.value for s in RunStatus] == ["completed", "preempted", "stopped", "collapsed",
                                          "failed", "already_complete"]


def test_evaluate_runs_every_eval_every_updates_after_the_update_is_finished(tmp_path):
  run = _Run(tmp_path, eval_every=3)
  assert [hooks.Evaluate()(s, run) for s in range(1, 7)] == [None] * 6
  assert run.calls == ["finish", ("evaluate", 3), "finish", ("evaluate", 6)]
  assert hooks.Evaluate()(3, _Run(tmp_path)) is None          # eval_every=0: never
  failed = _Run(tmp_path, eval_every=1, fail=True)
  assert hooks.Evaluate()(1, failed) == RunStatus.FAILED and failed.calls == ["finish"]


def test_callback_is_called_with_the_update_finished():
  seen = []
  run = types.SimpleNamespace(finish=lambda: seen.append("finish"))
  assert hooks.Callback(seen.append)(5, run) is None and seen == ["finish", 5]
  assert hooks.Callback.runs == "once"


def test_save_follows_the_policy_the_last_update_and_a_signal(tmp_path):
  run = _Run(tmp_path, due={4})
  assert [hooks.Save()(s, run) for s in (1, 2, 3, 4)] == [None] * 4
  assert run.calls == ["finish", ("save", 4)] and run.ckpt.asked == [1, 2, 3, 4]
  assert run.writer.lines == []                      # a periodic save says nothing
  end = _Run(tmp_path, stop_at=5)
  assert hooks.Save()(5, end) is None and end.calls == ["finish", ("save", 5)]
  assert end.ckpt.asked == []                        # the last update: not asked
  stop = _Run(tmp_path, signal_name="SIGTERM")
  hooks.Save()(3, stop)
  assert stop.calls == ["finish", ("save", 3)] and stop.ckpt.asked == []


def test_a_timed_save_says_so_and_a_failed_update_is_not_saved(tmp_path):
  run = _Run(tmp_path, due={3})                       # 3 is not a multiple of 4: timed
  hooks.Save()(3, run)
  assert run.writer.lines == ["update 3: no checkpoint yet; saving (checkpoint_minutes)"]
  run.ckpt.latest, run.ckpt.due = 3, {6}
  hooks.Save()(6, run)
  assert run.writer.lines[-1] == ("update 6: 0.5 min since the newest checkpoint (3); "
                                  "saving (checkpoint_minutes)")
  failed = _Run(tmp_path, due={4}, fail=True)
  assert hooks.Save()(4, failed) == RunStatus.FAILED and failed.calls == ["finish"]


def test_preempt_stops_at_the_saved_update(tmp_path):
  assert hooks.Preempt()(3, _Run(tmp_path)) is None
  run = _Run(tmp_path, signal_name="SIGINT")
  run.state_step = 3
  assert hooks.Preempt()(3, run) == RunStatus.PREEMPTED and run.ckpt.waits == 1
  assert run.writer.lines == [f"SIGINT: saved step 3 in {tmp_path / 'checkpoints'}; run "
                              "the same command again to resume"]
  assert hooks.Preempt.runs == "live"          # masked runs of a program stop too


def test_collapse_stop_saves_once_and_writes_why(tmp_path):
  assert hooks.CollapseStop()(3, _Run(tmp_path)) is None        # nothing found
  assert read_stopped(tmp_path) is None
  run = _Run(tmp_path, reason="collapsed: because")
  assert hooks.CollapseStop()(3, run) == RunStatus.COLLAPSED
  assert run.calls == ["finish", ("save", 3)] and run.ckpt.waits == 1
  assert read_stopped(tmp_path) == {"step": 3, "reason": "collapsed: because"}
  saved = _Run(tmp_path, reason="again")
  saved.saved_step = 4                                          # Save saved update 4
  assert hooks.CollapseStop()(4, saved) == RunStatus.COLLAPSED
  assert saved.calls == ["finish"]


def test_stop_at_stops_only_below_total_steps(tmp_path):
  stop = hooks.StopAt()
  assert [stop(s, _Run(tmp_path, stop_at=5)) for s in (4, 5)] == [None, RunStatus.STOPPED]
  assert stop(8, _Run(tmp_path, stop_at=8)) is None             # the whole schedule
  assert stop(8, _Run(tmp_path)) is None


def test_the_hooks_run_in_their_order_and_the_first_reason_wins(tmp_path):
  names = lambda hs: [type(h).__name__ for h in hs]
  assert names(hooks.make_hooks()) == ["Evaluate", "Save", "Preempt", "CollapseStop",
                                       "StopAt"]
  assert names(hooks.make_hooks(print)) == ["Evaluate", "Callback", "Save", "Preempt",
                                            "CollapseStop", "StopAt"]
  # a signal at the update that also collapses and reaches stop_at: saved once,
  # preempted, no stopped.json (found again after the resume)
  run = _Run(tmp_path, stop_at=4, eval_every=4, signal_name="SIGTERM", reason="x")
  assert hooks.run_hooks(hooks.make_hooks(), 4, run) == RunStatus.PREEMPTED
  assert run.calls == ["finish", ("evaluate", 4), "finish", ("save", 4)]
  assert read_stopped(tmp_path) is None
  run.signal_name = None
  assert hooks.run_hooks(hooks.make_hooks(), 4, run) == RunStatus.COLLAPSED
  assert hooks.run_hooks(hooks.make_hooks(), 3, _Run(tmp_path)) is None


def test_collapse_reason_counts_consecutive_diagnostics_steps_per_layer():
  """Brute force: a layer counts when its similarity was >= the threshold at each of
  the last n rows."""
  rng = np.random.default_rng(0)
  for _ in range(200):
    rows = list(rng.uniform(0, 1, (int(rng.integers(0, 6)), 3)))
    n = int(rng.integers(1, 4))
    want = [l for l in range(3)
            if len(rows) >= n and all(r[l] >= 0.5 for r in rows[-n:])]
    got = hooks.collapse_reason(rows, n, 0.5, 9)
    if want:
      assert got == (f"collapsed: token similarity >= 0.5 in layers "
                     f"{', '.join(map(str, want))} at the last {n} diagnostics steps "
                     "(to update 9)")
    else:
      assert got is None


def test_a_signal_answers_once_per_step():
  """Every run of a program stops at the same update: a signal arriving between two
  questions about one step waits for the next step."""
  p = preemption.DuringTraining()
  assert not p.reached(3)
  p._handle(signal.SIGTERM, None)
  assert not p.reached(3) and p.reached(4) and p.signal_name == "SIGTERM"
