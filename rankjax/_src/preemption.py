"""SIGTERM and Ctrl-C, the same way in every command (``rankjax train``, ``tour``,
``reproduce``): a run that is training saves the step it is on and stops
(:class:`DuringTraining`, inside ``rankjax._src.train.loop.train``); anywhere else the signal
stops the command at once with nothing to save (:func:`outside_training` raises
:class:`Stopped`). Either way the same command, run again, continues: ``train`` and
``reproduce`` exit 75 (requeue), ``tour`` 130 (interrupted).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


class Stopped(KeyboardInterrupt):
  """SIGTERM outside a training step (setting up, between runs, analysing): nothing to
  save. A KeyboardInterrupt, so that no ``except Exception`` swallows it and a command
  that handles Ctrl-C handles it the same way."""


def _raise(signum, frame):
  del frame
  raise Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def outside_training() -> Iterator[None]:
  """While active, SIGTERM raises :class:`Stopped` (main thread only; elsewhere signals
  cannot be handled and nothing changes); ``DuringTraining`` takes over inside a run."""
  main = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _raise) if main else None
  try:
    yield
  finally:
    if main:
      signal.signal(signal.SIGTERM, previous)


class DuringTraining:
  """Inside ``rankjax._src.train.loop.train``: whether to save and stop at a step because of
  SIGTERM or Ctrl-C (it takes the signals over from :func:`outside_training`).

  One process: handlers for SIGTERM and SIGINT (main thread only) set a flag; the
  run saves the current step and returns. A second Ctrl-C raises KeyboardInterrupt
  at once (the first one restores the previous SIGINT handler). Several processes:
  JAX's preemption service (started by ``jax.distributed.initialize``) catches
  SIGTERM on any host and all hosts agree on the step to stop at
  (``multihost_utils.reached_preemption_sync_point``, called every step), so they
  save the same step.
  """

  def __init__(self):
    self.signal_name: str | None = None
    self._old: dict[int, Any] = {}
    self._polled: tuple[int | None, bool] = (None, False)   # (step, its answer)
    import jax     # here, not at import: outside_training is installed before jax loads
    self._multi = jax.process_count() > 1

  def __enter__(self):
    if not self._multi and threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._old[signum] = signal.signal(signum, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    self.signal_name = signal.Signals(signum).name
    if signum == signal.SIGINT:   # a second Ctrl-C interrupts at once
      signal.signal(signal.SIGINT, self._old.pop(signal.SIGINT))

  def reached(self, step: int) -> bool:
    """Whether to stop at ``step``: call at every step, on every process; the answer of
    a step's first call holds for the step (every run of a program stops at the same
    one; several processes ask the sync point once)."""
    if self._polled[0] != step:
      if self._multi:
        from jax.experimental import multihost_utils
        if multihost_utils.reached_preemption_sync_point(step):
          self.signal_name = "SIGTERM"
      self._polled = (step, self.signal_name is not None)
    return self._polled[1]

  def __exit__(self, *exc):
    for signum, handler in self._old.items():
      signal.signal(signum, handler)
    self._old = {}
