"""The training plan, before anything trains: what each run of a study (or any
``{workdir: TrainConfig}``) costs on this job's devices or on hardware that is not here.

:func:`plan` gives each run's updates, tokens, parameters, checkpoint disk, peak memory
per device (XLA's analysis of the compiled step on the devices themselves; for a
``--plan --target`` XLA:CPU's of the step compiled at the target's mesh on host devices,
``rankjax._src.train.plan_memory``; else the estimate, ``rankjax._src.train.memory``, each
labelled) and device-hours at a labelled MFU (``rankjax._src.train.mfu.mfu_for``);
:func:`refusals` the one-line reasons a run cannot start (a data set not prepared, a
tokenizer file missing, a config that the devices cannot hold); :func:`fit_batch` the
batch split fitted to a device count; :func:`program_size` how many runs of one step
shape one program holds. :func:`planning_for` points all of them at a ``--target``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any, Mapping

# the share of a device's memory a run may plan to use (the rest: XLA's workspace,
# fragmentation, the diagnostics step)
MEMORY_SHARE = 0.9
# {fitted config: the line saying how :func:`fit_batch` changed it} (the plan prints it)
_BATCH_NOTES: dict[Any, str] = {}


# ``rankjax reproduce --plan --target KIND:N``: the hardware the plan is for while
# :func:`planning_for` is active (None: this job's own devices)
_TARGET: list[Any] = [None]


@contextlib.contextmanager
def planning_for(target):
  """While active, the plan, the batch fit and the refusals are for ``target``
  (``rankjax._src.train.mfu.Target``: N devices of a kind, from any machine) instead of this
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


def fitted(cfg, num_devices: int):
  """:func:`fit_batch`'s config, its note kept for the plan (``rankjax reproduce``'s
  runs pass here: ``rankjax._src.studies.training.at_scale``)."""
  out, note = fit_batch(cfg, num_devices)
  if note:
    _BATCH_NOTES[out] = note
  return out


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


def program_size(cfg) -> int:
  """How many runs of ``cfg``'s step shape one program holds: all of them where the
  devices report no memory limit (a CPU: the host's memory); on an accelerator as many
  as fit ``MEMORY_SHARE`` of a device at the planned peak of one run per device
  (``memory_estimate``; R runs of one program hold R runs' state and activations), at
  least one (a paper-scale run fills its devices alone)."""
  import jax
  from rankjax._src.train import memory
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


def fitting(names: list[str], size: int) -> list[list[str]]:
  """``names`` cut into programs of at most ``size`` runs, in order (the cut depends on
  the device memory only, so a run's program is the same on the same devices)."""
  return [names[i:i + size] for i in range(0, len(names), size)]


@functools.lru_cache(maxsize=None)
def _task(cfg):
  """The run's Task (cached: the plan, the memory estimate and the refusals all ask)."""
  from rankjax._src.train import tasks
  return tasks.make_task(cfg)


@functools.lru_cache(maxsize=None)
def _param_count(cfg) -> int:
  from rankjax._src.train import memory
  return memory.param_count(cfg)


def on_the_devices(num_devices: int) -> bool:
  """Planning for this job's own devices, and they report a memory limit (an
  accelerator): then the plan compiles the step and reads XLA's analysis, as
  ``rankjax train`` does."""
  import jax
  from rankjax._src.train import memory
  return (_TARGET[0] is None and memory.device_limit() is not None
          and num_devices == jax.device_count())


@functools.lru_cache(maxsize=None)
def _compiled_peak(cfg):
  """``loop.compiled_peak_bytes``, once per config (the plan, the remat choice and the
  refusals all ask)."""
  from rankjax._src.train import loop
  return loop.compiled_peak_bytes(cfg)


# env: "estimate" plans a --target's memory by rankjax._src.train.memory.estimate alone (no
# compile; seconds instead of a minute); else XLA's compiled analysis (plan_memory)
PLAN_MEMORY_ENV = "RANKJAX_PLAN_MEMORY"


def compiles_for_target(num_devices: int) -> bool:
  """Planning for a ``--target`` whose step the plan compiles on ``num_devices`` host
  devices (``rankjax._src.train.plan_memory``): a target is active, the count is at most
  ``plan_memory.MAX_HOST_DEVICES`` and ``RANKJAX_PLAN_MEMORY`` is not "estimate"."""
  from rankjax._src.train import plan_memory
  return (_TARGET[0] is not None and num_devices <= plan_memory.MAX_HOST_DEVICES
          and os.environ.get(PLAN_MEMORY_ENV, "compiled") != "estimate")


def _measure(num_devices: int):
  """The compiled peak of a config on these devices, or None (the estimate plans)."""
  if on_the_devices(num_devices):
    return _compiled_peak
  if compiles_for_target(num_devices):
    from rankjax._src.train import plan_memory
    return lambda c: plan_memory.compiled_peak(c, num_devices)
  return None


def resolved(cfg, num_devices: int):
  """``(cfg, note)``: ``lm.kernels.remat="auto"`` replaced by the policy ``rankjax train`` will
  choose on these devices (``rankjax._src.train.memory.resolve_remat``, the same limit
  ``memory.device_limit`` and, on the devices, the same compiled peaks; for a target,
  its memory and its compiled peaks on host devices, :func:`compiles_for_target`), and
  the line saying so (None when nothing was chosen)."""
  from rankjax._src.train import memory
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
  (``rankjax._src.train.memory.estimate``; ``compiled`` 0.0). :func:`memory_source` says
  which."""
  from rankjax._src.train import memory
  run_cfg = resolved(cfg, num_devices)[0]
  est = memory.estimate(run_cfg, num_devices, _param_count(cfg))
  measure = _measure(num_devices)
  peak = measure(run_cfg) if measure is not None else None
  return {**est, "total": peak if peak is not None else est["total"],
          "compiled": float(peak is not None)}


def memory_source(cfg, num_devices: int) -> str:
  """How :func:`memory_estimate` got ``cfg``'s number on ``num_devices`` devices: one
  phrase for the plan."""
  from rankjax._src.train import plan_memory
  if on_the_devices(num_devices):
    return "compiled: XLA's analysis of the step on these devices"
  if compiles_for_target(num_devices):
    run_cfg = resolved(cfg, num_devices)[0]
    why = plan_memory.failure(run_cfg, num_devices)
    return (plan_memory.how(run_cfg, num_devices) if why is None else
            f"estimated (rankjax._src.train.memory: {why})")
  if _TARGET[0] is not None:
    return ("estimated (rankjax._src.train.memory" + (f": {PLAN_MEMORY_ENV}=estimate)"
            if num_devices <= plan_memory.MAX_HOST_DEVICES else
            f": {num_devices} > {plan_memory.MAX_HOST_DEVICES} host devices are not "
            "compiled)"))
  return ("estimated (rankjax._src.train.memory; on the devices themselves the plan reads "
          "XLA's analysis of the compiled step)")


def checkpoint_bytes(cfg, params: int) -> float:
  """Disk of the kept checkpoints: parameters and AdamW moments in float32 (12 bytes a
  parameter) times ``max_to_keep`` (the diagnostics history is small beside them)."""
  return 12.0 * params * max(cfg.max_to_keep, 1)


def device_memory() -> tuple[str, int, float | None]:
  """(device kind, number of devices of the job, bytes of one device or None when
  unknown; on CPU the host's available memory over its devices); for a
  :func:`planning_for` target its kind, count and memory per device (the spec sheet's,
  ``rankjax._src.train.mfu.HARDWARE``), never this host's."""
  import jax
  from rankjax._src.train import memory
  if _TARGET[0] is not None:
    hw = _TARGET[0].hardware
    return hw.device_kind, _TARGET[0].devices, float(hw.memory_bytes)
  local = jax.local_devices()
  limit = memory.device_limit()
  if local[0].platform == "cpu":
    from rankjax._src.analyze.checkpoints import host_available_bytes
    limit = host_available_bytes() / len(local)
  return local[0].device_kind, jax.device_count(), (float(limit) if limit else None)

def plan(runs: Mapping[str, Any]) -> dict[str, Any]:
  """Rows (one per run: workdir, updates (to ``stop_at`` for a partial run), tokens,
  parameters, checkpoint GB, peak GB per device and how it was obtained
  (:func:`memory_source`), device-hours at the run's MFU and its label (:func:`mfu_for`),
  the remat policy and, for "auto", the line saying why) and totals, for ``runs``
  ({workdir: cfg}) on this machine's devices or the :func:`planning_for` target.
  Device-hours: the model FLOPs of every update (``Task.flops_per_example``, causal
  attention at half) over the devices' spec peak times the MFU."""
  from rankjax._src.train import run_reader
  import time

  from rankjax._src.train import mfu as mfu_lib
  from rankjax._src.train import plan_memory
  from rankjax._src.train.loop import last_step
  t0, compiles0 = time.perf_counter(), plan_memory.COMPILES[0]
  kind, count, memory = device_memory()
  dtype = "bfloat16"
  rows = []
  for path, cfg in runs.items():
    task = _task(cfg)
    est = memory_estimate(cfg, count)
    run_cfg, note = resolved(cfg, count)
    mfu, source = mfu_lib.mfu_for(cfg, kind)
    flops = task.flops_per_example(causal=True) * cfg.batch_size * last_step(cfg)
    peak = mfu_lib.spec_peak(kind, dtype if cfg.compute_dtype == "bfloat16" else "float32")
    hours = None if not peak else flops / (peak * mfu) / 3600
    lm = cfg.model.kind == "transformer"
    rows.append({
        "run": path, "updates": last_step(cfg), "done": run_reader.finished(path, cfg),
        "tokens": cfg.batch_size * cfg.seq_len * last_step(cfg) if lm else None,
        "examples": cfg.batch_size * last_step(cfg),
        "parameters": int(est["parameters"]), "flops": flops,
        "checkpoint_gb": checkpoint_bytes(cfg, int(est["parameters"])) / 1e9,
        "peak_gb_per_device": est["total"] / 1e9, "peak_compiled": bool(est["compiled"]),
        "peak_source": memory_source(cfg, count), "mfu": mfu, "mfu_source": source,
        "device_hours": hours, "mesh": mesh_text(cfg, count),
        "remat": run_cfg.model.kernels.remat if lm else None, "remat_note": note,
        "batch_note": _BATCH_NOTES.get(cfg)})
  todo = [r for r in rows if not r["done"]]
  hours = [r["device_hours"] for r in todo]
  from rankjax._src.train import runs as runs_lib
  peaks = {r["run"]: r["peak_gb_per_device"] * 1e9 for r in rows}
  groups = runs_lib.group(runs) if runs_lib.one_program_pays() else [[p] for p in runs]
  programs = [len(chunk) for g in groups
              for chunk in fitting(g, runs_per_program(peaks[g[0]], memory))]
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
  (``rankjax._src.train.sharding.make_mesh``: ``mesh_data`` 0 takes the devices ``mesh_fsdp``
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
               "(rankjax._src.train.mfu.SPEC_PEAKS; plan for one with --plan --target KIND:N)")
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
                 f"rankjax._src.train.plan_memory; {PLAN_MEMORY_ENV}=estimate skips them)")
  wall = ("" if p["device_hours"] is None else
          f" ({p['device_hours'] / p['devices']:.3g} hours on {p['devices']} device"
          f"{'s' if p['devices'] > 1 else ''})")
  lines.append(f"  total: {num(p['device_hours'])} device-hours to train{wall}, "
               f"{num(p['checkpoint_gb'])} GB of checkpoints")
  return "\n".join(lines)


def refusals(runs: Mapping[str, Any]) -> list[str]:
  """One line per reason a run cannot start (duplicates once): its data set or
  tokenizer is not there (``rankjax._src.data.dataset_info`` says which command prepares
  it), or its estimated peak memory exceeds ``MEMORY_SHARE`` of a device."""
  from rankjax._src.train import run_reader
  from rankjax._src.data import pipeline
  from rankjax._src.train import tasks
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
            for line in device_refusals(cfg, count, memory, kind, run_reader.finished(path, cfg),
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
    full = lm and resolved(fitted, num_devices)[0].model.kernels.remat == "full"
    fix = (f"--set mesh_fsdp={fsdp} (parameters and optimizer state sharded over {fsdp} "
           "devices), " if fsdp and fsdp > 1 else "") + (
               "--set grad_accum=<a larger divisor of the batch> (remat is full already)"
               if full else "--set model.kernels.remat=full or a larger grad_accum")
    what = ("an estimated" if not est["compiled"] else "a compiled" if
            not compiles_for_target(num_devices) else "XLA:CPU's compiled (uncorrected)")
    out.append(f"{what} {_gb(est['total'])} GB per device exceeds "
               f"{MEMORY_SHARE:.0%} of the {_gb(memory)} GB of a {kind} ({num_devices} "
               f"devices): {fix}")
  return out


def _gb(x: float) -> str:
  """Bytes as GB: one decimal, three digits below 0.1 GB."""
  return f"{x / 1e9:.1f}" if x >= 1e8 else f"{x / 1e9:.3g}"
