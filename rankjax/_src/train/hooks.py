"""How a run ends (``RunStatus``) and what happens after each update (the hooks).

After update s is dispatched and the previous update's outputs are recorded (the
flush: ``loop._Loop._flush``, or ``runs._Driver._flush`` for several runs of one
program, the one place a train row is written), the loop calls the hooks of ``make_hooks`` in this fixed order, each as
``hook(step, run) -> RunStatus | None``; the first reason stops the run:

1. ``Evaluate``: every ``eval_every`` updates, the evaluation row;
2. ``Callback``: ``on_step(step)`` (tests and tools; once per step of a program);
3. ``Save``: the checkpoint Orbax's policy asks for (every ``checkpoint_every``
   updates, timed by ``checkpoint_minutes``), the last update of the call, and the
   update a SIGTERM / Ctrl-C stops at;
4. ``Preempt``: SIGTERM / Ctrl-C -> ``PREEMPTED`` (before the two below: a preempted
   update ends as preempted whatever else it reached);
5. ``CollapseStop``: ``stop_on_collapse`` found a collapse -> saves, writes
   ``stopped.json``, ``COLLAPSED``;
6. ``StopAt``: ``stop_at`` below ``total_steps`` reached -> ``STOPPED``.

A hook that needs update s fetched and checked finite (not only s-1) calls
``run.finish()`` (the same flush, now of update s) first; it returns ``FAILED`` when that update's loss was NaN/Inf in a
run of a program (a single run raises ``loop.NonFiniteLossError`` instead). The
diagnostics of an update (history, TensorBoard, the collapse evidence) are recorded by
the flush with its metrics, so that every file keeps its order.

``run`` is a ``RunContext``: ``loop._Loop`` for one run (``runs._Driver`` points its
``finish``, ``save`` and ``current_state`` at the program).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from rankjax._src.train.checkpoint import write_stopped


class RunStatus(str, enum.Enum):
  """How a ``train`` call ended (``TrainResult.status``); a ``str``, so that it equals
  and serializes as its value ("completed", ...)."""

  COMPLETED = "completed"          # reached total_steps
  PREEMPTED = "preempted"          # saved and stopped on SIGTERM / Ctrl-C
  STOPPED = "stopped"              # saved at stop_at < total_steps
  COLLAPSED = "collapsed"          # saved and stopped by stop_on_collapse
  FAILED = "failed"                # one run of a program: its loss became NaN/Inf
  ALREADY_COMPLETE = "already_complete"   # nothing to train; nothing written

  def __str__(self) -> str:
    return self.value


class RunContext(Protocol):
  """What the hooks read and call of one run (``loop._Loop``)."""

  cfg: Any
  ckpt: Any                        # checkpoint.Checkpointer
  writer: Any                      # logging.MetricsWriter
  state_step: int                  # the run's newest update
  saved_step: int                  # the update it saved last in this call (0: none)
  collapse_reason: str | None      # set by the flush when stop_on_collapse fires

  def finish(self) -> RunStatus | None: ...
  def evaluate(self, step: int) -> None: ...
  def save(self, step: int) -> None: ...
  def preempted(self, step: int) -> str | None: ...   # the signal's name: stop here


def last_step(cfg: Any) -> int:
  """The last update this call trains: ``stop_at`` when set below ``total_steps``."""
  return cfg.stop_at if 0 < cfg.stop_at < cfg.total_steps else cfg.total_steps


def collapse_runs(tsim_rows: Sequence[Any], threshold: float) -> np.ndarray:
  """Per layer, how many of the last diagnostics steps in a row had token similarity at
  or above ``threshold`` (``tsim_rows``: one (L,) row per diagnostics step, in order)."""
  runs = np.zeros(len(tsim_rows[0]) if tsim_rows else 0, np.int64)
  for row in tsim_rows:
    runs = (runs + 1) * (np.asarray(row) >= threshold)
  return runs


def collapse_reason(tsim_rows: Sequence[Any], n: int, threshold: float,
                    step: int) -> str | None:
  """Why ``stop_on_collapse=n`` stops after update ``step`` (``tsim_rows``: each
  diagnostics step's per-layer token similarity ``basic/tsim_y2``, of the residual sum
  after the FFN sublayer, in order): the layers whose similarity was at least
  ``threshold`` at each of the last ``n`` diagnostics steps; None when there is none."""
  layers = np.flatnonzero(collapse_runs(list(tsim_rows)[-n:], threshold) >= n)
  if not layers.size:
    return None
  return (f"collapsed: token similarity >= {threshold} in layers "
          f"{', '.join(str(int(x)) for x in layers)} at the last {n} diagnostics steps "
          f"(to update {step})")


class Hook:
  """``hook(step, run) -> RunStatus | None``. ``runs``: which runs of a program it is
  called for: "active" (those updated at this step), "live" (every run still
  training, masked ones too) or "once" (the first active run: once per step)."""

  runs = "active"

  def __call__(self, step: int, run: RunContext) -> RunStatus | None:
    raise NotImplementedError


class Evaluate(Hook):
  """Every ``eval_every`` updates: the mean evaluation metrics of update ``step``."""

  def __call__(self, step, run):
    if not (run.cfg.eval_every and step % run.cfg.eval_every == 0):
      return None
    failed = run.finish()             # the eval row follows the update's own row
    if failed is None:
      run.evaluate(step)
    return failed


class Callback(Hook):
  """``on_step(step)`` once update ``step`` is finished and checked."""

  runs = "once"

  def __init__(self, on_step: Callable[[int], None]):
    self.on_step = on_step

  def __call__(self, step, run):
    run.finish()
    self.on_step(step)
    return None


class Save(Hook):
  """Saves ``step`` when Orbax's policy says so (``Checkpointer.should_save``), at the
  last update of the call, and when a signal stops the run; a save that only
  ``checkpoint_minutes`` asked for says so on the console."""

  def __call__(self, step, run):
    cfg, end = run.cfg, last_step(run.cfg)
    stop = run.preempted(step) is not None
    if not (stop or step == end or run.ckpt.should_save(step)):
      return None
    if not stop and step != end and step % cfg.checkpoint_every:
      latest = run.ckpt.latest_step()
      since = ("no checkpoint yet" if latest is None else
               f"{cfg.checkpoint_minutes:g} min since the newest checkpoint ({latest})")
      run.writer.message(f"update {step}: {since}; saving (checkpoint_minutes)")
    failed = run.finish()             # saving needs this update checked finite
    if failed is None:
      run.save(step)
    return failed


class Preempt(Hook):
  """SIGTERM / Ctrl-C: the run (every run of a program, masked ones too: those had
  nothing new) stops at the update ``Save`` saved."""

  runs = "live"

  def __call__(self, step, run):
    name = run.preempted(step)
    if name is None:
      return None
    run.ckpt.wait()
    run.writer.message(f"{name}: saved step {run.state_step} in "
                       f"{run.ckpt.directory}; run the same command again to resume")
    return RunStatus.PREEMPTED


class CollapseStop(Hook):
  """``stop_on_collapse``: once the flush found the collapse (``run.collapse_reason``),
  saves ``step`` (unless ``Save`` did), waits for it and writes ``stopped.json``."""

  def __call__(self, step, run):
    if run.collapse_reason is None:
      return None
    failed = run.finish()
    if failed is not None:
      return failed
    if run.saved_step != step:
      run.save(step)
    run.ckpt.wait()
    write_stopped(run.ckpt.workdir, step, run.collapse_reason)
    return RunStatus.COLLAPSED


class StopAt(Hook):
  """``stop_at`` below ``total_steps``: stops after that update (``Save`` saved it)."""

  def __call__(self, step, run):
    return RunStatus.STOPPED if step == last_step(run.cfg) < run.cfg.total_steps else None


def make_hooks(on_step: Callable[[int], None] | None = None) -> tuple[Hook, ...]:
  """The hooks in their order (the module's docstring)."""
  return (Evaluate(), *([Callback(on_step)] if on_step is not None else []), Save(),
          Preempt(), CollapseStop(), StopAt())


def run_hooks(hooks: Sequence[Hook], step: int, run: RunContext) -> RunStatus | None:
  """One run's hooks after update ``step``: the first stop reason, or None."""
  for hook in hooks:
    status = hook(step, run)
    if status is not None:
      return status
  return None
