"""``rankjax.load_run``: a saved run's config, parameters, diagnostics and metrics.

Reads a workdir written by ``rankjax train`` without building the model, the
optimizer or the data pipeline: parameters come back as numpy arrays on the host,
whatever mesh the run was trained on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src.train import checkpoint as ckpt_lib
from rankjax._src.train import diagnostics as diag_lib
from rankjax._src import storage
from rankjax._src.train import tasks as task_lib


@dataclasses.dataclass(repr=False)
class Run:
  """A saved run.

  Attributes:
    workdir: the run's directory.
    config: its TrainConfig.
    step: the checkpoint step read (updates done).
    params: parameters at ``step`` (numpy arrays, the model's pytree).
    diagnostics: ``{"<diagnostic>/<key>": (n, ...)}``, every diagnostics step from
      the start of the run to ``step`` (the same names as TensorBoard's
      ``diagnostics/<diagnostic>/<key>`` tags). Per-layer series are (n, L); column l
      is layer l, numbered from 0 (the first layer) as TensorBoard's ``layer_00`` tags
      and the report's axes. Keys
      ending in ``_x1``, ``_y1``, ``_x2``, ``_y2`` name the LM's residual tensors of
      layer l (Transforming Rank Eq. 17, postnorm Eq. 1; k = 1 attention, k = 2
      FFN; ``models.blocks.residual_sublayer``): ``x_k`` = X_k^l = P(h), the input
      of sublayer k's branch (the normalized stream under Pre-Norm, the stream
      itself under Post-Norm); ``y_k`` = Y_k^l = h + beta * branch(X_k^l), the
      residual sum before any R norm (Post-Norm's norm follows it). ``tsim_y2`` of
      the last layer is the last-layer token similarity. MLP runs name the stream
      h_l ``stream`` (``h0`` the input).
    diagnostic_steps: (n,) the update each diagnostics row belongs to.
    metrics: the checkpoint's JSON metrics (loss, throughput, ...).
    history: rows of ``metrics.jsonl`` up to ``step``: one per update (step, loss,
      grad_norm, lr, tokens_per_s, ...) and one per evaluation (``"kind": "eval"``,
      eval_loss, ...); ``train_history`` and ``eval_history`` hold each kind alone.
    checkpoint_steps: the steps of the checkpoints in the workdir.
    stopped: ``{"step", "reason"}`` when the run stopped itself (``stop_on_collapse``;
      the workdir's ``stopped.json``), else None.

  ``repr`` is one line (workdir, model, step, checkpoints, how many series and rows).
  """

  workdir: epath.Path
  config: TrainConfig
  step: int
  params: Any
  diagnostics: dict[str, np.ndarray]
  diagnostic_steps: np.ndarray
  metrics: dict[str, Any]
  history: list[dict[str, Any]]
  checkpoint_steps: tuple[int, ...] = ()
  stopped: dict[str, Any] | None = None

  def __repr__(self) -> str:
    return (f"Run({str(self.workdir)!r}, model={self.config.model.kind!r}, step={self.step} of "
            f"{self.config.total_steps}, checkpoints={len(self.checkpoint_steps)}, "
            f"diagnostics={len(self.diagnostics)} series x {len(self.diagnostic_steps)} "
            f"steps, history={len(self.history)} rows)")

  @property
  def train_history(self) -> list[dict[str, Any]]:
    """One row per update: step, loss, grad_norm, lr, tokens_per_s, ..."""
    return [r for r in self.history if r.get("kind", "train") == "train"]

  @property
  def eval_history(self) -> list[dict[str, Any]]:
    """One row per evaluation: step, eval_loss (, eval_accuracy), eval_examples."""
    return [r for r in self.history if r.get("kind") == "eval"]


def read_metrics_jsonl(path: str | epath.PathLike,
                       up_to: int | None = None) -> list[dict[str, Any]]:
  """Lines of ``metrics.jsonl``; for a step logged twice (a resumed run) the last one."""
  path = storage.as_path(path)
  if not path.exists():
    return []
  by_step: dict[tuple[int, str], dict[str, Any]] = {}
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue  # a line cut short by a kill
    if up_to is None or row.get("step", 0) <= up_to:
      by_step[(row.get("step", 0), row.get("kind", "train"))] = row
  return [by_step[k] for k in sorted(by_step)]


def _this_process() -> ocp.options.MultiprocessingOptions:
  """Orbax reads with this process alone: a run is read into host memory, also by one
  process of a multi-host job (``rankjax reproduce``: process 0 analyses)."""
  me = jax.process_index()
  return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me},
                                            barrier_sync_key_prefix=f"load_run_{me}")


@functools.lru_cache(maxsize=16)
def _model_params(cfg: TrainConfig) -> Any:
  """The shapes of the parameters ``cfg``'s model has (its task's init, traced only)."""
  return jax.eval_shape(task_lib.make_task(cfg).init, jax.random.key(0))


def load_run(workdir: str | epath.PathLike, step: int | None = None) -> Run:
  """Reads the newest readable checkpoint of ``workdir`` (or ``step``): a ``Run``,
  whose docstring names every field and diagnostic series.

  A run of a model registered by a module of your own (``rankjax train --import
  MODULE``) needs that module imported first (``rankjax._src.plugins.import_module``).

  Raises:
    FileNotFoundError: no run or no complete checkpoint in ``workdir``.
    RestoreError: every checkpoint is corrupt, a step's metrics too damaged for Orbax
      to list the steps (``checkpoint.open_manager``), or one could not be read for
      another reason (``checkpoint.restore_with_fallback``; one line).
    ValueError: a URL whose filesystem package is missing.
  """
  workdir = storage.as_path(workdir, "workdir")
  cfg_path = ckpt_lib.config_path(workdir)
  if not cfg_path.exists():
    raise FileNotFoundError(f"{workdir} holds no rankjax run (no config.json)")
  cfg = config_lib.from_json(TrainConfig, cfg_path)
  task_lib.require_task(cfg)    # a plug-in model's module must be imported first
  directory = ckpt_lib.checkpoint_dir(workdir)
  if not directory.is_dir():
    raise FileNotFoundError(f"{workdir} holds no checkpoint yet ({directory} is missing)")
  absl_log = logging.getLogger("absl")   # read_only makes Orbax warn about what it skips
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    manager = ckpt_lib.open_manager(directory, lambda: ocp.CheckpointManager(
        storage.absolute(directory), options=ocp.CheckpointManagerOptions(
            read_only=True, multiprocessing_options=_this_process()),
        item_handlers=ckpt_lib.handlers()))
  finally:
    absl_log.setLevel(level)
  cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])

  def restore(s: int) -> dict[str, Any]:
    meta = manager.item_metadata(s)["state"]
    meta = getattr(meta, "tree", meta)
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu), meta)
    items = {"state": ocp.args.StandardRestore(abstract), "metrics": ocp.args.JsonRestore()}
    if (directory / str(s) / "diagnostics").is_dir():
      items["diagnostics"] = ocp.args.StandardRestore()
    out = manager.restore(s, args=ocp.args.Composite(**items))
    return {k: out[k] for k in items}

  saved = sorted(int(x) for x in manager.all_steps())
  steps = [step] if step is not None else saved
  if not steps:
    raise FileNotFoundError(f"{workdir} holds no checkpoint yet")
  try:
    found = ckpt_lib.restore_with_fallback(directory, steps, restore)
  finally:
    manager.close()
  if found is None:
    raise FileNotFoundError(f"no readable checkpoint in {directory}")
  s, out = found
  ckpt_lib.check_param_names(f"checkpoint step {s} in {directory}", out["state"]["params"],
                             _model_params(cfg))
  params = jax.tree.map(np.asarray, out["state"]["params"])
  history = diag_lib.DiagnosticsHistory.from_tree(out.get("diagnostics"))
  return Run(workdir=workdir, config=cfg, step=s, params=params,
             diagnostics=history.flat(), diagnostic_steps=np.asarray(history.steps, np.int64),
             metrics=out["metrics"],
             history=read_metrics_jsonl(workdir / "metrics.jsonl", up_to=s),
             checkpoint_steps=tuple(saved), stopped=ckpt_lib.read_stopped(workdir))


def finished(path: str, cfg) -> bool:
  """The run in ``path`` has ``cfg`` (up to the resumable fields) and its last step
  saved (``stop_at``'s, for a partial run), or it stopped itself on collapse."""
  from rankjax._src.train.hooks import last_step
  saved = os.path.join(path, "config.json")
  if not (os.path.isfile(saved)
          and (os.path.isdir(os.path.join(path, "checkpoints", str(last_step(cfg))))
               or stopped_itself(path, cfg))):
    return False
  differ = config_lib.diff(config_lib.from_json(TrainConfig, saved), cfg)
  return not [k for k in differ if k not in ckpt_lib.RESUMABLE_FIELDS]


def stopped_itself(path: str, cfg) -> bool:
  """The run in ``path`` stopped itself on collapse (``stop_on_collapse``; its
  ``stopped.json``) and ``cfg`` keeps that stop: it will train no further."""
  return bool(cfg.stop_on_collapse) and ckpt_lib.read_stopped(path) is not None
