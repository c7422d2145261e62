"""Threaded host singular values (rankjax._src._host_lapack, fast_paths.singular_values)
against numpy's SVD."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src import _host_lapack, fast_paths


def _ref(a):
  return np.linalg.svd(np.asarray(a, np.float64), compute_uv=False)


@pytest.mark.parametrize("shape", [(7, 12, 12), (2, 3, 9, 20), (5, 20, 9), (1, 1, 4), (4, 6, 1)])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_host_singular_values_equal_numpy_float64(shape, workers):
  a = np.random.default_rng(sum(shape)).standard_normal(shape)
  s = _host_lapack.host_singular_values(a, workers=workers)
  assert s.shape == shape[:-1][:-1] + (min(shape[-2:]),) and s.dtype == np.float64
  np.testing.assert_allclose(s, _ref(a), rtol=1e-12, atol=1e-12)


def test_host_singular_values_float32_rank_deficient_and_bad_input():
  rng = np.random.default_rng(0)
  u = rng.standard_normal((6, 32, 3)).astype(np.float32)
  a = u @ u.transpose(0, 2, 1)                       # rank 3
  s = _host_lapack.host_singular_values(a, workers=2)
  assert s.dtype == np.float32
  np.testing.assert_allclose(s, _ref(a), atol=2e-6 * float(_ref(a).max()))
  assert np.all(s[:, 3:] <= 1e-5 * s[:, :1])
  zero_nan = np.stack([np.zeros((5, 5)), np.full((5, 5), np.nan)])
  out = _host_lapack.host_singular_values(zero_nan)
  assert np.all(out[0] == 0) and np.all(np.isnan(out[1]))
  with pytest.raises(TypeError, match="float32 or float64"):
    _host_lapack.host_singular_values(np.zeros((2, 2), np.int32))


def test_threaded_singular_values_under_jit_vmap_and_map(monkeypatch):
  monkeypatch.setattr(fast_paths, "MIN_THREADED_WORK", 0)
  a = np.random.default_rng(1).standard_normal((3, 4, 5, 10, 8)).astype(np.float32)
  fn = jax.jit(lambda x: jax.lax.map(jax.vmap(fast_paths.singular_values), x))
  assert "callback" in fn.lower(jnp.asarray(a)).as_text()
  np.testing.assert_allclose(np.asarray(fn(jnp.asarray(a))), _ref(a), rtol=2e-6, atol=2e-6)
  # other dtypes fall back to jnp.linalg.svd
  c = jnp.asarray(a[0, 0] + 1j * a[0, 1])
  np.testing.assert_allclose(np.asarray(fast_paths.singular_values(c)),
                             np.linalg.svd(np.asarray(c), compute_uv=False), rtol=2e-6)


def test_threaded_singular_values_float64_uses_jnp(x64):
  a = jnp.asarray(np.random.default_rng(2).standard_normal((2, 9, 7)))
  fn = jax.jit(fast_paths.singular_values)
  assert "callback" not in fn.lower(a).as_text()
  np.testing.assert_allclose(np.asarray(fn(a)), _ref(a), rtol=1e-12, atol=1e-12)


def test_small_batches_stay_on_jnp():
  small = jnp.zeros((4, 16, 16), jnp.float32)
  assert "callback" not in jax.jit(fast_paths.singular_values).lower(small).as_text()
  big = jnp.zeros((2, 256, 256), jnp.float32)
  assert "callback" in jax.jit(fast_paths.singular_values).lower(big).as_text()
