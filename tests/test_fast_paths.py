"""The CPU fast paths (rankjax._src.fast_paths) against their plain references.

Tolerances: threefry is bit for bit (the same cipher, integer arithmetic). The SVD and
eigh fast paths run the same LAPACK algorithm family in another order (gesdd per
matrix; numpy's eigh in float64, cast back): float32 results agree to a few ulps of
the largest value, so 1e-5 relative to the largest singular value/eigenvalue holds with
a margin of ~10x on these well-scaled sizes. transposed_product changes no summation
order in exact arithmetic; XLA's dot kernels may block differently, so 1e-6 relative.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from rankjax._src import fast_paths

RTOL = 1e-5
CPU_KIND = ("callback", "xla_python")   # what a host callback leaves in the lowered text


@pytest.fixture
def every_batch(monkeypatch):
  monkeypatch.setattr(fast_paths, "MIN_THREADED_WORK", 0)


def _svd_input():
  return jnp.asarray(np.random.default_rng(0).standard_normal((3, 4, 12, 9)), jnp.float32)


def _sym_input():
  a = np.random.default_rng(1).standard_normal((3, 5, 10, 10)).astype(np.float32)
  return jnp.asarray(a + np.swapaxes(a, -1, -2))


def _has_callback(fn, *args) -> bool:
  text = jax.jit(fn).lower(*args).as_text()
  return any(k in text for k in CPU_KIND)


def test_singular_values_equal_reference_under_jit_and_vmap(every_batch):
  a = _svd_input()
  ref = np.asarray(jnp.linalg.svd(a, compute_uv=False))
  fn = jax.jit(jax.vmap(fast_paths.singular_values))
  assert _has_callback(jax.vmap(fast_paths.singular_values), a)
  np.testing.assert_allclose(np.asarray(fn(a)), ref, rtol=0, atol=RTOL * ref.max())


def test_eigh_equal_reference_under_jit_and_vmap():
  m = _sym_input()
  w_ref, v_ref = jnp.linalg.eigh(m)
  fn = jax.jit(jax.vmap(fast_paths.eigh))
  assert _has_callback(jax.vmap(fast_paths.eigh), m)
  w, v = fn(m)
  scale = float(jnp.max(jnp.abs(w_ref)))
  np.testing.assert_allclose(np.asarray(w), np.asarray(w_ref), rtol=0, atol=RTOL * scale)
  # eigenvectors up to sign (the eigenvalues of these random matrices are distinct)
  sign = jnp.sign(jnp.sum(v * v_ref, axis=-2, keepdims=True))
  np.testing.assert_allclose(np.asarray(v * sign), np.asarray(v_ref), atol=1e-4)


def test_threefry_bits_bit_for_bit_under_jit_and_vmap():
  keys = jax.random.split(jax.random.PRNGKey(7), 3)
  size = 1000
  got = jax.jit(jax.vmap(lambda k: fast_paths.threefry_bits(k, size)))(keys)
  ref = jax.vmap(lambda k: jax.random.bits(k, (size,), jnp.uint32))(keys)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
  typed = jax.random.key(3)
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda k: fast_paths.threefry_bits(k, 77))(typed)),
                                np.asarray(jax.random.bits(typed, (77,), jnp.uint32)))


def test_transposed_product_equal_reference_under_jit_and_vmap():
  rng = np.random.default_rng(2)
  a = jnp.asarray(rng.standard_normal((3, 16, 40)), jnp.float32)
  b = jnp.asarray(rng.standard_normal((3, 40, 16)), jnp.float32)
  fn = jax.jit(jax.vmap(fast_paths.transposed_product))
  assert "optimization_barrier" in jax.jit(fast_paths.transposed_product).lower(a[0], b[0]).as_text()
  ref = np.swapaxes(np.asarray(a) @ np.asarray(b), -1, -2)
  np.testing.assert_allclose(np.asarray(fn(a, b)), ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
  np.testing.assert_allclose(np.asarray(fast_paths.transposed_product(a, b)), ref,
                             rtol=1e-6, atol=1e-6 * np.abs(ref).max())


def test_plain_switch_takes_the_reference(every_batch):
  a, m = _svd_input()[0], _sym_input()[0]
  key = jax.random.PRNGKey(0)
  with fast_paths.plain():
    assert not fast_paths.enabled()
    assert not _has_callback(fast_paths.singular_values, a)
    assert not _has_callback(fast_paths.eigh, m)
    text = jax.jit(lambda x, y: fast_paths.transposed_product(x, y)).lower(a, jnp.swapaxes(a, -1, -2)).as_text()
    assert "optimization_barrier" not in text
    plain_jaxpr = str(jax.make_jaxpr(lambda k: fast_paths.threefry_bits(k, 8))(key))
    assert "random_bits" in plain_jaxpr and "platform_index" not in plain_jaxpr
  assert fast_paths.enabled()
  assert "platform_index" in str(jax.make_jaxpr(lambda k: fast_paths.threefry_bits(k, 8))(key))
  np.testing.assert_allclose(np.asarray(fast_paths.singular_values(a)),
                             np.asarray(jnp.linalg.svd(a, compute_uv=False)), rtol=RTOL)


def test_env_switch_read_at_import():
  import os
  import subprocess
  import sys
  probe = ("from rankjax._src import fast_paths; import jax.numpy as jnp, jax\n"
           "fast_paths.MIN_THREADED_WORK = 0\n"
           "a = jnp.ones((2, 4, 4))\n"
           "assert not fast_paths.enabled()\n"
           "assert 'callback' not in jax.jit(fast_paths.singular_values).lower(a).as_text()\n"
           "print('ok')")
  env = dict(os.environ, RANKJAX_FAST_PATHS="0", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                       timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_cuda_export_lowers_the_plain_calls(every_batch):
  a, m = _svd_input()[0], _sym_input()[0]
  key = jax.random.PRNGKey(0)

  def every_path(a, m, key):
    w, v = fast_paths.eigh(m)
    return (fast_paths.singular_values(a), w, v, fast_paths.threefry_bits(key, 64),
            fast_paths.transposed_product(a, jnp.swapaxes(a, -1, -2)))

  cuda = export.export(jax.jit(every_path), platforms=["cuda"])(a, m, key).mlir_module()
  assert not any(k in cuda for k in CPU_KIND)
  assert "optimization_barrier" not in cuda
  assert "lapack" not in cuda.lower()
  cpu = export.export(jax.jit(every_path), platforms=["cpu"])
  with pytest.raises(Exception, match="(?i)callback"):   # the CPU lowering has them
    cpu(a, m, key)


def test_fast_paths_imports_neither_measure_nor_models_at_module_level():
  import ast
  import pathlib
  tree = ast.parse(pathlib.Path(fast_paths.__file__).read_text())
  top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
  names = {a.name for n in top for a in n.names} | {
      n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
  assert not {n for n in names if n.startswith(("rankjax._src.measure", "rankjax._src.models"))}
