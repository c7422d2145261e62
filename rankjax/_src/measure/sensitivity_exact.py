"""Exact softmax sensitivity theta(p), the exact inf->1 Jacobian norm, Cor 3.4's forms.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability"
(``papers/softmax_sensitivity.txt``). For a distribution ``p`` on ``L`` atoms,

    theta(p) = 4 max_{S subset [L]} p(S) (1 - p(S))            (Def 3.1)

and for the tempered softmax ``s_tau(u) = softmax(u / tau)`` with ``p = s_tau(u)``

    ||J_tau(u)||_{inf->1} = theta(p) / tau                       (Thm 3.2).

Computing theta is a Partition-type problem (Remark 3.3). This module gives

* ``theta_enumerate``: all ``2^(L-1)`` subsets, ``jnp`` and jit-able (``L <= 16``);
* ``theta_mitm``: meet in the middle on sorted half-sums, numpy host code (threads
  over rows), exact up to ``L ~ 44`` nonzero atoms (rows with ``p_max >= 1/2`` are
  exact at any ``L``);
* ``theta_exact``: the first for ``L <= 16``, the second above;
* ``softmax_jacobian_inf_to_one``: the left side of Thm 3.2 by sign enumeration of
  the autodiff Jacobian, independent of theta;
* the closed forms of Cor 3.4.

Lower bounds at large ``L`` (App D.2's certificate) are in ``sensitivity_certificates``,
the Sec 5 statistics in ``sensitivity_statistics``; ``rankjax._src.measure.sensitivity``
re-exports all three. Every function is batched over leading axes (the atom axis is
``-1``).
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.numerics import as_float

Array = jax.Array

MAX_ENUMERATE_L = 16  # 2^(L-1) subsets on the jnp path
MAX_MITM_L = 44       # 2^21 half-sums per side on the host path
MAX_SIGN_L = 20       # 2^L sign vectors in softmax_jacobian_inf_to_one
_HIGHEST = jax.lax.Precision.HIGHEST


def _bits(idx: Array, n: int, dtype) -> Array:
  """Row ``r`` of the result is the binary expansion of ``idx[r]`` (``n`` bits)."""
  return ((idx[:, None] >> jnp.arange(n, dtype=idx.dtype)) & 1).astype(dtype)


# --------------------------------------------------------------------------- exact


@functools.partial(jax.jit, static_argnames="block")
def theta_enumerate(p: Array, block: int = 4096) -> Array:
  """theta(p) by enumerating subsets (Def 3.1); jnp, jit-able, ``L <= 16``.

  ``S`` and its complement give the same ``p(S)(1 - p(S))``, so only the ``2^(L-1)``
  subsets without the last atom are visited, in blocks of ``block`` (memory
  ``O(rows * block)``). ``p(S)`` and ``p(S^c)`` are both summed directly, so
  ``4 p(S) p(S^c)`` keeps its relative accuracy for nearly one-hot rows.

  Args:
    p: ``(..., L)`` probabilities (rows summing to one; zeros allowed).
    block: subsets per block.
  Returns:
    ``(...)`` theta values.
  """
  p = as_float(p)
  L = p.shape[-1]
  if L > MAX_ENUMERATE_L:
    raise ValueError(f"theta_enumerate handles L <= {MAX_ENUMERATE_L}, got {L}; "
                     "use theta_mitm (host) or theta_certificate")
  lead = p.shape[:-1]
  if L <= 1:
    return jnp.zeros(lead, p.dtype)
  n = L - 1
  num = 2 ** n
  block = min(block, num)
  p_RxL = p.reshape(-1, L)
  p_RxN, last_R = p_RxL[:, :n], p_RxL[:, n:]

  def body(best_R, b):
    masks_KxN = _bits(b * block + jnp.arange(block, dtype=jnp.int32), n, p.dtype)
    q_RxK = jnp.matmul(p_RxN, masks_KxN.T, precision=_HIGHEST)
    r_RxK = jnp.matmul(p_RxN, 1.0 - masks_KxN.T, precision=_HIGHEST) + last_R
    return jnp.maximum(best_R, jnp.max(4.0 * q_RxK * r_RxK, axis=-1)), None

  best_R, _ = jax.lax.scan(body, jnp.zeros(p_RxL.shape[0], p.dtype),
                           jnp.arange(num // block, dtype=jnp.int32))
  return best_R.reshape(lead)


def _sorted_signed_sums(x_RxK: np.ndarray) -> np.ndarray:
  """Row ``r``: all ``2^K`` sums ``sum_i +-x[r, i]``, ascending (Horowitz-Sahni).

  Built by doubling: each step merges two sorted runs (``s - v`` and ``s + v``);
  numpy's stable sort (timsort) merges two runs in linear time, row by row.
  """
  R, K = x_RxK.shape
  s_RxM = np.zeros((R, 1))
  for i in range(K):
    m = s_RxM.shape[1]
    out_RxM2 = np.empty((R, 2 * m))
    np.subtract(s_RxM, x_RxK[:, i:i + 1], out=out_RxM2[:, :m])
    np.add(s_RxM, x_RxK[:, i:i + 1], out=out_RxM2[:, m:])
    out_RxM2.sort(axis=-1, kind="stable")
    s_RxM = out_RxM2
  return s_RxM


def _theta_mitm_block(x_RxN: np.ndarray) -> np.ndarray:
  """Meet in the middle for rows of ``n >= 2`` nonzero atoms each (``p_max < 1/2``)."""
  R, n = x_RxN.shape
  h = n // 2
  total_R = x_RxN.sum(axis=-1)
  # Signed sums D = p(S) - p(S^c); fixing the sign of x[0] halves the work (S ~ S^c).
  a_RxM = _sorted_signed_sums(x_RxN[:, 1:h]) + x_RxN[:, :1]
  b_RxK = _sorted_signed_sums(x_RxN[:, h:])
  out_R = np.empty(R)
  for r in range(R):
    a, b, total = a_RxM[r], b_RxK[r], total_R[r]
    # p(S) = (D + total) / 2 is closest to 1/2 when D = a + b is closest to 1 - total.
    a_rev = a[::-1]
    want = (1.0 - total) - a_rev  # ascending
    idx = np.searchsorted(b, want)
    best = 0.0
    for j in (np.minimum(idx, b.size - 1), np.maximum(idx - 1, 0)):
      k = int(np.argmin(np.abs(b[j] - want)))
      q = 0.5 * (a_rev[k] + b[j[k]] + total)
      best = max(best, 4.0 * q * (1.0 - q))
    out_R[r] = best
  return out_R


def _default_workers() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def theta_mitm(p, workers: int | None = None) -> np.ndarray:
  """theta(p) exactly by meet in the middle (Def 3.1, Remark 3.3); numpy host code.

  Per row: zero atoms are dropped; ``p_max >= 1/2`` uses the exact dominant-atom
  formula ``4 p_max (1 - p_max)`` (Cor 3.4(3)); otherwise the nonzero atoms are split
  in two halves, all signed half-sums ``+-p_i`` are listed in sorted order
  (Horowitz-Sahni doubling with linear merges, batched over rows), and for each sum
  of the first half ``searchsorted`` finds the nearest complement in the second half,
  so ``p(S)`` closest to 1/2 is found in ``O(2^(n/2) n)``. Rows with the same number of
  nonzero atoms are processed in blocks, spread over ``workers`` threads (numpy
  releases the GIL in its sorts, searches and ufunc loops). About 4-5 ms of CPU per
  row at ``L = 32`` and 0.1-0.2 s at ``L = 40``.

  Args:
    p: ``(..., L)`` probabilities.
    workers: threads (default: the CPUs this process may use).
  Returns:
    float64 numpy array of shape ``(...)``.
  """
  p = np.asarray(p, dtype=np.float64)
  lead, L = p.shape[:-1], p.shape[-1]
  flat_RxL = p.reshape(-1, L)
  out_R = np.zeros(flat_RxL.shape[0])
  if L == 0 or out_R.size == 0:
    return out_R.reshape(lead)
  pos_RxL = flat_RxL > 0
  x_RxL = np.where(pos_RxL, flat_RxL, 0.0)
  n_R = pos_RxL.sum(axis=-1)
  top_R = np.argmax(x_RxL, axis=-1)
  p_max_R = x_RxL[np.arange(x_RxL.shape[0]), top_R]
  dom_R = (n_R >= 2) & (p_max_R >= 0.5)
  if dom_R.any():  # Cor 3.4(3): exact dominant-atom formula, kappa summed directly
    rest_R = np.where(np.arange(L) == top_R[:, None], 0.0, x_RxL).sum(axis=-1)
    out_R[dom_R] = 4.0 * p_max_R[dom_R] * rest_R[dom_R]
  search_R = (n_R >= 2) & ~dom_R
  if np.any(n_R[search_R] > MAX_MITM_L):
    raise ValueError(f"theta_mitm: a row has {n_R[search_R].max()} nonzero atoms and "
                     f"p_max < 1/2; exact search is limited to {MAX_MITM_L}. Use "
                     "theta_bracket instead.")
  tasks = []
  for n in np.unique(n_R[search_R]):
    rows = np.flatnonzero(search_R & (n_R == n))
    vals_RxN = flat_RxL[rows][pos_RxL[rows]].reshape(rows.size, n)  # original order
    block = int(np.clip(2 ** 19 >> (n - n // 2), 1, 8))  # ~2^19 second-half sums
    tasks += [(rows[i:i + block], vals_RxN[i:i + block]) for i in range(0, rows.size, block)]
  workers = min(workers or _default_workers(), len(tasks))
  if workers <= 1:
    results = [_theta_mitm_block(vals) for _, vals in tasks]
  else:
    with ThreadPoolExecutor(workers) as pool:
      results = list(pool.map(_theta_mitm_block, [vals for _, vals in tasks]))
  for (rows, _), vals in zip(tasks, results):
    out_R[rows] = vals
  return out_R.reshape(lead)


def theta_exact(p, max_enumerate: int = MAX_ENUMERATE_L):
  """Exact theta(p) (Def 3.1): ``theta_enumerate`` for ``L <= max_enumerate`` (jnp,
  jit-able, returns a jax Array), else ``theta_mitm`` (host, returns float64 numpy).

  Args:
    p: ``(..., L)`` probabilities.
    max_enumerate: largest ``L`` sent to the jnp enumeration.
  """
  L = jnp.shape(p)[-1]
  if L <= max_enumerate:
    return theta_enumerate(p)
  if isinstance(p, jax.core.Tracer):
    raise TypeError(f"theta_exact at L = {L} > {max_enumerate} is host code (meet in "
                    "the middle); call it outside jit, or use theta_certificate")
  return theta_mitm(np.asarray(p))


# ----------------------------------------------------------- Thm 3.2 and Cor 3.4


@jax.jit
def softmax_jacobian_inf_to_one(u: Array, tau: float = 1.0) -> Array:
  """``||J_tau(u)||_{inf->1}``, ``J_tau = D_u softmax(u / tau)``, exhaustively (Thm 3.2).

  The Jacobian comes from ``jax.jacfwd`` (not from the closed form of Thm 3.2) and
  the norm ``max_{||x||_inf <= 1} ||J x||_1`` is the maximum over all ``2^L`` sign
  vectors (a convex function on the cube peaks at a vertex, App B). This is the
  left side of Thm 3.2, computed without theta; ``L <= 20``.

  Args:
    u: ``(..., L)`` logits.
    tau: temperature ``> 0``.
  Returns:
    ``(...)`` operator norms.
  """
  u = as_float(u)
  L = u.shape[-1]
  if L > MAX_SIGN_L:
    raise ValueError(f"sign enumeration handles L <= {MAX_SIGN_L}, got {L}")
  signs_KxL = 1.0 - 2.0 * _bits(jnp.arange(2 ** L, dtype=jnp.int32), L, u.dtype)

  def one(u_L):
    jac_LxL = jax.jacfwd(lambda v: jax.nn.softmax(v / tau))(u_L)
    jx_KxL = jnp.matmul(signs_KxL, jac_LxL.T, precision=_HIGHEST)
    return jnp.max(jnp.sum(jnp.abs(jx_KxL), axis=-1))

  out = jax.lax.map(one, u.reshape(-1, L), batch_size=8)
  return out.reshape(u.shape[:-1])


@jax.jit
def theta_uniform(L) -> Array:
  """Cor 3.4(1): theta of the uniform distribution on L atoms: 1 (L even), 1 - 1/L^2."""
  Lf = jnp.asarray(L, jnp.result_type(float))
  return jnp.where(jnp.asarray(L) % 2 == 0, 1.0, 1.0 - 1.0 / Lf ** 2).astype(Lf.dtype)


@jax.jit
def theta_top_k_uniform(k) -> Array:
  """Cor 3.4(4): mass 1/k on k atoms: ``1 - (1 - 2 floor(k/2) / k)^2``.

  ``k = 1`` is the one-hot case of Cor 3.4(2), ``theta = 0``.
  """
  k = jnp.asarray(k)
  return 1.0 - (1.0 - 2.0 * (k // 2) / k.astype(jnp.result_type(float))) ** 2


@jax.jit
def theta_dominant_atom(p_max: Array) -> Array:
  """Cor 3.4(3): top atom of mass ``1 - kappa``, ``kappa <= 1/2``: ``theta =
  4 kappa (1 - kappa)``. NaN where ``p_max < 1/2`` (the formula does not apply)."""
  p_max = as_float(p_max)
  return jnp.where(p_max >= 0.5, 4.0 * p_max * (1.0 - p_max), jnp.nan)


@jax.jit
def theta_lower_bound_pmax(p_max: Array) -> Array:
  """Cor 3.4(5): ``theta(p) >= 1 - p_max^2``."""
  return 1.0 - as_float(p_max) ** 2
