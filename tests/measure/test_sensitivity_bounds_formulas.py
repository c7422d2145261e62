"""Sec 4 bounds of the softmax-sensitivity paper against the paper's formulas.

Each bound is recomputed here from its formula with numpy only (spectral norms by
SVD, theta by enumerating every subset of each attention row, GELU's slope on a grid),
so a bound that is valid but inflated, or built from the wrong norms, fails.
"""
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.measure import sensitivity_bounds as bounds

RTOL = 1e-10


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


def _spec(w):
  return np.linalg.svd(np.asarray(w, np.float64), compute_uv=False)[0]


def _theta_brute(p):
  """Def 3.1: theta(p) = max over subsets S of 4 p(S) (1 - p(S))."""
  best = 0.0
  for mask in itertools.product((0, 1), repeat=len(p)):
    s = float(np.dot(mask, p))
    best = max(best, 4 * s * (1 - s))
  return best


def _probs(u, wq, wk, tau, causal):
  T, d_h = u.shape[0], wq.shape[-1]
  out = []
  for h in range(wq.shape[0]):
    s = (u @ wq[h]) @ (u @ wk[h]).T / (tau * math.sqrt(d_h))
    if causal:
      s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    out.append(e / e.sum(-1, keepdims=True))
  return np.array(out)


def _weights(rng, d, heads, d_h, scale):
  w = lambda *s: scale * rng.standard_normal(s) / math.sqrt(s[-2])
  return w(heads, d, d_h), w(heads, d, d_h), w(heads, d, d_h), w(heads * d_h, d)


@pytest.mark.parametrize("causal", [False, True])
def test_thm41_local_bound_is_the_formula(x64, causal):
  """Thm 4.1: ||W^O||_2 sum_h (||W_h^V||_2 + theta_h/tau Phi_h), Phi_h = 2 B_U^2 /
  sqrt(d_h) ||W_h^Q|| ||W_h^K|| ||W_h^V||, B_U = max_i ||u_i||_2, theta_h = max_i theta."""
  rng = np.random.default_rng(3)
  T, d, H, d_h, tau = 6, 8, 2, 4, 0.7
  wq, wk, wv, wo = _weights(rng, d, H, d_h, 1.3)
  u = 1.5 * rng.standard_normal((T, d))
  probs = _probs(u, wq, wk, tau, causal)
  theta = [max(_theta_brute(row) for row in probs[h]) for h in range(H)]
  b_u = np.linalg.norm(u, axis=-1).max()
  phi = [2 * b_u ** 2 / math.sqrt(d_h) * _spec(wq[h]) * _spec(wk[h]) * _spec(wv[h])
         for h in range(H)]
  want = _spec(wo) * sum(_spec(wv[h]) + theta[h] / tau * phi[h] for h in range(H))
  out = bounds.mha_local_bound(jnp.asarray(u), jnp.asarray(wq), jnp.asarray(wk),
                               jnp.asarray(wv), jnp.asarray(wo), tau, causal)
  np.testing.assert_allclose(float(out["bound"]), want, rtol=RTOL)
  np.testing.assert_allclose(np.asarray(out["theta_tilde"]), theta, rtol=RTOL)
  np.testing.assert_allclose(np.asarray(out["phi"]), phi, rtol=RTOL)
  np.testing.assert_allclose(float(out["b_bar"]), b_u, rtol=RTOL)


def test_cor42_lipschitz_bound_is_the_formula(x64):
  """Cor 4.2: ||W^O|| sum_h (||W_h^V|| + 2 d B^2 / (tau sqrt(d_h)) ||W_h^Q|| ||W_h^K||
  ||W_h^V||)."""
  rng = np.random.default_rng(4)
  d, H, d_h, tau, B = 12, 3, 4, 1.5, 0.8
  wq, wk, wv, wo = _weights(rng, d, H, d_h, 1.0)
  want = _spec(wo) * sum(_spec(wv[h]) + 2 * d * B ** 2 / (tau * math.sqrt(d_h))
                         * _spec(wq[h]) * _spec(wk[h]) * _spec(wv[h]) for h in range(H))
  got = bounds.mha_lipschitz_bound(*(jnp.asarray(w) for w in (wq, wk, wv, wo)), B, tau)
  np.testing.assert_allclose(float(got), want, rtol=RTOL)


def test_gelu_lipschitz_constant_is_its_largest_slope(x64):
  x = jnp.linspace(-6.0, 6.0, 240001)
  slope = jax.vmap(jax.grad(lambda v: jax.nn.gelu(v, approximate=False)))(x)
  np.testing.assert_allclose(bounds.gelu_lipschitz(), float(jnp.max(jnp.abs(slope))), rtol=1e-9)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_thm43_thm44_layer_bounds_are_the_formulas(x64, placement):
  """Sec 4.2 constants B_LN = max_j (||gamma_j||_inf + ||beta_j||_inf), L_LN = max_j
  ||gamma_j||_inf / sqrt(eps_j); L_FFN = ||W_2|| Lip(GELU) ||W_1||; Thm 4.3
  (1 + L_LN L_MHA)(1 + L_LN L_FFN), Thm 4.4 L_LN^2 (1 + L_MHA)(1 + L_FFN), with L_MHA
  Cor 4.2's constant at B = B_LN."""
  rng = np.random.default_rng(5)
  d, H, d_h, d_ff, tau = 8, 2, 4, 16, 1.0
  wq, wk, wv, wo = _weights(rng, d, H, d_h, 1.0)
  w1 = rng.standard_normal((d, d_ff)) / math.sqrt(d)
  w2 = rng.standard_normal((d_ff, d)) / math.sqrt(d_ff)
  gam = 1.0 + 0.3 * rng.standard_normal((3, d))
  bet = 0.2 * rng.standard_normal((3, d))
  eps = np.array([0.5, 0.2, 0.8])
  b_ln = np.max(np.abs(gam).max(-1) + np.abs(bet).max(-1))
  l_ln = np.max(np.abs(gam).max(-1) / np.sqrt(eps))
  l_mha = _spec(wo) * sum(_spec(wv[h]) + 2 * d * b_ln ** 2 / (tau * math.sqrt(d_h))
                          * _spec(wq[h]) * _spec(wk[h]) * _spec(wv[h]) for h in range(H))
  gelu_slope = 0.5 * (1 + math.erf(1)) + math.sqrt(2) * math.exp(-1) / math.sqrt(2 * math.pi)
  l_ffn = _spec(w2) * gelu_slope * _spec(w1)
  want = ((1 + l_ln * l_mha) * (1 + l_ln * l_ffn) if placement == "pre"
          else l_ln ** 2 * (1 + l_mha) * (1 + l_ffn))
  out = bounds.layer_lipschitz_bound(
      placement, w_q=jnp.asarray(wq), w_k=jnp.asarray(wk), w_v=jnp.asarray(wv),
      w_o=jnp.asarray(wo), w1=jnp.asarray(w1), w2=jnp.asarray(w2),
      ln_gamma_JxD=jnp.asarray(gam), ln_beta_JxD=jnp.asarray(bet), ln_eps=jnp.asarray(eps))
  for key, value in (("b_ln", b_ln), ("l_ln", l_ln), ("l_mha", l_mha), ("l_ffn", l_ffn),
                     ("bound", want)):
    np.testing.assert_allclose(float(out[key]), value, rtol=RTOL, err_msg=key)
