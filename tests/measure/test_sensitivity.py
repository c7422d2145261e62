"""Tests for rankjax._src.measure.sensitivity and sensitivity_bounds.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability".
Each check is independent of the code under test where it can be: the operator
norm from autodiff and sign enumeration (Thm 3.2), subsets by numpy brute force,
the MHA Jacobian from ``jax.jacfwd`` of an MHA written here, statistics by numpy.
"""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.measure import sensitivity as sens
from rankjax._src.measure import sensitivity_certificates as certs
from rankjax._src.measure import sensitivity_bounds as bounds


def _rows(rng, n, L, scale=1.0):
  u = scale * rng.standard_normal((n, L))
  p = np.exp(u - u.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


PAD = 28  # rows of different lengths are zero-padded to one width: one compile


def _pad(p, width=PAD):
  p = np.atleast_2d(np.asarray(p, np.float64))
  return np.concatenate([p, np.zeros((p.shape[0], width - p.shape[1]))], -1)


@functools.partial(jax.jit, static_argnames="methods")
def _certify(p, methods):
  """``theta_certificate(p, m)`` for each of ``methods``, in one compiled program."""
  return tuple(sens.theta_certificate(p, m) for m in methods)


def _theta_brute(p_RxL):
  """Def 3.1 by numpy brute force over all 2^L subsets (chunked)."""
  R, L = p_RxL.shape
  best = np.zeros(R)
  for start in range(0, 2 ** L, 2 ** 14):
    idx = np.arange(start, min(start + 2 ** 14, 2 ** L))
    masks = ((idx[:, None] >> np.arange(L)) & 1).astype(np.float64)
    q = p_RxL @ masks.T
    r = p_RxL @ (1.0 - masks).T
    best = np.maximum(best, (4.0 * q * r).max(-1))
  return best


# ------------------------------------------------------------------ Thm 3.2


@pytest.mark.parametrize("L", [pytest.param(4, marks=pytest.mark.slow), 8,
                               pytest.param(12, marks=pytest.mark.slow)])
def test_inf_to_one_norm_equals_theta_over_tau(x64, L):
  rng = np.random.default_rng(L)
  u = rng.standard_normal((16, L))
  for tau in (0.5, 1.0, 2.0):
    p = np.asarray(jax.nn.softmax(jnp.asarray(u) / tau))
    lhs = np.asarray(sens.softmax_jacobian_inf_to_one(u, tau))
    rhs = np.asarray(sens.theta_exact(_pad(p, 16))) / tau  # zero atoms change nothing
    assert lhs.dtype == np.float64
    np.testing.assert_array_less(np.abs(lhs - rhs) / rhs, 1e-12)


def test_theta_enumerate_jit_and_batch(x64):
  p = _pad(_rows(np.random.default_rng(0), 12, 10), 16)
  out = jax.jit(sens.theta_enumerate)(p.reshape(3, 4, 16))
  assert out.shape == (3, 4)
  np.testing.assert_allclose(out.reshape(-1), _theta_brute(p[:, :10]), rtol=1e-13)


# ------------------------------------------------------------ exact theta


@pytest.mark.parametrize("L,n", [(6, 40), (11, 20), (16, 8), (20, 3)])
def test_mitm_equals_brute_force(x64, L, n):
  rng = np.random.default_rng(100 + L)
  p = _rows(rng, n, L, scale=rng.uniform(0.5, 3.0))
  p[0, : L // 3] = 0.0  # masked positions
  p[0] /= p[0].sum()
  p[-1] = _rows(rng, 1, L, scale=8.0)[0]  # likely a dominant atom
  want = _theta_brute(p)
  got = sens.theta_mitm(p)
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
  np.testing.assert_array_equal(sens.theta_mitm(p, workers=1), got)  # threads: same blocks
  np.testing.assert_array_equal(sens.theta_mitm(p.reshape(n, 1, L), workers=3)[:, 0], got)
  if L <= sens.MAX_ENUMERATE_L:
    np.testing.assert_allclose(np.asarray(sens.theta_enumerate(_pad(p, 16))), want, rtol=1e-12)


def test_theta_exact_dispatch(x64):
  p = _rows(np.random.default_rng(1), 4, 24)
  out = sens.theta_exact(p)
  assert isinstance(out, np.ndarray) and out.shape == (4,)
  with pytest.raises(TypeError):
    jax.jit(sens.theta_exact)(p)


# ------------------------------------------------------------ certificates


def test_certificates_are_lower_bounds(x64):
  rng = np.random.default_rng(0)
  paper = _pad([0.4, 0.3, 0.2, 0.1])  # App D.2's example: greedy 0.96, optimum 1
  p = np.concatenate([paper] + [_pad(_rows(rng, 100, L, scale)) for L in (8, 16, 28)
                                for scale in (1.0, 3.0)])
  exact = sens.theta_mitm(p)
  greedy, balance = map(np.asarray, _certify(p, ("greedy_prefix", "balance")))
  np.testing.assert_allclose([greedy[0], balance[0], exact[0]], [0.96, 1.0, 1.0], rtol=1e-12)
  p_max = p.max(-1)
  assert np.all(greedy <= exact + 1e-12) and np.all(balance <= exact + 1e-12)
  assert np.all(balance >= greedy)  # by construction
  assert balance.mean() > greedy.mean()
  assert np.all(greedy >= 1.0 - p_max ** 2 - 1e-12)  # Cor 3.4(5), App B case 5
  lower, upper = map(np.asarray, sens.theta_bracket(p))
  assert np.all(lower <= exact + 1e-12) and np.all(exact <= upper + 1e-12)
  dom = p_max >= 0.5
  np.testing.assert_allclose(lower[dom], exact[dom], rtol=1e-12)
  np.testing.assert_allclose(upper[dom], exact[dom], rtol=1e-12)


def test_certificate_masks_and_batch_axes(x64):
  rng = np.random.default_rng(3)
  p = np.concatenate([_pad(_rows(rng, 100, L, 2.0)) for L in (8, 16, 28)] * 2 + [_pad([1.0])])
  shuffled = np.stack([row[rng.permutation(PAD)] for row in p])  # zeros anywhere
  methods = ("greedy_prefix", "repair", "balance")  # sums in position order: ulps apart
  for got, want in zip(_certify(p, methods), _certify(shuffled, methods)):
    np.testing.assert_allclose(got, want, rtol=1e-14)
  out = sens.theta_certificate(p.reshape(1, -1, 1, PAD), "greedy_prefix")
  assert out.shape == (1, p.shape[0], 1)
  with pytest.raises(ValueError):
    sens.theta_certificate(p, "nope")


@jax.jit
def _greedy_sorted(p):
  """App D.2 steps 1-4 literally (sort, cumsum, argmin |c_k - 1/2|), jnp in p's dtype:
  the independent reference of the sort-free greedy prefix."""
  c = jnp.cumsum(-jnp.sort(-p, axis=-1), axis=-1)
  k = jnp.argmin(jnp.abs(c - 0.5), axis=-1)
  ck = jnp.take_along_axis(c, k[..., None], axis=-1)[..., 0]
  return 4.0 * ck * (1.0 - ck)


@jax.jit
def _batched_greedy_and_sorted(p):
  """The sort-free greedy prefix of ``p`` as a (2, 3, 20) batch, and the sorted one."""
  return sens.theta_certificate(p.reshape(2, 3, 20, -1), "greedy_prefix"), _greedy_sorted(p)


@jax.jit
def _greedy_sorted_and_vmapped(p):
  """The sort-free greedy prefix, the sorted one, and the sort-free one under vmap."""
  return (sens.theta_certificate(p, "greedy_prefix"), _greedy_sorted(p),
          jax.vmap(lambda r: sens.theta_certificate(r, "greedy_prefix"))(p))


def _tied_rows(width):
  """Rows with ties at and around the greedy boundary, zeros, and unnormalized rows."""
  rows = [np.full(width, 1.0 / width), np.r_[np.full(3, 1 / 3), np.zeros(width - 3)],
          np.r_[np.full(5, 0.2), np.zeros(width - 5)], np.r_[[0.25] * 2, [1 / 16] * 8,
                                                            np.zeros(width - 10)],
          np.eye(width)[3], np.r_[np.full(7, 1 / 7), np.zeros(width - 7)],
          np.r_[[0.375, 0.125, 0.125, 0.125, 0.0625, 0.0625, 0.0625, 0.0625],
                np.zeros(width - 8)],  # boundary inside a tie group
          np.zeros(width), np.r_[[0.2, 0.1], np.zeros(width - 2)],  # total <= 1/2
          np.r_[[0.75, 0.5, 0.25], np.zeros(width - 3)]]  # total 1.5
  rng = np.random.default_rng(12)
  for k in (4, 16, width):  # masses on a 1/32 grid: many ties, exact sums
    q = rng.integers(0, 5, k).astype(np.float64)
    q[0] += 1
    q = np.floor(32 * q / q.sum()) / 32
    q[0] += 1.0 - q.sum()
    rows.append(np.r_[rng.permutation(q), np.zeros(width - k)])
  return np.stack(rows)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_greedy_prefix_sort_free_equals_sorted(dtype):
  """The bisection greedy (App D.2 without a sort) picks the sort's prefix: the values
  agree up to summation order on continuous, masked, tied and unnormalized rows, and
  batched shapes and vmap give the same."""
  with jax.enable_x64(dtype == "float64"):
    rng = np.random.default_rng(21)
    rtol = 1e-13 if dtype == "float64" else 2e-6
    for L in (1, 7, 64, 300):
      p = np.concatenate([_rows(rng, 40, L, scale) for scale in (0.5, 1.0, 4.0)])
      if L > 2:
        p[:10, : L // 3] = 0.0  # masked positions
      p = p.astype(dtype)
      got, want = map(np.asarray, _batched_greedy_and_sorted(p))
      assert got.shape == (2, 3, 20) and got.dtype == np.dtype(dtype)
      np.testing.assert_allclose(got.reshape(-1), want, rtol=rtol, atol=0)
    ties = _tied_rows(32).astype(dtype)
    got, want, vm = map(np.asarray, _greedy_sorted_and_vmapped(ties))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0)
    np.testing.assert_allclose(got[:8], [1.0, 8 / 9, 0.96, 1.0, 0.0, 48 / 49, 1.0, 0.0],
                               rtol=rtol)
    np.testing.assert_allclose(vm, got, rtol=rtol)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_certificates_never_exceed_exact_small_L(dtype):
  """Both certificates <= theta by enumeration (L <= 16), in either dtype, and
  balance >= greedy prefix, on random rows (float32 rows are checked against the exact
  theta of their own float32 values, up to float32 rounding)."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(22)
    p = np.concatenate([_pad(_rows(rng, 60, L, s), 16) for L in (3, 8, 13, 16)
                        for s in (0.7, 2.0)] + [_pad(r, 16) for r in _tied_rows(16)[:8]])
    p = p.astype(dtype).astype(np.float64)
    exact = np.asarray(sens.theta_exact(p))
  with jax.enable_x64(dtype == "float64"):
    greedy, balance = map(np.asarray, _certify(p.astype(dtype), ("greedy_prefix", "balance")))
  tol = 1e-12 if dtype == "float64" else 1e-6
  assert np.all(greedy <= exact + tol) and np.all(balance <= exact + tol)
  assert np.all(balance >= greedy)
  assert np.mean(balance > greedy + tol) > 0.2


def _greedy_numpy(p):
  """App D.2 by a numpy sort in float64: the descending cumsums ``c_k`` and the best
  ``4 c_k (1 - c_k)`` (= at ``argmin |c_k - 1/2|``, without its ties when every
  ``|c_k - 1/2|`` rounds to 1/2)."""
  c = np.cumsum(np.sort(np.asarray(p, np.float64), axis=-1)[..., ::-1], axis=-1)
  return (4.0 * c * (1.0 - c)).max(-1)


def _hard_rows(width, dtype):
  """Rows aimed at the interpolation search: atoms one ulp apart at the boundary,
  dominant atoms, huge dynamic range, total mass <= 1/2, tie groups straddling 1/2."""
  rng = np.random.default_rng(31)
  rows = []
  for _ in range(6):  # near-ties: atoms 0..3 ulps apart around the boundary value
    base = np.full(width, 0.0, dtype)
    v = dtype(1.0 / (width // 2))
    k = width // 2
    base[:k] = v
    base[:k] = np.nextafter(base[:k], dtype(1.0)) if rng.random() < 0.5 else base[:k]
    base[rng.integers(0, k, 3)] = np.nextafter(v, dtype(0.0))
    base[k:k + 4] = v * dtype(1e-3)
    rows.append(base)
  rows.append(np.r_[[0.9], np.full(width - 1, 0.1 / (width - 1))])  # dominant atom
  rows.append(np.r_[[0.5], np.full(width - 1, 0.5 / (width - 1))])  # p_max = 1/2
  rows.append(np.r_[[0.5 - 1e-7, 0.5 + 1e-7], np.zeros(width - 2)])
  rows.append(np.r_[np.geomspace(0.3, 1e-30, width - 1), [0.0]])  # huge range
  rows.append(np.r_[np.full(width // 4, 1e-3), np.zeros(width - width // 4)])  # total < 1/2
  rows.append(np.r_[[0.3], np.full(width - 1, 0.4 / (width - 1))])  # tail tie group
  u = 30.0 * rng.standard_normal((4, width))  # near one-hot
  rows += list(np.exp(u - u.max(-1, keepdims=True)))
  return np.stack([np.asarray(r, np.float64) for r in rows]).astype(dtype)


@jax.jit
def _greedy_and_passes(p):
  """The greedy-prefix certificate and its search's number of passes, in one program."""
  return (sens.theta_certificate(p, "greedy_prefix"),
          certs._greedy_boundary(certs._nonneg(p))[3])


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_greedy_prefix_hard_rows_and_pass_bound(dtype):
  """The interpolation search equals the sorted greedy (numpy, float64 sums of the same
  atoms) on adversarial rows, and stays within its bisection-like pass bound."""
  with jax.enable_x64(dtype == "float64"):
    rtol = 1e-12 if dtype == "float64" else 2e-6
    rng = np.random.default_rng(32)
    for L in (2, 33, 1024):
      hard = _hard_rows(max(L, 8), np.dtype(dtype).type)[:, :L]
      soft = np.concatenate([_rows(rng, 64, L, s) for s in (0.25, 1.0, 4.0, 16.0)])
      p = np.concatenate([hard, soft.astype(dtype)])
      got, passes = map(np.asarray, _greedy_and_passes(p))
      np.testing.assert_allclose(got, _greedy_numpy(p), rtol=rtol, atol=1e-30)
      passes = int(passes)
      assert passes <= (34 if dtype == "float32" else 66)


def _repair_numpy(p):
  """Brute-force reference of "repair": the greedy boundary prefixes of a numpy sort,
  every single atom added to the lower one or removed from the upper one, and the
  greedy prefix."""
  s = np.sort(np.asarray(p, np.float64))[::-1]
  c = np.r_[0.0, np.cumsum(s)]  # c[k]: mass of the first k atoms
  best = (4 * c * (1 - c)).max()
  k = int(np.sum(c[1:] <= 0.5))  # largest prefix of mass <= 1/2 has k atoms
  if k < s.size:
    q = np.r_[c[k] + s[k + 1:], c[k + 1] - s[:k + 1]]
    best = max(best, (4 * q * (1 - q)).max())
  return best


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_repair_certificate(dtype):
  """"repair" equals its brute-force reference, is never below the greedy prefix and
  never above theta (enumeration and meet in the middle), on random, masked, tied,
  dominant and unnormalized rows."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(33)
    hard = _hard_rows(16, np.float64)[:-6]  # normalized below; theta needs sum 1
    p = np.concatenate([_pad(_rows(rng, 60, L, s), 16) for L in (3, 8, 13, 16)
                        for s in (0.7, 2.0, 6.0)] + [_pad(r, 16) for r in _tied_rows(16)[:8]]
                       + [hard / hard.sum(-1, keepdims=True)])
    p = p.astype(dtype).astype(np.float64)
    exact = np.asarray(sens.theta_exact(p))
    big = np.concatenate([_rows(rng, 30, 32, s) for s in (1.0, 3.0)]).astype(dtype)
    exact_big = sens.theta_mitm(big.astype(np.float64))
  tol = 1e-12 if dtype == "float64" else 2e-6
  with jax.enable_x64(dtype == "float64"):
    for q, ex in ((p, exact), (big, exact_big)):
      q = q.astype(dtype)
      greedy, repair = map(np.asarray, _certify(q, ("greedy_prefix", "repair")))
      want = np.array([_repair_numpy(r) for r in q])
      np.testing.assert_allclose(repair, want, rtol=tol, atol=tol)
      assert np.all(repair >= greedy) and np.all(repair <= ex + tol)
      assert np.mean(repair > greedy + tol) > 0.2
    ok = np.abs(p.sum(-1) - 1.0) < 1e-6  # Cor 3.4(5) needs a distribution (not 0)
    lower, _ = sens.theta_bracket(p[ok].astype(dtype), "repair")
    assert np.all(np.asarray(lower) <= exact[ok] + tol)


# ------------------------------------------------------------- Cor 3.4


def test_cor34_regimes(x64):
  exact = lambda rows: np.asarray(sens.theta_exact(np.stack([_pad(r, 16)[0] for r in rows])))
  Ls = np.array([2, 5, 8, 11, 16])  # (1) uniform
  np.testing.assert_allclose(exact([np.full(L, 1.0 / L) for L in Ls]), sens.theta_uniform(Ls),
                             rtol=1e-12)
  np.testing.assert_allclose(sens.theta_uniform(7), 1 - 1 / 49, rtol=1e-12)
  ks = np.arange(1, 12)  # (4) top-k uniform, placed among zeros; k = 1 is (2) one-hot
  rows = [np.roll(np.r_[np.full(k, 1.0 / k), np.zeros(16 - k)], 3) for k in ks]
  np.testing.assert_allclose(exact(rows), sens.theta_top_k_uniform(ks), atol=1e-12)
  np.testing.assert_allclose(exact(list(np.eye(16))), 0.0)
  rng = np.random.default_rng(4)  # (3) dominant atom
  rest = rng.dirichlet(np.ones(11), 10) * rng.uniform(0.0, 0.5, (10, 1))
  p = np.concatenate([1.0 - rest.sum(-1, keepdims=True), rest], -1)
  np.testing.assert_allclose(exact(p), sens.theta_dominant_atom(p.max(-1)), rtol=1e-12)
  assert np.isnan(sens.theta_dominant_atom(0.3))
  p = np.concatenate([_rows(rng, 50, 16), _rows(rng, 50, 16, scale=2.5)])  # (5)
  assert np.all(exact(p) >= np.asarray(sens.theta_lower_bound_pmax(p.max(-1))) - 1e-12)


# ------------------------------------------------- Thm 4.1, Cor 4.2, 4.3, 4.4


@jax.jit
def _mha(u, wq, wk, wv, wo, tau, causal):
  """Multi-head attention of Sec 4.1, written independently of the library."""
  d_h = wq.shape[-1]
  q, k, v = (jnp.einsum("td,hdk->htk", u, w) for w in (wq, wk, wv))
  s = jnp.einsum("htk,hsk->hts", q, k) / (tau * math.sqrt(d_h))
  s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)) | jnp.logical_not(causal), s, -jnp.inf)
  o = jnp.einsum("hts,hsk->thk", jax.nn.softmax(s, -1), v)
  return o.reshape(u.shape[0], -1) @ wo


_mha_jac = jax.jit(jax.jacfwd(_mha))


def _layernorm(x, gamma, beta, eps):
  c = x - x.mean(-1, keepdims=True)
  return gamma * c / jnp.sqrt((c ** 2).mean(-1, keepdims=True) + eps) + beta


def _induced_norm_lower(jac, rng, iters=40):
  """Lower bound of ||J||_{inf,rms -> inf,rms} for J of shape (T, d, T, d): random
  sign/Gaussian probes, then per-output-row ascent g -> h_j = sqrt(d) J_ij^T g / |.|
  -> g = J_i h / |.|, which never decreases ||(J h)_i||."""
  jac = np.asarray(jac, np.float64)
  T, d = jac.shape[:2]
  best = 0.0
  for _ in range(20):
    h = rng.standard_normal((T, d))
    h *= math.sqrt(d) / np.linalg.norm(h, axis=-1, keepdims=True)
    best = max(best, np.linalg.norm(np.einsum("adsk,sk->ad", jac, h), axis=-1).max() / math.sqrt(d))
  for i in range(T):
    for _ in range(2):
      g = rng.standard_normal(d)
      for _ in range(iters):
        jt = np.einsum("dsk,d->sk", jac[i], g / np.linalg.norm(g))
        h = math.sqrt(d) * jt / np.maximum(np.linalg.norm(jt, axis=-1, keepdims=True), 1e-300)
        g = np.einsum("dsk,sk->d", jac[i], h)
      best = max(best, np.linalg.norm(g) / math.sqrt(d))
  return best


def _weights(rng, d, heads, d_h, scale=1.0):
  w = lambda *s: jnp.asarray(scale * rng.standard_normal(s) / math.sqrt(s[-2]))
  return w(heads, d, d_h), w(heads, d, d_h), w(heads, d, d_h), w(heads * d_h, d)


@pytest.mark.parametrize("causal", [False, True])
def test_mha_local_bound_dominates_jacobian(x64, causal):
  rng = np.random.default_rng(7 + causal)
  T, d, heads, d_h, tau = 6, 8, 2, 4, 0.7
  for u_scale in (0.5, 2.0):
    wq, wk, wv, wo = _weights(rng, d, heads, d_h, scale=1.5)
    u = jnp.asarray(u_scale * rng.standard_normal((T, d)))
    jac = _mha_jac(u, wq, wk, wv, wo, tau, causal)
    measured = _induced_norm_lower(jac, rng)
    out = bounds.mha_local_bound(u, wq, wk, wv, wo.reshape(heads, d_h, d), tau, causal)
    assert measured <= float(out["bound"]) * (1 + 1e-9)
    loose = bounds.mha_local_bound(u, wq, wk, wv, wo, tau, causal, theta="bracket")
    assert float(loose["bound"]) >= float(out["bound"]) * (1 - 1e-12)
    binf = lambda x: np.linalg.norm(np.asarray(x), axis=-1).max() / math.sqrt(d)
    B = binf(u)
    np.testing.assert_allclose(bounds.block_inf_rms_norm(u), B, rtol=1e-12)
    lip = float(bounds.mha_lipschitz_bound(wq, wk, wv, wo, B, tau))
    assert lip >= float(loose["bound"]) * (1 - 1e-12)
    for _ in range(5):  # Cor 4.2: secant ratios of pairs inside D_B
      v = np.asarray(u) + 0.3 * rng.standard_normal((T, d))
      v *= min(1.0, B / binf(v))
      out_v, out_u = (_mha(x, wq, wk, wv, wo, tau, causal) for x in (jnp.asarray(v), u))
      assert binf(out_v - out_u) / binf(v - np.asarray(u)) <= lip


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_layer_bounds_dominate_jacobian(x64, placement):
  rng = np.random.default_rng(11)
  T, d, heads, d_h, d_ff, eps = 4, 8, 2, 4, 16, 0.5
  wq, wk, wv, wo = _weights(rng, d, heads, d_h)
  w1 = jnp.asarray(rng.standard_normal((d, d_ff)) / math.sqrt(d))
  w2 = jnp.asarray(rng.standard_normal((d_ff, d)) / math.sqrt(d_ff))
  gam = jnp.asarray(1.0 + 0.2 * rng.standard_normal((3, d)))
  bet = jnp.asarray(0.1 * rng.standard_normal((3, d)))
  ffn = lambda x: jax.nn.gelu(x @ w1, approximate=False) @ w2
  ln = lambda x, j: _layernorm(x, gam[j], bet[j], eps)
  mha = lambda x: _mha(x, wq, wk, wv, wo, 1.0, True)
  if placement == "pre":
    def layer(x):
      z = x + mha(ln(x, 0))
      return z + ffn(ln(z, 1))
    x = jnp.asarray(3.0 * rng.standard_normal((T, d)))
  else:
    def layer(x):
      z = ln(x + mha(x), 0)
      return ln(z + ffn(z), 1)
    x = ln(jnp.asarray(rng.standard_normal((T, d))), 2)  # normalized-state domain
  out = bounds.layer_lipschitz_bound(placement, w_q=wq, w_k=wk, w_v=wv, w_o=wo, w1=w1,
                                     w2=w2, ln_gamma_JxD=gam, ln_beta_JxD=bet, ln_eps=eps)
  assert float(bounds.block_inf_rms_norm(x)) <= float(out["b_ln"]) or placement == "pre"
  measured = _induced_norm_lower(jax.jit(jax.jacfwd(layer))(x), rng, iters=20)
  assert measured <= float(out["bound"])
  np.testing.assert_allclose(out["l_ln"], np.abs(gam).max() / math.sqrt(eps))


def test_layernorm_only_product(x64):
  rng = np.random.default_rng(5)
  K, T, d, eps = 5, 3, 6, 0.1
  y = jnp.asarray(rng.standard_normal((K, T, d)) * rng.uniform(0.3, 2.0, (K, T, 1)))
  gam = jnp.asarray(1.0 + 0.3 * rng.standard_normal((K, d)))
  def norm(x, g, center):
    c = x - center * x.mean()
    return g * c / jnp.sqrt((c ** 2).mean() + eps)
  jac_fn = jax.jit(jax.vmap(jax.vmap(jax.jacfwd(norm), (0, None, None)), (0, 0, None)))
  for op in ("layer", "rms"):
    jac = jac_fn(y, gam, float(op == "layer"))  # KxTxDxD
    np.testing.assert_allclose(bounds.layernorm_jacobian(y, gam[:, None], eps, op), jac,
                               atol=1e-12)
    dense = []
    for i in range(T):
      m = np.eye(d)
      for k in range(K):
        m = np.asarray(jac[k, i]) @ m  # later layers on the left
      dense.append(np.log(np.linalg.norm(m, 2)))
    out = bounds.layernorm_only_product(y, gam, eps, op, power_iters=200)
    np.testing.assert_allclose(out["log_norm_T"], dense, rtol=1e-6)
    assert out["log_norm"] <= out["log_bound_token"] + 1e-12
    assert out["log_bound_token"] <= out["log_bound_layer"] + 1e-12
    c = np.asarray(y) - (np.asarray(y).mean(-1, keepdims=True) if op == "layer" else 0.0)
    a = np.abs(np.asarray(gam)).max(-1)[:, None] / np.sqrt((c ** 2).mean(-1) + eps)
    np.testing.assert_allclose(out["a_KxT"], a, rtol=1e-12)
    np.testing.assert_allclose(out["worst_token_factor_K"], a.max(-1), rtol=1e-12)


# ---------------------------------------------------- Sec 5 statistics, spikes


def _balance_numpy(p):
  """Reference of the "balance" certificate: greedy balancing of the descending
  atoms, the best single move or swap by brute force, and the greedy prefix."""
  s = np.sort(p)[::-1]
  in_a = np.zeros(s.size, bool)
  a = b = 0.0
  for i, x in enumerate(s):
    in_a[i] = a <= b
    a, b = (a + x, b) if in_a[i] else (a, b + x)
  xs = np.r_[s[in_a], 0.0]
  ys = np.r_[s[~in_a], 0.0]
  q = a - xs[:, None] + ys[None, :]
  c = np.cumsum(s)
  return max((4 * q * (1 - q)).max(), (4 * c * (1 - c)).max())


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_balance_certificate_matches_numpy(dtype):
  """The "balance" certificate (int-bit-pattern sort, greedy balancing, best move or
  swap) equals the numpy reference on random, masked and tied rows."""
  with jax.enable_x64(dtype == "float64"):
    rng = np.random.default_rng(23)
    p = np.concatenate([_pad(_rows(rng, 40, L, s), 32) for L in (5, 17, 32)
                        for s in (1.0, 3.0)] + [_tied_rows(32)]).astype(dtype)
    got = np.asarray(sens.theta_certificate(p, "balance"))
    want = [_balance_numpy(r.astype(np.float64)) for r in p]
    np.testing.assert_allclose(got, want, rtol=1e-12 if dtype == "float64" else 2e-6,
                               atol=0 if dtype == "float64" else 1e-7)


def test_attention_statistics_matches_numpy():
  rng = np.random.default_rng(9)
  B, H, T, n = 2, 3, 28, 40
  logits = 2.0 * rng.standard_normal((B, H, T, T))
  logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1), np.float32)
  out = sens.attention_statistics(probs, jax.random.PRNGKey(0), num_rows=n, method="balance")
  default = sens.attention_statistics(probs, jax.random.PRNGKey(0), num_rows=n)["rows"]
  rows = out["rows"]
  b, h, t = (np.asarray(rows[k]) for k in "bht")
  assert np.all(t >= 16) and len(set(zip(b, h, t))) == n
  theta, greedy, pmax, ent, support = [], [], [], [], []
  for bi, hi, ti in zip(b, h, t):
    p = probs[bi, hi, ti, :ti + 1].astype(np.float64)
    p /= p.sum()
    c = np.cumsum(np.sort(p)[::-1])
    k = np.argmin(np.abs(c - 0.5))
    greedy.append(4 * c[k] * (1 - c[k]))
    theta.append(_balance_numpy(p))
    pmax.append(p.max())
    ent.append(-(p * np.log(p)).sum() / np.log(ti + 1))
    support.append(_pad(p, T)[0])
  for name, vals in (("theta_cert", theta), ("p_max", pmax), ("entropy_norm", ent)):
    np.testing.assert_allclose(rows[name], vals, rtol=2e-5, atol=2e-6)
    for q in (5, 25, 50, 75, 95):
      np.testing.assert_allclose(out[name][f"p{q}"], np.percentile(vals, q), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out[name]["mean"], np.mean(vals), rtol=2e-5)
  cert = np.asarray(rows["theta_cert"])
  assert np.all(cert >= np.array(greedy) - 1e-6)
  # the default is the paper's greedy-prefix certificate (App D.2)
  np.testing.assert_allclose(default["theta_cert"], greedy, rtol=2e-5, atol=2e-6)
  assert np.all(cert <= sens.theta_mitm(np.stack(support)) + 1e-5)


def test_gradient_spikes_rule():
  rng = np.random.default_rng(2)
  g = np.exp(0.3 * rng.standard_normal(300))
  g[[5, 40, 41, 120, 299]] *= 6.0
  g = np.stack([g, g[::-1]])
  for excl in (False, True):
    want = np.zeros_like(g, bool)
    for r in range(2):
      for i in range(10, 300):
        lo = max(10 if excl else 0, i - 50)
        want[r, i] = lo < i and g[r, i] > 2.0 * np.median(g[r, lo:i])
    got = np.asarray(sens.gradient_spikes(g, exclude_warmup_from_window=excl))
    np.testing.assert_array_equal(got, want)
  assert not got[0, 5] and got[0, 40] and got[0, 120]
