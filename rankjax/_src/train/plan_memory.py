"""XLA's compiled memory of a run's training step at a target's sharding, from any machine.

``rankjax reproduce --plan --target KIND:N`` plans for N devices that are not here. The
step's peak bytes per device come from XLA itself: the run's training step (and its
diagnostics variant when the run has diagnostics) is built with the mesh the target
would use (``rankjax._src.train.loop.build``) and compiled for N *host* devices, and
``compiled.memory_analysis()`` gives arguments + outputs + temporaries - aliased per
device (``loop.compiled_memory``). JAX fixes the device count when it starts, so the
compiles run in a worker process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (``python -m
rankjax._src.train.plan_memory``; one worker per device count, kept for the plan's every
request). Nothing is allocated: a compile needs the shapes only, so N host devices
"hold" any model.

Depth. The layers are one ``nn.scan``: a rolled scan (``scan_unroll`` 1, the shipped
configs) compiles in the same time at 48 layers as at 2 (measured: 13 s each for the
48-layer d=512 step on 8 host devices), so such a step is compiled at its full depth.
Where the scan is unrolled (``scan_unroll`` > ``UNROLL_SHRINK``: compile time grows with
the depth) the step is compiled at ``SHRUNK_DEPTHS`` layers and each part scaled to the
real depth by the per-layer difference, ``m(L) = m(d2) + (L - d2) (m(d2) - m(d1)) /
(d2 - d1)``. XLA's buffer assignment is not exactly linear in depth: on the 48-layer
d=512 step, depths 4 and 8 scaled to 48 came within 3% of the direct compile (plain
and diagnostics steps; depths 2 and 4: 7% and 19%), which is why the depths are 4 and
8; ``tests/train/test_plan_memory.py`` bounds it on a small model.

Device count. Compiling for N host devices costs about the same for any N (measured on
2 busy cores: 20 s for the 48-layer step at 64 and 25 s at 256); up to
``MAX_HOST_DEVICES`` the step is compiled at the target's count. Beyond it the plan
keeps the estimate (``rankjax._src.train.memory.estimate``), labelled so.

CPU to target. XLA:CPU's buffer assignment and fusion are not XLA:GPU's or TPU's: it
computes bfloat16 matmuls in float32 and fuses less, so its temporaries can exceed a
GPU's; the arguments (the sharded state and the batch) are the same on every backend.
No device measurement of the same step is recorded (the device check never ran on a
device), so the numbers are **uncorrected** CPU compiles: read them as an upper side
of the target's peak, and the refusals compare them, uncorrected, with the target's
memory (``rankjax._src.train.mfu.HARDWARE``), never this host's.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

MAX_HOST_DEVICES = 256     # the largest N compiled directly (measured: 25 s at 256)
UNROLL_SHRINK = 4          # a layer scan unrolled more than this compiles shrunk
SHRUNK_DEPTHS = (4, 8)     # the depths a shrunk step is compiled at
PARTS = ("arguments", "outputs", "temporaries", "aliased", "peak")
_REPLY = "plan_memory: "   # the worker's reply lines start with this

# (step shape, devices) -> compiled_memory's dict (or None), for this process
_CACHE: dict[Any, Any] = {}
# (program key, devices) -> why its compile failed (the plan then keeps the estimate)
_FAILED: dict[Any, str] = {}
# devices -> the running worker
_WORKERS: dict[int, "_Worker"] = {}
COMPILES = [0]             # programs (plain, diagnostics steps) the workers compiled


def depths(cfg) -> tuple[int, int] | None:
  """The two depths ``cfg``'s step compiles at (``SHRUNK_DEPTHS``), or None: its full
  depth (a rolled layer scan, an MLP, a model no deeper than the larger of them)."""
  lm = cfg.model
  if lm.kind != "transformer" or lm.kernels.scan_unroll <= UNROLL_SHRINK:
    return None
  return None if lm.num_layers <= SHRUNK_DEPTHS[1] else SHRUNK_DEPTHS


def how(cfg, devices: int) -> str:
  """How the plan's memory number of ``cfg`` on ``devices`` devices was obtained."""
  if devices > MAX_HOST_DEVICES:
    return (f"estimated (rankjax._src.train.memory: {devices} > {MAX_HOST_DEVICES} host "
            "devices are not compiled)")
  d = depths(cfg)
  if cfg.model.kind != "transformer":
    depth = "at its full depth"
  elif d is None:
    depth = f"at its full depth {cfg.model.num_layers}"
  else:
    depth = (f"at depths {d[0]} and {d[1]}, the per-layer difference scaled to "
             f"{cfg.model.num_layers} layers")
  hosts = f"{devices} host device{'s' if devices > 1 else ''}"
  return (f"compiled by XLA:CPU on {hosts} {depth} at the target's mesh, uncorrected "
          "for the target's compiler")


def compiled_memory(cfg, devices: int) -> dict[str, dict[str, float]] | None:
  """``loop.compiled_memory`` of ``cfg`` on ``devices`` host devices (a worker process),
  its depth shrunk and scaled per layer where :func:`depths` says; once per step shape
  and device count. None where XLA gives no analysis."""
  key = (program_key(cfg), devices)
  if key not in _CACHE:
    d = depths(cfg)
    try:
      if d is None:
        _CACHE[key] = _worker(devices).ask(cfg)
      else:
        small = [_worker(devices).ask(_with_depth(cfg, n)) for n in d]
        _CACHE[key] = None if None in small else extrapolate(
            small[0], small[1], d, cfg.model.num_layers)
    except RuntimeError as e:         # the plan keeps the estimate and says why
      _CACHE[key], _FAILED[key] = None, str(e)
  return _CACHE[key]


def failure(cfg, devices: int) -> str | None:
  """Why ``cfg``'s step could not be compiled on ``devices`` host devices, or None."""
  return _FAILED.get((program_key(cfg), devices))


def program_key(cfg):
  """What ``cfg``'s compiled steps depend on: its step shape (``config.step_shape``: the
  per-run scalars dropped) with the fields ``loop.build`` does not read (``build=False``:
  logging, checkpointing, evaluation, stopping) at their defaults and ``diag_every`` as
  0 or 1 (``loop.build_for_run``'s key): configs with equal keys compile to the same
  programs, so the plan compiles once for all of them."""
  from rankjax._src import config as config_lib
  from rankjax._src.config import TrainConfig
  defaults = TrainConfig()
  not_built = config_lib.fields_with(TrainConfig, "build", False)
  return config_lib.step_shape(dataclasses.replace(
      cfg, diag_every=min(cfg.diag_every, 1),
      **{f: getattr(defaults, f) for f in not_built}))


def compiled_peak(cfg, devices: int) -> float | None:
  """The larger peak of the plain and the diagnostics step (:func:`compiled_memory`)."""
  m = compiled_memory(cfg, devices)
  return None if m is None else max(p["peak"] for p in m.values())


def extrapolate(small: dict, large: dict, at: tuple[int, int], layers: int) -> dict:
  """Each part of each step variant scaled from depths ``at`` to ``layers``:
  ``m(d2) + (layers - d2) (m(d2) - m(d1)) / (d2 - d1)``."""
  d1, d2 = at
  return {name: {k: large[name][k] + (layers - d2) * (large[name][k] - small[name][k])
                 / (d2 - d1) for k in PARTS} for name in large}


def _with_depth(cfg, layers: int):
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_layers=layers))


class _Worker:
  """``python -m rankjax._src.train.plan_memory`` on ``devices`` host devices: one config a
  line in, one reply a line out."""

  def __init__(self, devices: int):
    flags = " ".join(filter(None, [os.environ.get("XLA_FLAGS"),
                                   f"--xla_force_host_platform_device_count={devices}"]))
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    import jax
    if jax.config.jax_compilation_cache_dir:       # the plan's persistent cache, shared
      env["JAX_COMPILATION_CACHE_DIR"] = str(jax.config.jax_compilation_cache_dir)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    self.devices = devices
    self.stderr = tempfile.TemporaryFile(mode="w+")     # a pipe left unread could block
    self.proc = subprocess.Popen([sys.executable, "-m", "rankjax._src.train.plan_memory"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self.stderr, text=True, env=env)

  def ask(self, cfg):
    from rankjax._src import config as config_lib
    try:
      self.proc.stdin.write(json.dumps(config_lib.to_json(cfg)) + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      pass                             # the worker has stopped: said below
    for line in self.proc.stdout:
      if line.startswith(_REPLY):
        reply = json.loads(line[len(_REPLY):])
        if "error" in reply:
          raise RuntimeError(f"compiling the step on {self.devices} host devices: "
                             f"{reply['error']}")
        COMPILES[0] += len(reply["memory"] or {})
        return reply["memory"]
    self.stderr.seek(0)
    err = self.stderr.read()[-2000:]
    raise RuntimeError(f"the plan's compile worker on {self.devices} host devices "
                       f"stopped: {err.strip().splitlines()[-1] if err.strip() else ''}")

  def close(self):
    if self.proc.poll() is None:
      self.proc.stdin.close()
      try:
        self.proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self.proc.kill()


def _worker(devices: int) -> _Worker:
  if devices not in _WORKERS or _WORKERS[devices].proc.poll() is not None:
    _WORKERS[devices] = _Worker(devices)
  return _WORKERS[devices]


@atexit.register
def close_workers() -> None:
  """Ends this process's workers (each finishes its compile first)."""
  while _WORKERS:
    _WORKERS.popitem()[1].close()


def main() -> None:
  """The worker: a JSON config text per stdin line, a reply line per config."""
  import jax
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if cache:
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  from rankjax._src import config as config_lib
  from rankjax._src.config import TrainConfig
  from rankjax._src.train import loop
  for line in sys.stdin:
    try:
      cfg = config_lib.from_json(TrainConfig, json.loads(line))
      reply = {"memory": loop.compiled_memory(cfg)}
    except Exception as e:  # noqa: BLE001 (one line back to the plan)
      reply = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
    print(_REPLY + json.dumps(reply), flush=True)


if __name__ == "__main__":
  main()
