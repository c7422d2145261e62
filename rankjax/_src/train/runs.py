"""Several runs of one step shape trained as one program (``rankjax train --seeds``,
``--sweep``; ``rankjax reproduce`` groups a study's runs so).

Runs whose configs differ only in per-run fields (``config.per_run_paths``: the seed,
the optimizer's scalar hyperparameters and the model scalars marked
``run_field(per_run=True)``: ``model.alpha``, ``model.beta``, ``model.tau``,
``model.init_scale``) have the
same step shape. ``train_runs`` trains them together: the train state carries a leading
run axis (each run's initialization, data order and dropout keys from its own seed),
the step is ``jax.vmap`` of the one-run step (``state.make_step``) over that axis with
the differing hyperparameters as per-run arrays, and one compile serves every run. A
swept model scalar reaches the run's model as a traced scalar: the step builds each
run's task from a copy of the model config whose swept fields are the run's values (no
``__post_init__``: the concrete configs were checked); each run is initialized from its
own concrete config (the runs of one model config vmapped over their seeds), so that
its parameters at init are its single run's, bit for bit. Each run keeps its own
workdir, written exactly as ``rankjax train`` writes one (config.json, metrics.jsonl,
diagnostics, TensorBoard, its own Orbax checkpoints), which ``load_run``, ``report``
and ``analyze`` read like any other run; everything of a run before its first update
is ``loop.open_run``'s, everything after an update ``loop._Loop``'s and the hooks'
(``rankjax._src.train.hooks``, in their order, per run), the code of a single run.

Per run: a resumed run continues from its own newest checkpoint (runs that stopped at
different updates are masked until the others reach them; a finished run stays in the
program, masked throughout, so that the run count, on which a run's floats depend, is
the group's whatever an earlier command left finished); ``stop_on_collapse`` saves
and stops that run, a NaN/Inf loss stops it with its last good checkpoint kept (its
result says so), and the others go on. A masked run's update is computed and thrown
away (``jnp.where``): the program's shape never changes.

The numbers: ``jax.vmap`` batches each matmul over the runs, so a run's floats are
those of its single run up to the order of floating-point reductions (a float32 loss
within a few ulps after one update; ``tests/train/test_runs.py`` bounds a short run),
never bit for bit. A group of one run is the single run (``loop.train``), bit for bit.

Devices: with one process, more than one device, ``mesh_fsdp=1`` and a run count that
the device count divides, the run axis is sharded over the devices (each device trains
its own runs; no collective inside a run). Otherwise every run is laid out as a single
run is (the batch over ``data``, parameters by the training rules) and the run axis is
replicated.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import itertools
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec as P

from rankjax._src import preemption as preemption_lib
from rankjax._src import storage
from rankjax._src.config import TrainConfig, get_path, per_run_paths, step_shape
from rankjax._src.errors import UserError
from rankjax._src.models import attention
from rankjax._src.train import diagnostics as diag_lib
from rankjax._src.train import loop as loop_lib
from rankjax._src.train import sharding as shard_lib
from rankjax._src.train import hooks as hooks_lib
from rankjax._src.train.checkpoint import check_workdir_config
from rankjax._src.train.hooks import RunStatus
from rankjax._src.train.state import make_init, make_optimizer, make_step
from rankjax._src.train.tasks import Task

# the fields that may differ between the runs of one program are ``per_run_paths(cfg)``
# (per-run arrays in the step: ``run_field(per_run=True)``); any other difference is
# another step shape, hence another program (``config.step_shape``)
_INTS = ("seed", "warmup_steps")
_MODEL = "model."
ONE_PROGRAM = "RANKJAX_ONE_PROGRAM"   # env: 0 trains a study's runs one after another


def one_program_pays() -> bool:
  """Whether ``rankjax reproduce`` trains a study's runs of one step shape as one program:
  yes, on a CPU and on an accelerator alike, unless ``RANKJAX_ONE_PROGRAM=0`` (one run
  after another, the single runs' floats). Measured on a 2-core CPU
  (``experiments/benchmarks/RESULTS.md``, "Runs as one program"): 2.3x faster in wall
  time for the softmax study's quick runs (each single run recompiles its diagnostics
  step, whose host callbacks keep it out of the persistent compilation cache), about
  even for the Post-Norm quick runs (XLA:CPU computes the batched matmuls of R runs as R
  loops, so a step of R runs costs R single steps); on an accelerator a run of these
  sizes uses a sliver of the device."""
  return os.environ.get(ONE_PROGRAM, "") != "0"


def group(cfgs: Mapping[str, TrainConfig]) -> list[list[str]]:
  """The names of ``cfgs`` grouped by step shape, in their first appearance's order."""
  groups: dict[tuple[tuple[str, Any], ...], list[str]] = {}
  for name, cfg in cfgs.items():
    groups.setdefault(step_shape(cfg), []).append(name)
  return list(groups.values())


def parse_seeds(text: str) -> list[int]:
  """``"0-7"``, ``"0,3,5"`` or ``"0-3,8"`` -> the seeds, in order, each once."""
  seeds: list[int] = []
  try:
    for part in text.split(","):
      lo, _, hi = part.strip().partition("-")
      seeds.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
  except ValueError:
    raise UserError(f"--seeds {text!r}: expected seeds like 0-7 or 0,3,5") from None
  if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
    raise UserError(f"--seeds {text!r}: expected distinct non-negative seeds like 0-7")
  return seeds


def sweepable(cfg: TrainConfig) -> tuple[str, ...]:
  """What ``--sweep`` takes for ``cfg``: its per-run fields but the seed (``--seeds``),
  the model's (``model.beta``) included."""
  return tuple(p for p in per_run_paths(cfg) if p != "seed")


def parse_sweep(items: Sequence[str], cfg: TrainConfig | None = None) -> dict[str, list[str]]:
  """``["learning_rate=4e-4,8e-4"]`` -> ``{"learning_rate": ["4e-4", "8e-4"]}``; the
  fields ``sweepable(cfg)`` (``cfg`` None: a default ``TrainConfig``'s)."""
  allowed = sweepable(cfg if cfg is not None else TrainConfig())
  out: dict[str, list[str]] = {}
  for item in items:
    key, sep, values = item.partition("=")
    if not sep or not values or key in out:
      raise UserError(f"--sweep {item!r}: expected FIELD=V1,V2,... once per field")
    if key not in allowed:
      raise UserError(f"--sweep {key}: one program sweeps only {', '.join(allowed)} (use "
                      "--seeds for seeds; a field that changes a shape, or that the model "
                      "branches on, needs runs of their own)")
    out[key] = [v.strip() for v in values.split(",")]
  return out


def expand(cfg: TrainConfig, workdir: str, seeds: Sequence[int] | None,
           sweep: Mapping[str, Sequence[str]]) -> dict[str, TrainConfig]:
  """``{run workdir: config}`` of ``--seeds`` x ``--sweep`` under ``workdir``:
  ``seed_<s>``, ``<field>_<value>[_...]`` or ``<field>_<value>/seed_<s>``."""
  from rankjax._src import config as config_lib
  root = epath.Path(workdir)
  points = [dict(zip(sweep, values)) for values in itertools.product(*sweep.values())]
  out: dict[str, TrainConfig] = {}
  for point in points:
    base = config_lib.override(cfg, [f"{k}={v}" for k, v in point.items()])
    folder = root / "_".join(f"{k}_{v}" for k, v in point.items()) if point else root
    for seed in (seeds if seeds is not None else [None]):
      run = base if seed is None else dataclasses.replace(base, seed=seed)
      out[str(folder / f"seed_{seed}" if seed is not None else folder)] = run
  return out


class _RunView:
  """``cfg`` with some fields replaced by one run's traced values (inside the vmap);
  ``model``: the run's model config (``_with_values``)."""

  def __init__(self, cfg: TrainConfig, values: Mapping[str, Any], model: Any):
    self._cfg, self._values, self._model = cfg, values, model

  def __getattr__(self, name: str) -> Any:
    if name == "model":
      return self._model
    return self._values[name] if name in self._values else getattr(self._cfg, name)


def _with_values(cfg: Any, values: Mapping[str, Any]) -> Any:
  """A copy of the config ``cfg`` with the fields at the dotted paths of ``values`` set
  to them (traced scalars), without ``__post_init__``: its checks ran on the concrete
  configs, and a tracer cannot be compared."""
  if not values:
    return cfg
  out = copy.copy(cfg)
  nested: dict[str, dict[str, Any]] = {}
  for path, value in values.items():
    head, _, rest = path.partition(".")
    if rest:
      nested.setdefault(head, {})[rest] = value
    else:
      object.__setattr__(out, head, value)
  for head, inner in nested.items():
    object.__setattr__(out, head, _with_values(getattr(cfg, head), inner))
  return out


def _run_task(task: Task, model_values: Mapping[str, Any]) -> Task:
  """``task`` whose model reads one run's model scalars (``model_values``, paths under
  ``model.``: traced in the step, numbers at init); its parameters' axes are the
  concrete task's."""
  if not model_values:
    return task
  return task.with_model(task.model.clone(cfg=_with_values(task.model.cfg, model_values)))


def _check_model_sweep(cfg: TrainConfig, task: Task, model_swept: Sequence[str]) -> None:
  """Refuses a swept model scalar the model cannot take traced: a task whose model
  carries no ``cfg``, or ``tau`` under an attention kernel that takes a fixed scale."""
  if not model_swept:
    return
  if not dataclasses.is_dataclass(getattr(task.model, "cfg", None)):
    raise UserError(f"--sweep {_MODEL}{model_swept[0]}: the {cfg.model.kind!r} task's model "
                    "has no config attribute cfg to give each run its value; train the "
                    "values as runs of their own")
  m = cfg.model
  if "tau" in model_swept:
    dtype = jnp.dtype(m.compute_dtype)
    fixed = sorted({k.name for dropout in {False, bool(m.attn_dropout_rate)}
                    if not (k := attention.kernel_for(m, dtype, cfg.seq_len,
                                                      dropout=dropout)).traced_scale})
    if fixed:
      raise UserError(f"--sweep model.tau: the {'/'.join(fixed)} attention kernel takes a "
                      "fixed scale; set model.kernels.attention_impl=xla (and "
                      "kernels.attn_dropout_kernel=blocks with hash masks) to sweep the "
                      "temperature in one program")


@dataclasses.dataclass
class Program:
  """The jitted functions of R runs of one shape (built once, no data, no I/O)."""

  runs: int
  swept: dict[str, np.ndarray]          # the per-run values of the fields that differ
  stacked: Any                          # the state's shardings with the run axis
  batch_sharding: NamedSharding
  vector_sharding: NamedSharding        # (R,) arrays: hyperparameters, the active mask
  init: Callable
  step: Callable
  diag_step: Callable | None
  take: Callable                        # (state, i) -> run i's state (single-run layout)
  put: Callable                         # (state, i, one) -> state with run i replaced


def build_program(cfgs: Sequence[TrainConfig], c: loop_lib.Compiled,
                  diags: tuple[diag_lib.Diagnostic, ...]) -> Program:
  """The program of ``cfgs`` (one shape) around ``c``, the single run's build."""
  cfg = cfgs[0]
  runs, mesh, task = len(cfgs), c.mesh, c.task
  swept = {f: np.asarray([get_path(x, f) for x in cfgs],
                         np.int32 if f in _INTS else np.float32)
           for f in sweepable(cfg) if len({get_path(x, f) for x in cfgs}) > 1}
  model_swept = [f[len(_MODEL):] for f in swept if f.startswith(_MODEL)]
  _check_model_sweep(cfg, task, model_swept)
  seeds = np.asarray([x.seed for x in cfgs], np.int32)
  by_run = (jax.process_count() == 1 and mesh.size > 1 and mesh.shape["fsdp"] == 1
            and runs % mesh.shape["data"] == 0)
  if by_run:     # each device trains whole runs
    stacked = jax.tree.map(lambda _: NamedSharding(mesh, P("data")), c.state_shardings)
    batch_sh = vector_sh = NamedSharding(mesh, P("data"))
    inner_mesh, grad_shardings = None, None
  else:          # each run laid out as a single run; the run axis replicated
    stacked = jax.tree.map(lambda s: NamedSharding(mesh, P(None, *s.spec)),
                           c.state_shardings)
    batch_sh = NamedSharding(mesh, P(None, *c.batch_sharding.spec))
    vector_sh = shard_lib.replicated(mesh)
    inner_mesh, grad_shardings = mesh, c.state_shardings.params
  tx = make_optimizer(cfg, task.stacked_roots)

  init = _init_fn(cfgs, task, tx, model_swept)

  def one(values, state, batch, diags_):
    model_values = {k[len(_MODEL):]: v for k, v in values.items() if k.startswith(_MODEL)}
    run = _RunView(cfg, values, _with_values(cfg.model, model_values))
    run_tx = make_optimizer(run, task.stacked_roots)
    try:
      return make_step(_run_task(task, model_values), run, run_tx, diags_,
                       grad_shardings=grad_shardings, mesh=inner_mesh)(state, batch)
    except jax.errors.ConcretizationTypeError:
      if not model_values:
        raise
      raise UserError(f"--sweep {', '.join(_MODEL + f for f in model_values)}: the model "
                      "branches on a swept value or needs it as a fixed number (its field "
                      "should not be per_run); train the values as runs of their own"
                      ) from None

  def jit_step(diags_):
    def step(values, state, batch, active):
      new, metrics, diag = jax.vmap(lambda v, s, b: one(v, s, b, diags_))(values, state, batch)
      keep = lambda n, o: jnp.where(active.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
      return jax.tree.map(keep, new, state), metrics, diag
    repl = shard_lib.replicated(mesh)
    return jax.jit(step, in_shardings=(vector_sh, stacked, batch_sh, vector_sh),
                   out_shardings=(stacked, repl, repl), donate_argnums=(1,))

  take = jax.jit(lambda state, i: jax.tree.map(lambda x: x[i], state),
                 out_shardings=c.state_shardings)
  put = jax.jit(lambda state, i, one_: jax.tree.map(lambda x, y: x.at[i].set(y), state, one_),
                out_shardings=stacked, donate_argnums=(0,))
  init_fn = jax.jit(init, out_shardings=stacked)
  return Program(runs=runs, swept=swept, stacked=stacked, batch_sharding=batch_sh,
                 vector_sharding=vector_sh, init=lambda: init_fn(seeds),
                 step=jit_step(()), diag_step=jit_step(diags) if diags else None,
                 take=take, put=put)


def _init_fn(cfgs: Sequence[TrainConfig], task: Task, tx,
             model_swept: Sequence[str]) -> Callable:
  """seeds (R,) -> the R runs' initial states: each run's from its own concrete values
  (``task`` with the run's swept model scalars as numbers; the runs of one point vmapped
  over their seeds), so that a swept init scalar (``model.alpha``) gives each run
  exactly its single run's init."""
  by_point: dict[Any, list[int]] = {}
  for i, x in enumerate(cfgs):
    by_point.setdefault(tuple(getattr(x.model, f) for f in model_swept), []).append(i)
  if len(by_point) == 1:
    return lambda seeds_r: jax.vmap(lambda s: make_init(task, tx, s)())(seeds_r)
  parts = [(_run_task(task, dict(zip(model_swept, point))), np.asarray(idx))
           for point, idx in by_point.items()]
  order = np.argsort(np.concatenate([idx for _, idx in parts]))

  def init(seeds_r):
    states = [jax.vmap(lambda s, t=t: make_init(t, tx, s)())(seeds_r[idx]) for t, idx in parts]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs)[order], *states)

  return init


def train_runs(cfgs: Mapping[str, TrainConfig], *, on_step: Callable[[int], None] | None = None,
               stream: TextIO | None = None, progress_bar: bool | None = None
               ) -> dict[str, loop_lib.TrainResult]:
  """Trains ``cfgs`` ({workdir: config}, one step shape) as one program; a run's
  workdir is written as ``loop.train`` writes it. Returns {workdir: result}; a run whose
  loss became NaN/Inf has status ``RunStatus.FAILED``, the reason in ``error`` and the
  update in ``step`` (its last good checkpoint kept), and the others trained on.

  Raises:
    UserError: runs of different step shapes (naming a field), or bad input.
  """
  if not cfgs:
    return {}
  names = list(cfgs)
  first = step_shape(cfgs[names[0]])
  for name in names[1:]:
    shape = step_shape(cfgs[name])
    if shape != first:
      diff = [k for (k, v), (_, w) in zip(shape, first) if v != w]
      raise UserError(f"{name} and {names[0]} differ in {', '.join(diff)}: one program "
                      "trains runs that differ only in "
                      f"{', '.join(per_run_paths(cfgs[names[0]]))}")
  if len(set(map(str, names))) != len(names):
    raise UserError("two runs of one program share a workdir")
  if len(names) == 1:          # a group of one is the single run, bit for bit
    result = loop_lib.train(cfgs[names[0]], names[0], on_step=on_step, stream=stream,
                            progress_bar=progress_bar)
    return {names[0]: result}
  workdirs = [storage.check_output(n, "workdir") for n in names]
  with preemption_lib.DuringTraining() as preemption:
    return _train_runs([cfgs[n] for n in names], workdirs, names, preemption, on_step,
                       stream, progress_bar)


def _train_runs(cfgs, workdirs, names, preemption, on_step, stream, progress_bar):
  t_start = time.perf_counter()
  cfg = cfgs[0]
  if cfg.compilation_cache_dir:
    loop_lib.enable_compilation_cache(cfg.compilation_cache_dir)
  loop_lib.check_param_dtype(cfg)
  c = loop_lib.build_for_run(cfg)
  for run_cfg, workdir in zip(cfgs, workdirs):   # every refusal before any file is written
    check_workdir_config(workdir, run_cfg)
  quiet = _Discard()
  results: dict[str, loop_lib.TrainResult] = {}
  slots: list[loop_lib._Loop | None] = []     # one per run; None: nothing to train
  try:
    for i, (run_cfg, workdir) in enumerate(zip(cfgs, workdirs)):
      first = not any(slots)
      opened = loop_lib.open_run(run_cfg, workdir, c, stream if first else quiet,
                                 progress_bar if first else False, checked=i > 0)
      if isinstance(opened, loop_lib.TrainResult):
        results[names[i]] = opened
        slots.append(None)
      else:
        slots.append(opened)
  except BaseException:
    for lp in filter(None, slots):
      lp.close()
    raise
  live = [k for k, lp in enumerate(slots) if lp is not None]
  if not live:
    return results
  # every run of the group stays in the program (a finished one masked throughout): a
  # run's floats depend on the program's run count, which must not depend on which
  # runs a kill or an earlier command left finished
  diags = diag_lib.resolve(cfg.diagnostics) if cfg.diag_every else ()
  program = build_program(cfgs, c, diags)
  if jax.process_index() == 0:
    done = f", {len(results)} of them finished (masked)" if results else ""
    print(f"{len(slots)} runs as one program{done} (the run axis {_layout(program)}; "
          + ("per-run " + ", ".join(["seed", *program.swept]) if program.swept
             else "per-run seeds") + f"); the console follows {workdirs[live[0]]}",
          file=stream or sys.stdout, flush=True)
  driver = _Driver(program, slots, preemption, on_step)
  try:
    statuses = driver.run()
  finally:
    for k in live:
      slots[k].close()
  for k in live:
    lp = slots[k]
    if statuses[k] != RunStatus.FAILED:
      lp.say_end(lp.state_step, statuses[k], t_start)
    results[names[k]] = loop_lib.TrainResult(
        workdirs[k], lp.state_step, statuses[k], lp.last_metrics, lp.start,
        error=driver.errors.get(k))
  return {n: results[n] for n in names}


class _Discard(io.TextIOBase):
  """The console of every run but the first (their files are written in full)."""

  def write(self, text: str) -> int:
    return len(text)


def _layout(program: Program) -> str:
  spec = program.batch_sharding.spec
  return "sharded over the devices" if spec and spec[0] == "data" else "replicated"


class _Driver:
  """The step loop of one program: a ``loop._Loop`` per run does the per-run work
  (metrics, diagnostics, checks, saving) and is the run the hooks see (``hooks``: its
  ``finish``, ``save`` and ``current_state`` pointed at the program); this class steps
  the runs together. A run a hook stops (collapsed, stop_at) or whose loss becomes
  NaN/Inf (failed) is masked from then on while the others go on."""

  def __init__(self, program: Program, loops: list[loop_lib._Loop | None],
               preemption: preemption_lib.DuringTraining, on_step):
    self.p, self.loops, self.preemption = program, loops, preemption
    self.hooks = hooks_lib.make_hooks(on_step)
    self.live = [k for k, lp in enumerate(loops) if lp is not None]
    self.cfg = loops[self.live[0]].cfg
    # finished before the call, stopped or failed: masked from then on
    self.stopped = [lp is None for lp in loops]
    self.errors: dict[int, str] = {}
    self.status = [RunStatus.COMPLETED] * len(loops)
    self.pending: tuple[int, Any, Any, list[int]] | None = None
    self._t_last = time.perf_counter()
    self._called: set[Any] = set()
    self._saving: Any = None      # the Checkpointer of the newest save
    self.state_step, self.state_active = 0, []
    self.values = {k: jax.device_put(v, program.vector_sharding)
                   for k, v in program.swept.items()}
    for k in self.live:
      lp = loops[k]
      lp.state_step, lp.preemption = lp.start, preemption
      lp.finish = functools.partial(self._finish_for, k)
      lp.save = functools.partial(self._save, k)
      lp.current_state = functools.partial(self._take, k)

  def _initial_state(self):
    state = self.p.init()
    for k in self.live:
      lp = self.loops[k]
      if lp.restored_state is not None:
        state = self.p.put(state, k, lp.restored_state)
        lp.restored_state = None
    return state

  def _active(self, step: int) -> list[int]:
    return [k for k in self.live if self.loops[k].start < step and not self.stopped[k]]

  def _batch(self, active: list[int]):
    """Each active run's next batch from its own iterator, stacked; a masked run gets
    a copy of the first active run's (its own iterator does not move)."""
    local = {k: next(self.loops[k].data_it) for k in active}
    filler = local[active[0]]
    rows = [local.get(k, filler) for k in range(len(self.loops))]
    k_acc, hosts = self.cfg.grad_accum, jax.process_count()
    out = {}
    for key in filler:
      x = np.stack([np.asarray(r[key]).reshape(k_acc, -1, *np.shape(r[key])[1:]) for r in rows])
      shape = (x.shape[0], k_acc, x.shape[2] * hosts, *x.shape[3:])
      out[key] = jax.make_array_from_process_local_data(self.p.batch_sharding, x, shape)
    return out

  def run(self) -> list[RunStatus]:
    try:
      return self._run()
    except (loop_lib.NonFiniteLossError, preemption_lib.Stopped):
      raise
    except Exception as e:
      self._save_after_error(e)
      raise

  def _run(self) -> list[RunStatus]:
    self.state = self._initial_state()
    if self.preemption.signal_name is not None:
      for lp in (self.loops[k] for k in self.live):
        lp.writer.message(f"{self.preemption.signal_name} before update {lp.start + 1}: "
                          "nothing new to save; run the same command again to continue")
      return [RunStatus.PREEMPTED] * len(self.loops)
    first = min(self.loops[k].start for k in self.live) + 1
    for step in range(first, self.cfg.total_steps + 1):
      active = self._active(step)
      if not active:
        break
      metrics, diag = self._dispatch(step, active)
      self._flush()                 # update step - 1, while `step` runs
      self.pending = (step, metrics, diag, active)
      self._run_hooks(step, active)
    self._flush()
    return self.status

  def _dispatch(self, step: int, active: list[int]):
    """Queues update ``step`` of the ``active`` runs (the others masked)."""
    mask = jax.device_put(np.asarray([k in active for k in range(len(self.loops))]),
                          self.p.vector_sharding)
    batch = self._batch(active)
    fn = loop_lib.step_variant(self.p, self.cfg, step)
    before = loop_lib._compiled_count(fn)
    self.state, metrics, diag = fn(self.values, self.state, batch, mask)
    self.state_step, self.state_active = step, active
    compiled = fn not in self._called or loop_lib._compiled_count(fn) != before
    self._called.add(fn)
    for k in active:              # the next measured step time holds the compile
      self.loops[k]._compiling |= compiled
      self.loops[k].state_step = step
    return metrics, diag

  def _run_hooks(self, step: int, active: list[int]) -> None:
    """Each hook in order for the runs it concerns (``hooks.Hook.runs``); a run given
    a stop reason is masked from then on."""
    for hook in self.hooks:
      runs = {"once": active[:1], "active": active, "live": self.live}[hook.runs]
      for k in (k for k in runs if hook.runs == "once" or not self.stopped[k]):
        status = hook(step, self.loops[k])
        if status is not None:
          self.stopped[k], self.status[k] = True, status

  def _take(self, k: int):
    return self.p.take(self.state, k)

  def _finish_for(self, k: int) -> RunStatus | None:
    """Run k's ``finish``: records the pending update of every run; FAILED when run k's
    loss was NaN/Inf."""
    self._flush()
    return RunStatus.FAILED if k in self.errors else None

  def _save(self, k: int, step: int) -> None:
    """Run k's checkpoint of ``step``. One run's save at a time: the previous save (async
    or not) ends first, so that Orbax's multi-process barriers and metadata checks of
    one run's checkpoint never interleave with another's (two managers finalizing at
    once on two processes failed its metadata check); the last save still overlaps the
    next updates."""
    if self._saving is not None:
      self._saving.wait()
    self.loops[k]._save(step, self._take(k))
    self._saving = self.loops[k].ckpt

  def _flush(self) -> None:
    """Fetches the pending update's outputs once and hands each active run its slice
    (``_Loop._record``): the one place the program's train rows are written."""
    if self.pending is None:
      return
    step, metrics, diag, active = self.pending
    self.pending = None
    metrics, diag = jax.device_get((metrics, diag))
    now = time.perf_counter()
    dt, self._t_last = now - self._t_last, now
    for k in active:
      if self.stopped[k]:
        continue
      one = lambda tree: jax.tree.map(lambda x: x[k], tree)
      try:
        self.loops[k]._record(step, one(metrics), one(diag) if diag else diag, dt=dt)
      except loop_lib.NonFiniteLossError as e:
        self.stopped[k], self.status[k], self.errors[k] = True, RunStatus.FAILED, str(e)
        self.loops[k].state_step = step
        self.loops[k].writer.message(f"run stopped: {e}")

  def _save_after_error(self, error: Exception) -> None:
    """Each run of the newest dispatched update saves it when it is finished and
    finite (``_Loop._save_after_error``); a run masked at that update has nothing new."""
    pending, self.pending = self.pending, None
    if self._saving is not None:   # one run's save at a time (``_save``)
      try:
        self._saving.wait()
      except Exception:  # noqa: BLE001 - the original error matters more
        pass
    for k in self.state_active:
      lp = self.loops[k]
      if self.stopped[k]:
        continue
      try:
        lp.state = self.p.take(self.state, k)
      except Exception:  # noqa: BLE001 - the buffers may be gone: nothing to save then
        continue
      lp.state_step, lp.pending = self.state_step, None
      if pending is not None and pending[0] == self.state_step and k in pending[3]:
        lp.pending = (pending[0], jax.tree.map(lambda x: x[k], jax.device_get(pending[1])),
                      None)
      lp._save_after_error(error)
