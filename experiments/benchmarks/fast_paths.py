"""Each CPU fast path of ``rankjax._src.fast_paths`` against its plain reference, same run.

Interleaved rounds (fast, reference, fast, ...; each the best of a few calls), so load
changes hit both sides alike; reported as the median of the per-round ratios
reference / fast with their min-max. Also: the SVD's ctypes fast path against numpy's
SVD in a thread per core under ``threadpoolctl`` (a well-kept library within
10% would replace it), and the closed-form JVPs of ``models/activations`` and
``models/norms.rescale`` against autodiff of the plain formula (saved residuals and
gradient time), which decide whether those are CPU tricks. Writes the
``## CPU fast paths`` section of RESULTS.md.

  python experiments/benchmarks/fast_paths.py [--rounds 7] [--no-write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from threadpoolctl import ThreadpoolController  # noqa: E402

from experiments.benchmarks import common  # noqa: E402
from rankjax._src import _host_lapack, fast_paths  # noqa: E402
from rankjax._src.models import activations, norms  # noqa: E402


def _best(fn, args, reps):
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t)
  return best


def interleaved(fast, ref, args, rounds, reps=3):
  """(fast time, reference time, median ratio ref/fast, min, max) over ``rounds``."""
  jax.block_until_ready(fast(*args))
  jax.block_until_ready(ref(*args))
  tf, tr = [], []
  for _ in range(rounds):
    tf.append(_best(fast, args, reps))
    tr.append(_best(ref, args, reps))
  ratios = [r / f for f, r in zip(tf, tr)]
  return statistics.median(tf), statistics.median(tr), statistics.median(ratios), min(ratios), max(ratios)


def jit_pair(fn):
  """``fn`` jitted twice: the fast-path trace and one traced under ``fast_paths.plain()``
  (traced at the first call, so compile it inside the block)."""
  return jax.jit(fn), jax.jit(lambda *a: fn(*a))


def compile_plain(fn, args):
  with fast_paths.plain():
    jax.block_until_ready(fn(*args))
  return fn


def study_like_matrices(n, d, seed):
  """``n`` running products of residual-like blocks (the shape of dh_l/dh_0)."""
  rng = np.random.default_rng(seed)
  out, p = np.empty((n, d, d), np.float32), np.eye(d)
  for l in range(n):
    p = (np.eye(d) + 0.7 * rng.standard_normal((d, d)) / np.sqrt(d)) @ p
    p /= np.linalg.norm(p) / np.sqrt(d)
    out[l] = p
  return out


_WORKERS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
_POOL = ThreadPoolExecutor(_WORKERS)
_CONTROLLER = ThreadpoolController()


def numpy_threaded_svdvals(a: np.ndarray) -> np.ndarray:
  """``np.linalg.svd(a, compute_uv=False)`` split over a thread per core, BLAS limited to
  one thread (threadpoolctl)."""
  out = np.empty(a.shape[:-2] + (min(a.shape[-2:]),), a.dtype)
  edges = np.linspace(0, a.shape[0], _WORKERS + 1).astype(int)

  def part(se):
    out[se[0]:se[1]] = np.linalg.svd(a[se[0]:se[1]], compute_uv=False)

  with _CONTROLLER.limit(limits=1):
    list(_POOL.map(part, zip(edges[:-1], edges[1:])))
  return out


def bench_svd(rounds):
  rows = []
  for n, d in ((48, 256), (16, 64)):
    data = [study_like_matrices(n, d, s) for s in range(8)]
    each = lambda f: (lambda: [f(x) for x in data])
    ref = [np.linalg.svd(x.astype(np.float64), compute_uv=False) for x in data]
    for name, f in (("ctypes", _host_lapack.host_singular_values), ("numpy", numpy_threaded_svdvals)):
      err = max(float(np.max(np.abs(f(x) - r)) / r.max()) for x, r in zip(data, ref))
      assert err < 1e-5, (name, err)
    t_c, t_n, med, lo, hi = interleaved(each(_host_lapack.host_singular_values),
                                        each(numpy_threaded_svdvals), (), rounds)
    rows.append((f"host: 8 seeds x {n} of {d}x{d} float32, ctypes gesdd vs numpy in "
                 f"{_WORKERS} threads under threadpoolctl", t_c, t_n, med, lo, hi))
  data = [jnp.asarray(study_like_matrices(48, 256, s)) for s in range(8)]
  fast, plain = jit_pair(fast_paths.singular_values)
  compile_plain(plain, (data[0],))
  run = lambda f: (lambda: [f(x) for x in data])
  rows.append(("`singular_values`: 8 seeds x 48 of 256x256 in jit, fast vs `jnp.linalg.svd`",
               *interleaved(run(fast), run(plain), (), rounds)))
  return rows


def bench_eigh(rounds):
  # the matrix-free estimator's shape: 16 probes x 48 Lanczos steps (tridiagonal)
  rng = np.random.default_rng(0)
  a, b = rng.uniform(1, 2, (16, 48)), rng.uniform(0, 0.5, (16, 47))
  m = jnp.asarray(jax.vmap(lambda x, y: jnp.diag(x) + jnp.diag(y, 1) + jnp.diag(y, -1))(a, b),
                  jnp.float32)
  fast, plain = jit_pair(jax.vmap(fast_paths.eigh))
  compile_plain(plain, (m,))
  return [("`eigh`: 16 tridiagonals 48x48 (vmapped, SLQ's shape), numpy callback vs "
           "`jnp.linalg.eigh` (kept for the deadlock, not speed)", *interleaved(fast, plain, (m,), rounds))]


def bench_threefry(rounds):
  size = 25_000_000        # the study's weights and inputs, L=48, d=256, 4x
  key = jax.random.PRNGKey(0)
  fast, plain = jit_pair(lambda k: fast_paths.threefry_bits(k, size))
  compile_plain(plain, (key,))
  assert np.array_equal(np.asarray(fast(key)), np.asarray(plain(key)))
  return [("`threefry_bits`: 25M words, unrolled cipher vs `jax.random.bits` (bit for bit)",
           *interleaved(fast, plain, (key,), rounds))]


def bench_transposed(rounds):
  rng = np.random.default_rng(0)
  L, d, m = 48, 256, 1024
  w_in = jnp.asarray(rng.standard_normal((L, d, m)) / np.sqrt(d), jnp.float32)
  s = jnp.asarray(rng.uniform(0, 1, (L, m)), jnp.float32)
  w_down = jnp.asarray(rng.standard_normal((L, m, d)) / np.sqrt(m), jnp.float32)
  h = jnp.asarray(rng.standard_normal((L, d)), jnp.float32)

  def block(w, s, wd, h):   # jacobians.branch_jacobian's product, then the P-norm's J
    return norms.jacobian_right(fast_paths.transposed_product(w * s[None, :], wd), h, "rms", 0.0)

  fn = lambda *a: jax.lax.scan(lambda c, x: (c, block(*x)), 0, a)[1]   # over depth
  fast, plain = jit_pair(fn)
  args = (w_in, s, w_down, h)
  compile_plain(plain, args)
  return [("`transposed_product`: the branch Jacobians (256x1024)(1024x256) of 48 blocks "
           "in a scan, then `jacobian_right`; barrier vs folded transpose",
           *interleaved(fast, plain, args, rounds))]


def _residual_arrays(f, x):
  """Saved residuals of ``x``'s size (not the input itself) in ``jax.vjp(f, x)``."""
  from jax._src.ad_checkpoint import saved_residuals
  res = saved_residuals(f, x)
  return sum(1 for aval, why in res if aval.shape == x.shape and "argument" not in why)


def bench_jvp_rules(rounds):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2048, 128)), jnp.float32)
  w1 = jnp.asarray(rng.standard_normal((128, 512)) / np.sqrt(128), jnp.float32)
  w2 = jnp.asarray(rng.standard_normal((512, 128)) / np.sqrt(512), jnp.float32)
  plain_gelu = lambda z: jax.nn.gelu(z, approximate=False)
  plain_rescale = lambda z: z / norms.rms(z, 1e-6)
  rows, saved = [], {}
  for name, rule, plain in (("gelu", activations.gelu, plain_gelu),
                            ("silu", activations.silu, jax.nn.silu),
                            ("rescale", lambda z: norms.rescale(z, 1e-6), plain_rescale)):
    z = x @ w1
    saved[name] = (_residual_arrays(rule, z), _residual_arrays(plain, z))

    def loss(w1, w2, x, act):
      h = act(x @ w1) @ w2
      return jnp.sum(jnp.square(h))

    g_rule = jax.jit(jax.grad(lambda a, b, c: loss(a, b, c, rule), argnums=(0, 1)))
    g_plain = jax.jit(jax.grad(lambda a, b, c: loss(a, b, c, plain), argnums=(0, 1)))
    rows.append((f"`{name}` closed-form JVP vs autodiff: grad of a 2048x128x512 FFN layer",
                 *interleaved(g_rule, g_plain, (w1, w2, x), rounds)))
  return rows, saved


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--no-write", action="store_true")
  args = ap.parse_args(argv)
  load0 = common.load_average()
  t0 = time.perf_counter()
  rows = []
  for bench in (bench_svd, bench_threefry, bench_transposed, bench_eigh):
    rows += bench(args.rounds)
    print(rows[-1], flush=True)
  jvp_rows, saved = bench_jvp_rules(args.rounds)
  rows += jvp_rows
  elapsed = time.perf_counter() - t0
  lines = ["## CPU fast paths", "",
           f"`experiments/benchmarks/fast_paths.py`, {datetime.date.today().isoformat()}: "
           f"{common.machine_name()}; jax {jax.__version__}, numpy {np.__version__}; "
           f"load average {load0:.2f} at the start, {common.load_average():.2f} at the end "
           f"(a second process shared the 2 cores); {args.rounds} interleaved rounds, "
           f"each side the best of 3 calls per round; {elapsed:.0f} s in all.", "",
           "| what | fast (s, median) | reference (s, median) | reference / fast, median [min, max] |",
           "|---|---|---|---|"]
  for what, tf, tr, med, lo, hi in rows:
    lines.append(f"| {what} | {tf:.4f} | {tr:.4f} | {med:.2f} [{lo:.2f}, {hi:.2f}] |")
  lines += ["", "Arrays of z's size that `jax.vjp` saves for the backward pass (closed-form "
            "rule / autodiff of the plain formula): " + ", ".join(
                f"{k} {a} / {b}" for k, (a, b) in saved.items()) + ".", ""]
  text = "\n".join(lines)
  print(text)
  if not args.no_write:
    common.write_section("## CPU fast paths", text)


if __name__ == "__main__":
  main()
