"""Checkpoints of a run: one ``orbax.checkpoint.CheckpointManager`` over the workdir.

Layout of ``WORKDIR`` (a local path or any ``etils.epath`` URL such as ``gs://...``)::

  config.json            the run's TrainConfig (written before the first step)
  metrics.jsonl          one JSON line per update (rankjax._src.train.logging)
  metrics_replaced.jsonl lines a resumed run rewrote (after the restored step): kept
  checkpoints/<step>/    Orbax step directories, each with four items:
    state/               TrainState: params, opt_state, step, rng (StandardSave)
    data/                the grain iterator state, one file per process
                         (``process_{i}-of-{n}.json``)
    diagnostics/         the whole diagnostics history up to <step>:
                         {"steps": (n,), <diagnostic>: {<key>: (n, ...)}}
                         (absent while no diagnostics step has run)
    metrics/             JSON: config, loss, throughput at <step>
  corrupt_checkpoints/   steps set aside by a resume (never deleted)

When a step is saved is Orbax's save-decision policy (``save_policy``: every
``checkpoint_every`` updates; with ``checkpoint_minutes``, also when that many minutes
have passed since the newest checkpoint), which the loop asks at every update, besides
the saves it makes itself (the last update, a preemption, stop_on_collapse, an error).
Which steps are kept is Orbax's preservation policy (``LatestN(max_to_keep)``); every
checkpoint holds the full diagnostics history, so deleting old steps loses none of it.
Saving is asynchronous; Orbax marks a finished step (and each finished item) with
``commit_success.txt``.

Restoring never destroys a run (``restore_with_fallback``):

* a step that is provably incomplete (its commit marker, ``_CHECKPOINT_METADATA`` or
  an item directory is missing) is skipped and moved to ``corrupt_checkpoints/``;
* a complete step whose data cannot be read (an integrity failure: unparsable
  metadata, truncated or missing array chunks; ``is_integrity_failure``) is skipped
  with a warning naming it; once an earlier step restored, it is moved to
  ``corrupt_checkpoints/`` too (the resumed run writes that step number again);
* any other error (a transient storage error, permissions, a state that does not
  fit) stops the restore with one line, nothing moved;
* when steps exist but none is readable, or Orbax cannot list them (a step's metrics
  unreadable: ``open_manager``), the run refuses to start with one line (``RestoreError``;
  nothing moved).

A checkpoint written by another number of processes restores the train state (Orbax
reshards it onto the current mesh) and rebuilds the data iterator deterministically
(``rankjax._src.data.streams.rebuild_data_state``, handed to the ``Checkpointer``: in-memory
sets and the training order of streamed sets); a state that cannot be re-sharded is
refused with one line naming both process counts (``reshard_data_state``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from typing import Any, Callable, Mapping

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath

from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src import distributed, storage
from rankjax._src.errors import UserError

log = logging.getLogger("rankjax._src.train")


class _AbandonedOrbaxReads(logging.Filter):
  """Drops asyncio's "Task exception was never retrieved" for orbax's array reads. When
  one read of a damaged checkpoint fails, ``asyncio.gather`` raises it and abandons the
  other reads, which fail the same way and are logged (as ERRORs with tracebacks) when
  garbage-collected, at a time that depends on the event loop; the restore has already
  said it in one line (``restore_newest``). Every other asyncio record passes."""

  def filter(self, record: logging.LogRecord) -> bool:
    msg = record.getMessage()
    return not (msg.startswith("Task exception was never retrieved")
                and "orbax" in msg and "deserialize" in msg)


ABANDONED_READS_FILTER = _AbandonedOrbaxReads()


def quiet_abandoned_reads() -> None:
  """Adds ``ABANDONED_READS_FILTER`` to asyncio's logger, once. Called when this module
  loads: any code that reads checkpoints loads it first, so reads abandoned by any
  reader and collected later are covered; ``import rankjax`` does not load it."""
  log_ = logging.getLogger("asyncio")
  if ABANDONED_READS_FILTER not in log_.filters:
    log_.addFilter(ABANDONED_READS_FILTER)


quiet_abandoned_reads()

# Fields that may change when a run resumes: they do not change the trajectory
# (``resumable=True`` in TrainConfig's field metadata).
RESUMABLE_FIELDS = frozenset(config_lib.fields_with(TrainConfig, "resumable", True))

COMMIT_MARKER = "commit_success.txt"
REQUIRED_ITEMS = ("state", "data", "metrics")
_DATA_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json$")


def checkpoint_dir(workdir: str | epath.PathLike) -> epath.Path:
  return storage.as_path(workdir) / "checkpoints"


def config_path(workdir: str | epath.PathLike) -> epath.Path:
  return storage.as_path(workdir) / "config.json"


def check_workdir_config(workdir: str | epath.PathLike, cfg: TrainConfig) -> bool:
  """Refuses a workdir whose run has another config; True when one is saved there.

  Raises:
    ValueError naming every differing field (dotted keys, saved vs given value).
  """
  path = config_path(workdir)
  if not path.exists():
    return False
  saved = config_lib.from_json(TrainConfig, path)
  differ = {k: v for k, v in config_lib.diff(saved, cfg).items() if k not in RESUMABLE_FIELDS}
  if differ:
    fields = ", ".join(f"{k}: {a!r} (saved) vs {b!r} (given)" for k, (a, b) in differ.items())
    raise UserError(f"workdir {workdir} holds a run with a different config: {fields}; "
                     "use another --workdir, or the saved config.json to resume")
  return True


STOPPED = "stopped.json"   # a run's own stop (stop_on_collapse): {"step", "reason"}


def read_stopped(workdir: str | epath.PathLike) -> dict[str, Any] | None:
  """What ``workdir/stopped.json`` says (the update at which a run stopped itself and
  why), or None."""
  path = storage.as_path(workdir) / STOPPED
  return storage.read_json(path) if path.exists() else None


def write_stopped(workdir: str | epath.PathLike, step: int, reason: str) -> None:
  """``stopped.json``, written by process 0 atomically."""
  if jax.process_index() == 0:
    storage.write_text_atomic(storage.as_path(workdir) / STOPPED,
                            json.dumps({"step": int(step), "reason": reason}) + "\n")


def write_config(workdir: str | epath.PathLike, cfg: TrainConfig) -> None:
  """config.json, written by process 0 atomically (temporary file + rename); all
  processes wait for it at a barrier, so none reads a half-written file."""
  if jax.process_index() == 0:
    storage.write_text_atomic(config_path(workdir), config_lib.to_json(cfg) + "\n")
  distributed.barrier("rankjax_config_written")


def handlers() -> dict[str, Any]:
  return {
      "state": ocp.StandardCheckpointHandler(),
      "data": grain.checkpoint.CheckpointHandler(),
      "diagnostics": ocp.StandardCheckpointHandler(),
      "metrics": ocp.JsonCheckpointHandler(),
  }


def _short(e: BaseException) -> str:
  """The root cause of ``e`` in one line (an outer error of Orbax may print a whole
  TensorStore spec through a pybind repr; the storage's own error is the cause)."""
  root = _chain(e)[-1]
  text = str(root).strip().splitlines()
  return f"{type(root).__name__}: {text[0][:200] if text else ''}"


def _chain(e: BaseException) -> list[BaseException]:
  out, seen = [], set()
  while e is not None and id(e) not in seen:
    out.append(e)
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return out


# tensorstore raises ValueError carrying an absl status: its message starts with the
# canonical code ("OUT_OF_RANGE: Error reading ..."). The codes that say the stored
# bytes are bad or missing, and those that say the storage is (perhaps only for now)
# not reachable.
_INTEGRITY_CODES = frozenset({"DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND"})
_TRANSIENT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "PERMISSION_DENIED",
                              "UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "ABORTED",
                              "CANCELLED"})
_STATUS = re.compile(r"([A-Z][A-Z_]+): ")
_INTEGRITY_TYPES = (json.JSONDecodeError, UnicodeDecodeError, EOFError, FileNotFoundError)
_TRANSIENT_TYPES = (PermissionError, TimeoutError, ConnectionError)


def status_code(e: BaseException) -> str | None:
  """The canonical status code a tensorstore error states, else None."""
  m = _STATUS.match(str(e)) if isinstance(e, ValueError) else None
  return m.group(1) if m else None


def is_integrity_failure(e: BaseException) -> bool:
  """Whether ``e`` (raised reading a step) says the step's bytes are bad.

  Classified by exception type and by the status code of a tensorstore error, never by
  the wording of a message. True for unparsable JSON metadata, a missing file, array
  chunks cut short (OUT_OF_RANGE) or lost (DATA_LOSS, NOT_FOUND); False as soon as the
  chain holds a transient storage error or a permission error, and for everything
  else (errors of the caller, such as a state that does not fit the checkpoint), which
  must not make a resume skip a step.
  """
  chain = _chain(e)
  codes = {status_code(x) for x in chain} - {None}
  if codes & _TRANSIENT_CODES or any(isinstance(x, _TRANSIENT_TYPES) for x in chain):
    return False
  return bool(codes & _INTEGRITY_CODES) or any(isinstance(x, _INTEGRITY_TYPES) for x in chain)


def incomplete_reason(step_dir: epath.Path) -> str | None:
  """Why ``step_dir`` is provably incomplete (a missing marker or item), else None."""
  storage.refresh(step_dir)
  if not step_dir.is_dir():
    return f"{step_dir} is missing"
  for name in (COMMIT_MARKER, "_CHECKPOINT_METADATA"):
    if not (step_dir / name).exists():
      return f"{name} is missing"
  for item in REQUIRED_ITEMS:
    if not (step_dir / item).is_dir():
      return f"item {item}/ is missing"
    if not (step_dir / item / COMMIT_MARKER).exists():
      return f"item {item}/ has no {COMMIT_MARKER}"
  return None


class IncompleteStep(Exception):
  """A step that lacks a file every finished step has."""


class RestoreError(RuntimeError):
  """A step could not be read for a reason that is not its integrity; nothing moved."""


class ProcessCountError(UserError):
  """A step of another process count whose data iterator cannot be re-sharded."""


def restore_with_fallback(directory: epath.Path, steps: list[int],
                          restore: Callable[[int], Any],
                          on_skipped: Callable[[int, bool], None] | None = None,
                          ) -> tuple[int, Any] | None:
  """Tries ``restore(step)`` from the newest step down: the one integrity fallback of
  every reader of checkpoints (a resume, ``load_run``).

  A step is skipped only when it is provably incomplete (``incomplete_reason``, checked
  here before ``restore`` is called, or ``restore`` raises ``IncompleteStep``) or
  ``restore`` raises an integrity failure (``is_integrity_failure``): one logged
  warning names it and the step used
  instead, at once for an incomplete step, once an earlier step restored for an
  unreadable one (when none does, the ``RestoreError`` names them all, so a refusal is
  one line). ``on_skipped(step, incomplete)`` is called for each skipped step once a
  restore succeeded (or at once for an incomplete step). Any other error is raised as
  ``RestoreError`` naming the step; nothing is skipped.

  Returns:
    (step, restored) or None when ``steps`` is empty.

  Raises:
    RestoreError: a non-integrity failure, or steps exist and none is readable.
  """
  steps = sorted(steps, reverse=True)
  unreadable: list[tuple[int, str]] = []
  for i, step in enumerate(steps):
    try:
      why = incomplete_reason(directory / str(step))
      if why is not None:
        raise IncompleteStep(why)
      out = restore(step)
    except IncompleteStep as e:
      reason, incomplete = str(e), True
    except ProcessCountError:
      raise
    except ValueError as e:
      if not is_integrity_failure(e):  # a refusal (e.g. process counts): as it is
        raise
      reason, incomplete = _short(e), False
    except Exception as e:  # noqa: BLE001 - classified below
      if not is_integrity_failure(e):
        raise RestoreError(
            f"could not read checkpoint step {step} in {directory} ({_short(e)}); "
            "this is not a sign of a damaged checkpoint, so nothing was skipped or moved: "
            "fix the cause and run again") from e
      reason, incomplete = _short(e), False
    else:
      for bad, why in unreadable:
        log.warning(f"checkpoint at step {bad} in {directory} is unreadable ({why}); "
                    f"using step {step} instead")
        if on_skipped is not None:
          on_skipped(bad, False)
      return step, out
    if incomplete:
      nxt = f"using step {steps[i + 1]} instead" if i + 1 < len(steps) else "no earlier step"
      log.warning(f"checkpoint at step {step} in {directory} is incomplete ({reason}); {nxt}")
      if on_skipped is not None:
        on_skipped(step, True)
    else:
      unreadable.append((step, reason))
  if unreadable:
    listed = "; ".join(f"step {s}: {r}" for s, r in unreadable)
    raise RestoreError(
        f"no checkpoint in {directory} could be read: every step is corrupt ({listed}); "
        f"nothing was moved: move {directory} aside to start this run from scratch")
  return None


def open_manager(directory: epath.Path, make: Callable[[], Any]) -> Any:
  """``make()``: an ``ocp.CheckpointManager`` over ``directory``, whose constructor reads
  every step's ``metrics`` item.

  Raises:
    RestoreError naming the steps whose ``metrics`` cannot be read when that fails with
    an integrity failure (nothing moved); any other error as it is.
  """
  try:
    return make()
  except Exception as e:  # noqa: BLE001 - classified below
    if not is_integrity_failure(e):
      raise
    steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    bad = [s for s in steps if not _json_readable(directory / str(s) / "metrics" / "metrics")]
    which = f"step(s) {', '.join(map(str, bad))}" if bad else "a step"
    todo = (f"move {directory} aside to start this run from scratch" if bad == steps else
            "move the damaged step folder(s) aside to use the others")
    raise RestoreError(f"the checkpoints in {directory} cannot be listed: the metrics of "
                       f"{which} are corrupt ({_short(e)}); nothing was moved: {todo}") from None


def _json_readable(path: epath.Path) -> bool:
  try:
    json.loads(path.read_text())
  except FileNotFoundError:
    return True    # a step without metrics is incomplete, not damaged
  except (ValueError, OSError):
    return False
  return True


def saved_process_count(data_dir: epath.Path) -> int | None:
  """The process count a step's ``data/`` item was written by (None: no files)."""
  counts = {int(m.group(2)) for f in data_dir.iterdir()
            if (m := _DATA_FILE.search(f.name))}
  if len(counts) > 1:
    raise IncompleteStep(f"data/ holds files of several process counts {sorted(counts)}")
  return counts.pop() if counts else None


def reshard_data_state(data_dir: epath.Path, saved_count: int, step: int,
                       rebuild: Callable[[epath.Path, int], Any]) -> Any:
  """``rebuild(data_dir, saved_count)``: this process's iterator state from a step's
  ``data/`` item written by ``saved_count`` processes (``rankjax._src.data.streams.
  rebuild_data_state``, handed down by the training loop), its failures as the fallback
  reads them.

  Raises:
    IncompleteStep: a process's state file is missing.
    ProcessCountError (a ValueError; one line naming both counts): the states do not
      re-shard.
    an unreadable file's error as it is (an integrity failure).
  """
  try:
    return rebuild(data_dir, saved_count)
  except FileNotFoundError as e:
    raise IncompleteStep(f"data/{e}") from None
  except ValueError as e:
    if is_integrity_failure(e):
      raise
    raise ProcessCountError(
        f"checkpoint step {step} was written by {saved_count} process(es) and this run has "
        f"{jax.process_count()}; the data iterator of this data set cannot be re-sharded: "
        f"resume with {saved_count} process(es), or train in a new --workdir"
        + (f" ({e})" if str(e) else "")) from None


@dataclasses.dataclass
class Restored:
  step: int
  state: Any
  diagnostics: dict[str, Any] | None
  metrics: dict[str, Any]
  saved_process_count: int | None = None


def param_names(params: Any) -> set[str]:
  """The ``/``-joined key paths of the leaves of a parameter tree (arrays, shapes or
  Orbax's metadata)."""
  return {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}


def check_param_names(where: str, saved: Any, expected: Any) -> None:
  """Refuses, in one line, a checkpoint whose parameters (``saved``) are named otherwise
  than the model's (``expected``): parameters are never renamed on restore.

  Raises:
    ValueError naming a few names of each side.
  """
  have, want = param_names(saved), param_names(expected)
  if have == want:
    return

  def few(names: set[str]) -> str:
    listed = sorted(names)
    return ", ".join(listed[:3]) + (f" and {len(listed) - 3} more" if len(listed) > 3 else "")

  raise UserError(f"{where} holds parameters named otherwise than this config's model "
                   f"(saved only: {few(have - want) or 'none'}; model only: "
                   f"{few(want - have) or 'none'}): written by other model code, and "
                   "parameters are never renamed on restore")


def save_policy(checkpoint_every: int, checkpoint_minutes: float
                ) -> ocp.checkpoint_managers.SaveDecisionPolicy:
  """When a run saves besides the saves the loop makes itself (the last update, a
  SIGTERM or Ctrl-C stop, stop_on_collapse, an error): Orbax's policies, asked by
  ``CheckpointManager.should_save`` at every update.

  * ``FixedIntervalPolicy``: every ``checkpoint_every`` updates;
  * with ``checkpoint_minutes`` > 0, ``ContinuousCheckpointingPolicy``: when that many
    minutes have passed since the newest checkpoint (for a step this run saved, when
    its save call handed the write over; for a step on disk, its commit time; at once
    when there is none) and no save is still being written. Process 0's clock decides and the others receive its answer
    through the coordination service, so every process saves the same steps (every
    process asks at every update).

  Orbax's ``PreemptionCheckpointingPolicy`` is not among them: the loop saves and
  stops at a preemption itself (``rankjax._src.preemption.DuringTraining``: JAX's sync
  point across hosts, and on one process the SIGTERM and Ctrl-C that Orbax does not
  see).
  """
  policies: list[ocp.checkpoint_managers.SaveDecisionPolicy] = [
      ocp.checkpoint_managers.FixedIntervalPolicy(checkpoint_every)]
  if checkpoint_minutes > 0:
    policies.append(ocp.checkpoint_managers.ContinuousCheckpointingPolicy(
        minimum_interval_secs=checkpoint_minutes * 60))
  return ocp.checkpoint_managers.AnySavePolicy(policies)


class Checkpointer:
  """Saves and restores the four items of a run's steps under ``WORKDIR/checkpoints``.

  ``rebuild_data_state(data_dir, saved_count)``: the iterator state of this process
  from a step's ``data/`` item written by another number of processes
  (``rankjax._src.data.streams.rebuild_data_state``: the data sets are the training loop's
  to know, not this module's).
  """

  def __init__(self, workdir: str | epath.PathLike, *, checkpoint_every: int,
               rebuild_data_state: Callable[[epath.Path, int], Any],
               checkpoint_minutes: float = 0.0, max_to_keep: int = 3,
               async_save: bool = True):
    self.workdir = storage.as_path(workdir)
    self.directory = checkpoint_dir(workdir)
    self.rebuild_data_state = rebuild_data_state
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=save_policy(checkpoint_every, checkpoint_minutes),
        preservation_policy=ocp.checkpoint_managers.LatestN(max_to_keep),
        enable_async_checkpointing=async_save, create=True, cleanup_tmp_directories=True,
        enable_background_delete=storage.is_remote(self.directory))
    self.manager = open_manager(self.directory, lambda: ocp.CheckpointManager(
        storage.absolute(self.directory), options=options, item_handlers=handlers()))

  def should_save(self, step: int) -> bool:
    """Whether ``save_policy`` saves ``step``: the same answer on every process, which
    must all ask at the same steps. False for a step not above the newest saved one."""
    return self.manager.should_save(step)

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_iter: Any,
           diagnostics: Mapping[str, Any] | None, metrics: Mapping[str, Any]) -> None:
    """Starts saving ``step`` (returns before the write ends when async), whatever
    ``should_save`` says: the caller has decided (it asks ``should_save`` first where
    the policy decides)."""
    items = {
        "state": ocp.args.StandardSave(state),
        "data": grain.checkpoint.CheckpointSave(data_iter),
        "metrics": ocp.args.JsonSave(dict(metrics)),
    }
    if diagnostics:
      items["diagnostics"] = ocp.args.StandardSave(diagnostics)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  def _has_item(self, step: int, item: str) -> bool:
    return (self.directory / str(step) / item).is_dir()

  def restore(self, abstract_state: Any, data_iter: Any) -> Restored | None:
    """The newest readable step (state into ``abstract_state``'s shardings), or None.
    A step whose parameter names are not ``abstract_state``'s is refused in one line
    (``check_param_names``)."""

    def restore(step: int) -> Restored:
      step_dir = self.directory / str(step)
      count = saved_process_count(step_dir / "data")
      if count is None:
        raise IncompleteStep("data/ holds no iterator state")
      data_state = None
      own = step_dir / "data" / f"process_{jax.process_index()}-of-{count}.json"
      if count == jax.process_count() and not own.exists():
        raise IncompleteStep(f"data/{own.name} is missing")
      if count != jax.process_count():
        data_state = reshard_data_state(step_dir / "data", count, step,
                                        self.rebuild_data_state)
      meta = self.manager.item_metadata(step)["state"]
      check_param_names(f"checkpoint step {step} in {self.directory}",
                        getattr(meta, "tree", meta)["params"], abstract_state.params)
      items = {"state": ocp.args.StandardRestore(abstract_state),
               "metrics": ocp.args.JsonRestore()}
      if self._has_item(step, "diagnostics"):
        items["diagnostics"] = ocp.args.StandardRestore()
      out = self.manager.restore(step, args=ocp.args.Composite(**items))
      if data_state is None:
        self.manager.restore(step, args=ocp.args.Composite(
            data=grain.checkpoint.CheckpointRestore(data_iter)))
      else:
        data_iter.set_state(data_state)
      diagnostics = out.get("diagnostics") if "diagnostics" in items else None
      return Restored(step, out.state, diagnostics, out.metrics, count)

    found = restore_with_fallback(self.directory, self.all_steps(), restore, self._set_aside)
    return None if found is None else found[1]

  def _set_aside(self, step: int, incomplete: bool) -> None:
    """Moves a skipped step to ``corrupt_checkpoints/`` (so it can be saved again)."""
    if jax.process_index() == 0:
      kind = "incomplete" if incomplete else "unreadable"
      dest = self.workdir / "corrupt_checkpoints" / f"{step}-{kind}-{int(time.time())}"
      dest.parent.mkdir(parents=True, exist_ok=True)
      storage.move(self.directory / str(step), dest)
      log.warning("moved the %s checkpoint %s to %s", kind, step, dest)
    distributed.barrier(f"rankjax_set_aside_{step}")
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
