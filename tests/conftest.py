"""Shared test fixtures.

Float64 checks use the ``x64`` fixture, which turns on ``jax_enable_x64`` only for
the duration of one test (``jax.enable_x64`` context), so float32 defaults elsewhere
in the same process are untouched.
"""
import os

# Tests compile many small programs; XLA's cheaper CPU backend passes halve compile
# time and change no semantics. The CPU backend's loop emitters instead of its MLIR
# fusion emitters (the same fused computations) cut the suite's compile time by another
# ~35%. Set before JAX initializes; an explicit XLA_FLAGS wins.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_use_fusion_emitters=false")

import jax  # noqa: E402
import pytest  # noqa: E402

# a test's own timeout mark moves faulthandler's watchdog (tests/watchdog.py)
from tests.watchdog import pytest_runtest_setup  # noqa: E402,F401


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
  """The committed reruns first, in their declared order (the Post-Norm group, the
  longest, first: tests/experiments/test_committed_results.py, CHECKED), then every other
  test as collected. CI runs them in one stage with the slow tests: the long reruns start
  at once, and the many short slow tests fill the other worker and the end, instead of
  each stage ending on one worker."""
  committed = [item for item in items if item.get_closest_marker("committed")]
  if committed and len(committed) < len(items):
    items[:] = committed + [item for item in items if not item.get_closest_marker("committed")]


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


@pytest.fixture(scope="module")
def single_blas_thread():
  """Host LAPACK (SVD, eigh) single-threaded for a module (``pytestmark =
  pytest.mark.usefixtures("single_blas_thread")``): OpenBLAS worker threads thrash on a
  loaded 2-core machine (SVD/eigh 20x slower). No-op without threadpoolctl."""
  from rankjax._src import fast_paths
  with fast_paths.single_blas_thread():
    yield


def with_kernels(lm, **knobs):
  """The TransformerConfig ``lm`` with ``knobs`` of its ``kernels`` (``KernelConfig``:
  remat, attention_impl, loss_chunk, ...) changed, the others kept."""
  import dataclasses
  return dataclasses.replace(lm, kernels=dataclasses.replace(lm.kernels, **knobs))
