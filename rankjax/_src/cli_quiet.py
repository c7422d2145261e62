"""Third-party noise kept off the terminal while a ``rankjax`` command runs.

Reading damaged checkpoints makes Orbax and TensorStore report every read they
abandon: absl log records ("Failed to read Metadata file ..."), "Exception ignored
in: <coroutine ...>" (``sys.unraisablehook``), tracebacks that TensorStore's threads
print through ``sys.excepthook`` ("Event loop is closed") and asyncio's "Task exception
was never retrieved". Within ``quiet(command)`` these go to one log file, created on
the first record (``LogFile.path``); rankjax's own lines and the main thread's errors
stay on the terminal. Nothing is installed before the command starts; once it ends
the hooks are put back, unless it had abandoned reads: those may still report (from
TensorStore's threads, or as the interpreter exits), so the hooks then keep writing
to the log file until the process ends.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from typing import Iterator

THIRD_PARTY_LOGGERS = ("absl", "asyncio")
SETTLE_S = 0.3   # a pause without new records that ends a command with abandoned reads


class LogFile:
  """Text appended to ``path``, which the first write creates; ``errors`` counts the
  writes of errors (records at ERROR and above, tracebacks)."""

  def __init__(self, path: str):
    self.path = path
    self._file = None
    self._lock = threading.Lock()
    self.errors = 0
    self.abandoned = False   # the command gave up reads (a RestoreError): stragglers follow

  def write(self, text: str, error: bool = True) -> None:
    with self._lock:
      if self._file is None:
        self._file = open(self.path, "a", encoding="utf-8")
      self._file.write(text if text.endswith("\n") else text + "\n")
      self._file.flush()
      self.errors += error

  def close(self) -> None:
    with self._lock:
      if self._file is not None:
        self._file.close()
        self._file = None


def log_path(command: str) -> str:
  return os.path.join(tempfile.gettempdir(), f"rankjax-{command}-{os.getpid()}.log")


def _unraisable_hook(sink: LogFile):
  def hook(u) -> None:
    try:
      where = repr(u.object)
    except Exception:  # noqa: BLE001 - a repr that fails says nothing more
      where = object.__repr__(u.object)
    lines = traceback.format_exception(u.exc_type, u.exc_value, u.exc_traceback)
    sink.write(f"{u.err_msg or 'Exception ignored in'}: {where}\n{''.join(lines)}")
  return hook


class _Records(logging.Handler):
  def __init__(self, sink: LogFile):
    super().__init__()
    self.sink = sink
    self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

  def emit(self, record: logging.LogRecord) -> None:
    self.sink.write(self.format(record), error=record.levelno >= logging.ERROR)


def _except_hook(sink: LogFile, previous):
  """Tracebacks printed from other threads (TensorStore's) go to ``sink``; the main
  thread's go to ``previous``."""
  def hook(exc_type, exc, tb) -> None:
    if threading.current_thread() is threading.main_thread():
      previous(exc_type, exc, tb)
    else:
      sink.write("".join(traceback.format_exception(exc_type, exc, tb)))
  return hook


def _settle(sink: LogFile) -> None:
  """Collects abandoned coroutines and waits while stragglers still arrive (only when
  there were errors or abandoned reads)."""
  if not (sink.errors or sink.abandoned):
    return
  gc.collect()
  seen = -1
  while sink.errors != seen:
    seen = sink.errors
    time.sleep(SETTLE_S)
    gc.collect()


@contextlib.contextmanager
def quiet(command: str) -> Iterator[LogFile]:
  """Third-party records and tracebacks of other threads to ``log_path(command)``."""
  sink = LogFile(log_path(command))
  handler = _Records(sink)
  loggers = [logging.getLogger(n) for n in THIRD_PARTY_LOGGERS]
  saved = [(lg, lg.propagate) for lg in loggers]
  hooks = sys.unraisablehook, sys.excepthook
  for lg in loggers:
    lg.addHandler(handler)
    lg.propagate = False
  sys.unraisablehook = _unraisable_hook(sink)
  sys.excepthook = _except_hook(sink, hooks[1])
  try:
    yield sink
  finally:
    _settle(sink)
    for lg, propagate in saved:
      lg.removeHandler(handler)
      lg.propagate = propagate
    sink.close()
    if not (sink.errors or sink.abandoned):   # else abandoned reads may report later
      sys.unraisablehook, sys.excepthook = hooks
