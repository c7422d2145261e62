"""Host helpers of ``rankjax._src.fast_paths``: batched singular values on the CPU, one LAPACK
``gesdd`` per matrix, threaded (the fast path of ``fast_paths.singular_values``).

XLA:CPU runs a batched ``jnp.linalg.svd`` as LAPACK calls that mostly follow one
another on one thread, so in the Jacobian study (``jacobians.sample_measurements``:
L * seeds singular-value decompositions of ``dh_l/dh_0``) the other cores mostly wait
while the SVDs run (384 SVDs of 256 x 256 in the study: 1.29 s that way, 0.94 s here, on
2 cores). ``singular_values_threaded`` splits the batch over a thread per available core;
each thread calls the same LAPACK routine jax uses (``?gesdd`` with ``jobz='N'``, from
SciPy's LAPACK, whose function pointers jaxlib also reads) through ``ctypes``, which
releases the GIL for the call. ``fast_paths.singular_values`` calls it from ``jit`` as a
``jax.pure_callback`` on CPU; other backends run plain ``jnp.linalg.svd``.

Each worker thread asks OpenBLAS for one thread for its own calls
(``openblas_set_num_threads_local``, where SciPy's OpenBLAS has it), so the threads do
not oversubscribe the cores. Forward only (no derivative); ``host_singular_values``
takes float32 and float64, ``fast_paths.singular_values`` threads float32 only.

Why not numpy or SciPy (a well-kept library is preferred where one is within 10%):
measured on a 2-core Xeon (experiments/benchmarks/RESULTS.md, "CPU fast paths"),
``np.linalg.svd(..., compute_uv=False)`` in a thread per core under
``threadpoolctl.threadpool_limits(1)`` is about 1.6x slower on the study's 48 x 256 x 256
(numpy's own OpenBLAS build runs ``sgesdd`` about 1.5x slower on one thread), and
``scipy.linalg.svdvals`` (the same LAPACK as here) holds the GIL, so its threads run one
after another (2x).
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_c_int = ctypes.c_int
_GESDD_ARGS = 14  # jobz, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, iwork, info


def _capsule_function(name: str):
  """A ctypes function from SciPy's ``cython_lapack`` capsule (every argument a pointer,
  the Fortran convention)."""
  api = ctypes.pythonapi
  api.PyCapsule_GetName.restype = ctypes.c_char_p
  api.PyCapsule_GetName.argtypes = [ctypes.py_object]
  api.PyCapsule_GetPointer.restype = ctypes.c_void_p
  api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
  import scipy.linalg.cython_lapack as cython_lapack
  capsule = cython_lapack.__pyx_capi__[name]
  pointer = api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))
  return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * _GESDD_ARGS)(pointer)


GESDD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_gesdd: dict[np.dtype, object] = {}     # filled on first use (nothing loads at import)
_gesdd_lock = threading.Lock()


def _gesdd_function(dtype: np.dtype):
  """The ctypes ``?gesdd`` of ``dtype``, created on first use."""
  fn = _gesdd.get(dtype)
  if fn is None:
    with _gesdd_lock:
      if not _gesdd:
        _gesdd.update({np.dtype(np.float32): _capsule_function("sgesdd"),
                       np.dtype(np.float64): _capsule_function("dgesdd")})
      fn = _gesdd[dtype]
  return fn


def _openblas_one_thread_here():
  """``openblas_set_num_threads_local(1)`` of SciPy's OpenBLAS for the calling thread,
  or a no-op where that library or symbol is not found."""
  import scipy
  libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)),
                                "scipy.libs", "libscipy_openblas*.so*"))
  for path in libs:
    try:
      fn = ctypes.CDLL(path).openblas_set_num_threads_local
    except (OSError, AttributeError):
      continue
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return lambda: fn(1)
  return lambda: None


_one_thread_fn = None


def _one_thread() -> None:
  """One OpenBLAS thread for the calling thread (the library is looked up once)."""
  global _one_thread_fn
  if _one_thread_fn is None:
    _one_thread_fn = _openblas_one_thread_here()
  _one_thread_fn()

_local = threading.local()
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workspace(dtype: np.dtype, rows: int, cols: int):
  """Per-thread LAPACK workspace for ``rows x cols`` (column-major) ``gesdd``."""
  cache = getattr(_local, "cache", None)
  if cache is None:
    _one_thread()
    cache = _local.cache = {}
  key = (dtype, rows, cols)
  if key not in cache:
    k = min(rows, cols)
    a = np.empty((cols, rows), dtype)            # C order (cols, rows) = F order (rows, cols)
    s = np.empty(max(k, 1), dtype)
    dummy = np.empty(1, dtype)
    iwork = np.empty(8 * max(k, 1), np.int32)
    query = np.empty(1, dtype)
    info = _c_int(0)
    _call(dtype, rows, cols, a, s, dummy, query, -1, iwork, info)
    lwork = int(query[0]) + 1
    cache[key] = (a, dummy, iwork, np.empty(lwork, dtype), lwork)
  return cache[key]


def _call(dtype, rows, cols, a, s, dummy, work, lwork, iwork, info) -> None:
  ref = ctypes.byref
  one = _c_int(1)
  _gesdd_function(dtype)(ref(ctypes.c_char(b"N")), ref(_c_int(rows)), ref(_c_int(cols)),
                a.ctypes.data, ref(_c_int(max(1, rows))), s.ctypes.data,
                dummy.ctypes.data, ref(one), dummy.ctypes.data, ref(one),
                work.ctypes.data, ref(_c_int(lwork)), iwork.ctypes.data, ref(info))


def _svdvals_range(a_BxNxM: np.ndarray, out_BxK: np.ndarray, start: int, stop: int) -> None:
  """Singular values of ``a[start:stop]`` into ``out[start:stop]``. A C-order ``n x m``
  matrix is LAPACK's column-major ``m x n``, its transpose: the same singular values,
  so no transpose is needed; ``gesdd`` overwrites its input, hence the copy."""
  dtype = a_BxNxM.dtype
  rows, cols = a_BxNxM.shape[2], a_BxNxM.shape[1]
  a, dummy, iwork, work, lwork = _workspace(dtype, rows, cols)
  info = _c_int(0)
  for i in range(start, stop):
    np.copyto(a, a_BxNxM[i])
    _call(dtype, rows, cols, a, out_BxK[i], dummy, work, lwork, iwork, info)
    if info.value != 0:   # no convergence, or NaN/inf input
      out_BxK[i] = np.nan


@contextlib.contextmanager
def single_blas_thread():
  """Host LAPACK (SVD, eigh) single-threaded inside the block: OpenBLAS worker threads
  thrash on a loaded small machine (measured 20x slower SVDs). No-op without
  threadpoolctl. (``host_singular_values`` sets one thread per worker itself.)"""
  try:
    from threadpoolctl import threadpool_limits
  except ImportError:
    yield
    return
  with threadpool_limits(1):
    yield


def _num_workers() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:   # not on Linux
    return os.cpu_count() or 1


def host_singular_values(a: np.ndarray, workers: int | None = None) -> np.ndarray:
  """Singular values (descending) over the last two axes of a float32/float64 numpy
  array, the batch split over ``workers`` threads (default: the available cores)."""
  global _pool
  a = np.ascontiguousarray(a)
  if a.dtype not in GESDD_DTYPES:
    raise TypeError(f"host_singular_values takes float32 or float64, not {a.dtype}")
  n, m = a.shape[-2:]
  a_BxNxM = a.reshape(-1, n, m)
  batch = a_BxNxM.shape[0]
  out = np.empty((batch, min(n, m)), a.dtype)
  if batch and min(n, m):
    workers = max(1, min(workers or _num_workers(), batch))
    if workers == 1:
      _svdvals_range(a_BxNxM, out, 0, batch)
    else:
      with _pool_lock:
        if _pool is None or _pool._max_workers < workers:
          _pool = ThreadPoolExecutor(workers, thread_name_prefix="rankjax-svd")
        pool = _pool
      edges = np.linspace(0, batch, workers + 1).astype(int)
      list(pool.map(lambda se: _svdvals_range(a_BxNxM, out, *se), zip(edges[:-1], edges[1:])))
  return out.reshape(*a.shape[:-2], min(n, m))


def host_eigh(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``np.linalg.eigh`` in float64, cast back to ``m``'s dtype (``fast_paths.eigh``)."""
  w, v = np.linalg.eigh(np.asarray(m, np.float64))
  return w.astype(m.dtype), v.astype(m.dtype)
