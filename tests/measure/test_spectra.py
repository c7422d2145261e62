"""Spectral measures, Marchenko-Pastur law and activation moments (Transforming Rank)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special

from rankjax._src.measure import spectra


pytestmark = pytest.mark.usefixtures("single_blas_thread")


def _np_erank(a):
  s = np.linalg.svd(a, compute_uv=False)
  p = s / s.sum()
  p = p[p > 0]
  return math.exp(-np.sum(p * np.log(p)))


def _np_stable_rank(a):
  s = np.linalg.svd(a, compute_uv=False)
  return np.sum(s**2) / s[0] ** 2


def test_effective_and_stable_rank_match_numpy(x64):
  rng = np.random.default_rng(0)
  a = rng.standard_normal((3, 2, 7, 5)) * rng.uniform(0.1, 10, (3, 2, 1, 5))
  er = np.asarray(spectra.effective_rank(jnp.asarray(a)))
  st = np.asarray(spectra.stable_rank(jnp.asarray(a)))
  assert er.shape == st.shape == (3, 2)
  for idx in np.ndindex(3, 2):
    np.testing.assert_allclose(er[idx], _np_erank(a[idx]), rtol=1e-12)
    np.testing.assert_allclose(st[idx], _np_stable_rank(a[idx]), rtol=1e-12)
  top = np.asarray(spectra.top_energy_fraction(jnp.asarray(a)))
  np.testing.assert_allclose(top, 1.0 / st, rtol=1e-12)


def test_effective_rank_float32_matches_numpy():
  a = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
  np.testing.assert_allclose(float(spectra.effective_rank(jnp.asarray(a))), _np_erank(a),
                             rtol=1e-5)


def test_rank_extremes(x64):
  d = 13
  eye = jnp.eye(d, dtype=jnp.float64)
  np.testing.assert_allclose(float(spectra.effective_rank(eye)), d, rtol=1e-12)
  np.testing.assert_allclose(float(spectra.stable_rank(eye)), d, rtol=1e-12)
  u = jnp.arange(1.0, d + 1)
  rank1 = jnp.outer(u, u[::-1] - 0.5)
  np.testing.assert_allclose(float(spectra.effective_rank(rank1)), 1.0, atol=1e-6)
  np.testing.assert_allclose(float(spectra.stable_rank(rank1)), 1.0, rtol=1e-12)
  assert float(spectra.effective_rank(jnp.zeros((4, 4)))) == 0.0


@pytest.mark.parametrize("gamma", [1.0, 1.5, 4.0, 16.0])
def test_marchenko_pastur_density_integrates_to_one(x64, gamma):
  lo, hi = (float(e) for e in spectra.marchenko_pastur_edges(gamma))
  np.testing.assert_allclose(lo, (1 - 1 / math.sqrt(gamma)) ** 2, rtol=1e-14, atol=1e-15)
  np.testing.assert_allclose(hi, (1 + 1 / math.sqrt(gamma)) ** 2, rtol=1e-14)
  # Gauss-Chebyshev (second kind) on [lo, hi] integrates sqrt((hi-x)(x-lo)) g(x) exactly
  # for polynomial g; here g = gamma/(2 pi x) is smooth on the support for gamma > 1.
  x, w = _chebyshev_u_rule(lo, hi, 4000)
  dens = np.asarray(spectra.marchenko_pastur_density(jnp.asarray(x), gamma))
  total = np.sum(w * dens)
  np.testing.assert_allclose(total, 1.0, atol=2e-3 if gamma == 1.0 else 1e-9)
  assert float(spectra.marchenko_pastur_atom(gamma)) == 0.0
  outside = np.asarray(spectra.marchenko_pastur_density(jnp.asarray([lo * 0.99, hi * 1.01]), gamma))
  assert np.all(outside == 0.0)


def _chebyshev_u_rule(lo, hi, n):
  """Nodes and weights integrating f over [lo, hi] (midpoint rule in theta)."""
  theta = (np.arange(n) + 0.5) * np.pi / n
  x = 0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos(theta)
  w = 0.5 * (hi - lo) * np.sin(theta) * np.pi / n
  return x, w


def test_marchenko_pastur_below_threshold_has_atom(x64):
  gamma = 0.5
  lo, hi = (float(e) for e in spectra.marchenko_pastur_edges(gamma))
  x, w = _chebyshev_u_rule(lo, hi, 4000)
  cont = np.sum(w * np.asarray(spectra.marchenko_pastur_density(jnp.asarray(x), gamma)))
  np.testing.assert_allclose(cont + float(spectra.marchenko_pastur_atom(gamma)), 1.0, atol=1e-6)


def test_marchenko_pastur_matches_gaussian_gram():
  d, gamma = 200, 4.0
  x = jax.random.normal(jax.random.PRNGKey(0), (int(gamma * d), d))
  eig = np.asarray(jnp.linalg.eigvalsh(x.T @ x / x.shape[0]))
  lo, hi = (float(e) for e in spectra.marchenko_pastur_edges(gamma))
  assert abs(eig.min() - lo) < 0.1 * lo + 0.02 and abs(eig.max() - hi) < 0.05 * hi
  np.testing.assert_allclose(float(spectra.marchenko_pastur_condition_number(2.0)), 5.83,
                             atol=0.01)   # App D.3: 5.8 at gamma = 2, 3.0 at gamma = 4
  np.testing.assert_allclose(float(spectra.marchenko_pastur_condition_number(4.0)), 3.0)


def test_gaussian_product_curve_rises():
  key = jax.random.PRNGKey(0)
  vals = [float(jnp.mean(spectra.gaussian_product_effective_rank(key, g, 16, 2)))
          for g in (0.5, 4.0)]
  assert 0.2 < vals[0] < vals[1] < 1.0


def test_closed_form_moments():
  relu = spectra.activation_moments("relu")
  np.testing.assert_allclose(relu.coherence, 1 / math.pi, rtol=1e-11)
  np.testing.assert_allclose(relu.survival, 0.5, rtol=1e-11)
  np.testing.assert_allclose(relu.kappa, 0.5, rtol=1e-11)
  np.testing.assert_allclose(relu.width_threshold, 2.0, rtol=1e-11)
  ab = spectra.activation_moments("abs")
  np.testing.assert_allclose(ab.coherence, 2 / math.pi, rtol=1e-11)
  np.testing.assert_allclose(ab.survival, 1.0, rtol=1e-11)
  assert spectra.coherence_constant("tanh") == 0.0
  assert spectra.activation_moments("swiglu").coherence == 0.0


def test_smooth_moments_match_paper_and_adaptive_quadrature():
  # Table 1: c = 0.187 (GELU), 0.120 (SiLU); Sec 6 / App D.4: p = 0.46, 0.38;
  # full-rank thresholds 1/p "about 2.2x" and "2.6x".
  for name, c_paper, p_paper, thr_paper in (("gelu", 0.187, 0.46, 2.2),
                                             ("silu", 0.120, 0.38, 2.6)):
    mom = spectra.activation_moments(name)
    assert abs(mom.coherence - c_paper) < 1e-3
    assert round(mom.survival, 2) == p_paper
    assert round(mom.width_threshold, 1) == thr_paper
    act, dact = spectra.NUMPY_ACTIVATIONS[name]
    phi = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    quad = lambda f: integrate.quad(lambda z: f(np.asarray(z)) * phi(z), -40, 40,
                                    epsabs=1e-14, epsrel=1e-13, limit=400)[0]
    e1, e2, ed = quad(act), quad(lambda z: act(z) ** 2), quad(lambda z: dact(z) ** 2)
    np.testing.assert_allclose(mom.coherence, e1 * e1 / e2, rtol=1e-10)
    np.testing.assert_allclose(mom.survival, ed, rtol=1e-10)
  # The paper's spike bound s = 1/c for GELU is quoted as 5.35 (from c rounded to 0.187).
  assert abs(1 / 0.187 - 5.35) < 5e-3


def test_gelu_numpy_matches_model_activation():
  from rankjax._src.models.blocks import ACTIVATIONS
  z = np.linspace(-5, 5, 101)
  for name in ("relu", "abs", "gelu", "silu", "tanh"):
    np.testing.assert_allclose(spectra.NUMPY_ACTIVATIONS[name][0](z),
                               np.asarray(ACTIVATIONS[name](jnp.asarray(z))), atol=1e-6)
  assert special.erf(0.0) == 0.0
