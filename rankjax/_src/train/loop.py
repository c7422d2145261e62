"""The training loop, shared by the LM and the classifier.

``train(cfg, workdir)`` builds the task (``tasks.make_task``, the only place that
knows the model kind), the mesh and shardings, initializes the state sharded (or
restores the newest readable checkpoint of ``workdir``), and runs updates until
``cfg.total_steps`` (or ``cfg.stop_at``, a partial run of the same schedule):

* two compiled variants of the step: the plain one, and one that also computes the
  configured diagnostics, used at update 1 and every ``diag_every`` updates;
* after each update the hooks of ``hooks.make_hooks`` run in a fixed order
  (evaluation, ``on_step``, saving, preemption, ``stop_on_collapse``, ``stop_at``), the
  first stop reason (a ``hooks.RunStatus``) ending the run;
* metrics are fetched one step behind, so the host queues update s before it waits
  for update s-1, and recorded in one place (``_Loop._flush``); throughput
  (``tokens_per_s_avg``, or ``images_per_s_avg`` for image tasks, and MFU) is the mean
  over each ``log_every`` window of the updates whose measured time includes no compile
  (``throughput``; such rows carry ``compile_step: 1``); a NaN/Inf loss or gradient
  norm stops the run with ``NonFiniteLossError`` before anything is saved from it,
  leaving the last good checkpoint as the newest;
* checkpoints when Orbax's save-decision policy says so (``checkpoint.save_policy``:
  every ``checkpoint_every`` updates, and with ``checkpoint_minutes`` when that many
  minutes have passed since the newest checkpoint), at the end, and on SIGTERM
  (preemption) or Ctrl-C, after which the run returns with status PREEMPTED;
  an exception after training started (an evaluation, the data, a disk) first saves
  the newest finished update whose loss is finite, then propagates;
* an interrupted run started again with the same workdir resumes exactly: the state,
  the data iterator and the diagnostics history come from the checkpoint, dropout
  keys from the step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from typing import Any, Callable, TextIO

import jax
import numpy as np
from etils import epath

from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src.data import pipeline as data_pipeline
from rankjax._src.data import streams
from rankjax._src.data.common import DataUnavailableError
from rankjax._src.train import diagnostics as diag_lib
from rankjax._src.train import memory
from rankjax._src.train import mfu as mfu_lib
from rankjax._src import preemption as preemption_lib
from rankjax._src import storage
from rankjax._src.train import sharding as shard_lib
from rankjax._src.train import tasks as task_lib
from rankjax._src.train.checkpoint import Checkpointer
from rankjax._src.train.diagnostics import DiagnosticsHistory
from rankjax._src.train.checkpoint import STOPPED, read_stopped
from rankjax._src.train import hooks as hooks_lib
from rankjax._src.train.hooks import RunStatus, last_step
from rankjax._src.train.checkpoint import check_workdir_config, write_config
from rankjax._src.measure.gradients import ALARM_SIM_MIN as COLLAPSED_SIM
from rankjax._src.train.logging import MetricsWriter
from rankjax._src.train.state import TrainState, make_eval_step, make_init, make_optimizer, make_step
from rankjax._src.errors import UserError


class NonFiniteLossError(RuntimeError):
  """The loss or the gradient norm became NaN or Inf; the run stopped."""


@dataclasses.dataclass
class TrainResult:
  """How a ``train`` call ended: ``status`` (a ``hooks.RunStatus``, equal to its string)
  is COMPLETED, PREEMPTED (saved and stopped on SIGTERM / Ctrl-C), STOPPED (saved at
  ``cfg.stop_at`` before ``total_steps``; run again without it to continue), COLLAPSED
  (saved and stopped by ``cfg.stop_on_collapse``; why in ``stopped.json``) or
  ALREADY_COMPLETE (the workdir's checkpoint had reached ``total_steps``, or
  ``stop_at``, or the run had stopped on collapse; nothing was run or written); with
  several runs as one program (``rankjax._src.train.runs``) also FAILED: its loss became
  NaN/Inf at update ``step`` (``error`` says where), its last good checkpoint kept,
  while the others trained on."""

  workdir: epath.Path
  step: int
  status: RunStatus
  metrics: dict[str, Any]
  start_step: int
  error: str | None = None     # status "failed" (one of several runs of one program)


@dataclasses.dataclass
class Compiled:
  """Everything the loop calls on device, built once per run."""

  task: task_lib.Task
  mesh: jax.sharding.Mesh
  state_shardings: Any
  batch_sharding: Any
  init: Callable[[], TrainState]
  step: Callable
  diag_step: Callable | None
  eval_step: Callable
  remat_note: str | None = None    # lm.kernels.remat="auto": the policy chosen and the estimates


def build(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None,
          diags: tuple[diag_lib.Diagnostic, ...] | None = None) -> Compiled:
  """The task, mesh, shardings and jitted functions of ``cfg`` (no data, no I/O);
  ``lm.kernels.remat="auto"`` is resolved here (``memory.resolve_remat``): by XLA's analysis of
  each policy's compiled step (``compiled_peak_bytes``) where the devices report a memory
  limit, else by the estimate's fallback."""
  limit = memory.device_limit()
  cfg, remat_note = memory.resolve_remat(cfg, jax.device_count(), limit,
                                         measure=compiled_peak_bytes if limit else None)
  task = task_lib.make_task(cfg)
  if diags is None:
    diags = diag_lib.resolve(cfg.diagnostics) if cfg.diag_every else ()
  mesh = mesh or shard_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp)
  shard_lib.check_batch(cfg.batch_size, cfg.grad_accum, mesh)
  tx = make_optimizer(cfg, task.stacked_roots)
  init = make_init(task, tx, cfg.seed)
  abstract = jax.eval_shape(init)
  shardings = shard_lib.state_shardings(abstract, mesh, task.param_axes(), zero1=cfg.zero1)
  batch_sh = shard_lib.batch_sharding(mesh)
  repl = shard_lib.replicated(mesh)

  def jit_step(diags_):
    fn = make_step(task, cfg, tx, diags_, grad_shardings=shardings.params, mesh=mesh)
    return jax.jit(fn, in_shardings=(shardings, batch_sh), out_shardings=(shardings, repl, repl),
                   donate_argnums=(0,))

  eval_step = jax.jit(make_eval_step(task, mesh),
                      in_shardings=(shardings.params, shard_lib.eval_batch_sharding(mesh)),
                      out_shardings=repl)
  return Compiled(task=task, mesh=mesh, state_shardings=shardings, batch_sharding=batch_sh,
                  init=jax.jit(init, out_shardings=shardings), step=jit_step(()),
                  diag_step=jit_step(diags) if diags else None, eval_step=eval_step,
                  remat_note=remat_note)


def compiled_peak_bytes(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None
                        ) -> float | None:
  """XLA's peak bytes per device of ``cfg``'s training step compiled for this job's
  devices (or ``mesh``'s): ``compiled_memory``'s peak, the larger of the plain and the
  diagnostics variant when diagnostics run; None where the backend gives no analysis."""
  parts = compiled_memory(cfg, mesh)
  return None if parts is None else max(p["peak"] for p in parts.values())


def compiled_memory(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None
                    ) -> dict[str, dict[str, float]] | None:
  """``{"step": ..., "diag_step": ...}`` (the latter when diagnostics run): XLA's
  ``memory_analysis`` of each compiled step per device, in bytes: ``arguments`` (the
  sharded train state and the batch), ``outputs``, ``temporaries``, ``aliased`` (outputs
  written into the donated state) and ``peak`` = arguments + outputs + temporaries -
  aliased. None where the backend gives no analysis. Nothing is allocated. Compiled once
  per step shape (``config.step_shape``: configs that differ in a seed, a learning
  rate or a per-run model scalar share their memory) and devices when ``mesh`` is None."""
  if mesh is not None:
    return _compiled_memory(cfg, mesh)
  key = (config_lib.step_shape(cfg), tuple(jax.devices()))
  if key not in _MEMORY:
    _MEMORY[key] = _compiled_memory(cfg, None)
  return _MEMORY[key]


# compiled_memory of each (step shape, devices) this process has compiled
_MEMORY: dict[Any, dict[str, dict[str, float]] | None] = {}


def _compiled_memory(cfg: TrainConfig, mesh: jax.sharding.Mesh | None):
  c = build(cfg, mesh)
  state, batch = abstract_inputs(cfg, c)
  out = {}
  for name, fn in (("step", c.step), ("diag_step", c.diag_step)):
    if fn is None:
      continue
    m = fn.lower(state, batch).compile().memory_analysis()
    if m is None:
      return None
    out[name] = {"arguments": float(m.argument_size_in_bytes),
                 "outputs": float(m.output_size_in_bytes),
                 "temporaries": float(m.temp_size_in_bytes),
                 "aliased": float(m.alias_size_in_bytes),
                 "peak": float(m.argument_size_in_bytes + m.output_size_in_bytes
                               + m.temp_size_in_bytes - m.alias_size_in_bytes)}
  return out


def abstract_inputs(cfg: TrainConfig, c: Compiled) -> tuple[Any, dict[str, Any]]:
  """The train state and one batch of ``c``'s steps as sharded shapes (nothing
  allocated)."""
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       jax.eval_shape(c.init), c.state_shardings)
  micro = cfg.batch_size // cfg.grad_accum
  batch = {k: jax.ShapeDtypeStruct((cfg.grad_accum, micro, *v.shape[1:]), v.dtype,
                                   sharding=c.batch_sharding)
           for k, v in jax.eval_shape(lambda: c.task.dummy_batch(1)).items()}
  return state, batch


def check_diagnostics(cfg: TrainConfig, c: Compiled) -> None:
  """Traces the diagnostics step (nothing compiled or allocated), so that a diagnostic
  refusing this model (the attention one on an MLP, layers out of range) refuses
  before anything is written, not at the first diagnostics update."""
  if c.diag_step is not None:
    jax.eval_shape(c.diag_step, *abstract_inputs(cfg, c))


@functools.lru_cache(maxsize=2)
def _build_cached(cfg: TrainConfig, diags: tuple[diag_lib.Diagnostic, ...],
                  devices: tuple[Any, ...]) -> Compiled:
  del devices  # part of the cache key only
  return build(cfg, diags=diags)


# Fields that ``build`` does not read (``build=False`` in TrainConfig's field metadata):
# runs differing only in these share a build.
_NOT_BUILT = config_lib.fields_with(TrainConfig, "build", False)


def build_for_run(cfg: TrainConfig) -> Compiled:
  """``build(cfg)``, reused when the same process trains the same model again
  (a resumed run in a notebook or a test skips tracing and compiling)."""
  diags = diag_lib.resolve(cfg.diagnostics) if cfg.diag_every else ()
  defaults = TrainConfig()
  key = dataclasses.replace(cfg, diag_every=min(cfg.diag_every, 1),
                            **{f: getattr(defaults, f) for f in _NOT_BUILT})
  return _build_cached(key, diags, tuple(jax.devices()))


def make_data_iterator(cfg: TrainConfig, task: task_lib.Task, *, split: str = "train",
                       batch_size: int | None = None, eval_mode: bool = False):
  """This host's iterator of training (or evaluation) batches.

  Evaluation keeps a last short batch where every host gets the same number of
  examples (in-memory image sets always, text with one process), so a split smaller
  than a batch is still evaluated (``eval_batches``).
  """
  keep_short = eval_mode and (task.data_kind == "images" or jax.process_count() == 1)
  return data_pipeline.make_iterator(
      task.data_kind, split=split,
      batch_size=shard_lib.host_batch_size(batch_size or cfg.batch_size),
      seed=cfg.seed, shuffle=not eval_mode, num_epochs=1 if eval_mode else None,
      shard_index=jax.process_index(), shard_count=jax.process_count(),
      micro_batches=1 if eval_mode else cfg.grad_accum, drop_remainder=not keep_short,
      **task_lib.data_kwargs(cfg, task))


def eval_batches(cfg: TrainConfig, task: task_lib.Task):
  """This host's evaluation batches: at most ``cfg.eval_batches``, each cut to a
  multiple of the local device count (a short last batch loses fewer than that many
  examples); every host stops at the same batch."""
  it = make_data_iterator(cfg, task, split=cfg.eval_split, batch_size=cfg.micro_batch_size,
                          eval_mode=True)
  per_device = jax.local_device_count()
  for _ in range(cfg.eval_batches):
    local = next(it, None)
    if local is not None:
      n = len(next(iter(local.values())))
      n -= n % per_device
      local = {k: v[:n] for k, v in local.items()} if n else None
    if not shard_lib.all_hosts_have(local is not None):
      return       # a streamed set ran out on some host: every host stops here
    yield local


def check_eval_split(cfg: TrainConfig, task: task_lib.Task, data_name: str) -> None:
  """UserError before training when evaluation is configured but its split gives no
  batch at all (rather than an error at the first evaluation); the data layer's
  ValueErrors (tfds' unknown split among them) are told as that."""
  if not cfg.eval_every:
    return
  try:
    first = next(eval_batches(cfg, task), None)
  except DataUnavailableError:
    raise
  except ValueError as e:
    raise UserError(f"eval_split={cfg.eval_split!r} of {data_name}: {e} (set eval_every=0 "
                     "to train without evaluation)") from None
  if first is None:
    raise UserError(f"eval_split={cfg.eval_split!r} of {data_name} has fewer than "
                     f"{jax.local_device_count()} examples per host: nothing to evaluate "
                     "(set eval_every=0 to train without evaluation)")


def check_param_dtype(cfg: TrainConfig) -> None:
  """float64 parameters need JAX's x64 mode, which training does not switch on for the
  whole process: one UserError instead of silently training in float32."""
  dtype = getattr(cfg.model, "param_dtype", "float32")
  if str(dtype) == "float64" and not jax.config.jax_enable_x64:
    raise UserError("model.param_dtype=float64 needs JAX's x64 mode: run with "
                     "JAX_ENABLE_X64=1 (without it JAX would train in float32)")


def enable_compilation_cache(directory: str) -> None:
  """JAX's persistent compilation cache in ``directory`` (local or gs://): a run
  restarted after a preemption loads its compiled steps instead of compiling them.
  Takes effect for programs compiled after the call (``rankjax train`` calls it
  before compiling anything)."""
  from jax.experimental.compilation_cache import compilation_cache
  path = storage.check_output(directory, "compilation_cache_dir")
  if jax.config.jax_compilation_cache_dir != str(storage.absolute(path)):
    jax.config.update("jax_compilation_cache_dir", str(storage.absolute(path)))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    compilation_cache.reset_cache()


def throughput(units_per_step: float, step_times: list[float],
               compiled: list[bool]) -> float | None:
  """Units per second over the steps that did not compile; None when every step did."""
  kept = [dt for dt, c in zip(step_times, compiled) if not c]
  return units_per_step * len(kept) / sum(kept) if kept and sum(kept) > 0 else None


def _compiled_count(fn) -> int | None:
  """How many programs ``fn`` (a ``jax.jit`` function) has compiled, if jax says."""
  size = getattr(fn, "_cache_size", None)
  return size() if callable(size) else None


def train(cfg: TrainConfig, workdir: str | epath.PathLike, *,
          on_step: Callable[[int], None] | None = None, stream: TextIO | None = None,
          progress_bar: bool | None = None) -> TrainResult:
  """Trains ``cfg`` in ``workdir``, resuming from its newest readable checkpoint.

  Args:
    cfg: the run's config.
    workdir: where config.json, metrics.jsonl and checkpoints/ live.
    on_step: called with s after update s is finished and checked (forces the host to
      wait for every step; for tests and tools).
    stream: console output (default stdout); progress_bar: force the tqdm bar on/off.

  Raises:
    UserError: bad input (config, data set, batch vs devices, a diagnostic refusing the
      model, a workdir holding a different run), before anything is written.
    NonFiniteLossError: the loss or gradient norm became NaN/Inf.
  """
  workdir = storage.check_output(workdir, "workdir")
  with preemption_lib.DuringTraining() as preemption:   # from here a SIGTERM stops the run at a step
    return _train(cfg, workdir, preemption, on_step, stream, progress_bar)


def _train(cfg: TrainConfig, workdir: epath.Path, preemption: preemption_lib.DuringTraining, on_step,
           stream: TextIO | None, progress_bar: bool | None) -> TrainResult:
  t_start = time.perf_counter()
  if cfg.compilation_cache_dir:
    enable_compilation_cache(cfg.compilation_cache_dir)
  check_param_dtype(cfg)
  compiled = build_for_run(cfg)
  opened = open_run(cfg, workdir, compiled, stream, progress_bar)
  if isinstance(opened, TrainResult):
    return opened
  loop = opened
  state = loop.restored_state if loop.restored_state is not None else compiled.init()
  loop.restored_state = None
  try:
    step, status = loop.run(state, loop.start, preemption, on_step)
    loop.say_end(step, status, t_start)
  finally:
    loop.close()
  return TrainResult(workdir, step, status, loop.last_metrics, loop.start)


def open_run(cfg: TrainConfig, workdir: epath.Path, compiled: Compiled,
             stream: TextIO | None, progress_bar: bool | None, *, checked: bool = False
             ) -> "TrainResult | _Loop":
  """Everything of one run before its first update: the checks (data, evaluation split,
  diagnostics, the workdir's config), config.json, the data iterator, the checkpoint
  restored (``restored_state``; None for a fresh run, whose state the caller
  initializes) and the console writer; or the ``already_complete`` result when there is
  nothing to train. Shared by ``train`` and ``rankjax._src.train.runs`` (one per run;
  ``checked``: a run of the same step shape passed the data, evaluation and diagnostics
  checks already)."""
  shard_lib.check_batch(cfg.batch_size, cfg.grad_accum, compiled.mesh)  # also when cached
  task = compiled.task
  info = data_pipeline.dataset_info(task.data_kind, **task_lib.data_kwargs(cfg, task))
  if not checked:
    data_pipeline.check_model_fits(info, **task_lib.model_requirements(task))
    check_eval_split(cfg, task, info.name)
    check_diagnostics(cfg, compiled)
  check_workdir_config(workdir, cfg)
  data_it = make_data_iterator(cfg, task)
  write_config(workdir, cfg)

  ckpt = Checkpointer(workdir, checkpoint_every=cfg.checkpoint_every,
                      checkpoint_minutes=cfg.checkpoint_minutes,
                      rebuild_data_state=streams.rebuild_data_state,
                      max_to_keep=cfg.max_to_keep, async_save=cfg.async_checkpointing)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          jax.eval_shape(compiled.init), compiled.state_shardings)
  had_steps = bool(ckpt.all_steps())
  restored = ckpt.restore(abstract, data_it)
  resharded = ""
  if restored is not None:
    state, start = restored.state, restored.step
    if restored.saved_process_count not in (None, jax.process_count()):
      resharded = (f" (checkpoint written by {restored.saved_process_count} process(es); "
                   "data iterator re-sharded, see rankjax._src.data.streams.rebuild_data_state)")
    history = DiagnosticsHistory.from_tree(restored.diagnostics)
    history.truncate(start)
  else:
    if had_steps:  # every step was incomplete (moved aside); the iterator may have moved
      data_it = make_data_iterator(cfg, task)
    state, start, history = None, 0, DiagnosticsHistory()
  stopped = read_stopped(workdir)
  if stopped and not cfg.stop_on_collapse:   # trained on past its collapse stop, on purpose
    if jax.process_index() == 0:
      (workdir / STOPPED).unlink()
    stopped = None
  if stopped and restored is not None and restored.step == stopped["step"]:
    ckpt.close()
    if jax.process_index() == 0:
      print(f"{workdir} stopped itself at update {stopped['step']}: {stopped['reason']} "
            "(stop_on_collapse=0 trains on)", file=stream or sys.stdout)
    return TrainResult(workdir, start, RunStatus.ALREADY_COMPLETE, restored.metrics or {},
                       start)
  if start >= last_step(cfg):   # nothing to do: no event file, no new lines
    ckpt.close()
    if jax.process_index() == 0:
      print(f"{workdir} is already complete: step {start} of total_steps={cfg.total_steps} "
            + (f"(stop_at={cfg.stop_at}: run without it to continue)"
               if last_step(cfg) < cfg.total_steps else "(raise total_steps to train on)"),
            file=stream or sys.stdout)
    return TrainResult(workdir, start, RunStatus.ALREADY_COMPLETE, restored.metrics or {},
                       start)
  MetricsWriter.truncate(workdir, start)
  writer = MetricsWriter(workdir, total_steps=cfg.total_steps, log_every=cfg.log_every,
                         start_step=start, stream=stream, progress_bar=progress_bar,
                         image_every=cfg.image_every, diag_every=cfg.diag_every)
  writer.backfill(start, history)   # events a kill lost before they reached the files
  writer.message(
      f"{'resumed' if restored is not None else 'started'} {workdir} at step {start}: "
      f"{task.kind} on {info.name}, mesh {dict(compiled.mesh.shape)}, "
      f"{jax.process_count()} process(es){resharded}")
  if compiled.remat_note:
    writer.message(compiled.remat_note)
  loop = _Loop(cfg, compiled, ckpt, writer, history, data_it)
  loop.data_name = info.name
  loop.start, loop.restored_state = start, state
  loop.param_dtype = str(jax.tree.leaves(abstract.params)[0].dtype)   # what is computed
  return loop


def step_variant(c: "Compiled | Any", cfg: TrainConfig, step: int) -> Callable:
  """The step function of update ``step``: the diagnostics variant at update 1 and every
  ``diag_every`` updates (when diagnostics run), else the plain one (``c``: a
  ``Compiled`` or a ``runs.Program``)."""
  if c.diag_step is not None and (step == 1 or step % cfg.diag_every == 0):
    return c.diag_step
  return c.step


class _Loop:
  """The step loop of ``train`` and one run's work around it (metrics, diagnostics,
  evaluation, saving: a ``hooks.RunContext``); state that survives between steps
  lives here. ``runs._Driver`` steps several of them as one program."""

  def __init__(self, cfg, compiled: Compiled, ckpt: Checkpointer, writer: MetricsWriter,
               history: DiagnosticsHistory, data_it):
    self.cfg, self.c, self.ckpt, self.writer = cfg, compiled, ckpt, writer
    self.history, self.data_it = history, data_it
    self.unit = compiled.task.throughput_unit
    self.units_per_step = cfg.batch_size * (
        compiled.task.tokens_per_example if self.unit == "tokens" else 1)
    self.flops_per_step = compiled.task.flops_per_example() * cfg.batch_size
    self.flops_per_step_full = compiled.task.flops_per_example(causal=False) \
        * cfg.batch_size
    self.peak_flops = mfu_lib.local_spec_peak(cfg.compute_dtype)   # None: no spec peak
    self.last_metrics: dict[str, Any] = {}
    self.data_name = ""
    self.param_dtype = ""
    self._window: list[tuple[float, bool]] = []   # (step time, compiled) since the log
    self._called: set[Any] = set()       # step variants called in this run
    self._compiling = False              # a compile since the last measured step
    self.recent_losses: list[float] = []
    self._t_last = time.perf_counter()
    self._t_start = self._t_last
    self.collapse_reason: str | None = None
    self._tsim_rows = list(history.series.get("basic", {}).get("tsim_y2", []))  # resumed
    self.start = 0                       # the update the run resumes after (open_run)
    self.restored_state: Any = None      # its restored state; None: a fresh run
    self.state_step = self.saved_step = 0
    self.pending: tuple[int, Any, Any] | None = None   # an update not yet recorded
    self.preemption: preemption_lib.DuringTraining | None = None

  def say_end(self, step: int, status: RunStatus, t_start: float) -> None:
    """The console line of how the run ended (none for PREEMPTED: ``Preempt`` said)."""
    workdir, where = self.ckpt.workdir, self.ckpt.directory
    line = {
        RunStatus.COMPLETED: f"done: step {step} of {workdir} ({step - self.start} updates "
                             f"in {time.perf_counter() - t_start:.1f} s); metrics.jsonl and "
                             f"checkpoints/ are there, `rankjax report {workdir}` draws them",
        RunStatus.COLLAPSED: f"stopped at update {step}: {self.collapse_reason} "
                             f"(stop_on_collapse); saved in {where}; stopped.json says why",
        RunStatus.STOPPED: f"stopped at update {step} of {self.cfg.total_steps} (stop_at), "
                           f"saved in {where}; run again without stop_at to continue",
    }.get(status)
    if line is not None:
      self.writer.message(line)

  def close(self) -> None:
    self.writer.close()
    self.ckpt.close()

  def run(self, state, start: int, preemption: preemption_lib.DuringTraining,
          on_step) -> tuple[int, RunStatus]:
    """Updates start+1 .. total_steps, each followed by the hooks (``hooks``); on an
    error other than a non-finite loss the newest finished, finite state is saved
    before the error propagates."""
    self.state, self.state_step, self.pending = state, start, None
    self.preemption = preemption
    try:
      return self._run(start, hooks_lib.make_hooks(on_step))
    except NonFiniteLossError:
      raise
    except Exception as e:
      self._save_after_error(e)
      raise

  def _run(self, start: int, hooks) -> tuple[int, RunStatus]:
    name = self.preemption.signal_name
    if name is not None:                # it came while the run was being set up
      self.writer.message(f"{name} before update {start + 1}: nothing new to save; run "
                          "the same command again to continue")
      return start, RunStatus.PREEMPTED
    for step in range(start + 1, self.cfg.total_steps + 1):
      batch = shard_lib.global_batch(next(self.data_it), self.cfg.grad_accum,
                                     self.c.batch_sharding)
      state, metrics, diag = self._dispatch(step_variant(self.c, self.cfg, step), batch)
      self.state, self.state_step = state, step
      self._flush()                     # update step - 1, while `step` runs
      self.pending = (step, metrics, diag)
      status = hooks_lib.run_hooks(hooks, step, self)
      if status is not None:
        return step, status
    return step, RunStatus.COMPLETED    # the last update's Save recorded it

  # hooks.RunContext: what the hooks call (runs._Driver points the first three at
  # its program)
  def finish(self) -> RunStatus | None:
    """Records the pending update (raises NonFiniteLossError on NaN/Inf)."""
    self._flush()
    return None

  def save(self, step: int) -> None:
    self._save(step, self.current_state())

  def current_state(self):
    return self.state


  def preempted(self, step: int) -> str | None:
    return self.preemption.signal_name if self.preemption.reached(step) else None

  def _flush(self) -> None:
    """Records the pending update, if any: the one place a train row is written."""
    if self.pending is not None:
      self._record(*self.pending)
      self.pending = None

  def _dispatch(self, fn, batch):
    """``fn(state, batch)``; notes a compile (the variant's first call in this run, or
    a new program in its cache) for the next measured step time, which holds it."""
    before = _compiled_count(fn)
    out = fn(self.state, batch)
    after = _compiled_count(fn)
    self._compiling |= fn not in self._called or (after is not None and after != before)
    self._called.add(fn)
    return out

  def _save_after_error(self, error: Exception) -> None:
    """Saves ``self.state`` (update ``state_step``) unless it is already saved, its
    loss is not finite, or its buffers are gone; says what happened in one line."""
    step = self.state_step
    try:
      if self.pending is not None and self.pending[0] == step:
        self._flush()                  # raises NonFiniteLossError: nothing is saved
      if self.last_metrics.get("step") != step or step <= (self.ckpt.latest_step() or 0):
        return                          # not checked finite, or already saved
      self.ckpt.wait()
      self._save(step, self.state)
      self.ckpt.wait()
      self.writer.message(f"{type(error).__name__} after update {step}: saved step {step} "
                          f"in {self.ckpt.directory} before stopping")
    except Exception as save_error:  # noqa: BLE001 - the original error matters more
      self.writer.message(f"{type(error).__name__} after update {step}: step {step} not "
                          f"saved ({type(save_error).__name__}: {save_error})")

  def _save(self, step: int, state) -> None:
    self.writer.flush()
    self.ckpt.save(step, state, self.data_it, self.history.to_tree(), self._summary(step))
    self.saved_step = step

  def _record(self, step: int, metrics, diag, dt: float | None = None) -> None:
    """Records a finished update (``_flush``, ``runs._Driver._flush``): its metrics row
    with the step time and throughput, the NaN/Inf stop, then its diagnostics; ``dt``:
    the step's time when the caller measured it (several runs of one program)."""
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    metrics.update(self._timing(step, dt))
    self.writer.write(step, metrics)
    if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
      self.writer.flush()
      self.ckpt.wait()
      latest = self.ckpt.latest_step()
      kept = (f"the last good checkpoint, step {latest}, is intact in {self.ckpt.directory}"
              if latest is not None else "no checkpoint had been saved")
      raise NonFiniteLossError(
          f"loss {metrics['loss']} / gradient norm {metrics['grad_norm']} at step {step} is "
          f"not finite: training stopped; {kept} (try a lower learning_rate or more "
          "warmup_steps)")
    if diag:
      self._record_diagnostics(step, jax.device_get(diag))
    self.last_metrics = {"step": step, **metrics}
    self.recent_losses = (self.recent_losses + [metrics["loss"]])[-100:]

  def _timing(self, step: int, dt: float | None) -> dict[str, float]:
    """The step time, throughput and (every ``log_every`` updates) its window's mean
    and MFU."""
    now = time.perf_counter()
    if dt is None:
      dt = now - self._t_last
    self._t_last = now
    out = {"step_time_s": dt,
           f"{self.unit}_per_s": self.units_per_step / dt if dt > 0 else 0.0}
    if self._compiling:               # this step's time includes compiling a variant
      out["compile_step"] = 1.0
    self._window.append((dt, self._compiling))
    self._compiling = False
    if step % self.cfg.log_every == 0:  # the console shows the mean over log_every steps
      window, self._window = self._window, []
      rate = throughput(self.units_per_step, [t for t, _ in window], [c for _, c in window])
      if rate is not None:            # absent when every update of the window compiled
        out[f"{self.unit}_per_s_avg"] = rate
        for key, flops in (("mfu", self.flops_per_step),
                           ("mfu_full_attention", self.flops_per_step_full)):
          mfu = mfu_lib.mfu(flops, self.units_per_step / rate, self.c.mesh.size,
                            self.peak_flops)
          if mfu is not None:         # model FLOPs / spec peak of the devices (train/mfu.py)
            out[key] = mfu
    return out

  def _record_diagnostics(self, step: int, diag) -> None:
    """The history, TensorBoard, and ``stop_on_collapse``'s evidence (``collapse_reason``,
    which the ``hooks.CollapseStop`` hook acts on)."""
    self.history.append(step, diag)
    self.writer.write_diagnostics(step, diag)
    tsim = diag.get("basic", {}).get("tsim_y2")
    if self.cfg.stop_on_collapse and tsim is not None:
      self._tsim_rows.append(np.asarray(tsim))
      self.collapse_reason = self.collapse_reason or hooks_lib.collapse_reason(
          self._tsim_rows, self.cfg.stop_on_collapse, COLLAPSED_SIM, step)

  def _summary(self, step: int) -> dict[str, Any]:
    return {
        "step": step,
        "config": config_lib.to_dict(self.cfg),
        "loss": self.last_metrics.get("loss"),
        "recent_loss": float(np.mean(self.recent_losses)) if self.recent_losses else None,
        "grad_norm": self.last_metrics.get("grad_norm"),
        f"{self.unit}_per_s": self.last_metrics.get(f"{self.unit}_per_s_avg",
                                                    self.last_metrics.get(f"{self.unit}_per_s")),
        "mfu": self.last_metrics.get("mfu"),
        "elapsed_s": time.perf_counter() - self._t_start,
        "time": time.time(),
        "diagnostic_steps": len(self.history),
        "data": self.data_name,
        "param_dtype": self.param_dtype,
        "devices": self.c.mesh.size,
    }

  def evaluate(self, step: int) -> None:
    """The evaluation row of update ``step``: mean metrics over the evaluation examples
    (batches weighted by their size)."""
    params = self.current_state().params
    sharding = shard_lib.eval_batch_sharding(self.c.mesh)
    totals: dict[str, float] = {}
    n = 0
    for local in eval_batches(self.cfg, self.c.task):
      batch = shard_lib.global_eval_batch(local, sharding)
      size = len(next(iter(batch.values())))
      out = jax.device_get(self.c.eval_step(params, batch))
      for k, v in out.items():
        totals[k] = totals.get(k, 0.0) + float(v) * size
      n += size
    if n:
      row = {f"eval_{k}": v / n for k, v in totals.items()}
      self.writer.write(step, {**row, "eval_examples": float(n)}, kind="eval")
    self._t_last = time.perf_counter()  # keep evaluation out of the step time
