"""Closed-form forward predictions of the postnorm paper (Thm 3.2, Cor 3.3, Thm 3.4,
App C) against direct Monte Carlo of the surrogate sublayers and independent
quadrature."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special

from rankjax._src.measure import gradients as gr
from rankjax._src.measure import similarity as sim
from rankjax._src.measure import theory as th

N, D, D_FF = 64, 256, 768


def _silu(u):
  return u * special.expit(u)


# ---------------------------------------------------------------------------
# Closure and constants.

@pytest.mark.parametrize("t", [0.0, 1.0 / N, 0.37, 1.0])
def test_closure_sampler_is_exact(x64, t):
  x = th.sample_equal_correlation(jax.random.PRNGKey(0), t, N, D, shape=(2,))
  assert x.shape == (2, N, D)
  gram = np.asarray(x[1] @ x[1].T)
  np.testing.assert_allclose(gram, np.asarray(th.equal_correlation_gram(t, N, D)),
                             atol=1e-9 * D)
  np.testing.assert_allclose(np.diag(gram), D, rtol=1e-12)
  np.testing.assert_allclose(np.asarray(sim.token_similarity(x)), t, atol=1e-12)


def test_closure_gram_traces_and_inexact_sampler(x64):
  t, n, d = 0.3, 16, 8                                   # d < n: Gaussian sampler
  r = np.asarray(th.equal_correlation_gram(t, n, d))
  pi = np.full((n, n), 1.0 / n)
  assert np.trace(pi @ r) / np.trace(r) == pytest.approx(t, rel=1e-12)   # Eq. (4)
  with pytest.raises(ValueError):
    th.sample_equal_correlation(jax.random.PRNGKey(0), t, n, d)
  x = th.sample_equal_correlation(jax.random.PRNGKey(1), t, n, d, shape=(2000,),
                                  exact=False)
  mean_gram = np.asarray(jnp.mean(x @ jnp.swapaxes(x, -1, -2), axis=0))
  np.testing.assert_allclose(mean_gram, r, atol=0.15 * d)


def test_standard_init_constants(x64):
  d, d_ff = 512, 1536
  sw = th.folded_attention_variance(d)
  assert float(sw) == pytest.approx(1.0 / (9 * d))
  assert float(th.amount_of_attention_postnorm(d, sw)) == pytest.approx(1.0 / 9)
  assert float(th.swiglu_xi(d, d_ff)) == pytest.approx(1.0 / 9)
  assert float(th.harmonic_number(2048)) == pytest.approx(
      sum(1.0 / k for k in range(1, 2049)), rel=1e-12)


def test_amount_of_attention(x64):
  d, n = 32, 8
  sw = th.folded_attention_variance(d)
  x = th.sample_equal_correlation(jax.random.PRNGKey(0), 0.5, n, d)   # ||X||^2 = n d
  assert float(th.amount_of_attention(x, sw)) == pytest.approx(d * float(sw), rel=1e-12)
  # A Pre-Norm stream with 3x the squared norm has a third of the attention.
  assert float(th.amount_of_attention(np.sqrt(3) * x, sw)) == pytest.approx(
      d * float(sw) / 3, rel=1e-12)
  s_l = th.amount_of_attention_prenorm(jnp.arange(1, 5), 1 / 9, growth_per_layer=0.5)
  np.testing.assert_allclose(np.asarray(s_l), [1 / 9 / (1 + 0.5 * k) for k in range(4)])
  m1 = th.swiglu_moment(1.0)
  g = th.prenorm_growth_per_layer(1 / 9, 0.5, n, 1 / 9, m1)
  assert float(g) == pytest.approx(float(th.f2(0.5, n)) / 9 + float(m1) / 9, rel=1e-12)


# ---------------------------------------------------------------------------
# Attention: Thm 3.2, Thm C.3, Cor 3.3.

def test_f1_f2_match_the_rho_forms_of_app_c3(x64):
  """f_1, f_2 equal the paper's pre-substitution expressions in rho (App C.3)."""
  for n in (8, 64, 2048):
    h = sum(1.0 / k for k in range(1, n + 1))
    t = np.linspace(0.0, 1.0, 11)
    rho = (n * t - 1) / (n - 1)
    f1_rho = rho * (1 - t) + (1 - rho) / n * (2 - h / n - t * h)
    f2_rho = rho + (1 - rho) / n * h
    np.testing.assert_allclose(np.asarray(th.f1(t, n)), f1_rho, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(np.asarray(th.f2(t, n)), f2_rho, rtol=1e-10)


def test_delta_attn_sign_monotonicity_and_intervention(x64):
  for n in (16, 64, 2048):
    t = np.linspace(1.0 / n, 1.0, 400, endpoint=False)
    for s in (1 / 9, 2 / 9, 4 / 9, 10.0):
      assert np.all(np.asarray(th.delta_attn(s, t, n)) > 0)        # remark after Thm 3.2
    assert float(th.delta_attn(1 / 9, 1.0, n)) == pytest.approx(0.0, abs=1e-15)
    s_grid = np.linspace(0.01, 2, 50)
    assert np.all(np.diff(np.asarray(th.delta_attn(s_grid, 0.4, n))) > 0)
    alphas = np.linspace(0, 1, 21)
    de = np.asarray(th.delta_de(1 / 9, 0.4, n, alphas))
    assert np.all(np.diff(de) < 0) and de[-1] == pytest.approx(0.0, abs=1e-15)   # Cor 3.3
    assert de[0] == pytest.approx(float(th.delta_attn(1 / 9, 0.4, n)), rel=1e-14)


def test_conditional_moments_reduce_to_thm_c3(x64):
  """Lemma C.11 with P = C_n and a closure X reproduces Thm C.3 exactly."""
  sw = th.folded_attention_variance(D)
  c = sim.prefix_average_matrix(N, jnp.float64)
  for t in (0.05, 0.5, 0.95):
    x = th.sample_equal_correlation(jax.random.PRNGKey(3), t, N, D)
    a = th.attention_conditional_moments(x, c, sw)
    b = th.attention_second_moments(t, N, D, sw)
    assert float(a.proj) == pytest.approx(float(b.proj), rel=1e-10)
    assert float(a.total) == pytest.approx(float(b.total), rel=1e-10)


@functools.partial(jax.jit, static_argnames=("num",))
def _attention_mc(key, x_NxD, scale, sigma_w2, num):
  """Y = X + scale * C_n X W for ``num`` antithetic pairs (W, -W), W_ij ~ N(0, sigma_W^2)."""
  c = sim.prefix_average_matrix(N)
  w = jax.random.normal(key, (num, D, D)) * jnp.sqrt(sigma_w2)
  b = scale * jnp.einsum("nd,kde->kne", c @ x_NxD, w)
  tsim = 0.5 * (sim.token_similarity(x_NxD + b) + sim.token_similarity(x_NxD - b))
  proj_b = N * jnp.sum(jnp.mean(b, axis=1) ** 2, axis=-1)       # ||Pi C X W||^2
  row_sq = jnp.sum((x_NxD + b) ** 2, axis=-1)                   # ||Y_i||^2
  return tsim, proj_b, jnp.sum(b * b, axis=(1, 2)), row_sq


_slow = lambda *args: pytest.param(*args, marks=pytest.mark.slow)


@pytest.mark.parametrize("t,var_mult,alpha", [   # fast: one Thm 3.2 and one Cor 3.3 case
    _slow(0.1, 1.0, 0.0), (0.5, 1.0, 0.0), _slow(0.9, 1.0, 0.0),   # Thm 3.2, standard init
    _slow(0.5, 4.0, 0.0),                                 # the x4 variance of Fig 1
    _slow(0.5, 1.0, 0.5), (0.9, 4.0, 0.75),               # Cor 3.3
])
def test_thm32_cor33_against_monte_carlo(t, var_mult, alpha):
  """E_W[t_sim(X + (1-alpha) C_n X W)] - t vs Delta_attn / Delta_de (n=64, d=256)."""
  sigma_w2 = var_mult * float(th.folded_attention_variance(D))
  s = float(th.amount_of_attention_postnorm(D, sigma_w2))
  x = th.sample_equal_correlation(jax.random.PRNGKey(0), t, N, D)
  num = 128
  tsim, proj_b, tot_b, row_sq = _attention_mc(jax.random.PRNGKey(1), x, 1.0 - alpha,
                                              sigma_w2, num)
  mc = float(jnp.mean(tsim)) - t
  se = float(jnp.std(tsim)) / np.sqrt(num)
  pred = float(th.delta_de(s, t, N, alpha))
  assert pred > 0 and mc > 0
  assert abs(mc - pred) < 0.04 * pred + 3 * se, (mc, pred, se)
  # The second moments of Thm C.3 are exact expectations: branch parts within MC error.
  m = th.attention_second_moments(t, N, D, (1 - alpha) ** 2 * sigma_w2)
  np.testing.assert_allclose(float(jnp.mean(proj_b)), float(m.proj) - N * D * t, rtol=0.03)
  np.testing.assert_allclose(float(jnp.mean(tot_b)), float(m.total) - N * D, rtol=0.03)
  if alpha == 0.0:                         # Lemma C.5 row profile a + b/i
    rows = np.asarray(th.attention_row_norms_sq(t, N, D, sigma_w2))
    np.testing.assert_allclose(np.asarray(jnp.mean(row_sq, axis=0)), rows, rtol=0.03)


# ---------------------------------------------------------------------------
# SwiGLU: m(rho), Thm 3.4, App C.4.

def test_swiglu_moment_endpoints_against_1d_quadrature(x64):
  var = 1.0 / 3.0
  dens = lambda u: np.exp(-u * u / (2 * var)) / np.sqrt(2 * np.pi * var)
  e_silu = integrate.quad(lambda u: _silu(u) * dens(u), -np.inf, np.inf, epsabs=1e-13)[0]
  e_silu2 = integrate.quad(lambda u: _silu(u) ** 2 * dens(u), -np.inf, np.inf,
                           epsabs=1e-13)[0]
  m0, m1 = float(th.swiglu_moment(0.0)), float(th.swiglu_moment(1.0))
  assert m0 == pytest.approx(e_silu**2, rel=1e-10)
  assert m1 == pytest.approx(e_silu2, rel=1e-10)
  assert float(th.swiglu_moment(-1.0)) == pytest.approx(
      integrate.quad(lambda u: _silu(u) * _silu(-u) * dens(u), -np.inf, np.inf)[0], rel=1e-9)
  # The paper's reported values (App C.4, Fig 7): m(0) ~ 0.006, m(1) ~ 0.100.
  assert round(m0, 3) == 0.006 and round(m1, 3) == 0.100


def test_swiglu_moment_against_monte_carlo():
  rho = jnp.array([-0.6, 0.0, 0.3, 0.8, 1.0])
  num = 200_000
  z1, z2 = jax.random.normal(jax.random.PRNGKey(0), (2, num))
  sd = np.sqrt(1 / 3)
  u = sd * z1
  v = sd * (rho[:, None] * z1 + jnp.sqrt(1 - rho[:, None] ** 2) * z2)
  vals = jax.nn.silu(u) * jax.nn.silu(v)
  mc, se = jnp.mean(vals, axis=1), jnp.std(vals, axis=1) / np.sqrt(num)
  gh = th.swiglu_moment(rho)
  assert bool(jnp.all(jnp.abs(mc - gh) < 5 * se)), (mc, gh, se)


def test_swiglu_moment_shape_convergence_and_monotonicity(x64):
  rho = np.linspace(0.0, 1.0, 101)
  m = np.asarray(th.swiglu_moment(rho))
  np.testing.assert_allclose(np.asarray(th.swiglu_moment(rho, num_nodes=96)), m,
                             rtol=1e-12)
  assert np.all(np.diff(m) > 0) and np.all(np.diff(rho * m) > 0)    # Fig 7 remark
  grid = th.swiglu_moment(jnp.zeros((2, 3)), var_u=jnp.array([[0.1], [1.0]]))
  assert grid.shape == (2, 3)


def test_delta_ffn_sign_bound_and_moments(x64):
  xi = 1 / 9
  m1 = float(th.swiglu_moment(1.0))
  for n in (16, 2048):
    t = np.linspace(1.0 / n, 1.0, 200, endpoint=False)[1:]
    dffn = np.asarray(th.delta_ffn(xi, t, n))
    assert np.all(dffn < 0) and np.all(np.abs(dffn) <= xi * m1)      # Thm 3.4 remark
    mom = th.ffn_second_moments(t, n, 32, xi)
    np.testing.assert_allclose(np.asarray(mom.similarity) - t, dffn, rtol=1e-9, atol=1e-15)
  assert xi * m1 == pytest.approx(0.011, abs=5e-4)                   # "about 0.011"


@functools.partial(jax.jit, static_argnames=("num",))
def _swiglu_mc(key, x_NxD, num):
  k1, k2, k3 = jax.random.split(key, 3)
  w1 = jax.random.normal(k1, (num, D, D_FF)) / np.sqrt(3 * D)
  w3 = jax.random.normal(k2, (num, D, D_FF)) / np.sqrt(3 * D)
  w2 = jax.random.normal(k3, (num, D_FF, D)) / np.sqrt(3 * D_FF)
  r = jax.nn.silu(jnp.einsum("nd,kdf->knf", x_NxD, w1)) * jnp.einsum("nd,kdf->knf", x_NxD, w3)
  b = jnp.einsum("knf,kfd->knd", r, w2)
  tsim = 0.5 * (sim.token_similarity(x_NxD + b) + sim.token_similarity(x_NxD - b))
  return tsim, N * jnp.sum(jnp.mean(b, axis=1) ** 2, axis=-1), jnp.sum(b * b, axis=(1, 2))


@pytest.mark.parametrize("t", [_slow(0.1), 0.5, _slow(0.9)])
def test_thm34_against_monte_carlo(t):
  """SwiGLU sublayer with the standard init (xi = 1/9) on closure inputs."""
  xi = float(th.swiglu_xi(D, D_FF))
  x = th.sample_equal_correlation(jax.random.PRNGKey(0), t, N, D)
  num = 32
  tsim, proj_b, tot_b = _swiglu_mc(jax.random.PRNGKey(2), x, num)
  mc = float(jnp.mean(tsim)) - t
  se = float(jnp.std(tsim)) / np.sqrt(num)
  pred = float(th.delta_ffn(xi, t, N))
  assert pred < 0 and mc < 0
  assert abs(mc - pred) < 0.05 * abs(pred) + 3 * se, (mc, pred, se)
  m = th.ffn_second_moments(t, N, D, xi)
  np.testing.assert_allclose(float(jnp.mean(proj_b)), float(m.proj) - N * D * t, rtol=0.05)
  np.testing.assert_allclose(float(jnp.mean(tot_b)), float(m.total) - N * D, rtol=0.03)


# ---------------------------------------------------------------------------
# RMS rescaling: App C.5-C.6.

def test_rms_similarity_bounds_hold(x64):
  """Thm C.6 on random diagonal T and Y, with shared components of random size."""
  rng = np.random.default_rng(0)
  k, n, d = 4000, 8, 5
  y = (rng.normal(size=(k, n, d))
       + rng.normal(size=(k, 1, 1)) * 3 * rng.normal(size=(k, 1, d)))
  scale = np.exp(0.3 * rng.normal(size=(k, 1)) * rng.normal(size=(k, n)))
  eta = np.asarray(th.rms_spread(scale))
  lo, hi = th.rms_similarity_bounds(sim.token_similarity(y), eta)
  lo, hi = np.asarray(lo), np.asarray(hi)
  t_ty = np.asarray(sim.token_similarity(scale[..., None] * y))
  ok = eta < 1
  assert 0.3 < ok.mean() < 1.0
  assert np.all(lo[ok] - 1e-12 <= t_ty[ok]) and np.all(t_ty[ok] <= hi[ok] + 1e-12)
  assert np.all(np.isnan(lo[~ok])) and np.all(np.isnan(hi[~ok]))
  assert np.mean(lo[ok] > 0) > 0.1             # the lower bound is not always trivial


def test_rms_spread_and_factors(x64):
  assert float(th.rms_spread(np.array([1.0, 2.0, 3.0]))) == pytest.approx(0.5)
  y = np.array([[2.0, 0.0], [0.0, 1.0]])
  np.testing.assert_allclose(np.asarray(gr.rms_factor(y)), [1 / np.sqrt(2), np.sqrt(2)])
  rows = th.attention_row_norms_sq(0.5, N, D, th.folded_attention_variance(D))
  eta = float(th.rms_spread_from_row_norms(rows, D))
  assert 0 < eta < 0.1                      # small spread: first rows are a bit longer
  assert float(th.ffn_row_norm_sq(D, 1 / 9, 0.1)) == pytest.approx(D * (1 + 0.1 / 9))
