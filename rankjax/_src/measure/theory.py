"""Closed-form forward predictions of the Post-Norm collapse paper (Sec 3.1, App C).

"Why Post-Norm Transformers Collapse" predicts the expected one-step change of the
token similarity ``t = t_sim(X)`` (``rankjax._src.measure.similarity``) caused by one
attention or one SwiGLU sublayer at initialization, under three approximations
(Sec 3.1, Assumptions C.1-C.2):

1. the attention matrix ``P`` is replaced by the prefix-average matrix ``C_n``;
2. ``E[t_sim(Y)]`` is replaced by ``E||Pi_1 Y||_F^2 / E||Y||_F^2``
   (ratio of expectations, Assumption C.1(iv));
3. the token Gram matrix is replaced by the equal-correlation closure
   ``R_eq(t) = d [(1 - rho) I + n rho Pi_1]``, ``rho = (n t - 1)/(n - 1)`` (Eq. (4)).

Notation follows the paper: ``n`` tokens, width ``d``, SwiGLU width ``d_ff``;
``W = W_V W_O`` is folded into one Gaussian matrix with entry variance
``sigma_W^2 = d sigma_V^2 sigma_O^2`` (Sec 2); the "amount of attention" is
``s = n d^2 sigma_W^2 / ||X_1||_F^2`` (Thm 3.2) and the SwiGLU coefficient is
``xi = d d_ff sigma_W2^2 sigma_W3^2`` (Thm 3.4). Under the paper's standard
initialization (all variances ``1/(3 fan_in)``) ``s = xi = 1/9`` and the SwiGLU
pre-activation variance is ``sigma_W1^2 d = 1/3``.

Everything here is a pure ``jnp`` function, broadcasting over array arguments and
jit-able with the integer sizes (``n``, ``d``, ``num_nodes``) static.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.numerics import as_float

Array = jax.Array
ArrayLike = Any

STANDARD_SWIGLU_VAR_U = 1.0 / 3.0   # sigma_W1^2 d under the standard init (Sec 2)


# ---------------------------------------------------------------------------
# Initialization constants (Sec 2).

def folded_attention_variance(d: int, var_v: ArrayLike | None = None,
                              var_o: ArrayLike | None = None) -> Array:
  """``sigma_W^2 = d sigma_V^2 sigma_O^2`` for the folded ``W = W_V W_O`` (Sec 2).

  ``var_v``/``var_o`` default to the paper's standard ``1/(3d)``, giving
  ``sigma_W^2 = 1/(9d)``.
  """
  var_v = 1.0 / (3 * d) if var_v is None else var_v
  var_o = 1.0 / (3 * d) if var_o is None else var_o
  return as_float(d * as_float(var_v) * as_float(var_o))


def swiglu_xi(d: int, d_ff: int, var_w2: ArrayLike | None = None,
              var_w3: ArrayLike | None = None) -> Array:
  """``xi = d d_ff sigma_W2^2 sigma_W3^2`` (Thm 3.4); ``1/9`` under the standard init.

  Defaults: ``sigma_W3^2 = 1/(3d)``, ``sigma_W2^2 = 1/(3 d_ff)`` (Sec 2).
  """
  var_w2 = 1.0 / (3 * d_ff) if var_w2 is None else var_w2
  var_w3 = 1.0 / (3 * d) if var_w3 is None else var_w3
  return as_float(d * d_ff * as_float(var_w2) * as_float(var_w3))


# ---------------------------------------------------------------------------
# Equal-correlation closure (Eq. (4), Assumption C.1(iii)).

def harmonic_number(n: ArrayLike) -> Array:
  """``H_n = sum_{k=1}^n 1/k`` (Thm 3.2), via ``digamma(n + 1) + gamma_euler``."""
  n = as_float(n)
  return jax.scipy.special.digamma(n + 1.0) + np.euler_gamma


def rho_from_similarity(t: ArrayLike, n: int) -> Array:
  """Pairwise correlation of the closure, ``rho(t) = (n t - 1)/(n - 1)`` (Eq. (4)).

  ``t = 1/n`` gives ``rho = 0``, ``t = 1`` gives ``rho = 1``; ``t in [0, 1/n)``
  gives the negative correlations ``rho in [-1/(n-1), 0)``.
  """
  return (n * as_float(t) - 1.0) / (n - 1.0)


def similarity_from_rho(rho: ArrayLike, n: int) -> Array:
  """Inverse of :func:`rho_from_similarity`: ``t = ((n - 1) rho + 1)/n``."""
  return ((n - 1.0) * as_float(rho) + 1.0) / n


@functools.partial(jax.jit, static_argnames=("n", "d"))
def equal_correlation_gram(t: ArrayLike, n: int, d: int) -> Array:
  """``R_eq(t) = d [(1 - rho) I + n rho Pi_1]`` (Eq. (4)); shape ``t.shape + (n, n)``.

  Diagonal ``d`` (RMS-normalized rows, Assumption C.1(ii)), off-diagonal
  ``d rho``; ``tr(Pi_1 R_eq)/tr(R_eq) = t``. Positive semidefinite iff
  ``t in [0, 1]``.
  """
  rho = rho_from_similarity(t, n)[..., None, None]
  eye = jnp.eye(n, dtype=rho.dtype)
  return d * ((1.0 - rho) * eye + rho * jnp.ones((n, n), rho.dtype))


@functools.partial(jax.jit, static_argnames=("n", "d", "shape", "exact", "dtype"))
def sample_equal_correlation(key: Array, t: ArrayLike, n: int, d: int,
                             shape: tuple[int, ...] = (), exact: bool = True,
                             dtype: Any = None) -> Array:
  """Draw token matrices ``X`` of shape ``shape + (n, d)`` from the closure ``R_eq(t)``.

  ``X = sqrt(d) G^{1/2} Q^T`` with ``G = R_eq(t)/d`` and
  ``G^{1/2} = sqrt(1 - rho)(I - Pi_1) + sqrt(1 + (n - 1) rho) Pi_1``.

  * ``exact=True`` (needs ``d >= n``): ``Q`` is a Haar-random ``d x n`` matrix
    with orthonormal columns, so ``X X^T = R_eq(t)`` holds exactly: every row has
    squared norm ``d``, every pair inner product ``d rho``, ``t_sim(X) = t``. The
    law of ``X`` is invariant under right rotations, so the forward formulas of
    App C, which depend on ``X`` only through ``X X^T``, hold for every draw.
  * ``exact=False``: ``Q^T`` has i.i.d. ``N(0, 1/d)`` entries, so only
    ``E[X X^T] = R_eq(t)`` (any ``d``).

  ``t`` must lie in ``[0, 1]`` and broadcast against ``shape``.
  """
  dtype = dtype or jnp.result_type(float)
  rho = rho_from_similarity(jnp.asarray(t, dtype), n).astype(dtype)
  rho = jnp.broadcast_to(rho, shape)[..., None, None]
  pi = jnp.full((n, n), 1.0 / n, dtype)
  eye = jnp.eye(n, dtype=dtype)
  sqrt_g = (jnp.sqrt(jnp.maximum(1.0 - rho, 0.0)) * (eye - pi)
            + jnp.sqrt(jnp.maximum(1.0 + (n - 1.0) * rho, 0.0)) * pi)
  if exact:
    if d < n:
      raise ValueError(f"exact closure sampling needs d >= n, got d={d}, n={n}")
    g = jax.random.normal(key, shape + (d, n), dtype)
    q, r = jnp.linalg.qr(g)                        # Haar: fix signs by diag(r)
    q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
    qt_NxD = jnp.swapaxes(q, -1, -2)
  else:
    qt_NxD = jax.random.normal(key, shape + (n, d), dtype) / np.sqrt(d)
  return np.sqrt(d) * (sqrt_g @ qt_NxD)


# ---------------------------------------------------------------------------
# Amount of attention (Thm 3.2 and its "Comparison with Pre-Norm").

def amount_of_attention(x_NxD: Array, sigma_w2: ArrayLike) -> Array:
  """``s = n d^2 sigma_W^2 / ||X_1||_F^2`` (Thm 3.2), batched over ``(..., n, d)``.

  ``X_1`` is the residual-stream matrix entering the attention sublayer. In
  Post-Norm it is RMS-normalized (``||X_1||_F^2 = n d``), so ``s = d sigma_W^2``
  (:func:`amount_of_attention_postnorm`). In Pre-Norm the branch sees
  ``RMS(X_1^l)`` but the skip carries the un-normalized stream, and the same
  expansion as Thm C.3 gives ``s^l = n d^2 sigma_W^2/||X_1^l||_F^2`` with the
  stream's norm: pass the stream ``X_1^l`` to get the per-layer value. (In
  ``rankjax._src.models.transformer``'s Pre-Norm, that stream is the previous layer's
  ``y2``, or the embeddings at layer 1; the captured ``x1`` is already normalized.)
  """
  x = as_float(x_NxD)
  n, d = x.shape[-2], x.shape[-1]
  return n * d * d * as_float(sigma_w2) / jnp.sum(x * x, axis=(-2, -1))


def amount_of_attention_postnorm(d: int, sigma_w2: ArrayLike) -> Array:
  """Post-Norm ``s = d sigma_W^2``, the same at every layer (Sec 3.1, App C.3).

  ``1/9`` under the standard initialization.
  """
  return d * as_float(sigma_w2)


def amount_of_attention_prenorm(layer: ArrayLike, s_post: ArrayLike,
                                growth_per_layer: ArrayLike,
                                init_sq_norm: ArrayLike = 1.0) -> Array:
  """Pre-Norm ``s^l`` under linear growth of the squared stream norm (Sec 3.1).

  The paper assumes ``||X_1^l||_F^2`` grows linearly with depth (Xiong et al.,
  2020), so ``s^l = O(d sigma_W^2 / l)``; it does not fix the constants. We write
  ``||X_1^l||_F^2 / (n d) = init_sq_norm + growth_per_layer * (l - 1)`` for
  1-indexed ``l``, so ``s^l = s_post / (init_sq_norm + growth_per_layer (l - 1))``
  with ``s_post = d sigma_W^2``. Under the surrogate each Pre-Norm layer adds
  ``s_post f_2(t) + xi m(1)`` to ``||X||_F^2/(n d)`` in expectation (Thm C.3,
  Lemma C.4); :func:`prenorm_growth_per_layer` computes it.
  """
  layer = as_float(layer)
  return as_float(s_post) / (as_float(init_sq_norm) + as_float(growth_per_layer) * (layer - 1.0))


def prenorm_growth_per_layer(s_post: ArrayLike, t: ArrayLike, n: int,
                             xi: ArrayLike, m_one: ArrayLike) -> Array:
  """Expected increase of ``||X||_F^2/(n d)`` over one Pre-Norm layer.

  Attention branch: ``E||C_n X W||_F^2/(n d) = s_post f_2(t)`` (Thm C.3, with the
  branch input RMS-normalized); SwiGLU branch: ``xi m(1)`` (Lemma C.4). Cross
  terms vanish in expectation. ``m_one`` is ``swiglu_moment(1.0)``.
  """
  return as_float(s_post) * f2(t, n) + as_float(xi) * as_float(m_one)


# ---------------------------------------------------------------------------
# Attention: Thm 3.2, Thm C.3, Cor 3.3, Lemma C.11.

@functools.partial(jax.jit, static_argnames=("n",))
def f1(t: ArrayLike, n: int) -> Array:
  """``f_1(t) = (1 - t)(n - H_n)(n t + 1) / (n (n - 1))`` (Thm 3.2)."""
  t = as_float(t)
  h = harmonic_number(n)
  return (1.0 - t) * (n - h) * (n * t + 1.0) / (n * (n - 1.0))


@functools.partial(jax.jit, static_argnames=("n",))
def f2(t: ArrayLike, n: int) -> Array:
  """``f_2(t) = ((n - H_n) t + H_n - 1) / (n - 1)`` (Thm 3.2).

  Equals ``rho + (1 - rho) H_n / n = ||C_n X||_F^2 / ||X||_F^2`` under the closure
  (App C.3, C.7).
  """
  t = as_float(t)
  h = harmonic_number(n)
  return ((n - h) * t + h - 1.0) / (n - 1.0)


@functools.partial(jax.jit, static_argnames=("n",))
def delta_attn(s: ArrayLike, t: ArrayLike, n: int) -> Array:
  """``Delta_attn(s, t) = s f_1(t) / (1 + s f_2(t))`` (Thm 3.2, Eq. (5)).

  Predicted ``E_W[t_sim(Y_1)] - t_sim(X_1)`` for ``Y_1 = X_1 + C_n X_1 W`` under
  the closure and the ratio-of-expectations surrogate. Positive for
  ``t in [1/n, 1)`` and ``s > 0``.
  """
  s = as_float(s)
  return s * f1(t, n) / (1.0 + s * f2(t, n))


@functools.partial(jax.jit, static_argnames=("n",))
def delta_de(s: ArrayLike, t: ArrayLike, n: int, alpha: ArrayLike) -> Array:
  """Cor 3.3: similarity change with ``P`` replaced by ``P - alpha C_n``.

  ``Delta_de = (1 - alpha)^2 s f_1(t) / (1 + (1 - alpha)^2 s f_2(t))``, i.e.
  :func:`delta_attn` at ``lambda_alpha s``, ``lambda_alpha = (1 - alpha)^2``
  (App C.3). Vanishes at ``alpha = 1``.
  """
  lam = (1.0 - as_float(alpha)) ** 2
  return delta_attn(lam * as_float(s), t, n)


class SecondMoments(NamedTuple):
  """Expected ``||Pi_1 Y||_F^2`` (``proj``) and ``||Y||_F^2`` (``total``)."""
  proj: Array
  total: Array

  @property
  def similarity(self) -> Array:
    """Ratio-of-expectations surrogate for ``E[t_sim(Y)]`` (Assumption C.1(iv))."""
    return self.proj / self.total


@functools.partial(jax.jit, static_argnames=("n", "d"))
def attention_second_moments(t: ArrayLike, n: int, d: int,
                             sigma_w2: ArrayLike) -> SecondMoments:
  """Thm C.3: ``E||Pi_1 Y_1||_F^2`` and ``E||Y_1||_F^2`` for ``Y_1 = X_1 + C_n X_1 W``.

  ``E||Pi_1 Y_1||^2 = n d t + d^2 sigma_W^2 (rho n + (1 - rho)(2 - H_n/n))`` and
  ``E||Y_1||^2 = n d + d^2 sigma_W^2 (rho n + (1 - rho) H_n)``, exact expectations
  over ``W`` for any ``X_1`` with ``X_1 X_1^T = R_eq(t)``.

  (App C.3 writes ``d sigma_W^2 lambda_alpha`` for the branch terms of Cor 3.3;
  with ``s = d sigma_W^2`` after dividing by ``n d`` this must read
  ``d^2 sigma_W^2 lambda_alpha``, which is what Thm C.3 has.)
  """
  t, sw = as_float(t), as_float(sigma_w2)
  rho = rho_from_similarity(t, n)
  h = harmonic_number(n)
  proj = n * d * t + d * d * sw * (rho * n + (1.0 - rho) * (2.0 - h / n))
  total = n * d + d * d * sw * (rho * n + (1.0 - rho) * h)
  return SecondMoments(proj, total)


def attention_conditional_moments(x_NxD: Array, p_NxN: Array,
                                  sigma_w2: ArrayLike) -> SecondMoments:
  """Lemma C.11: ``E[. | X, P]`` for ``Y = X + P X W`` with any fixed ``X`` and ``P``.

  ``E[||Pi_1 Y||^2 | X, P] = ||Pi_1 X||^2 + d sigma_W^2 ||Pi_1 P X||^2`` and
  ``E[||Y||^2 | X, P] = ||X||^2 + d sigma_W^2 ||P X||^2`` (only ``W`` random,
  ``W`` is ``d x d``). No closure and no prefix averaging: use it with measured
  ``X_1`` and attention ``P`` (e.g. ``P - alpha C_n``). Batched over leading axes.
  """
  x, p, sw = as_float(x_NxD), as_float(p_NxN), as_float(sigma_w2)
  d = x.shape[-1]
  px = p @ x
  sq = lambda a: jnp.sum(a * a, axis=(-2, -1))
  proj_sq = lambda a: a.shape[-2] * jnp.sum(jnp.mean(a, -2) ** 2, axis=-1)
  return SecondMoments(proj_sq(x) + d * sw * proj_sq(px),
                       sq(x) + d * sw * sq(px))


# ---------------------------------------------------------------------------
# SwiGLU: Thm 3.4, App C.4.

@functools.lru_cache(maxsize=16)
def _hermegauss(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
  x, w = np.polynomial.hermite_e.hermegauss(num_nodes)
  return x, w / np.sqrt(2.0 * np.pi)              # weights of a N(0, 1) expectation


@functools.partial(jax.jit, static_argnames=("num_nodes",))
def swiglu_moment(rho: ArrayLike, var_u: ArrayLike = STANDARD_SWIGLU_VAR_U,
                  num_nodes: int = 48) -> Array:
  """Pairwise SwiGLU moment ``m(rho) = E[SiLU(u) SiLU(v)]`` (Thm 3.4, App C.4).

  ``(u, v) ~ N(0, var_u [[1, rho], [rho, 1]])`` with ``var_u = sigma_W1^2 d``
  (``1/3`` under the standard initialization, for which the paper reports
  ``m(0) ~ 0.006``, ``m(1) ~ 0.100``, App C.4 / Fig 7). Computed by
  ``num_nodes x num_nodes`` Gauss-Hermite quadrature in ``(z_1, z_2)``,
  ``u = sqrt(var_u) z_1``, ``v = sqrt(var_u)(rho z_1 + sqrt(1 - rho^2) z_2)``;
  SiLU is smooth, so 48 nodes are accurate to ~1e-12 for ``var_u <= 1``.
  ``m(0) = E[SiLU(u)]^2`` and ``m(1) = E[SiLU(u)^2]``. Broadcasts over ``rho``
  and ``var_u``; ``rho`` must lie in ``[-1, 1]``.
  """
  rho, var_u = as_float(rho), as_float(var_u)
  dtype = jnp.result_type(rho, var_u)
  x_np, w_np = _hermegauss(num_nodes)
  z = jnp.asarray(x_np, dtype)
  w = jnp.asarray(w_np, dtype)
  rho_b = rho[..., None, None]
  sd = jnp.sqrt(var_u)[..., None, None]
  z1, z2 = z[:, None], z[None, :]
  u = sd * z1
  v = sd * (rho_b * z1 + jnp.sqrt(jnp.maximum(1.0 - rho_b * rho_b, 0.0)) * z2)
  vals = jax.nn.silu(u) * jax.nn.silu(v)
  return jnp.einsum("...ij,i,j->...", vals, w, w)


@functools.partial(jax.jit, static_argnames=("n", "num_nodes"))
def delta_ffn(xi: ArrayLike, t: ArrayLike, n: int,
              var_u: ArrayLike = STANDARD_SWIGLU_VAR_U,
              num_nodes: int = 48) -> Array:
  """``Delta_FFN(xi, t) = xi (t - 1/n)(m(rho(t)) - m(1)) / (1 + xi m(1))`` (Thm 3.4, Eq. (6)).

  Predicted ``E[t_sim(Y_2)] - t_sim(X_2)`` for the SwiGLU sublayer under the
  closure and the ratio-of-expectations surrogate. Negative for ``t in (1/n, 1)``
  because ``m`` increases on ``[0, 1]`` (Fig 7); ``|Delta_FFN| <= xi m(1)``.
  """
  t, xi = as_float(t), as_float(xi)
  m_rho = swiglu_moment(rho_from_similarity(t, n), var_u, num_nodes)
  m_one = swiglu_moment(1.0, var_u, num_nodes)
  return xi * (t - 1.0 / n) * (m_rho - m_one) / (1.0 + xi * m_one)


@functools.partial(jax.jit, static_argnames=("n", "d", "num_nodes"))
def ffn_second_moments(t: ArrayLike, n: int, d: int, xi: ArrayLike,
                       var_u: ArrayLike = STANDARD_SWIGLU_VAR_U,
                       num_nodes: int = 48) -> SecondMoments:
  """App C.4: ``E||Pi_1 Y_2||_F^2`` and ``E||Y_2||_F^2`` for the SwiGLU sublayer.

  ``E||Pi_1 Y_2||^2 = n d t + d xi h_n(rho)``, ``h_n(rho) = m(1) + (n - 1) rho m(rho)``;
  ``E||Y_2||^2 = n d + n d xi m(1)``. Exact over ``W_1, W_2, W_3`` for any ``X_2``
  with ``X_2 X_2^T = R_eq(t)``.
  """
  t, xi = as_float(t), as_float(xi)
  rho = rho_from_similarity(t, n)
  m_rho = swiglu_moment(rho, var_u, num_nodes)
  m_one = swiglu_moment(1.0, var_u, num_nodes)
  h_n = m_one + (n - 1.0) * rho * m_rho
  return SecondMoments(n * d * t + d * xi * h_n, n * d + n * d * xi * m_one)


# ---------------------------------------------------------------------------
# RMS rescaling after the residual add: App C.5-C.6.

@functools.partial(jax.jit, static_argnames=("n", "d"))
def attention_row_norms_sq(t: ArrayLike, n: int, d: int,
                           sigma_w2: ArrayLike) -> Array:
  """Lemma C.5: ``E||(Y_1)_i||^2 = a + b / i`` for rows ``i = 1..n``; shape ``(..., n)``.

  ``a = d + d^2 rho sigma_W^2``, ``b = d^2 sigma_W^2 (1 - rho)``.
  """
  t, sw = as_float(t), as_float(sigma_w2)
  rho = rho_from_similarity(t, n)[..., None]
  sw = sw[..., None]
  i = jnp.arange(1, n + 1, dtype=rho.dtype)
  return d + d * d * rho * sw + d * d * sw * (1.0 - rho) / i


def ffn_row_norm_sq(d: int, xi: ArrayLike, m_one: ArrayLike) -> Array:
  """Lemma C.4: ``E||(Y_2)_i||^2 = d + d xi m(1)``, the same for every row.

  (The paper writes ``d + d_ff d^2 sigma_W3^2 sigma_W2^2 m(1)``, which is
  ``d + d xi m(1)``.)
  """
  return d + d * as_float(xi) * as_float(m_one)


def rms_spread(scale_N: Array) -> Array:
  """``eta = ||T - mu I||_2 / mu`` for ``T = diag(scale_N)``, ``mu = tr(T)/n`` (Thm C.6).

  For a diagonal ``T`` the spectral norm is ``max_i |T_ii - mu|``. Batched over
  leading axes of ``scale_N`` (``(..., n)``).
  """
  s = as_float(scale_N)
  mu = jnp.mean(s, axis=-1)
  return jnp.max(jnp.abs(s - mu[..., None]), axis=-1) / mu


def rms_spread_from_row_norms(row_norm_sq_N: ArrayLike, d: int,
                              eps: ArrayLike = 0.0) -> Array:
  """``eta`` of Thm C.6 from (expected) squared row norms, e.g. Lemma C.5's ``a + b/i``."""
  return rms_spread(jax.lax.rsqrt(as_float(row_norm_sq_N) / d + as_float(eps)))


def rms_similarity_bounds(t: ArrayLike, eta: ArrayLike) -> tuple[Array, Array]:
  """Thm C.6: bounds on ``t_sim(T Y)`` from ``t = t_sim(Y)`` and the spread ``eta``.

  ``max(sqrt(t) - eta, 0)^2 / (1 + eta)^2 <= t_sim(T Y) <= (sqrt(t) + eta)^2/(1 - eta)^2``,
  valid for ``eta < 1`` (both bounds are NaN for ``eta >= 1``). The upper bound is
  returned as stated and can exceed the trivial bound 1.
  """
  t, eta = as_float(t), as_float(eta)
  rt = jnp.sqrt(t)
  lower = jnp.maximum(rt - eta, 0.0) ** 2 / (1.0 + eta) ** 2
  upper = (rt + eta) ** 2 / (1.0 - eta) ** 2
  ok = eta < 1.0
  return jnp.where(ok, lower, jnp.nan), jnp.where(ok, upper, jnp.nan)
