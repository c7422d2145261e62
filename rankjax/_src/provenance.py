"""Where and with what a reported number was computed (the results files' provenance).

``provenance()`` is what every committed results file carries: the commit and whether
the checkout had uncommitted changes, the jax / jaxlib / flax / numpy / Python
versions, the backend, device kind and count, the CPU model, the XLA flags, the date
and the wall time. ``rankjax._src.studies.results`` (the studies) and ``rankjax tour`` use it.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import pathlib
import platform
import subprocess
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
# files rendered from results (a checkout that differs only in these is not dirty)
RENDERED = ("/results/", "EXPECTED.md", "README.md", "docs/tour_summary.json")


def _git(*args: str) -> str | None:
  try:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError):
    return None


def last_commit(path: str | pathlib.Path, at: str = "HEAD") -> str | None:
  """The last commit at or before ``at`` that changed ``path`` (None outside git, or
  when no commit did)."""
  path = pathlib.Path(path).resolve()
  try:
    out = subprocess.run(["git", "-C", str(path.parent), "log", "-1", "--format=%H", at,
                          "--", path.name], capture_output=True, text=True, check=True,
                         timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return out or None


def cpu_name() -> str:
  """The CPU's model name (from /proc/cpuinfo where there is one)."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def cpu_features() -> str | None:
  """A short hash of the host CPU's feature flags (/proc/cpuinfo), which XLA's CPU
  compiler targets by default: the same jax/jaxlib, XLA flags and features give the
  same bits (None where the flags cannot be read)."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith(("flags", "Features")):
        flags = " ".join(sorted(line.split(":", 1)[1].split()))
        return hashlib.sha256(flags.encode()).hexdigest()[:16]
  except OSError:
    pass
  return None


BITS_KEYS = ("jax", "jaxlib", "flax", "optax", "numpy", "backend", "device_kind",
             "device_count", "xla_flags", "cpu_features")   # what decides a rerun's bits


def same_bits(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, str]:
  """Whether two provenances decide the same bits (:data:`BITS_KEYS` all recorded and
  equal), and why not in a line."""
  missing = [k for k in BITS_KEYS if a.get(k) is None and k != "xla_flags"]
  if missing:
    return False, f"the committed run recorded no {', '.join(missing)}"
  differ = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in BITS_KEYS if a.get(k) != b.get(k)]
  if differ:
    return False, "; ".join(differ)
  return True, "same " + ", ".join(BITS_KEYS)


def provenance(wall_s: float | None = None) -> dict[str, Any]:
  """Where and with what a result was computed. ``dirty``: the checkout had changes
  other than the files rendered from results (``RENDERED``): uncommitted code produced
  the numbers;
  None outside a git checkout."""
  import flax
  import jax
  import jaxlib
  import numpy
  import optax
  commit = _git("rev-parse", "HEAD")
  status = _git("status", "--porcelain", "--untracked-files=no")
  dirty = None if status is None else any(
      not any(r in line for r in RENDERED) for line in status.splitlines())
  dev = jax.devices()[0]
  return {"commit": commit.strip() if commit else None, "dirty": dirty,
          "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
          "numpy": numpy.__version__, "optax": optax.__version__, "python": platform.python_version(),
          "backend": jax.default_backend(), "device_kind": dev.device_kind,
          "device_count": jax.device_count(), "cpu": cpu_name(),
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "cpu_features": cpu_features(),
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "wall_s": None if wall_s is None else round(wall_s, 1)}
