"""A study's training runs: ``rankjax train`` runs under the study's output folder.

A training experiment declares, per scale, the runs it reads
(``Experiment.runs(scale) -> {name: TrainConfig}``); the runner trains them all before
any analysis, in every process of a multi-host job (``rankjax._src.train.loop.train``, the
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

Before anything trains, ``rankjax._src.train.plan`` says what the runs cost (``rankjax
reproduce --plan``, also for a ``--target`` that is not here) and why any cannot start.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from typing import Any, Mapping, Sequence

TINY_STEPS = 24          # updates of a tiny run
TINY_WIDTH = 32          # d_model (LM) / width (MLP) of a tiny run
TINY_TOKENS = 32         # sequence length of a tiny run
TINY_DATA_DIR = "RANKJAX_TINY_DATA_DIR"   # env: tiny runs read the paper's set from here


def load(config: str | pathlib.Path, overrides: tuple[str, ...] | list[str] = ()):
  """A TrainConfig from a JSON file with ``key=value`` overrides."""
  from rankjax._src import config as config_lib
  from rankjax._src.config import TrainConfig
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
        kernels=dataclasses.replace(lm.kernels, loss_chunk=min(lm.kernels.loss_chunk, 64)))
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
  from rankjax._src import storage
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
  (``rankjax._src.train.plan.fit_batch``: the global batch kept; the plan prints the change). The devices
  are the ``plan.planning_for`` target's where one is active."""
  import math

  from rankjax._src import config as config_lib
  from rankjax._src.train import plan as plan_lib
  count = plan_lib.device_count()
  if scale == "tiny":
    cfg = tiny(cfg, os.environ.get(TINY_DATA_DIR) or None)
    cfg = dataclasses.replace(cfg, mesh_fsdp=math.gcd(count, cfg.batch_size))
  if _USER_SETS:
    cfg = config_lib.override(cfg, _USER_SETS, "rankjax reproduce --set")
    _SETS_APPLIED[0] += 1
  return plan_lib.fitted(cfg, count)



def workdir(folder: str | pathlib.Path, name: str) -> str:
  """Where run ``name`` of an experiment writing into ``folder`` lives."""
  return os.path.join(str(folder), "runs", name)



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
  from rankjax._src.train.run_reader import finished
  if finished(path, cfg):
    return path
  from rankjax._src.train.hooks import RunStatus
  from rankjax._src.train.loop import train as train_loop
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

  Unless ``RANKJAX_ONE_PROGRAM=0`` (``rankjax._src.train.runs.one_program_pays``), runs of
  one step shape (``rankjax._src.train.runs.group``: configs that differ only in per-run
  fields, ``config.per_run_paths``: the seed, the optimizer's scalar hyperparameters and
  the model's per-run scalars such as ``model.beta``) train as one program
  (``rankjax._src.train.runs.train_runs``): the group is formed over ``groups_of`` (the
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
  from rankjax._src.train import plan as plan_lib
  from rankjax._src.train import runs as runs_lib
  from rankjax._src.train.hooks import RunStatus
  from rankjax._src.train.run_reader import finished
  if cache_dir is not None and runs and not jax.config.jax_compilation_cache_dir:
    from rankjax._src.train.loop import enable_compilation_cache
    enable_compilation_cache(str(cache_dir))
  every = {**(groups_of or {}), **runs}
  one_program = runs_lib.one_program_pays()
  groups = ([chunk for names in runs_lib.group(every)
             for chunk in plan_lib.fitting(names, plan_lib.program_size(every[names[0]]))]
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


