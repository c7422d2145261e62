"""Lower-bound certificates of the softmax sensitivity theta(p) at large L.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability"
(``papers/softmax_sensitivity.txt``), Sec 5 ("Certificates for theta(p) at large L")
and App D.2. Any subset ``S`` gives ``4 p(S)(1 - p(S)) <= theta(p)`` (Def 3.1).

* ``theta_certificate``: ``jnp``, jit-able (App D.2 greedy prefix by a sort-free
  interpolation search, our one-atom repair of it, and our balancing, ``O(L log L)``
  per row);
* ``theta_bracket``: ``(lower, upper)`` from the certificate and Cor 3.4.

Exact theta is in ``sensitivity_exact``. Every function is batched over leading axes
(the atom axis is ``-1``).
"""
from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp

from rankjax._src.numerics import as_float

Array = jax.Array

CertificateMethod = Literal["greedy_prefix", "repair", "balance"]


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
  p = as_float(p)
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
  p = as_float(p)
  p_max = jnp.max(p, axis=-1)
  dominant = 4.0 * p_max * (1.0 - p_max)
  lower = jnp.maximum(theta_certificate(p, method), 1.0 - p_max ** 2)
  is_dom = p_max >= 0.5
  return (jnp.where(is_dom, dominant, lower),
          jnp.where(is_dom, dominant, jnp.ones_like(p_max)))
