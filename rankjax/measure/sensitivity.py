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
  ``jnp``, jit-able (App D.2 greedy prefix by a sort-free interpolation search, our
  one-atom repair of it, and our balancing, ``O(L log L)`` per row);
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

CertificateMethod = Literal["greedy_prefix", "repair", "balance"]


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


def _greedy_boundary(x_RxL: Array) -> tuple[Array, Array, Array, Array]:
  """Boundary of the App D.2 greedy prefixes, per row, without sorting.

  ``x_RxL`` must be nonnegative without ``-0.0`` (``_nonneg``; the callers apply it
  once, since each copy is a pass over the rows).

  The descending prefixes of App D.2 are the sets ``{i : p_i >= t}``; with
  ``g(t) = sum_{p_i >= t} p_i`` (non-increasing in ``t``) the boundary atom value is
  ``v``, the largest ``t`` with ``g(t) > 1/2``: the prefix of the atoms ``> v`` has mass
  ``c = g(v^+) <= 1/2``, ``n_v >= 1`` atoms equal ``v``, and the prefixes straddling 1/2
  are ``c + j v``, ``j = 0..n_v``. A row of total mass ``<= 1/2`` gives ``v = 0``,
  ``c = total`` (every prefix is below 1/2, the whole row is the best).

  Search: a per-row bracket ``lo <= v <= s``, with ``g(lo) > 1/2`` and ``s`` the largest
  atom below the last probe ``hi`` where ``g(hi) <= 1/2`` (so ``g(s^+) = g(hi)``). Each
  pass probes one threshold ``t`` per row and computes, in one masked array, ``g(t)``
  and the largest atom below ``t`` (two row reductions), or ``g(t)`` alone while every
  searching row's bracket is wide (``s / lo > 2``; then ``s = t - 1``, the pattern
  below ``hi``, not an atom, which keeps ``g(s^+) = g(hi)``). The row is done when a probe
  at ``t = s`` gives ``g(s) > 1/2`` (then ``v = s``, ``c = g(hi)``), or when a probe
  ``t`` with ``g(t) <= 1/2`` has ``g(t) + s(t) > 1/2`` (then ``v = s(t)``,
  ``c = g(t)``, only if ``s(t)`` is an atom). Probes are chosen by Illinois-safeguarded
  linear interpolation of ``g`` (in the float bit pattern, i.e. about log ``t``, while
  ``s / lo > 2``; in ``t`` itself after), aimed half an atom below 1/2 so that the probe tends to land just
  above ``v``, then projected into ``mid +- r_k`` of the bit-pattern bracket (ITP: the
  width after ``k`` passes is ``<= 2^(nmax - k)``), so the worst case is that of a
  bisection plus one pass: ``nmax + 1`` passes, ``nmax = 32`` for float32 (64 for
  float64). The first ``lo`` is free: ``g(t) > total - L t >= 1/2`` for
  ``t <= (total - 1/2) / L``. Softmax rows of Gaussian logits at ``L = 1024`` take
  about 5 passes on average and 10-13 for the slowest of 512 rows (exactly uniform
  rows 8). A pass costs in proportion to its rows, so once at most a quarter (then a
  sixteenth) of the rows is still searching, those are gathered and searched alone;
  with one materialized masked array and two reductions per pass, this is about 2.2x
  faster than a plain bisection (27 passes of one masked sum) at 512 x 1024.

  The comparison ``g(t) > 1/2`` and the sums are in ``p``'s dtype (``g(t)`` as
  ``(sum y + total) / 2``, an error of a few ulps of ``total``), so the boundary is the
  sort's up to rounding; ties are exact (``n_v`` is counted, in one extra pass only
  when some row has a tie group straddling 1/2).

  Returns:
    ``(c_R, v_R, n_R, passes)``: ``n_R`` is the tie count ``n_v`` when some row has
    ``j0 = floor((1/2 - c) / v) >= 1``, else 1 (the callers need ``min(n_v, j0 + 1)``
    only); 0 where ``v = 0``. ``passes``: search passes of the slowest row.
  """
  dtype = x_RxL.dtype
  itype = jnp.int32 if dtype.itemsize == 4 else jnp.int64
  nbits = 8 * dtype.itemsize - 1  # nonnegative patterns are < 2^nbits
  nmax = nbits + 1
  half = jnp.asarray(0.5, dtype)
  zero = jnp.zeros((), dtype)
  R, L = x_RxL.shape
  bits = lambda v: jax.lax.bitcast_convert_type(v, itype)
  value = lambda b: jax.lax.bitcast_convert_type(b, dtype)

  total_R = jnp.sum(x_RxL, axis=-1)
  max_R = jnp.max(x_RxL, axis=-1)
  # g(t) > total - L t >= 1/2 below (total - 1/2) / L; 0.99 and total >= 3/4 keep the
  # bound strict through the rounding of total.
  lo_R = jnp.where(total_R >= 0.75, bits(0.99 * (total_R - half) / L), 0).astype(itype)
  g_lo_R = total_R  # only steers the interpolation (the true g(lo) is in (1/2, total])
  s_R = bits(max_R)
  g_hi_R = jnp.zeros(R, dtype)
  small_R = total_R <= half
  done_R = small_R | (max_R > half)  # max > 1/2: v = max, c = 0
  v_R = jnp.where(small_R, 0, s_R).astype(itype)
  c_R = jnp.where(small_R, total_R, zero)
  side_R = jnp.zeros(R, jnp.int32)  # +n: lo moved n times in a row; -n: hi did
  atom_R = jnp.ones(R, bool)  # s is an atom (else s = hi - 1, after a sum-only pass)
  switch = jnp.asarray(1 << (8 * dtype.itemsize - 9 if dtype.itemsize == 4 else 52), itype)

  def step(x_RxL, total_R, carry):
    done_R, v_R, c_R, lo_R, g_lo_R, s_R, g_hi_R, side_R, atom_R, k = carry
    s_val_R = value(s_R)
    g_s_R = g_hi_R + jnp.where(atom_R, s_val_R, zero)  # <= g(s)
    # Illinois: the end kept twice in a row has its distance to 1/2 halved per repeat.
    gl_R = jnp.where(side_R <= -2, half + (g_lo_R - half) * jnp.exp2((side_R + 1).astype(dtype)),
                     g_lo_R)
    gs_R = jnp.where(side_R >= 2, half - (half - g_s_R) * jnp.exp2((1 - side_R).astype(dtype)),
                     g_s_R)
    span_R = jnp.maximum(gl_R - gs_R, jnp.finfo(dtype).tiny)
    in_bits_R = s_R - lo_R > switch
    a_R = jnp.where(in_bits_R, lo_R.astype(dtype), value(lo_R))
    b_R = jnp.where(in_bits_R, s_R.astype(dtype), s_val_R)
    to_bits = lambda t_R: jnp.where(in_bits_R, jnp.floor(t_R).astype(itype), bits(t_R))
    # First the crossing of 1/2, then aim half an atom (~ its value) below 1/2.
    t_R = a_R + jnp.clip((gl_R - half) / span_R, 0.0, 1.0) * (b_R - a_R)
    est_R = value(jnp.clip(to_bits(t_R), lo_R, s_R))
    frac_R = jnp.clip((gl_R - (half - 0.5 * est_R)) / span_R, 0.0, 1.0)
    tp_R = jnp.clip(to_bits(a_R + frac_R * (b_R - a_R)) + 1, lo_R + 1, s_R)
    # ITP projection into mid +- r, r = 2^(nmax - k - 1) - w / 2 (bit patterns).
    w_R = s_R + 1 - lo_R
    e = nmax - k - 1
    r_R = jnp.where(e >= nbits, w_R,  # 2^e - w/2 >= w/2 there: no constraint
                    (jnp.asarray(1, itype) << jnp.clip(e, 0, nbits - 1).astype(itype))
                    - (w_R + 1) // 2)
    r_R = jnp.clip(r_R, 0, w_R // 2 + 1)
    mid_R = lo_R + w_R // 2
    tp_R = jnp.minimum(jnp.maximum(tp_R, mid_R - r_R), mid_R + r_R)
    tp_R = jnp.minimum(jnp.maximum(tp_R, lo_R + 1), s_R)
    # One masked array y gives both: atoms below t enter negated, so
    # g(t) = (sum y + total) / 2 and the largest atom below t is -min y (zero atoms as
    # -0.0; min y > 0 when no atom is below t).
    t_Rx1 = value(tp_R)[:, None]

    def full():
      y_RxL = x_RxL * jnp.where(x_RxL >= t_Rx1, 1.0, -1.0).astype(dtype)
      return (0.5 * (jnp.sum(y_RxL, axis=-1) + total_R),
              bits(jnp.maximum(-jnp.min(y_RxL, axis=-1), zero)), jnp.ones_like(done_R))

    def sum_only():  # s = t - 1 keeps g(s^+) = g(hi); enough while the bracket is wide
      return (jnp.sum(jnp.where(x_RxL >= t_Rx1, x_RxL, zero), axis=-1), tp_R - 1,
              jnp.zeros_like(done_R))

    g_R, below_R, below_atom_R = jax.lax.cond(jnp.any(~done_R & ~in_bits_R), full, sum_only)
    big_R = g_R > half
    act_R = ~done_R
    up_R, dn_R = act_R & big_R, act_R & ~big_R
    fin_a_R = up_R & (tp_R == s_R)  # g(s) > 1/2: v = s, c = g(hi)
    # v = the atom below t, c = g(t):
    fin_b_R = dn_R & below_atom_R & (g_R + value(below_R) > half)
    v_R = jnp.where(fin_a_R, s_R, jnp.where(fin_b_R, below_R, v_R))
    c_R = jnp.where(fin_a_R, g_hi_R, jnp.where(fin_b_R, g_R, c_R))
    return (done_R | fin_a_R | fin_b_R, v_R, c_R,
            jnp.where(up_R, tp_R, lo_R), jnp.where(up_R, g_R, g_lo_R),
            jnp.where(dn_R, below_R, s_R), jnp.where(dn_R, g_R, g_hi_R),
            jnp.where(up_R, jnp.maximum(side_R, 0) + 1,
                      jnp.where(dn_R, jnp.minimum(side_R, 0) - 1, side_R)),
            jnp.where(dn_R, below_atom_R, atom_R), k + 1)

  def search(x_RxL, total_R, carry, cap):  # until all done or <= cap rows active
    return jax.lax.while_loop(lambda c: jnp.sum(~c[0]) > cap,
                              lambda c: step(x_RxL, total_R, c), carry)

  carry = (done_R, v_R, c_R, lo_R, g_lo_R, s_R, g_hi_R, side_R, atom_R, jnp.int32(0))
  # Compaction: once at most a quarter of the rows is active, they are gathered and
  # searched on their own (a pass costs in proportion to its rows); twice.
  caps = [c for c in (R // 4, R // 16) if c >= 8]
  carry = search(x_RxL, total_R, carry, caps[0] if caps else 0)
  for i, cap in enumerate(caps):
    idx_C = jnp.nonzero(~carry[0], size=cap, fill_value=0)[0]
    sub = jax.tree.map(lambda a: a[idx_C] if a.ndim else a, carry)
    sub = search(x_RxL[idx_C], total_R[idx_C], sub, caps[i + 1] if i + 1 < len(caps) else 0)
    carry = jax.tree.map(lambda a, b: a.at[idx_C].set(b) if a.ndim else b, carry, sub)
  _, v_R, c_R, *_, passes = carry
  v_R = value(v_R)
  j0_R = jnp.floor((half - c_R) / jnp.where(v_R > 0, v_R, 1.0))
  n_R = jax.lax.cond(  # ties straddling 1/2 (j0 >= 1) need the tie count
      jnp.any(j0_R >= 1),
      lambda: jnp.sum(jnp.where(x_RxL == v_R[:, None], 1.0, 0.0), axis=-1).astype(dtype),
      lambda: jnp.ones_like(v_R))
  n_R = jnp.where(v_R > 0, n_R, 0.0)
  return c_R, v_R, n_R, passes


def _prefix_value(c_R: Array, v_R: Array, n_R: Array) -> Array:
  """Best greedy prefix value from the boundary ``(c, v, n_v)`` of ``_greedy_boundary``.

  Since ``4 c (1 - c)`` increases up to ``c = 1/2`` and decreases after, the max over
  all prefixes (= App D.2's ``k* = argmin_k |c_k - 1/2|``) among ``c + j v``,
  ``j = 0..n_v``, is at ``j0 = floor((1/2 - c) / v)`` or ``j0 + 1``; ``j = 0, 1`` are
  checked too against rounding in that quotient.
  """
  j0_R = jnp.floor((0.5 - c_R) / jnp.where(v_R > 0, v_R, 1.0))
  best_R = jnp.zeros_like(c_R)
  for j_R in (0.0, 1.0, j0_R, j0_R + 1.0):
    q_R = c_R + jnp.clip(j_R, 0.0, n_R) * v_R
    best_R = jnp.maximum(best_R, 4.0 * q_R * (1.0 - q_R))
  return best_R


def _greedy_prefix(p_RxL: Array) -> Array:
  """App D.2 greedy-prefix certificate, per row, without sorting.

  ``_greedy_boundary`` finds the boundary, ``_prefix_value`` the best prefix there.
  The set picked is the same as a descending sort's (ties included: each ``c + j v``
  is the mass of an actual prefix), so the value equals the sort-based one up to the
  summation order of ``c``. Rows are expected nonnegative (``-0.0`` counts as 0).
  """
  return _prefix_value(*_greedy_boundary(_nonneg(p_RxL))[:3])


def _repair(p_RxL: Array) -> Array:
  """``"repair"`` certificate: the greedy prefix, improved by one atom at its boundary.

  From ``_greedy_boundary``: ``S_lo`` = the largest greedy prefix of mass
  ``q_lo <= 1/2`` (the atoms ``> v`` and ``j`` of the ``n_v`` atoms equal to ``v``,
  ``j = clip(j0, 0, n_v - 1)``) and ``S_hi = S_lo + {one atom v}``, of mass
  ``q_hi = q_lo + v > 1/2``. Two feasible subsets are added: ``S_lo`` plus the atom
  ``x < v`` that brings its mass closest to 1/2, and ``S_hi`` minus the atom ``x > v``
  that does (adding or removing a ``v`` gives the other greedy prefix). Each is one
  masked min of ``|x - (1/2 - q_lo)|``, resp. ``|x - (q_hi - 1/2)|`` (both in one row
  reduction), whose minimum ``d`` gives ``4 q (1 - q) = 1 - 4 d^2``. The result is the max of these and
  the greedy prefix: never below ``"greedy_prefix"``, and the value of an actual subset
  (up to rounding), so a lower bound of theta (Def 3.1).
  """
  x_RxL = _nonneg(p_RxL)
  c_R, v_R, n_R, _ = _greedy_boundary(x_RxL)
  greedy_R = _prefix_value(c_R, v_R, n_R)
  j0_R = jnp.floor((0.5 - c_R) / jnp.where(v_R > 0, v_R, 1.0))
  j_R = jnp.where(v_R > 0, jnp.clip(j0_R, 0.0, n_R - 1.0), 0.0)
  q_lo_R = c_R + j_R * v_R
  q_hi_R = q_lo_R + v_R
  inf = jnp.asarray(jnp.inf, x_RxL.dtype)
  v_Rx1 = v_R[:, None]
  # One reduction for both moves: atoms below v may be added, atoms above v removed.
  target_RxL = jnp.where(x_RxL < v_Rx1, (0.5 - q_lo_R)[:, None], (q_hi_R - 0.5)[:, None])
  d_R = jnp.min(jnp.where(x_RxL != v_Rx1, jnp.abs(x_RxL - target_RxL), inf), axis=-1)
  return jnp.maximum(greedy_R, 1.0 - 4.0 * d_R * d_R)


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
def theta_certificate(p: Array, method: CertificateMethod = "greedy_prefix") -> Array:
  """Lower-bound certificate ``4 p(S)(1 - p(S)) <= theta(p)`` of a feasible subset S.

  Any subset gives a valid lower bound (Sec 5, "Certificates for theta(p) at large L").

  * ``"greedy_prefix"``: the paper's procedure (App D.2, steps 1-4): descending
    cumulative sums ``c_k``, ``k = 1..L``, ``k* = argmin_k |c_k - 1/2|``, return
    ``4 c_k* (1 - c_k*)``. Computed without a sort: the descending prefixes are the
    sets ``{i : p_i >= t}`` and a per-row safeguarded interpolation search over the
    threshold ``t`` finds the two straddling 1/2 (``_greedy_boundary``; each pass one
    masked array and two row reductions, about 5 passes per row on softmax rows at
    L = 1024, 10-13 for the slowest of 512 rows, at most 33 for float32). The value
    equals the sort-based one up to summation order, ties included.
  * ``"repair"`` (ours, cheap): the greedy prefix, plus the best single atom added to
    the largest prefix of mass ``<= 1/2`` or removed from the next one (``_repair``:
    two more masked min-reductions). Never below ``"greedy_prefix"``; exact when
    ``p_max >= 1/2``.
  * ``"balance"`` (ours): sort descending (an int sort of the bit patterns) and put
    each atom in the lighter of two bins (greedy balancing, a ``lax.scan`` over
    ``L``); then the best single move or swap of one atom between the bins (a
    scatter and a ``searchsorted``); return the best of that subset and the greedy
    prefix. It is never below ``"greedy_prefix"``, is exact when ``p_max >= 1/2``
    (the dominant atom ends alone in its bin) and, since balancing keeps the bin
    difference ``<= p_max``, is ``>= 1 - p_max^2`` (Cor 3.4(5)). Usually the tightest
    of the three, and the slowest (about 30x ``"greedy_prefix"`` at 512 x 1024 on
    CPU); ``"repair"`` is not ordered with it row by row.

  ``"greedy_prefix"`` and ``"repair"`` are ``O(L)`` per pass, ``"balance"``
  ``O(L log L)`` per row; all jnp and jit-able. Zero atoms (masked positions) do not
  change any certificate. Entries must be nonnegative (``-0.0`` is read as 0).

  Args:
    p: ``(..., L)`` probabilities.
    method: ``"greedy_prefix"`` (default: the paper's, so that paper numbers use it),
      ``"repair"`` or ``"balance"`` (ours; name them where they are used).
  Returns:
    ``(...)`` certificates.
  """
  p = _float(p)
  lead, L = p.shape[:-1], p.shape[-1]
  if method not in ("greedy_prefix", "repair", "balance"):
    raise ValueError(f"method {method!r} is not allowed; choose 'greedy_prefix', "
                     "'repair' or 'balance'")
  p_RxL = p.reshape(-1, L)
  if method == "repair":
    return _repair(p_RxL).reshape(lead)
  cert = _greedy_prefix(p_RxL)
  if method == "balance":
    cert = jnp.maximum(cert, _balance(_sort_desc(p_RxL)))
  return cert.reshape(lead)


@functools.partial(jax.jit, static_argnames="method")
def theta_bracket(p: Array, method: CertificateMethod = "balance") -> tuple[Array, Array]:
  """``(lower, upper)`` with ``lower <= theta(p) <= upper`` per row; jnp, jit-able.

  * ``p_max >= 1/2``: ``lower = upper = 4 p_max (1 - p_max)`` (Cor 3.4(3), exact).
  * otherwise ``lower = max(theta_certificate(p, method), 1 - p_max^2)`` (Cor 3.4(5)
    holds for every ``p``) and ``upper = 1`` (Def 3.1: ``theta in [0, 1]``). The paper
    states no other upper bound.

  ``method``: ``"balance"`` (default, tightest), ``"repair"`` (cheap, about the cost
  of ``"greedy_prefix"``) or ``"greedy_prefix"`` (App D.2); see ``theta_certificate``.
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
                         method: CertificateMethod = "greedy_prefix") -> dict:
  """Attention-row statistics of Sec 5 ("Attention measurements"); jit-able.

  Samples ``num_rows`` rows without replacement, pooled over batch and heads, with
  query position ``t >= min_query``; each row is restricted to its causal support
  ``j <= t`` (and renormalized there). For each row: the certificate
  ``theta_certificate(row, method)`` (default the paper's ``"greedy_prefix"``; our
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

