"""rankjax._src.preemption: one way to take SIGTERM in every command."""

from __future__ import annotations

import os
import signal

import pytest

from rankjax._src import preemption


def test_outside_training_sigterm_raises_stopped_and_the_handler_is_restored():
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(preemption.Stopped, match="SIGTERM"):
    with preemption.outside_training():
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(1000):
        pass
  assert signal.getsignal(signal.SIGTERM) is before
  assert issubclass(preemption.Stopped, KeyboardInterrupt)   # no `except Exception` eats it


def test_during_training_takes_over_and_gives_back():
  with preemption.outside_training():
    outer = signal.getsignal(signal.SIGTERM)
    with preemption.DuringTraining() as p:
      os.kill(os.getpid(), signal.SIGTERM)           # saved and stopped, not raised
      for _ in range(1000):
        pass
      assert p.reached(1) and p.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is outer


def test_reproduce_stopped_outside_a_run_exits_75(monkeypatch, tmp_path, capsys):
  from rankjax._src import cli, reproduce

  def stop(*args, **kwargs):
    raise preemption.Stopped("SIGTERM")
  monkeypatch.setattr(reproduce, "run", stop)
  code = cli.main(["reproduce", "transforming_rank", "--scale", "quick", "--only", "fig1",
                   "--out", str(tmp_path)])
  assert code == 75
  assert "stopped (SIGTERM) outside a training step" in capsys.readouterr().err
