"""Spectral measures and the closed-form spectral laws of "Transforming Rank".

Matrix measures (pure ``jnp`` functions, batched over leading axes, jit/vmap-able):

  effective_rank(A)   exp(-sum_k p_k ln p_k), p_k = sigma_k / sum_j sigma_j      (Eq. 3;
                      Roy & Vetterli 2007). Lies in [1, N]; erank(I_d) = d, rank-1 -> 1.
  stable_rank(A)      ||A||_F^2 / ||A||_2^2                                        (Sec 2)
  top_energy_fraction sigma_1^2 / sum_k sigma_k^2, the energy in the top direction
                      (the "mean spike" fraction of Fig 7c)

Laws and reference curves (App D):

  marchenko_pastur_*  the Marchenko-Pastur law of the Gram matrix
                      G = (1/n) X^T X of an n x d matrix X with i.i.d. unit-variance
                      entries, in the paper's convention gamma = n / d (rows per
                      column; Sec 6, App D.3): support [(1 - 1/sqrt(gamma))^2,
                      (1 + 1/sqrt(gamma))^2], plus an atom of mass 1 - gamma at zero
                      when gamma < 1 (App D.6).
  gaussian_product_effective_rank
                      erank(W_down W_up)/d for Gaussian factors with gamma d hidden
                      units (App D.8, the reference curve of Fig 8b).

Activation moments (Sec 3, 5, 6; Table 1), by half-range Gauss-Hermite quadrature
in float64 numpy (``gaussian_expectation``):

  coherence c = E[sigma]^2 / E[sigma^2]   (Sec 5, Table 1; relu 1/pi, abs 2/pi)
  survival  p = E[sigma'(z)^2]            (Sec 3, 6, App D.4; relu 1/2, abs 1)
  kappa       = E[sigma(z)^2]             (App B.3, Eq. 22; relu 1/2)

with z ~ N(0, 1).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from rankjax._src.measure import precision as precision_lib
from rankjax._src.numerics import as_float

Array = jax.Array

# ---------------------------------------------------------------------------
# Matrix measures


@precision_lib.measured
def singular_values(a_NxM: Array) -> Array:
  """Singular values (descending) over the last two axes, in at least float32."""
  a = as_float(a_NxM)
  return jnp.linalg.svd(a, compute_uv=False)


def effective_rank_from_singular_values(s_N: Array) -> Array:
  """Roy-Vetterli effective rank from singular values over the last axis (Eq. 3).

  ``p_k = s_k / sum_j s_j`` and ``erank = exp(-sum_k p_k ln p_k)`` with
  ``0 ln 0 = 0``. The zero matrix is given erank 0 (the measure is undefined there).
  """
  s = jnp.abs(jnp.asarray(s_N))
  total = jnp.sum(s, axis=-1, keepdims=True)
  p = s / jnp.where(total > 0, total, 1.0)
  erank = jnp.exp(jnp.sum(jax.scipy.special.entr(p), axis=-1))   # entr(0) = 0
  return jnp.where(total[..., 0] > 0, erank, 0.0)


def effective_rank(a_NxM: Array) -> Array:
  """Effective rank ``exp(H(p))``, ``p_k = sigma_k / sum sigma`` (paper Eq. 3).

  Args:
    a_NxM: array of shape ``(..., N, M)``.

  Returns:
    ``(...)`` effective ranks in ``[1, min(N, M)]`` (0 for an all-zero matrix).
  """
  return effective_rank_from_singular_values(singular_values(a_NxM))


def stable_rank_from_singular_values(s_N: Array) -> Array:
  """``sum_k s_k^2 / max_k s_k^2`` over the last axis (0 for the zero matrix)."""
  s2 = jnp.square(jnp.asarray(s_N))
  top = jnp.max(s2, axis=-1)
  return jnp.where(top > 0, jnp.sum(s2, axis=-1) / jnp.where(top > 0, top, 1.0), 0.0)


def stable_rank(a_NxM: Array) -> Array:
  """Stable rank ``||A||_F^2 / ||A||_2^2`` (paper Sec 2), batched over leading axes."""
  return stable_rank_from_singular_values(singular_values(a_NxM))


def top_energy_fraction_from_singular_values(s_N: Array) -> Array:
  """``s_1^2 / sum_k s_k^2``: the reciprocal of the stable rank."""
  st = stable_rank_from_singular_values(s_N)
  return jnp.where(st > 0, 1.0 / jnp.where(st > 0, st, 1.0), 0.0)


def top_energy_fraction(a_NxM: Array) -> Array:
  """Fraction of ``||A||_F^2`` in the top singular direction (Fig 7c)."""
  return top_energy_fraction_from_singular_values(singular_values(a_NxM))


# ---------------------------------------------------------------------------
# Marchenko-Pastur law (App D.3), convention gamma = n / d


def marchenko_pastur_edges(gamma: float | Array) -> tuple[Array, Array]:
  """Support edges ``((1 - 1/sqrt(gamma))^2, (1 + 1/sqrt(gamma))^2)`` (App D.3)."""
  g = jnp.asarray(gamma, dtype=jnp.result_type(float))
  r = 1.0 / jnp.sqrt(g)
  return (1.0 - r) ** 2, (1.0 + r) ** 2


def marchenko_pastur_atom(gamma: float | Array) -> Array:
  """Mass of the eigenvalue atom at zero, ``max(0, 1 - gamma)`` (App D.6)."""
  g = jnp.asarray(gamma, dtype=jnp.result_type(float))
  return jnp.maximum(0.0, 1.0 - g)


def marchenko_pastur_density(x: Array, gamma: float | Array) -> Array:
  """Continuous part of the MP density of ``G = (1/n) X^T X``, ``gamma = n/d`` (the
  Marchenko-Pastur law of Transforming Rank, App D.3).

  ``rho(x) = gamma sqrt((lam_+ - x)(x - lam_-)) / (2 pi x)`` on ``[lam_-, lam_+]``;
  it integrates to ``min(1, gamma)``, the rest being the atom at zero.
  """
  x = jnp.asarray(x, dtype=jnp.result_type(float))
  g = jnp.asarray(gamma, dtype=x.dtype)
  lo, hi = marchenko_pastur_edges(g)
  inside = (x > lo) & (x < hi) & (x > 0)
  safe_x = jnp.where(inside, x, 1.0)
  rad = jnp.where(inside, (hi - safe_x) * (safe_x - lo), 0.0)
  return jnp.where(inside, g * jnp.sqrt(rad) / (2.0 * jnp.pi * safe_x), 0.0)


def marchenko_pastur_condition_number(gamma: float | Array) -> Array:
  """``sigma_max / sigma_min = (1 + 1/sqrt(gamma)) / (1 - 1/sqrt(gamma))`` (App D.3)."""
  g = jnp.asarray(gamma, dtype=jnp.result_type(float))
  r = 1.0 / jnp.sqrt(g)
  return jnp.where(g > 1, (1 + r) / jnp.where(g > 1, 1 - r, 1.0), jnp.inf)


@precision_lib.measured
def gaussian_product_effective_rank(key: Array, gamma: float, d: int, num_seeds: int = 20,
                                    dtype=jnp.float32) -> Array:
  """``erank(W_down W_up) / d`` of a product of two Gaussian matrices (App D.8).

  ``W_up`` is ``n x d`` and ``W_down`` is ``d x n`` with ``n = round(gamma d)`` hidden
  units (the survivors of the mask in the masking-activation picture, Sec 6), i.i.d.
  Gaussian entries. Returns the ``(num_seeds,)`` per-seed values (the reference curve
  of Fig 8b is their mean).
  """
  n = max(1, int(round(gamma * d)))

  def one(k):
    k_up, k_down = jax.random.split(k)
    w_up = jax.random.normal(k_up, (n, d), dtype)
    w_down = jax.random.normal(k_down, (d, n), dtype)
    return effective_rank(w_down @ w_up) / d

  return jax.vmap(one)(jax.random.split(key, num_seeds))


# ---------------------------------------------------------------------------
# Gaussian expectations of activations (Sec 3, 5, 6; Table 1)


@functools.lru_cache(maxsize=8)
def half_range_hermite_rule(num_nodes: int = 64) -> tuple[np.ndarray, np.ndarray]:
  """Gauss rule for the half-line weight ``phi(z) = exp(-z^2/2)/sqrt(2 pi)`` on [0, inf).

  The "half-range Gauss-Hermite" rule: its Jacobi matrix comes from the discretized
  Stieltjes procedure (Gautschi, *Orthogonal Polynomials*, Sec 2.2) on a 2000-point
  Gauss-Legendre discretization of [0, 14] (the tail beyond is below 1e-44), and
  its nodes/weights from Golub-Welsch. Applying it to ``f(z) + f(-z)`` integrates
  ``E f(z)`` over both half-lines separately, so functions with a kink at zero
  (relu, abs, a step derivative) are integrated to machine precision, which the
  plain Gauss-Hermite rule does not do.
  """
  x, w = np.polynomial.legendre.leggauss(2000)
  zmax = 14.0
  z = 0.5 * zmax * (x + 1.0)
  wz = 0.5 * zmax * w * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
  alpha = np.zeros(num_nodes)
  beta = np.zeros(num_nodes)
  mass = wz.sum()
  p_prev = np.zeros_like(z)
  p = np.full_like(z, 1.0 / math.sqrt(mass))
  for k in range(num_nodes):
    alpha[k] = np.sum(wz * z * p * p)
    q = (z - alpha[k]) * p - (beta[k] * p_prev if k > 0 else 0.0)
    norm = math.sqrt(np.sum(wz * q * q))
    if k + 1 < num_nodes:
      beta[k + 1] = norm
    p_prev, p = p, q / norm
  jacobi = np.diag(alpha) + np.diag(beta[1:], 1) + np.diag(beta[1:], -1)
  nodes, vecs = np.linalg.eigh(jacobi)
  return nodes, mass * vecs[0] ** 2


def gaussian_expectation(f: Callable[[np.ndarray], np.ndarray], num_nodes: int = 64) -> float:
  """``E[f(z)]``, ``z ~ N(0, 1)``, by half-range Gauss-Hermite quadrature (float64)."""
  nodes, weights = half_range_hermite_rule(num_nodes)
  return float(np.sum(weights * (f(nodes) + f(-nodes))))


def _np_sigmoid(z):
  return 0.5 * (1.0 + np.tanh(0.5 * z))


def _np_phi(z):
  return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _np_Phi(z):
  return 0.5 * (1.0 + special.erf(z / math.sqrt(2.0)))


# (sigma, sigma') in float64 numpy, matching rankjax._src.models.blocks.ACTIVATIONS
# (gelu is the exact erf form). sigma'(0) for relu/abs is immaterial (measure zero).
NUMPY_ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(float)),
    "abs": (np.abs, np.sign),
    "gelu": (lambda z: z * _np_Phi(z), lambda z: _np_Phi(z) + z * _np_phi(z)),
    "silu": (lambda z: z * _np_sigmoid(z),
             lambda z: _np_sigmoid(z) * (1.0 + z * (1.0 - _np_sigmoid(z)))),
    "tanh": (np.tanh, lambda z: 1.0 - np.tanh(z) ** 2),
}


@dataclasses.dataclass(frozen=True)
class ActivationMoments:
  """Gaussian moments of an activation at ``z ~ N(0, 1)``.

  Attributes:
    mean: E[sigma(z)].
    second_moment: E[sigma(z)^2] (= kappa, the stream-growth coefficient, Eq. 22).
    coherence: c = E[sigma]^2 / E[sigma^2] (Sec 5, Table 1); 1/c bounds the
      post-activation stable rank (Davis & Drusvyatskiy 2025).
    survival: p = E[sigma'(z)^2] (Sec 3, 6, App D.4); the survival rate
      Pr[sigma' != 0] for relu and abs; the full-rank threshold is m/d = 1/p.
  """

  mean: float
  second_moment: float
  coherence: float
  survival: float

  @property
  def kappa(self) -> float:
    return self.second_moment

  @property
  def spike_bound(self) -> float:
    """s_sigma = 1/c (infinite for a centered activation)."""
    return math.inf if self.coherence == 0 else 1.0 / self.coherence

  @property
  def width_threshold(self) -> float:
    """m/d = 1/p at which the branch Jacobian becomes full rank (Sec 6)."""
    return 1.0 / self.survival


@functools.lru_cache(maxsize=None)
def activation_moments(activation: str, num_nodes: int = 64) -> ActivationMoments:
  """Moments of ``activation`` (relu, abs, gelu, silu, tanh, swiglu) by quadrature.

  swiglu, ``silu(g) * u`` with independent standard Gaussian ``g, u`` (independent
  gate and up rows), is centered (``E = E[silu] E[u] = 0``, so c = 0) with
  ``E[sigma^2] = E[silu(g)^2]``. Its derivative is not one scalar per unit, so the
  paper leaves its survival rate open (Sec 9); ``survival`` is NaN for it.
  """
  if activation == "swiglu":
    silu = NUMPY_ACTIVATIONS["silu"][0]
    second = gaussian_expectation(lambda z: silu(z) ** 2, num_nodes)
    return ActivationMoments(0.0, second, 0.0, math.nan)
  if activation not in NUMPY_ACTIVATIONS:
    raise ValueError(f"activation {activation!r} is not allowed; choose one of "
                     f"{sorted(NUMPY_ACTIVATIONS) + ['swiglu']}")
  act, dact = NUMPY_ACTIVATIONS[activation]
  mean = gaussian_expectation(act, num_nodes)
  second = gaussian_expectation(lambda z: act(z) ** 2, num_nodes)
  survival = gaussian_expectation(lambda z: dact(z) ** 2, num_nodes)
  coherence = mean * mean / second
  if abs(mean) < 1e-14:   # odd activations: exactly centered
    mean, coherence = 0.0, 0.0
  return ActivationMoments(mean, second, coherence, survival)


def coherence_constant(activation: str) -> float:
  """c = E[sigma]^2 / E[sigma^2] (Sec 5, Table 1)."""
  return activation_moments(activation).coherence


def survival_rate(activation: str) -> float:
  """p = E[sigma'(z)^2] (Sec 3, 6)."""
  return activation_moments(activation).survival
