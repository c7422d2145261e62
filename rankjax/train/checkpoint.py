"""Checkpoints of a run: one ``orbax.checkpoint.CheckpointManager`` over the workdir.

Layout of ``WORKDIR``::

  config.json            the run's TrainConfig (written before the first step)
  metrics.jsonl          one JSON line per update (rankjax.train.logging)
  checkpoints/<step>/    Orbax step directories, each with four items:
    state/               TrainState: params, opt_state, step, rng (StandardSave)
    data/                the grain iterator state, one file per process
    diagnostics/         the whole diagnostics history up to <step>:
                         {"steps": (n,), <diagnostic>: {<key>: (n, ...)}}
                         (absent while no diagnostics step has run)
    metrics/             JSON: config, loss, throughput at <step>

Every checkpoint holds the full diagnostics history, so ``max_to_keep`` deleting old
steps loses none of it. Saving is asynchronous (Orbax writes a temporary directory
and renames it when complete), so a half-written step is never listed. A step that
is listed but cannot be read (files lost or corrupted) is moved to
``WORKDIR/corrupt_checkpoints/`` and the previous step is restored, with a warning
naming both.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shutil
import time
import warnings
from typing import Any, Callable, Mapping

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from rankjax import config as config_lib
from rankjax.config import TrainConfig

log = logging.getLogger("rankjax.train")

# Fields that may change when a run resumes: they do not change the trajectory.
RESUMABLE_FIELDS = frozenset({
    "log_every", "checkpoint_every", "max_to_keep", "async_checkpointing",
    "mesh_data", "mesh_fsdp", "eval_every", "eval_batches", "eval_split",
})


def checkpoint_dir(workdir: str | pathlib.Path) -> pathlib.Path:
  return pathlib.Path(workdir) / "checkpoints"


def config_path(workdir: str | pathlib.Path) -> pathlib.Path:
  return pathlib.Path(workdir) / "config.json"


def check_workdir_config(workdir: str | pathlib.Path, cfg: TrainConfig) -> bool:
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
    raise ValueError(f"workdir {workdir} holds a run with a different config: {fields}; "
                     "use another --workdir, or the saved config.json to resume")
  return True


def write_config(workdir: str | pathlib.Path, cfg: TrainConfig) -> None:
  if jax.process_index() == 0:
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    config_lib.to_json(cfg, config_path(workdir))


def handlers() -> dict[str, Any]:
  return {
      "state": ocp.StandardCheckpointHandler(),
      "data": grain.checkpoint.CheckpointHandler(),
      "diagnostics": ocp.StandardCheckpointHandler(),
      "metrics": ocp.JsonCheckpointHandler(),
  }


def _short(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def restore_with_fallback(directory: pathlib.Path, steps: list[int],
                          restore: Callable[[int], Any],
                          on_corrupt: Callable[[int], None] | None = None) -> tuple[int, Any] | None:
  """Tries ``restore(step)`` from the newest step down; warns naming bad and used steps."""
  steps = sorted(steps, reverse=True)
  for i, step in enumerate(steps):
    try:
      return step, restore(step)
    except Exception as e:  # noqa: BLE001 - any failure means this step is unusable
      nxt = f"using step {steps[i + 1]} instead" if i + 1 < len(steps) else \
          "no earlier checkpoint: starting from scratch"
      message = (f"checkpoint at step {step} in {directory} is corrupt or incomplete "
                 f"({_short(e)}); {nxt}")
      warnings.warn(message, RuntimeWarning, stacklevel=2)
      log.warning(message)
      if on_corrupt is not None:
        on_corrupt(step)
  return None


@dataclasses.dataclass
class Restored:
  step: int
  state: Any
  diagnostics: dict[str, Any] | None
  metrics: dict[str, Any]


class Checkpointer:
  """Saves and restores the four items of a run's steps under ``WORKDIR/checkpoints``."""

  def __init__(self, workdir: str | pathlib.Path, *, max_to_keep: int = 3,
               async_save: bool = True):
    self.workdir = pathlib.Path(workdir)
    self.directory = checkpoint_dir(workdir)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True,
        cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory.absolute(), options=options,
                                         item_handlers=handlers())

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_iter: Any,
           diagnostics: Mapping[str, Any] | None, metrics: Mapping[str, Any]) -> None:
    """Starts saving ``step`` (returns before the write ends when async)."""
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
    """The newest readable step (state into ``abstract_state``'s shardings), or None."""

    def restore(step: int) -> Restored:
      items = {"state": ocp.args.StandardRestore(abstract_state),
               "metrics": ocp.args.JsonRestore()}
      if self._has_item(step, "diagnostics"):
        items["diagnostics"] = ocp.args.StandardRestore()
      out = self.manager.restore(step, args=ocp.args.Composite(**items))
      self.manager.restore(step, args=ocp.args.Composite(
          data=grain.checkpoint.CheckpointRestore(data_iter)))
      diagnostics = out.get("diagnostics") if "diagnostics" in items else None
      return Restored(step, out.state, diagnostics, out.metrics)

    found = restore_with_fallback(self.directory, self.all_steps(), restore, self._quarantine)
    return None if found is None else found[1]

  def _quarantine(self, step: int) -> None:
    """Moves an unreadable step out of the manager's way (so it can be saved again)."""
    if jax.process_index() == 0:
      dest = self.workdir / "corrupt_checkpoints" / f"{step}-{int(time.time())}"
      dest.parent.mkdir(parents=True, exist_ok=True)
      shutil.move(str(self.directory / str(step)), str(dest))
      log.warning("moved the unreadable checkpoint %s to %s", step, dest)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"rankjax_quarantine_{step}")
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


# ---------------------------------------------------------------------------
# the diagnostics history


class DiagnosticsHistory:
  """Host-side diagnostics of every diagnostics step of the run, stacked by step."""

  def __init__(self):
    self.steps: list[int] = []
    self.series: dict[str, dict[str, list[np.ndarray]]] = {}

  def append(self, step: int, values: Mapping[str, Mapping[str, Any]]) -> None:
    self.steps.append(int(step))
    for name, keys in values.items():
      for key, value in keys.items():
        self.series.setdefault(name, {}).setdefault(key, []).append(np.asarray(value))

  def __len__(self) -> int:
    return len(self.steps)

  def truncate(self, step: int) -> None:
    """Drops entries after ``step``."""
    keep = sum(1 for s in self.steps if s <= step)
    self.steps = self.steps[:keep]
    for keys in self.series.values():
      for key in keys:
        keys[key] = keys[key][:keep]

  def to_tree(self) -> dict[str, Any] | None:
    """``{"steps": (n,), name: {key: (n, ...)}}`` for the checkpoint; None when empty."""
    if not self.steps:
      return None
    tree: dict[str, Any] = {"steps": np.asarray(self.steps, np.int32)}
    for name, keys in self.series.items():
      tree[name] = {k: np.stack(v) for k, v in keys.items()}
    return tree

  @classmethod
  def from_tree(cls, tree: Mapping[str, Any] | None) -> "DiagnosticsHistory":
    h = cls()
    if not tree:
      return h
    h.steps = [int(s) for s in np.asarray(tree["steps"])]
    for name, keys in tree.items():
      if name == "steps":
        continue
      h.series[name] = {k: list(np.asarray(v)) for k, v in keys.items()}
    return h

  def flat(self) -> dict[str, np.ndarray]:
    """``{"<diagnostic>/<key>": (n, ...)}``."""
    return {f"{name}/{k}": np.stack(v) for name, keys in self.series.items()
            for k, v in keys.items() if v}
