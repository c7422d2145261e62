"""Exact softmax sensitivity theta(p), its certificates, and attention statistics.

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
* ``theta_certificate``: lower bounds ``4 p(S)(1 - p(S))`` of a feasible subset ``S``,
  ``jnp``, jit-able (App D.2 greedy prefix by a sort-free bisection, and our
  balancing, ``O(L log L)`` per row);
* ``theta_bracket``: ``(lower, upper)`` from the certificate and Cor 3.4;
* ``softmax_jacobian_inf_to_one``: the left side of Thm 3.2 by sign enumeration of
  the autodiff Jacobian, independent of theta;
* the regimes of Cor 3.4, the attention-row statistics of Sec 5 and the gradient
  spike rule of Sec 5 ("Other metrics").

Every function is batched over leading axes (the atom axis is ``-1``).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

MAX_ENUMERATE_L = 16  # 2^(L-1) subsets on the jnp path
MAX_MITM_L = 44       # 2^21 half-sums per side on the host path
MAX_SIGN_L = 20       # 2^L sign vectors in softmax_jacobian_inf_to_one
_HIGHEST = jax.lax.Precision.HIGHEST

CertificateMethod = Literal["greedy_prefix", "balance"]


def _float(x) -> Array:
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


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
  p = _float(p)
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


# -------------------------------------------------------------------- certificates


def _bits_of(x: Array) -> Array:
  """Bit patterns of nonnegative floats as signed ints of the same width; for ``x >= 0``
  they order exactly as the floats do (IEEE 754: exponent above mantissa, sign 0)."""
  itype = jnp.int32 if x.dtype.itemsize == 4 else jnp.int64
  return jax.lax.bitcast_convert_type(x, itype)


def _nonneg(p_RxL: Array) -> Array:
  """``p`` with ``-0.0`` (and any negative or NaN entry, not a probability) set to 0."""
  return jnp.where(p_RxL > 0, p_RxL, jnp.zeros((), p_RxL.dtype))


def _sort_desc(p_RxL: Array) -> Array:
  """Descending sort of nonnegative rows, as a sort of their int bit patterns (the same
  order, see ``_bits_of``): XLA:CPU sorts ints several times faster than floats, whose
  comparator also orders NaNs and signed zeros."""
  x = _nonneg(p_RxL)
  return jax.lax.bitcast_convert_type(-jnp.sort(-_bits_of(x), axis=-1), x.dtype)


def _greedy_prefix(p_RxL: Array) -> Array:
  """App D.2 greedy-prefix certificate, per row, without sorting.

  The descending prefixes of App D.2 are the sets ``{i : p_i >= t}``. With
  ``g(t) = sum_{p_i >= t} p_i`` (non-increasing in ``t``), a per-row bisection over the
  float bit pattern ``t`` finds the exact boundary: the largest pattern ``T`` with
  ``g(T) > 1/2``. Then ``v = p``-value of pattern ``T`` is the next atom after the
  largest prefix of mass ``c = g(T + 1) <= 1/2`` (``n_v`` atoms share that value), and
  the prefixes straddling 1/2 are ``c + j v``, ``j = 0..n_v``. Since ``4 c (1 - c)``
  increases up to ``c = 1/2`` and decreases after, the max over all prefixes
  (= App D.2's ``k* = argmin_k |c_k - 1/2|``) is at ``j = floor((1/2 - c) / v)`` or
  ``+1``; ``j = 0, 1`` are checked too against rounding in that quotient.

  The set picked is the same as a descending sort's (ties included: each ``c + j v`` is
  the mass of an actual prefix, the threshold set plus ``j`` of the tied atoms), so the
  value equals the sort-based one up to the summation order of ``c``. Each bisection
  pass is one masked row sum; about 27 passes for float32 rows of length 1024 (the
  search starts at ``total / (4L)``, where ``g > 3/4 total``), at most 31 (63 for
  float64). Rows are expected nonnegative (``-0.0`` counts as 0).
  """
  x_RxL = _nonneg(p_RxL)
  bits_RxL = _bits_of(x_RxL)
  dtype = x_RxL.dtype
  half = jnp.asarray(0.5, dtype)
  L = x_RxL.shape[-1]

  def mass(t_R: Array) -> Array:  # g(t): mass of the atoms with pattern >= t
    # Compared as floats (the same order for these nonnegative patterns, and one
    # array read per pass instead of two).
    t_R = jax.lax.bitcast_convert_type(t_R, dtype)
    return jnp.sum(jnp.where(x_RxL >= t_R[:, None], x_RxL, 0.0), axis=-1)

  hi_R = jnp.max(bits_RxL, axis=-1) + 1  # g(hi) = 0 <= 1/2
  lo_R = _bits_of(jnp.sum(x_RxL, axis=-1) / (4 * L))
  lo_R = jnp.where(mass(lo_R) > half, lo_R, jnp.zeros_like(lo_R))  # invariant g(lo) > 1/2
  c_hi_R = jnp.zeros(hi_R.shape, dtype)  # g(hi), kept with hi

  def cond(carry):
    lo_R, hi_R, _ = carry
    return jnp.any(hi_R - lo_R > 1)

  def body(carry):
    lo_R, hi_R, c_hi_R = carry
    active_R = hi_R - lo_R > 1
    mid_R = lo_R + (hi_R - lo_R) // 2
    g_R = mass(mid_R)
    big_R = g_R > half
    return (jnp.where(active_R & big_R, mid_R, lo_R),
            jnp.where(active_R & ~big_R, mid_R, hi_R),
            jnp.where(active_R & ~big_R, g_R, c_hi_R))

  lo_R, hi_R, c_R = jax.lax.while_loop(cond, body, (lo_R, hi_R, c_hi_R))
  # A row of total mass <= 1/2 ends with lo = 0, c = g(1) = total and v = 0: the whole
  # row, as for the sort (every prefix has c <= 1/2 there).
  v_R = jax.lax.bitcast_convert_type(lo_R, dtype)
  n_R = jnp.sum(bits_RxL == lo_R[:, None], axis=-1).astype(dtype)
  j0_R = jnp.floor((half - c_R) / jnp.where(v_R > 0, v_R, 1.0))
  best_R = jnp.zeros_like(c_R)
  for j_R in (0.0, 1.0, j0_R, j0_R + 1.0):
    q_R = c_R + jnp.clip(j_R, 0.0, n_R) * v_R
    best_R = jnp.maximum(best_R, 4.0 * q_R * (1.0 - q_R))
  return best_R


def _balance(s_RxL: Array) -> Array:
  """Greedy balancing plus one best move or swap; returns ``4 q (1 - q)``."""
  def step(carry, x_R):
    a_R, b_R = carry
    to_a = a_R <= b_R
    return (jnp.where(to_a, a_R + x_R, a_R), jnp.where(to_a, b_R, b_R + x_R)), to_a

  R, L = s_RxL.shape
  zero = jnp.zeros((R,), s_RxL.dtype)
  (a_R, b_R), in_a_LxR = jax.lax.scan(step, (zero, zero), s_RxL.T)
  in_a_RxL = in_a_LxR.T
  # Moving x from A to B and y from B to A (x or y may be 0: a move) changes the mass
  # of A to a - x + y; the best y for each x is the one nearest x - (a - b) / 2.
  # B's atoms, already descending in s, are compacted by a scatter and followed by
  # 0 (the move option) and -inf padding; flipped, that is ascending with no sort.
  in_b_RxL = ~in_a_RxL
  count_R = jnp.sum(in_b_RxL, axis=-1)
  slot_RxL = jnp.where(in_b_RxL, jnp.cumsum(in_b_RxL, axis=-1) - 1, L + 1)  # L+1: dropped
  rows_R = jnp.arange(R)
  y_desc = jnp.full((R, L + 1), -jnp.inf, s_RxL.dtype).at[rows_R, count_R].set(0.0)
  y_desc = y_desc.at[rows_R[:, None], slot_RxL].set(s_RxL, mode="drop")
  y_sorted = jnp.flip(y_desc, axis=-1)
  zcol = jnp.zeros((R, 1), s_RxL.dtype)
  x_RxM = jnp.concatenate([jnp.where(in_a_RxL, s_RxL, 0.0), zcol], -1)
  want_RxM = x_RxM - 0.5 * (a_R - b_R)[:, None]
  idx_RxM = jax.vmap(jnp.searchsorted)(y_sorted, want_RxM)
  best_R = jnp.zeros((R,), s_RxL.dtype)
  for j in (jnp.minimum(idx_RxM, L), jnp.maximum(idx_RxM - 1, 0)):
    y_RxM = jnp.take_along_axis(y_sorted, j, axis=-1)
    q_RxM = a_R[:, None] - x_RxM + y_RxM
    val = jnp.where(jnp.isfinite(q_RxM), 4.0 * q_RxM * (1.0 - q_RxM), 0.0)
    best_R = jnp.maximum(best_R, jnp.max(val, axis=-1))
  return best_R


@functools.partial(jax.jit, static_argnames="method")
def theta_certificate(p: Array, method: CertificateMethod = "balance") -> Array:
  """Lower-bound certificate ``4 p(S)(1 - p(S)) <= theta(p)`` of a feasible subset S.

  Any subset gives a valid lower bound (Sec 5, "Certificates for theta(p) at large L").

  * ``"greedy_prefix"``: the paper's procedure (App D.2, steps 1-4): descending
    cumulative sums ``c_k``, ``k = 1..L``, ``k* = argmin_k |c_k - 1/2|``, return
    ``4 c_k* (1 - c_k*)``. Computed without a sort: the descending prefixes are the
    sets ``{i : p_i >= t}`` and a per-row bisection over the float bit pattern of
    ``t`` finds the two straddling 1/2 (``_greedy_prefix``; about 27 masked row sums
    at L = 1024, float32). The value equals the sort-based one up to summation order,
    ties included.
  * ``"balance"`` (ours): sort descending (an int sort of the bit patterns) and put
    each atom in the lighter of two bins (greedy balancing, a ``lax.scan`` over
    ``L``); then the best single move or swap of one atom between the bins (a
    scatter and a ``searchsorted``); return the best of that subset and the greedy
    prefix. It is never below ``"greedy_prefix"``, is exact when ``p_max >= 1/2``
    (the dominant atom ends alone in its bin) and, since balancing keeps the bin
    difference ``<= p_max``, is ``>= 1 - p_max^2`` (Cor 3.4(5)).

  ``"greedy_prefix"`` is ``O(L)`` per bisection pass, ``"balance"`` ``O(L log L)``
  per row; both jnp and jit-able. Zero atoms (masked positions) do not change either
  certificate. Entries must be nonnegative (``-0.0`` is read as 0).

  Args:
    p: ``(..., L)`` probabilities.
    method: ``"balance"`` (default) or ``"greedy_prefix"``.
  Returns:
    ``(...)`` certificates.
  """
  p = _float(p)
  lead, L = p.shape[:-1], p.shape[-1]
  if method not in ("greedy_prefix", "balance"):
    raise ValueError(f"method {method!r} is not allowed; choose 'greedy_prefix' or 'balance'")
  p_RxL = p.reshape(-1, L)
  cert = _greedy_prefix(p_RxL)
  if method == "balance":
    cert = jnp.maximum(cert, _balance(_sort_desc(p_RxL)))
  return cert.reshape(lead)


@functools.partial(jax.jit, static_argnames="method")
def theta_bracket(p: Array, method: CertificateMethod = "balance") -> tuple[Array, Array]:
  """``(lower, upper)`` with ``lower <= theta(p) <= upper`` per row; jnp, jit-able.

  * ``p_max >= 1/2``: ``lower = upper = 4 p_max (1 - p_max)`` (Cor 3.4(3), exact).
  * otherwise ``lower = max(theta_certificate(p), 1 - p_max^2)`` (Cor 3.4(5) holds for
    every ``p``) and ``upper = 1`` (Def 3.1: ``theta in [0, 1]``). The paper states no
    other upper bound.
  """
  p = _float(p)
  p_max = jnp.max(p, axis=-1)
  dominant = 4.0 * p_max * (1.0 - p_max)
  lower = jnp.maximum(theta_certificate(p, method), 1.0 - p_max ** 2)
  is_dom = p_max >= 0.5
  return (jnp.where(is_dom, dominant, lower),
          jnp.where(is_dom, dominant, jnp.ones_like(p_max)))


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
  u = _float(u)
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
  p_max = _float(p_max)
  return jnp.where(p_max >= 0.5, 4.0 * p_max * (1.0 - p_max), jnp.nan)


@jax.jit
def theta_lower_bound_pmax(p_max: Array) -> Array:
  """Cor 3.4(5): ``theta(p) >= 1 - p_max^2``."""
  return 1.0 - _float(p_max) ** 2


# ------------------------------------------------------------ Sec 5 statistics


def _summary(x_R: Array, percentiles: Sequence[float]) -> dict[str, Array]:
  values = jnp.percentile(x_R, jnp.asarray(percentiles, x_R.dtype))
  out = {f"p{q:g}": values[i] for i, q in enumerate(percentiles)}
  out["mean"] = jnp.mean(x_R)
  return out


@functools.partial(jax.jit, static_argnames=("num_rows", "min_query", "percentiles",
                                             "method"))
def attention_statistics(probs_BxHxTxT: Array, key: Array, num_rows: int = 512,
                         min_query: int = 16,
                         percentiles: Sequence[float] = (5, 25, 50, 75, 95),
                         method: CertificateMethod = "balance") -> dict:
  """Attention-row statistics of Sec 5 ("Attention measurements"); jit-able.

  Samples ``num_rows`` rows without replacement, pooled over batch and heads, with
  query position ``t >= min_query``; each row is restricted to its causal support
  ``j <= t`` (and renormalized there). For each row: the certificate
  ``theta_certificate(row, method)`` (the paper uses ``"greedy_prefix"``; our default
  ``"balance"`` is never lower), ``p_max`` and the normalized entropy
  ``H_norm = -sum_j p_j log p_j / log(t + 1)`` (0 when ``t = 0``).

  Args:
    probs_BxHxTxT: attention probabilities (query axis -2, key axis -1).
    key: PRNG key for the row sample.
    num_rows, min_query, percentiles, method: static (``percentiles`` a tuple).
  Returns:
    ``{"theta_cert"|"p_max"|"entropy_norm": {"p5": ..., ..., "mean": ...},
    "rows": {"b", "h", "t", "theta_cert", "p_max", "entropy_norm"}}`` (per-row values
    and the sampled indices).
  """
  B, H, T, T2 = probs_BxHxTxT.shape
  if T != T2:
    raise ValueError(f"expected (B, H, T, T) probabilities, got {probs_BxHxTxT.shape}")
  nq = T - min_query
  pool = B * H * max(nq, 0)
  if num_rows > pool:
    raise ValueError(f"num_rows={num_rows} exceeds the {pool} rows with t >= {min_query}")
  flat = jax.random.choice(key, pool, (num_rows,), replace=False)
  b, h, t = flat // (H * nq), (flat // nq) % H, flat % nq + min_query
  rows_RxT = _float(probs_BxHxTxT[b, h, t, :])
  rows_RxT = jnp.where(jnp.arange(T)[None, :] <= t[:, None], rows_RxT, 0.0)
  p_RxT = rows_RxT / jnp.sum(rows_RxT, axis=-1, keepdims=True)
  theta = theta_certificate(p_RxT, method)
  p_max = jnp.max(p_RxT, axis=-1)
  plogp = jnp.where(p_RxT > 0, p_RxT * jnp.log(jnp.where(p_RxT > 0, p_RxT, 1.0)), 0.0)
  log_support = jnp.log((t + 1).astype(p_RxT.dtype))
  entropy = jnp.where(t > 0, -jnp.sum(plogp, -1) / jnp.where(t > 0, log_support, 1.0), 0.0)
  per_row = {"theta_cert": theta, "p_max": p_max, "entropy_norm": entropy}
  out = {name: _summary(v, percentiles) for name, v in per_row.items()}
  out["rows"] = dict(b=b, h=h, t=t, **per_row)
  return out


@functools.partial(jax.jit, static_argnames=("window", "warmup",
                                             "exclude_warmup_from_window"))
def gradient_spikes(grad_norms: Array, window: int = 50, warmup: int = 10,
                    factor: float = 2.0, exclude_warmup_from_window: bool = False) -> Array:
  """Gradient-spike flags (Sec 5, "Other metrics"); jnp, jit-able.

  "A gradient spike is an optimizer update whose pre-clipping norm exceeds twice the
  median of the available preceding updates, using a window of at most 50 updates;
  the first 10 updates are excluded." Update ``t`` (0-based) is a spike when
  ``t >= warmup`` and ``g[t] > factor * median(g[max(0, t - window) : t])``. The
  paper leaves open whether the first updates also leave the window; by default they
  stay in it ("available preceding updates"), ``exclude_warmup_from_window=True``
  drops them. The median of an even count is the mean of the two middle values.

  Args:
    grad_norms: ``(..., N)`` per-update pre-clipping global gradient norms.
  Returns:
    boolean ``(..., N)``.
  """
  g = _float(grad_norms)
  N = g.shape[-1]
  steps = jnp.arange(N)
  j_NxW = steps[:, None] - 1 - jnp.arange(window)[None, :]
  first = warmup if exclude_warmup_from_window else 0
  valid_NxW = j_NxW >= first
  prev = jnp.where(valid_NxW, g[..., jnp.clip(j_NxW, 0, max(N - 1, 0))], jnp.nan)
  median = jnp.nanmedian(prev, axis=-1)
  return (steps >= warmup) & jnp.any(valid_NxW, -1) & (g > factor * median)

