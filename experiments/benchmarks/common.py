"""What the benchmark scripts share: the machine's name, a matmul peak, RESULTS.md sections."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

from rankjax._src.provenance import cpu_name  # noqa: F401 (the benchmarks' machine line)

RESULTS = pathlib.Path(__file__).with_name("RESULTS.md")


def machine_name() -> str:
  """One line naming the devices this process computes on."""
  if jax.default_backend() == "cpu":
    return f"{cpu_name()}, {os.cpu_count()} cores"
  return f"{jax.device_count()} x {jax.devices()[0].device_kind}"


def load_average() -> float:
  return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def matmul_peak(dtype, n: int, reps: int = 5, precision=None) -> float:
  """FLOP/s of the best of ``reps`` (n x n) @ (n x n) products at ``precision``."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(lambda a, b: jnp.matmul(a, b, precision=precision))
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best


NOTES_MARK = "<!-- notes: kept when the script rewrites this section -->"


def write_section(section: str, text: str, path: pathlib.Path | str = RESULTS) -> None:
  """Replaces the ``section`` heading's part of ``path`` by ``text`` (or appends it).
  Hand-written notes below a ``NOTES_MARK`` line in the old section are kept after the
  new text."""
  path = pathlib.Path(path)
  old = path.read_text() if path.exists() else "# Benchmark results\n"
  pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
  text = text.rstrip("\n") + "\n\n"
  found = pattern.search(old)
  if found and NOTES_MARK in found.group(0):
    text += found.group(0)[found.group(0).index(NOTES_MARK):].rstrip("\n") + "\n\n"
  new = pattern.sub(lambda _: text, old) if found else old.rstrip("\n") + "\n\n" + text
  path.write_text(new.rstrip("\n") + "\n")


ROOT = pathlib.Path(__file__).resolve().parents[2]


def git_commit(ref: str) -> str:
  return subprocess.run(["git", "-C", str(ROOT), "rev-parse", ref], check=True,
                        capture_output=True, text=True).stdout.strip()


# put before every child: ``P``, the package of the side's implementation (rankjax._src
# since the public face, rankjax before it), so one child reads either layout
IMPL_PRELUDE = '''import importlib
try:
  P = importlib.import_module("rankjax._src").__name__
except ImportError:
  P = "rankjax"
'''


def before_after(ref: str, child: str, argv: list[str], rounds: int) -> dict[str, list[dict]]:
  """Runs the Python source ``child`` (with ``argv``) at commit ``ref`` (a temporary git
  worktree) and in this tree, each run in its own process, the two sides alternating
  for ``rounds`` rounds (so a change of the machine's load hits both alike), which side
  goes first alternating too: the same code measured on both sides came out about 9%
  slower on the side always run second. The child
  prints one JSON object on its last line (it runs after :data:`IMPL_PRELUDE`, which
  names the side's implementation package ``P``); returns ``{"before": [...], "after": [...]}``,
  one object per round."""
  with tempfile.TemporaryDirectory() as tmp:
    old = pathlib.Path(tmp) / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old),
                    git_commit(ref)], check=True)
    try:
      sides = {"before": old, "after": ROOT}
      out = {name: [] for name in sides}
      for r in range(rounds):
        order = list(sides.items())
        for name, path in (order if r % 2 == 0 else order[::-1]):   # ABBA: no side always second
          env = {**os.environ, "PYTHONPATH": str(path)}
          proc = subprocess.run([sys.executable, "-c", IMPL_PRELUDE + child, *argv], env=env,
                                capture_output=True, text=True, cwd=str(path))
          if proc.returncode:
            raise RuntimeError(f"the {name} side failed:\n{proc.stderr[-3000:]}")
          out[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
      subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                     check=False)
  return out
