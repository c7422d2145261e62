"""The library's CPU fast paths, each beside its plain reference, selected by platform.

Every public function here computes exactly what a plain JAX call computes (its
"reference", named in its docstring) and exists only because XLA:CPU or jaxlib's CPU
kernels do that call slowly, or once deadlocked in it. The mathematics lives in the
callers and in the papers; what is here is about machines. Gains are measured by
``experiments/benchmarks/fast_paths.py`` (RESULTS.md, "CPU fast paths"; same run,
interleaved rounds) and equality with the reference by ``tests/test_fast_paths.py``.

Selection. Each fast path is chosen at lowering time by
``jax.lax.platform_dependent(..., cpu=fast, default=plain)``: a program lowered for
CPU runs the fast path, one lowered or exported for CUDA/TPU the plain call (no host
callback there). Two switches force the plain reference on CPU too, both read when a
function is traced:

  * the environment variable ``RANKJAX_FAST_PATHS=0``, read once, at import;
  * the context manager ``plain()``. A function that ``jax.jit`` traced and cached
    before entering it keeps the choice it was traced with (the cache does not know
    about this switch); trace it inside the block (a fresh ``jax.jit``) to get the
    plain call.

What is not here: the closed-form derivatives of ``models/activations.py`` (gelu,
silu) and ``models/norms.rescale``. They were written for one XLA:CPU fusion, but they
are not CPU tricks, so they stay in models/ as the one rule on every platform.
Measured (RESULTS.md, "CPU fast paths"): the custom JVP saves one array of z's size
for the backward pass where autodiff of the plain formula saves three (gelu) or two
(silu), a memory gain on any backend; the CPU time of a plain FFN layer's gradient is
equal (silu) or 17% slower (gelu), so there is no CPU speed trick to isolate. rescale
saves as many arrays as autodiff and takes the same time: it is the paper's Jacobian
(TR Eq. 19, App B.1) written as the rule. The values are the plain calls bit for bit.
"""
from __future__ import annotations

import contextlib
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

_ENABLED_BY_ENV = os.environ.get("RANKJAX_FAST_PATHS", "1").strip() != "0"
_plain_depth = 0

# batch * n * m * min(n, m) below which the SVD callback's overhead (~0.1 ms) is not
# worth it (``singular_values``)
MIN_THREADED_WORK = 2 ** 24


def enabled() -> bool:
  """Whether a function traced now takes the fast paths on CPU."""
  return _ENABLED_BY_ENV and _plain_depth == 0


@contextlib.contextmanager
def plain():
  """Trace-time switch: functions traced inside the block take the plain reference on
  every platform. Jitted functions traced (and cached) before keep their choice."""
  global _plain_depth
  _plain_depth += 1
  try:
    yield
  finally:
    _plain_depth -= 1


def _select(fast, reference, *args):
  """``fast(*args)`` in programs lowered for CPU, ``reference(*args)`` elsewhere and
  whenever the fast paths are switched off."""
  if not enabled():
    return reference(*args)
  return jax.lax.platform_dependent(*args, cpu=fast, default=reference)


def single_blas_thread():
  """Host BLAS/LAPACK (numpy, SciPy, jaxlib's CPU LAPACK) on one thread inside the
  block (``threadpoolctl``): OpenBLAS worker threads thrash on a loaded small machine
  (SVDs measured 20x slower)."""
  from rankjax._src import _host_lapack
  return _host_lapack.single_blas_thread()


# --- singular values ------------------------------------------------------------------

def _svdvals(a: Array) -> Array:
  return jnp.linalg.svd(a, compute_uv=False)


def singular_values(a: Array) -> Array:
  """``jnp.linalg.svd(a, compute_uv=False)`` (the reference), batched over leading axes.

  Why: XLA:CPU runs a batched SVD as LAPACK calls one after another on one thread; the
  fast path is a host callback that splits the batch over a thread per core, each
  calling the same LAPACK ``sgesdd`` (values only) through ctypes (``_host_lapack``).
  Gain on the study's 8 seeds x 48 matrices of 256 x 256, 2-core Xeon: 1.24x in jit
  (median, 0.95-1.48x under a shared load; RESULTS.md, "CPU fast paths"). numpy's SVD
  in a thread per core under threadpoolctl is 1.57x slower than the ctypes call on the
  same matrices, not within 10%, so the ctypes call stays.

  Selected on CPU for float32 batches (before any vmap) of at least two matrices and
  ``MIN_THREADED_WORK``; float64 always runs the reference: a callback's float64 result
  is cast to float32 when x64 is on only through the thread-local ``jax.enable_x64``
  (the callback runs on another thread), and float64 runs are small accuracy checks.
  jit/vmap-able; not differentiable on the fast path.
  """
  a = jnp.asarray(a)
  n, m = a.shape[-2:]
  batch = math.prod(a.shape[:-2])
  if a.dtype != jnp.float32 or batch < 2 or batch * n * m * min(n, m) < MIN_THREADED_WORK:
    return _svdvals(a)
  shape = jax.ShapeDtypeStruct(a.shape[:-2] + (min(n, m),), a.dtype)

  def on_host(x):
    from rankjax._src import _host_lapack
    return jax.pure_callback(_host_lapack.host_singular_values, shape, x,
                             vmap_method="broadcast_all")

  return _select(on_host, _svdvals, a)


# --- symmetric eigendecomposition -----------------------------------------------------

def _eigh(m: Array) -> tuple[Array, Array]:
  return tuple(jnp.linalg.eigh(m))


def eigh(m: Array) -> tuple[Array, Array]:
  """``jnp.linalg.eigh(m)`` (the reference) as a tuple ``(w, v)``, ascending ``w``.

  Why: not speed but a deadlock. jaxlib 0.10's CPU LAPACK kernels split a batch over
  XLA's intra-op thread pool and block until it is done; when as many batched calls
  run at once as the pool has threads (vmapped Lanczos probes of several layers in
  ``measure/matrix_free``), each waits on work queued behind the others. It hung the
  test suite (both pool threads in ``ParallelBatchMap``'s ``BlockingCounter::Wait``
  under ``EigenvalueDecompositionSymmetric``). The fast path is a host callback to
  ``np.linalg.eigh`` (in float64, cast back), which does not use that pool. It costs
  time: 0.57x the reference's speed on SLQ's 16 tridiagonals of 48 x 48 (RESULTS.md).
  Forcing the reference on CPU (``plain()``) brings the deadlock risk back.

  Selected on CPU for float32; float64 runs the reference (see ``singular_values``).
  Eigenvectors are defined up to sign (and within repeated eigenvalues, up to a
  rotation): the two paths may differ there.
  """
  m = jnp.asarray(m)
  if m.dtype != jnp.float32:
    return _eigh(m)
  shapes = (jax.ShapeDtypeStruct(m.shape[:-1], m.dtype), jax.ShapeDtypeStruct(m.shape, m.dtype))

  def on_host(x):
    from rankjax._src import _host_lapack
    return jax.pure_callback(_host_lapack.host_eigh, shapes, x, vmap_method="broadcast_all")

  return _select(on_host, _eigh, m)


# --- threefry random bits -------------------------------------------------------------

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotate_left(x: Array, r: int) -> Array:
  return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k1: Array, k2: Array, x1: Array, x2: Array) -> tuple[Array, Array]:
  """The Threefry-2x32 block cipher, 20 rounds (Salmon et al., SC'11; JAX's rotation
  constants and key-schedule parity word 0x1BD11BDA), written out round by round."""
  ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
  x1, x2 = x1 + ks[0], x2 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = x1 ^ _rotate_left(x2, r)
    x1 = x1 + ks[(i + 1) % 3]
    x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x1, x2


def _threefry_key_words(key: Array) -> tuple[Array, Array] | None:
  """The two key words of a default threefry key (raw ``uint32[2]`` or typed), or None
  where the unrolled cipher would not reproduce ``jax.random.bits``."""
  if not jax.config.jax_threefry_partitionable:
    return None
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if jax.random.key_impl(key) != jax.random.key_impl(jax.random.key(0, impl="threefry2x32")):
      return None
    key = jax.random.key_data(key)
  elif jax.config.jax_default_prng_impl != "threefry2x32":
    return None
  if key.shape != (2,) or key.dtype != jnp.uint32:
    return None
  return key[0], key[1]


def threefry_bits(key: Array, size: int) -> Array:
  """``jax.random.bits(key, (size,), jnp.uint32)`` (the reference), bit for bit.

  Why: JAX's CPU lowering of the ``threefry2x32`` primitive rolls the 5 groups of 4
  rounds into a loop (for compile time), so each group is one more pass over the whole
  counter arrays in memory; unrolled (``threefry2x32`` here), XLA fuses the 20 rounds
  into one loop that stays in registers. Gain: 7.3x on the study's 25M words (L=48,
  d=256; 2-core Xeon, RESULTS.md "CPU fast paths"). Partitionable threefry hashes the 64-bit counter
  i (high word 0 below 2^32) and returns the XOR of the two output words
  (``jax._src.random.threefry2x32._threefry_random_bits_partitionable``).

  Selected on CPU for default threefry keys with ``jax_threefry_partitionable`` on
  (JAX's default) and ``size < 2**32``; every other key or configuration, and every
  other platform, runs the reference.
  """
  reference = lambda key: jax.random.bits(key, (size,), jnp.uint32)
  words = _threefry_key_words(key) if enabled() and size < 2 ** 32 else None
  if words is None:
    return reference(key)

  def unrolled(k1, k2):
    lo = jax.lax.iota(jnp.uint32, size)
    x1, x2 = threefry2x32(k1, k2, jnp.zeros_like(lo), lo)
    return x1 ^ x2

  return jax.lax.platform_dependent(*words, cpu=unrolled, default=lambda *_: reference(key))


# --- transposed matrix product --------------------------------------------------------

def _transposed_product(a: Array, b: Array) -> Array:
  return jnp.swapaxes(jnp.matmul(a, b), -1, -2)


def _transposed_product_barrier(a: Array, b: Array) -> Array:
  return jnp.swapaxes(jax.lax.optimization_barrier(jnp.matmul(a, b)), -1, -2)


def transposed_product(a: Array, b: Array) -> Array:
  """``(a @ b)^T`` over the last two axes (the reference: ``jnp.matmul(a, b)`` then a
  transpose, which XLA folds into one transposed-operand dot ``b^T a^T``).

  Why: XLA:CPU runs the (d x m)(m x d) product ``a @ b`` at about twice the rate of the
  folded ``b^T a^T`` (the MLP branch Jacobian ``J_f = (da @ W_down)^T``,
  ``measure/jacobians.branch_jacobian``). The fast path puts an
  ``optimization_barrier`` on the product so XLA cannot fold the transpose back into
  the dot, and transposes the result (one copy). Gain: 1.40x for the 48 branch
  Jacobians (256x1024)(1024x256) of the study's scan over depth, followed by the
  P-norm's ``jacobian_right`` (1.05x for the product alone; 2-core Xeon, RESULTS.md
  "CPU fast paths").

  Selected on CPU; the same values as the reference up to the dot's summation order
  (float32 rounding).
  """
  return _select(_transposed_product_barrier, _transposed_product, a, b)
