"""Matrix-free effective/stable rank (Lanczos, SLQ) against exact SVDs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import MLPConfig
from rankjax._src.measure import jacobians, matrix_free, spectra


# XLA:CPU's default backend optimization, for one compile under the suite's lowered flags
DEFAULT_OPTIMIZATION = {"xla_backend_optimization_level": 2,
                        "xla_llvm_disable_expensive_passes": False}


def _exact(jac):
  sv = np.linalg.svd(np.asarray(jac, np.float64), compute_uv=False)
  return (np.asarray(spectra.effective_rank_from_singular_values(sv)),
          np.asarray(spectra.stable_rank_from_singular_values(sv)), sv)


def test_full_krylov_quadrature_is_exact_per_probe(x64):
  d = 24
  rng = np.random.default_rng(0)
  j = rng.normal(size=(d, d)) @ np.diag(np.exp(-0.3 * np.arange(d)))
  a = j.T @ j
  lam, vecs = np.linalg.eigh(a)
  z = np.sign(rng.normal(size=d))
  alphas, betas, _ = matrix_free.lanczos(lambda v: jnp.asarray(a) @ v,
                                         jnp.asarray(z / np.sqrt(d)), d)
  theta, tau = matrix_free._quadrature(alphas, betas)
  np.testing.assert_allclose(np.sort(np.asarray(theta)), lam, rtol=1e-7, atol=1e-9)
  f = lambda x: np.sqrt(np.maximum(x, 0))
  direct = z @ (vecs @ np.diag(f(lam)) @ vecs.T) @ z
  np.testing.assert_allclose(d * np.sum(np.asarray(tau) * f(np.asarray(theta))), direct,
                             rtol=1e-7)


def test_deflated_estimates_of_a_known_spectrum(x64):
  d = 64
  rng = np.random.default_rng(1)
  u, _ = np.linalg.qr(rng.normal(size=(d, d)))
  sv = np.concatenate([[30.0, 12.0, 5.0], np.linspace(1.0, 0.1, d - 3)])
  j = u @ np.diag(sv) @ u.T
  er, st, _ = _exact(j)
  est = jax.jit(lambda jj: matrix_free.function_rank_estimates(
      lambda x: jj @ x, jnp.zeros(d, jnp.float64), jax.random.PRNGKey(0), num_probes=16,
      num_steps=32))(jnp.asarray(j))
  np.testing.assert_allclose(est.spectral_sq, sv[0] ** 2, rtol=1e-10)
  np.testing.assert_allclose(est.frobenius_sq, np.sum(sv ** 2), rtol=0.01)
  np.testing.assert_allclose(est.stable_rank, st, rtol=0.01)
  np.testing.assert_allclose(est.effective_rank, er, rtol=0.02)
  np.testing.assert_allclose(est.nuclear, np.sum(sv), rtol=0.02)


def _network_check(L, d, layers, probes, steps, tol):
  cfg = MLPConfig(depth=L, width=d, expansion=4.0, norm_position="pre")
  # the estimate compiled at XLA's default optimization (the suite's XLA_FLAGS lower it
  # for compile speed, tests/conftest.py): its Lanczos loops ran 4-5x slower there (L=48,
  # d=512: 86 s against 17 s on the 2-core Xeon); the draw and the exact engine as before
  blocks, h0 = jax.jit(lambda key: jacobians.seed_samples(cfg, key, 1))(jax.random.PRNGKey(0))
  ts = jax.jit(lambda b, h: jacobians.input_output_jacobians(
      jacobians.block_jacobians(b, h, cfg), cfg)[np.asarray(layers) - 1])(blocks, h0[0])
  est = jax.jit(lambda b, h: matrix_free.network_rank_estimates(
      b, h, cfg, jax.random.PRNGKey(1), layers=layers, num_probes=probes,
      num_steps=steps)).lower(blocks, h0[0]).compile(compiler_options=DEFAULT_OPTIMIZATION)(
          blocks, h0[0])
  er, st, sv = _exact(ts)
  np.testing.assert_allclose(est.spectral_sq, sv[:, 0] ** 2, rtol=1e-4)
  err_er = np.abs(np.asarray(est.effective_rank) / er - 1)
  err_st = np.abs(np.asarray(est.stable_rank) / st - 1)
  assert err_er.max() < tol and err_st.max() < tol, (err_er, err_st)
  return err_er, err_st


@pytest.mark.slow   # d = 256 (~5 s); block ranks against the exact engine stay fast
def test_network_ranks_match_the_exact_engine_at_d256():
  err_er, err_st = _network_check(8, 256, (8,), 12, 24, tol=0.03)
  print(f"matrix-free vs exact, L=8, d=256: erank {err_er}, stable rank {err_st}")


def test_block_ranks_match_exact_block_jacobians():
  cfg = MLPConfig(depth=3, width=96, expansion=4.0, norm_position="pre")

  @jax.jit   # one program: the draw, the exact block Jacobians and the estimates
  def compute(key):
    blocks, h0 = jacobians.seed_samples(cfg, key, 1)
    return (jacobians.block_jacobians(blocks, h0[0], cfg).branch,
            matrix_free.block_rank_estimates(blocks, h0[0], cfg, jax.random.PRNGKey(3),
                                             num_probes=16, num_steps=32))

  branch, est = compute(jax.random.PRNGKey(2))
  er, st, _ = _exact(np.asarray(branch, np.float64) + np.eye(cfg.width))
  # near-full-rank blocks: deflation removes little, the SLQ error is ~1.5% (16 probes);
  # the estimates agree with exact within 4 of their own standard errors
  assert np.all(np.abs(np.asarray(est.effective_rank) - er)
                <= 4 * np.asarray(est.effective_rank_stderr)), (est, er)
  assert np.all(np.abs(np.asarray(est.stable_rank) - st)
                <= 4 * np.asarray(est.stable_rank_stderr)), (est, st)
  assert np.all(np.asarray(est.effective_rank_stderr) < 0.03 * er)


@pytest.mark.slow
@pytest.mark.parametrize("d", [256, 512])   # d=1024 hung (0% CPU, in XLA) once under xdist: see note
def test_network_ranks_match_the_exact_engine_at_large_d(d):
  err_er, err_st = _network_check(48, d, (1, 24, 48), 16, 48, tol=0.03)
  print(f"matrix-free vs exact, L=48, d={d}, l=1/24/48: erank {err_er}, stable {err_st}")


def test_bad_layers_raise():
  cfg = MLPConfig(depth=4, width=8, expansion=2.0, norm_position="pre")
  blocks, h0 = jacobians.seed_samples(cfg, jax.random.PRNGKey(0), 1)
  with pytest.raises(ValueError, match=r"layers must lie in \[1, 4\]"):
    matrix_free.network_rank_estimates(blocks, h0[0], cfg, jax.random.PRNGKey(0), layers=(5,))
  with pytest.raises(ValueError, match="skip_every=1"):
    matrix_free.block_rank_estimates(blocks, h0[0], dataclasses.replace(cfg, skip_every=2),
                                     jax.random.PRNGKey(0))


def test_large_width_never_forms_dense_jacobians():
  """L=48, d=2048 (compiled only): the estimate's working memory is a few percent of the
  L dense d x d Jacobians the exact engine would hold (observed 36 MiB against 768 MiB)."""
  L, d = 48, 2048
  cfg = MLPConfig(depth=L, width=d, expansion=1.0, norm_position="pre")
  shapes = jax.eval_shape(lambda k: jacobians.seed_samples(cfg, k, 1), jax.random.PRNGKey(0))
  fn = jax.jit(lambda b, h: matrix_free.network_rank_estimates(
      b, h, cfg, jax.random.PRNGKey(1), num_probes=8, num_steps=32))
  mem = fn.lower(shapes[0], jax.ShapeDtypeStruct((d,), jnp.float32)).compile().memory_analysis()
  if mem is None:
    pytest.skip("this backend reports no compiled memory")
  assert mem.temp_size_in_bytes < 0.1 * L * d * d * 4, mem.temp_size_in_bytes
