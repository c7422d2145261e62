"""A study's training runs: ``rankjax train`` runs under the study's output folder.

A training experiment declares, per scale, the runs it reads
(``Experiment.runs(scale) -> {name: TrainConfig}``); the runner trains them all before
any analysis, in every process of a multi-host job (``rankjax.train.loop.train``, the
code of ``rankjax train``), and the experiment's ``run`` then reads them
(``rankjax.load_run``) on process 0. A run lives in ``<experiment folder>/runs/<name>``:
rerunning the command skips a finished run (same config, its last checkpoint saved)
and resumes a half-done one from its newest checkpoint.

Scales:

* ``paper``: the paper's model, data, tokenizer, batch, schedule, steps and seeds (the
  study's configs);
* ``tiny``: the same configs through :func:`tiny` (depth <= 4, width 32, 32 tokens,
  ``TINY_STEPS`` updates, the byte tokenizer; the data set is the offline stand-in
  unless ``RANKJAX_TINY_DATA_DIR`` names a tfds ``data_dir`` holding the paper's set):
  every code path of ``paper`` on a laptop CPU in minutes. Its rows are not judged
  against the paper (status ``tiny``).

Before anything trains, :func:`plan` gives each run's updates, tokens, parameters,
checkpoint disk, peak memory per device (XLA's analysis of the compiled step on the
devices themselves; for a ``--plan --target`` XLA:CPU's of the step compiled at the
target's mesh on host devices, ``rankjax.train.plan_memory``; else the estimate, each
labelled) and device-hours at a labelled MFU (:func:`mfu_for`), and
:func:`refusals` the one-line reasons a run cannot start (a data set not prepared, a
tokenizer file missing, a config that the devices cannot hold).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pathlib
from typing import Any, Mapping, Sequence

TINY_STEPS = 24          # updates of a tiny run
TINY_WIDTH = 32          # d_model (LM) / width (MLP) of a tiny run
TINY_TOKENS = 32         # sequence length of a tiny run
TINY_DATA_DIR = "RANKJAX_TINY_DATA_DIR"   # env: tiny runs read the paper's set from here
# the share of a device's memory a run may plan to use (the rest: XLA's workspace,
# fragmentation, the diagnostics step)
MEMORY_SHARE = 0.9


def load(config: str | pathlib.Path, overrides: tuple[str, ...] | list[str] = ()):
  """A TrainConfig from a JSON file with ``key=value`` overrides."""
  from rankjax import config as config_lib
  from rankjax.config import TrainConfig
  path = pathlib.Path(config)
  return config_lib.override(config_lib.from_json(TrainConfig, path), list(overrides))


def _scaled(n: int, total: int, steps: int) -> int:
  """``n`` of ``total`` updates as the same share of ``steps`` (0 stays 0, else >= 1)."""
  return 0 if n <= 0 else max(1, min(steps, round(n * steps / total)))


def tiny(cfg, data_dir: str | None = None):
  """``cfg`` shrunk to a laptop CPU, every other setting kept (placement, norms,
  positions, init, optimizer, schedule shape, dtype, remat, dropout, diagnostics,
  seed, learning rate).

  LM: at most 4 layers, d_model=32 with d_ff in the config's ratio, 2 heads (the kv
  heads' ratio kept), 32 tokens, the byte tokenizer (257 classes), batch 8 in at most 2
  micro-batches, ``TINY_STEPS`` updates with warmup at the same share of the run,
  diagnostics at update 1 and at least every ``TINY_STEPS // 8`` updates (a diagnostics
  step costs about a second here), evaluation at most twice. MLP: at most 4 blocks of width 32. Data: the offline stand-in
  (the Shakespeare corpus; an image set's offline fallback) unless ``data_dir`` holds the
  paper's tfds set (then the config's ``dataset`` is read from there).
  """
  steps = min(cfg.total_steps, TINY_STEPS)
  total = cfg.total_steps
  changes: dict[str, Any] = dict(
      total_steps=steps, warmup_steps=min(_scaled(cfg.warmup_steps, total, steps), steps),
      diag_every=max(_scaled(cfg.diag_every, total, steps), steps // 8) if cfg.diag_every else 0,
      eval_every=max(_scaled(cfg.eval_every, total, steps), steps // 2) if cfg.eval_every else 0,
      eval_batches=min(cfg.eval_batches, 2), checkpoint_every=steps, max_to_keep=1,
      log_every=max(1, steps // 4), async_checkpointing=False, mesh_fsdp=1, mesh_data=0,
      grad_accum=min(cfg.grad_accum, 2), batch_size=8, compilation_cache_dir="",
      diag_examples=min(cfg.diag_examples, 2) if cfg.diag_examples else 2)
  if data_dir:
    changes["data_dir"] = data_dir
  if cfg.model.kind == "transformer":
    lm = cfg.model
    heads = min(lm.num_heads, 2)
    kv = lm.num_kv_heads and max(1, heads * lm.num_kv_heads // lm.num_heads)
    d_ff = max(8, round(lm.d_ff * TINY_WIDTH / lm.d_model))
    lm = dataclasses.replace(
        lm, num_layers=min(lm.num_layers, 4), d_model=TINY_WIDTH, num_heads=heads,
        num_kv_heads=kv or None, d_ff=d_ff, max_seq_len=TINY_TOKENS, vocab_size=257,
        loss_chunk=min(lm.loss_chunk, 64) if lm.loss_chunk else 0)
    changes.update(model=lm, seq_len=TINY_TOKENS, tokenizer="byte")
    if not data_dir:
      changes["dataset"] = "shakespeare"
  elif cfg.model.kind == "mlp":
    changes["model"] = dataclasses.replace(cfg.model, depth=min(cfg.model.depth, 4),
                                         width=TINY_WIDTH)
    if not data_dir:
      changes["dataset"] = "digits"
      changes["model"] = dataclasses.replace(changes["model"], input_dim=64)
  return dataclasses.replace(cfg, **changes)


# ``rankjax reproduce --set KEY=VALUE``: applied to every run a study builds
# (:func:`at_scale`, the one place both studies' run configs pass), while :func:`user_sets`
# is active
_USER_SETS: tuple[str, ...] = ()
_SETS_APPLIED = [0]   # configs the active sets reached (``rankjax reproduce`` checks > 0)
# {fitted config: the line saying how :func:`fit_batch` changed it} (the plan prints it)
_BATCH_NOTES: dict[Any, str] = {}


# ``rankjax reproduce --plan --target KIND:N``: the hardware the plan is for while
# :func:`planning_for` is active (None: this job's own devices)
_TARGET: list[Any] = [None]


@contextlib.contextmanager
def planning_for(target):
  """While active, the plan, the batch fit and the refusals are for ``target``
  (``rankjax.train.mfu.Target``: N devices of a kind, from any machine) instead of this
  job's devices; None changes nothing."""
  before, _TARGET[0] = _TARGET[0], target
  try:
    yield
  finally:
    _TARGET[0] = before


def target():
  """The active :func:`planning_for` target, or None."""
  return _TARGET[0]


def device_count() -> int:
  """The devices the runs are planned for: the target's, else this job's."""
  import jax
  return _TARGET[0].devices if _TARGET[0] is not None else jax.device_count()


@contextlib.contextmanager
def user_sets(sets: Sequence[str]):
  """While active, :func:`at_scale` applies ``sets`` (``key=value``, the syntax of
  ``rankjax train --set``) to every run config."""
  global _USER_SETS
  before, _USER_SETS = _USER_SETS, tuple(sets)
  _SETS_APPLIED[0] = 0
  try:
    yield
  finally:
    _USER_SETS = before


def active_sets() -> tuple[str, ...]:
  """The ``--set`` assignments of the active :func:`user_sets` (empty outside one)."""
  return _USER_SETS


def sets_applied() -> int:
  """How many run configs the active :func:`user_sets` reached so far."""
  return _SETS_APPLIED[0]


def user_setting(key: str) -> str | None:
  """The value the active ``--set`` gives ``key`` (the last assignment), else None: how
  a study's own data check, or an experiment that trains outside ``rankjax train``
  runs, reads a setting such as ``data_dir``. A value read counts as applied (the
  command's "--set reached no run" refusal does not fire)."""
  values = [v.strip() for k, _, v in (a.partition("=") for a in _USER_SETS)
            if k.strip() == key]
  if not values:
    return None
  _SETS_APPLIED[0] += 1
  return values[-1]


def missing_directory(path: str, what: str) -> str | None:
  """None when ``path`` is a directory, local or at a URL (``gs://bucket/dir``, through
  etils.epath), else one line saying why not (``what`` names the setting)."""
  from rankjax import storage
  try:
    if storage.as_path(path, what).is_dir():
      return None
  except (OSError, ValueError) as e:
    return f"{what}={path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
  return f"{what}={path} is not a directory"


def at_scale(cfg, scale: str):
  """``cfg`` as the runs of ``scale`` train it: :func:`tiny` at ``tiny`` (its parameters
  and optimizer state sharded over this job's devices, ``mesh_fsdp``, as a paper run that
  needs it: the paper step's code path on host devices), then the user's ``--set``
  (:func:`user_sets`), then the batch split fitted to this job's devices
  (:func:`fit_batch`: the global batch kept; the plan prints the change). The devices
  are the :func:`planning_for` target's where one is active."""
  import math

  from rankjax import config as config_lib
  count = device_count()
  if scale == "tiny":
    cfg = tiny(cfg, os.environ.get(TINY_DATA_DIR) or None)
    cfg = dataclasses.replace(cfg, mesh_fsdp=math.gcd(count, cfg.batch_size))
  if _USER_SETS:
    cfg = config_lib.override(cfg, _USER_SETS, "rankjax reproduce --set")
    _SETS_APPLIED[0] += 1
  fitted, note = fit_batch(cfg, count)
  if note:
    _BATCH_NOTES[fitted] = note
  return fitted


def fit_batch(cfg, num_devices: int):
  """``(cfg, note)``: the global batch kept, ``grad_accum`` lowered to the largest value
  whose micro-batch ``batch_size / grad_accum`` splits evenly over ``num_devices`` (more
  devices carry the same micro-batch with fewer accumulation steps); ``cfg`` unchanged
  and note None when it splits already or when no ``grad_accum`` can
  (:func:`refusals` names that)."""
  b, k = cfg.batch_size, cfg.grad_accum
  if (b // k) % num_devices == 0:
    return cfg, None
  for g in range(k - 1, 0, -1):
    if b % g == 0 and (b // g) % num_devices == 0:
      return dataclasses.replace(cfg, grad_accum=g), (
          f"grad_accum {k} -> {g}: micro-batch {b // g} over {num_devices} devices "
          f"(batch {b} kept)")
  return cfg, None


def workdir(folder: str | pathlib.Path, name: str) -> str:
  """Where run ``name`` of an experiment writing into ``folder`` lives."""
  return os.path.join(str(folder), "runs", name)


def finished(path: str, cfg) -> bool:
  """The run in ``path`` has ``cfg`` (up to the resumable fields) and its last step
  saved (``stop_at``'s, for a partial run), or it stopped itself on collapse."""
  from rankjax import config as config_lib
  from rankjax.config import TrainConfig
  from rankjax.train import checkpoint
  from rankjax.train.loop import last_step
  saved = os.path.join(path, "config.json")
  if not (os.path.isfile(saved)
          and (os.path.isdir(os.path.join(path, "checkpoints", str(last_step(cfg))))
               or stopped_itself(path, cfg))):
    return False
  differ = config_lib.diff(config_lib.from_json(TrainConfig, saved), cfg)
  return not [k for k in differ if k not in checkpoint.RESUMABLE_FIELDS]


def stopped_itself(path: str, cfg) -> bool:
  """The run in ``path`` stopped itself on collapse (``stop_on_collapse``; its
  ``stopped.json``) and ``cfg`` keeps that stop: it will train no further."""
  from rankjax.train.checkpoint import read_stopped
  return bool(cfg.stop_on_collapse) and read_stopped(path) is not None


class Preempted(RuntimeError):
  """A run saved a checkpoint and stopped on SIGTERM / Ctrl-C (``rankjax reproduce``
  exits 75, as ``rankjax train``: run the same command again to resume)."""


def train(path: str, cfg) -> str:
  """Trains ``cfg`` in ``path`` unless it finished there; resumes a half-done run.
  Every process of a multi-host job calls it (the step is one SPMD program).

  Raises:
    Preempted: the run was stopped by SIGTERM or Ctrl-C after saving (nothing after it
      may run: the analysis would read an unfinished run).
  """
  if finished(path, cfg):
    return path
  from rankjax.train.hooks import RunStatus
  from rankjax.train.loop import train as train_loop
  result = train_loop(cfg, path, progress_bar=False)
  if result.status == RunStatus.PREEMPTED:
    raise Preempted(f"{path}: saved at update {result.step} and stopped (SIGTERM or Ctrl-C); "
                    "run the same command again to resume")
  return path


def train_all(runs: Mapping[str, Any], cache_dir: str | pathlib.Path | None = None,
              groups_of: Mapping[str, Any] | None = None) -> dict[str, str]:
  """Trains each of ``runs`` ({workdir: cfg}; skipped when finished) and returns
  {workdir: one-line error} of the runs that failed (a NaN loss, a bad config): the
  experiments that read them fail, the others still run.

  Unless ``RANKJAX_ONE_PROGRAM=0`` (``rankjax.train.runs.one_program_pays``), runs of
  one step shape (``rankjax.train.runs.group``: configs that differ
  only in the seed and the optimizer's scalar hyperparameters) train as one program
  (``rankjax.train.runs.train_runs``): the group is formed over ``groups_of`` (the
  study's every run at this scale; default ``runs``), so a run's program, hence its
  floats, is the same whichever experiments a command selects, and a group trains when
  any of its runs in ``runs`` is unfinished; on an accelerator a group larger than one
  program holds (``program_size``: the device memory) is cut into programs in order.
  Otherwise each run trains alone. ``cache_dir``: JAX's persistent compilation
  cache for the runs, unless one is configured already.

  Raises:
    Preempted: a run was stopped by SIGTERM / Ctrl-C (nothing after it runs).
  """
  import jax
  from rankjax.train import runs as runs_lib
  from rankjax.train.hooks import RunStatus
  if cache_dir is not None and runs and not jax.config.jax_compilation_cache_dir:
    from rankjax.train.loop import enable_compilation_cache
    enable_compilation_cache(str(cache_dir))
  every = {**(groups_of or {}), **runs}
  one_program = runs_lib.one_program_pays()
  groups = ([chunk for names in runs_lib.group(every)
             for chunk in _fitting(names, program_size(every[names[0]]))]
            if one_program else [[p] for p in runs])
  failed: dict[str, str] = {}
  for names in groups:
    if not any(p in runs and not finished(p, every[p]) for p in names):
      continue
    print(f"train {', '.join(names)}", flush=True)
    try:
      if len(names) == 1:
        train(names[0], every[names[0]])
        continue
      results = runs_lib.train_runs({p: every[p] for p in names})
    except Preempted:
      raise
    except Exception as e:  # noqa: BLE001 (the experiments reading them fail, one line each)
      line = f"{type(e).__name__}: " + (str(e).splitlines() or [""])[0][:300]
      for p in names:
        failed[p] = f"training {os.path.basename(p)}: {line}"
      print(failed[names[0]], flush=True)
      continue
    if any(r.status == RunStatus.PREEMPTED for r in results.values()):
      raise Preempted(f"{os.path.dirname(names[0])}: {len(names)} runs saved and stopped "
                      "(SIGTERM or Ctrl-C); run the same command again to resume")
    for p, r in results.items():
      if r.status == RunStatus.FAILED:
        failed[p] = f"training {os.path.basename(p)}: NonFiniteLossError: {r.error[:300]}"
        print(failed[p], flush=True)
  return {p: e for p, e in failed.items() if p in runs}


def program_size(cfg) -> int:
  """How many runs of ``cfg``'s step shape one program holds: all of them where the
  devices report no memory limit (a CPU: the host's memory); on an accelerator as many
  as fit ``MEMORY_SHARE`` of a device at the planned peak of one run per device
  (``memory_estimate``; R runs of one program hold R runs' state and activations), at
  least one (a paper-scale run fills its devices alone)."""
  import jax
  from rankjax.train import memory
  limit = memory.device_limit()
  if limit is None:
    return 1 << 30
  return runs_per_program(memory_estimate(cfg, jax.device_count())["total"], limit)


def runs_per_program(peak: float, memory: float | None) -> int:
  """Runs of ``peak`` bytes per device one program holds in ``memory`` bytes per device
  (``MEMORY_SHARE`` of it); None (no limit): all of them."""
  if memory is None or peak <= 0:
    return 1 << 30
  return max(1, int(MEMORY_SHARE * memory // peak))


def _fitting(names: list[str], size: int) -> list[list[str]]:
  """``names`` cut into programs of at most ``size`` runs, in order (the cut depends on
  the device memory only, so a run's program is the same on the same devices)."""
  return [names[i:i + size] for i in range(0, len(names), size)]


# ---------------------------------------------------------------------------------------
# The plan and the refusals, before anything trains


@functools.lru_cache(maxsize=None)
def _task(cfg):
  """The run's Task (cached: the plan, the memory estimate and the refusals all ask)."""
  from rankjax.train import tasks
  return tasks.make_task(cfg)


@functools.lru_cache(maxsize=None)
def _param_count(cfg) -> int:
  from rankjax.train import memory
  return memory.param_count(cfg)


def on_the_devices(num_devices: int) -> bool:
  """Planning for this job's own devices, and they report a memory limit (an
  accelerator): then the plan compiles the step and reads XLA's analysis, as
  ``rankjax train`` does."""
  import jax
  from rankjax.train import memory
  return (_TARGET[0] is None and memory.device_limit() is not None
          and num_devices == jax.device_count())


@functools.lru_cache(maxsize=None)
def _compiled_peak(cfg):
  """``loop.compiled_peak_bytes``, once per config (the plan, the remat choice and the
  refusals all ask)."""
  from rankjax.train import loop
  return loop.compiled_peak_bytes(cfg)


# env: "estimate" plans a --target's memory by rankjax.train.memory.estimate alone (no
# compile; seconds instead of a minute); else XLA's compiled analysis (plan_memory)
PLAN_MEMORY_ENV = "RANKJAX_PLAN_MEMORY"


def compiles_for_target(num_devices: int) -> bool:
  """Planning for a ``--target`` whose step the plan compiles on ``num_devices`` host
  devices (``rankjax.train.plan_memory``): a target is active, the count is at most
  ``plan_memory.MAX_HOST_DEVICES`` and ``RANKJAX_PLAN_MEMORY`` is not "estimate"."""
  from rankjax.train import plan_memory
  return (_TARGET[0] is not None and num_devices <= plan_memory.MAX_HOST_DEVICES
          and os.environ.get(PLAN_MEMORY_ENV, "compiled") != "estimate")


def _measure(num_devices: int):
  """The compiled peak of a config on these devices, or None (the estimate plans)."""
  if on_the_devices(num_devices):
    return _compiled_peak
  if compiles_for_target(num_devices):
    from rankjax.train import plan_memory
    return lambda c: plan_memory.compiled_peak(c, num_devices)
  return None


def resolved(cfg, num_devices: int):
  """``(cfg, note)``: ``lm.remat="auto"`` replaced by the policy ``rankjax train`` will
  choose on these devices (``rankjax.train.memory.resolve_remat``, the same limit
  ``memory.device_limit`` and, on the devices, the same compiled peaks; for a target,
  its memory and its compiled peaks on host devices, :func:`compiles_for_target`), and
  the line saying so (None when nothing was chosen)."""
  from rankjax.train import memory
  limit = (_TARGET[0].hardware.memory_bytes if _TARGET[0] is not None
           else memory.device_limit())
  measure = _measure(num_devices)
  try:
    return memory.resolve_remat(cfg, num_devices, limit, params=_param_count(cfg),
                                measure=measure)
  except ValueError:
    if measure is _compiled_peak:       # on the devices: as rankjax train would fail
      raise
    # a target's compile failed (memory_source says why): the estimate chooses
    return memory.resolve_remat(cfg, num_devices, limit, params=_param_count(cfg))


def memory_estimate(cfg, num_devices: int) -> dict[str, float]:
  """Peak bytes per device of the training step under the remat policy the run will use
  (``resolved``): on the devices themselves (``on_the_devices``) XLA's analysis of the
  compiled step, for a ``--target`` XLA:CPU's analysis of the step compiled on
  ``num_devices`` host devices at the target's mesh (:func:`compiles_for_target`;
  ``total``; ``compiled`` 1.0), elsewhere the library's one estimate
  (``rankjax.train.memory.estimate``; ``compiled`` 0.0). :func:`memory_source` says
  which."""
  from rankjax.train import memory
  run_cfg = resolved(cfg, num_devices)[0]
  est = memory.estimate(run_cfg, num_devices, _param_count(cfg))
  measure = _measure(num_devices)
  peak = measure(run_cfg) if measure is not None else None
  return {**est, "total": peak if peak is not None else est["total"],
          "compiled": float(peak is not None)}


def memory_source(cfg, num_devices: int) -> str:
  """How :func:`memory_estimate` got ``cfg``'s number on ``num_devices`` devices: one
  phrase for the plan."""
  from rankjax.train import plan_memory
  if on_the_devices(num_devices):
    return "compiled: XLA's analysis of the step on these devices"
  if compiles_for_target(num_devices):
    run_cfg = resolved(cfg, num_devices)[0]
    why = plan_memory.failure(run_cfg, num_devices)
    return (plan_memory.how(run_cfg, num_devices) if why is None else
            f"estimated (rankjax.train.memory: {why})")
  if _TARGET[0] is not None:
    return ("estimated (rankjax.train.memory" + (f": {PLAN_MEMORY_ENV}=estimate)"
            if num_devices <= plan_memory.MAX_HOST_DEVICES else
            f": {num_devices} > {plan_memory.MAX_HOST_DEVICES} host devices are not "
            "compiled)"))
  return ("estimated (rankjax.train.memory; on the devices themselves the plan reads "
          "XLA's analysis of the compiled step)")


def checkpoint_bytes(cfg, params: int) -> float:
  """Disk of the kept checkpoints: parameters and AdamW moments in float32 (12 bytes a
  parameter) times ``max_to_keep`` (the diagnostics history is small beside them)."""
  return 12.0 * params * max(cfg.max_to_keep, 1)


def device_memory() -> tuple[str, int, float | None]:
  """(device kind, number of devices of the job, bytes of one device or None when
  unknown; on CPU the host's available memory over its devices); for a
  :func:`planning_for` target its kind, count and memory per device (the spec sheet's,
  ``rankjax.train.mfu.HARDWARE``), never this host's."""
  import jax
  from rankjax.train import memory
  if _TARGET[0] is not None:
    hw = _TARGET[0].hardware
    return hw.device_kind, _TARGET[0].devices, float(hw.memory_bytes)
  local = jax.local_devices()
  limit = memory.device_limit()
  if local[0].platform == "cpu":
    from rankjax.analyze.checkpoints import host_available_bytes
    limit = host_available_bytes() / len(local)
  return local[0].device_kind, jax.device_count(), (float(limit) if limit else None)


def mfu_for(cfg, device_kind: str) -> tuple[float, str]:
  """``(mfu, source)`` of ``cfg``'s device-hours on ``device_kind``: the device check's
  measurement where it recorded one on that kind (:func:`measured_mfu`), else the
  estimate for the config's step family on that kind
  (``rankjax.train.mfu.estimated_mfu``), each labelled."""
  from rankjax.train import mfu as mfu_lib
  measured = measured_mfu(device_kind)
  if measured:
    return measured, (f"measured by the device check on {device_kind} (the lower of its "
                      "paper steps; experiments/benchmarks/device_check.json)")
  return mfu_lib.estimated_mfu(cfg, device_kind)


def measured_mfu(device_kind: str, path: pathlib.Path | None = None) -> float | None:
  """The training MFU the device check measured on ``device_kind``
  (``experiments/benchmarks/device_check.json``: ``{"train_mfu": {kind: mfu}}``, the lower
  of its two paper steps; written by ``device_check.py``), or None when it never ran
  there."""
  import json
  from rankjax.studies import finder
  path = path or finder.CHECKOUT_STUDIES / "benchmarks" / "device_check.json"
  if not path.is_file():
    return None
  return (json.loads(path.read_text()).get("train_mfu") or {}).get(device_kind)


def plan(runs: Mapping[str, Any]) -> dict[str, Any]:
  """Rows (one per run: workdir, updates (to ``stop_at`` for a partial run), tokens,
  parameters, checkpoint GB, peak GB per device and how it was obtained
  (:func:`memory_source`), device-hours at the run's MFU and its label (:func:`mfu_for`),
  the remat policy and, for "auto", the line saying why) and totals, for ``runs``
  ({workdir: cfg}) on this machine's devices or the :func:`planning_for` target.
  Device-hours: the model FLOPs of every update (``Task.flops_per_example``, causal
  attention at half) over the devices' spec peak times the MFU."""
  import time

  from rankjax.train import mfu as mfu_lib
  from rankjax.train import plan_memory
  from rankjax.train.loop import last_step
  t0, compiles0 = time.perf_counter(), plan_memory.COMPILES[0]
  kind, count, memory = device_memory()
  dtype = "bfloat16"
  rows = []
  for path, cfg in runs.items():
    task = _task(cfg)
    est = memory_estimate(cfg, count)
    run_cfg, note = resolved(cfg, count)
    mfu, source = mfu_for(cfg, kind)
    flops = task.flops_per_example(causal=True) * cfg.batch_size * last_step(cfg)
    peak = mfu_lib.spec_peak(kind, dtype if cfg.compute_dtype == "bfloat16" else "float32")
    hours = None if not peak else flops / (peak * mfu) / 3600
    lm = cfg.model.kind == "transformer"
    rows.append({
        "run": path, "updates": last_step(cfg), "done": finished(path, cfg),
        "tokens": cfg.batch_size * cfg.seq_len * last_step(cfg) if lm else None,
        "examples": cfg.batch_size * last_step(cfg),
        "parameters": int(est["parameters"]), "flops": flops,
        "checkpoint_gb": checkpoint_bytes(cfg, int(est["parameters"])) / 1e9,
        "peak_gb_per_device": est["total"] / 1e9, "peak_compiled": bool(est["compiled"]),
        "peak_source": memory_source(cfg, count), "mfu": mfu, "mfu_source": source,
        "device_hours": hours, "mesh": mesh_text(cfg, count),
        "remat": run_cfg.model.remat if lm else None, "remat_note": note,
        "batch_note": _BATCH_NOTES.get(cfg)})
  todo = [r for r in rows if not r["done"]]
  hours = [r["device_hours"] for r in todo]
  from rankjax.train import runs as runs_lib
  peaks = {r["run"]: r["peak_gb_per_device"] * 1e9 for r in rows}
  groups = runs_lib.group(runs) if runs_lib.one_program_pays() else [[p] for p in runs]
  programs = [len(chunk) for g in groups
              for chunk in _fitting(g, runs_per_program(peaks[g[0]], memory))]
  mfus = list(dict.fromkeys((r["mfu"], r["mfu_source"]) for r in rows))
  return {
      "programs": programs,
      "device": kind, "devices": count,
      "target": None if _TARGET[0] is None else _TARGET[0].describe(),
      "device_memory_gb": None if memory is None else memory / 1e9,
      "mfu": mfus[0][0] if len(mfus) == 1 else None,
      "mfu_source": mfus[0][1] if len(mfus) == 1 else None, "mfus": mfus,
      "rows": rows, "to_train": len(todo),
      "device_hours": (sum(hours) if hours and None not in hours else None),
      "checkpoint_gb": sum(r["checkpoint_gb"] for r in rows),
      "seconds": time.perf_counter() - t0,
      "compiles": plan_memory.COMPILES[0] - compiles0}


def mesh_text(cfg, num_devices: int) -> str:
  """The (data, fsdp) mesh ``cfg`` trains on over ``num_devices`` devices
  (``rankjax.train.sharding.make_mesh``: ``mesh_data`` 0 takes the devices ``mesh_fsdp``
  leaves)."""
  fsdp = cfg.mesh_fsdp if 0 < cfg.mesh_fsdp <= num_devices else num_devices
  data = cfg.mesh_data or max(num_devices // max(fsdp, 1), 1)
  return f"data {data} x fsdp {fsdp}"


def plan_text(p: Mapping[str, Any]) -> str:
  """The plan as the lines ``rankjax reproduce`` prints."""
  def num(x, fmt="{:.3g}"):
    return "-" if x is None else fmt.format(x)
  where = (f"for {p['target']}, planned from this machine" if p.get("target") else
           f"on {p['devices']} x {p['device']} ({num(p['device_memory_gb'])} GB each)")
  hours_why = ("" if p["device_hours"] is not None or not p["to_train"] else
               f"; device-hours '-': {p['device']} has no spec peak "
               "(rankjax.train.mfu.SPEC_PEAKS; plan for one with --plan --target KIND:N)")
  mfus = p.get("mfus") or [(p["mfu"], p["mfu_source"])]
  lines = [f"plan: {len(p['rows'])} training runs ({p['to_train']} to train) {where}"
           f"{hours_why}"]
  lines += [f"  MFU {num(m)}: {source}" for m, source in mfus]
  lines.append(f"  {'run':<48} {'updates':>8} {'tokens':>10} {'params':>9} {'ckpt GB':>8} "
               f"{'GB/dev':>7} {'dev-h':>7}")
  for r in p["rows"]:
    name = r["run"] if len(r["run"]) <= 48 else "..." + r["run"][-45:]
    lines.append(f"  {name:<48} {r['updates']:>8} {num(r['tokens'], '{:.3g}'):>10} "
                 f"{num(r['parameters'], '{:.3g}'):>9} {num(r['checkpoint_gb']):>8} "
                 f"{num(r['peak_gb_per_device']):>7} "
                 f"{'done' if r['done'] else num(r['device_hours']):>7}")
    if not r["done"]:
      lines.append(f"    mesh {r['mesh']}" + (f"; MFU {num(r['mfu'])}" if len(mfus) > 1
                                                 else ""))
    for key in ("batch_note", "remat_note"):
      if r.get(key):
        lines.append(f"    {r[key]}")
  if p.get("programs"):
    sizes = p["programs"]
    lines.append(f"  {len(sizes)} program{'s' if len(sizes) > 1 else ''} (runs of one step "
                 f"shape train as one program, one compile each; runs per program: "
                 f"{', '.join(map(str, sizes))})")
  sources = list(dict.fromkeys(r.get("peak_source") for r in p["rows"] if r.get("peak_source")))
  for source in sources:
    n = sum(r.get("peak_source") == source for r in p["rows"])
    lines.append(f"  GB/dev of {n} run{'s' if n > 1 else ''}: {source}")
  if any(r.get("peak_compiled") for r in p["rows"]) and p.get("target"):
    lines.append(f"    (CPU to target: uncorrected; no device measurement of these steps "
                 f"is recorded, and XLA:CPU computes bf16 matmuls in float32 and fuses "
                 f"less: read it as the upper side; {p.get('compiles', 0)} steps compiled "
                 f"for this plan, {num(p.get('seconds'), '{:.0f}')} s; "
                 f"rankjax.train.plan_memory; {PLAN_MEMORY_ENV}=estimate skips them)")
  wall = ("" if p["device_hours"] is None else
          f" ({p['device_hours'] / p['devices']:.3g} hours on {p['devices']} device"
          f"{'s' if p['devices'] > 1 else ''})")
  lines.append(f"  total: {num(p['device_hours'])} device-hours to train{wall}, "
               f"{num(p['checkpoint_gb'])} GB of checkpoints")
  return "\n".join(lines)


def refusals(runs: Mapping[str, Any]) -> list[str]:
  """One line per reason a run cannot start (duplicates once): its data set or
  tokenizer is not there (``rankjax.data.dataset_info`` says which command prepares
  it), or its estimated peak memory exceeds ``MEMORY_SHARE`` of a device."""
  from rankjax.data import pipeline
  from rankjax.train import tasks
  kind, count, memory = device_memory()
  out: list[str] = []
  for path, cfg in runs.items():
    task = _task(cfg)
    try:
      pipeline.dataset_info(task.data_kind, **tasks.data_kwargs(cfg, task))
    except (OSError, ValueError) as e:   # named, and the other checks still run
      line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      out.append(line)
    hosts = _TARGET[0].hosts if _TARGET[0] is not None else None
    out += [f"{os.path.basename(path)}: {line}"
            for line in device_refusals(cfg, count, memory, kind, finished(path, cfg),
                                        processes=hosts)]
  return list(dict.fromkeys(out))


def device_refusals(cfg, num_devices: int, memory: float | None, kind: str = "device",
                    done: bool = False, processes: int | None = None) -> list[str]:
  """Why ``cfg`` cannot train on ``num_devices`` devices of ``memory`` bytes each (over
  ``processes`` hosts; this job's when None), each with its fix: a batch no
  ``grad_accum`` splits over the devices (:func:`fit_batch`), an estimated peak above
  ``MEMORY_SHARE`` of a device. Pure arithmetic: the plan for any device count."""
  import jax
  hosts = jax.process_count() if processes is None else processes
  out = []
  fitted, _ = fit_batch(cfg, num_devices)
  if (fitted.batch_size // fitted.grad_accum) % num_devices:
    divisors = [n for n in range(1, cfg.batch_size + 1) if cfg.batch_size % n == 0]
    below = max(n for n in divisors if n <= num_devices)
    out.append(f"batch_size={cfg.batch_size} splits over no {num_devices} devices at any "
               f"grad_accum: run on {below} devices (a divisor of the batch) or "
               f"--set batch_size=<a multiple of {num_devices}>")
  if cfg.batch_size % hosts:
    out.append(f"batch_size={cfg.batch_size} is not divisible by the {hosts} hosts: "
               "run on a host count dividing it")
  est = memory_estimate(fitted, num_devices)
  if memory and not done and est["total"] > MEMORY_SHARE * memory:
    fsdp = num_devices if cfg.mesh_fsdp < num_devices else None
    lm = cfg.model.kind == "transformer"
    full = lm and resolved(fitted, num_devices)[0].model.remat == "full"
    fix = (f"--set mesh_fsdp={fsdp} (parameters and optimizer state sharded over {fsdp} "
           "devices), " if fsdp and fsdp > 1 else "") + (
               "--set grad_accum=<a larger divisor of the batch> (remat is full already)"
               if full else "--set model.remat=full or a larger grad_accum")
    what = ("an estimated" if not est["compiled"] else "a compiled" if
            not compiles_for_target(num_devices) else "XLA:CPU's compiled (uncorrected)")
    out.append(f"{what} {_gb(est['total'])} GB per device exceeds "
               f"{MEMORY_SHARE:.0%} of the {_gb(memory)} GB of a {kind} ({num_devices} "
               f"devices): {fix}")
  return out


def _gb(x: float) -> str:
  """Bytes as GB: one decimal, three digits below 0.1 GB."""
  return f"{x / 1e9:.1f}" if x >= 1e8 else f"{x / 1e9:.3g}"
