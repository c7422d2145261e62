"""Per-order path sums of a product of block Jacobians ("Transforming Rank", App A.1).

A residual network's input-output Jacobian is the ordered product of block Jacobians
``K_l + B_l`` (skip part K, branch part B; ``K_l = I`` and ``B_l = beta J_l`` without a
post-residual norm, Eq. 2, 10). Distributing the product over the ``2^L`` choices of
skip or branch per block and grouping by the order k (the number of branch visits)
gives Eq. 5 / Eq. 11,

    dh_L/dh_0 = sum_{k=0}^{L} S_k,
    S_k = sum_{l_1 < ... < l_k} K_L ... B_{l_k} ... K ... B_{l_1} ... K_1,

with ``S_k = beta^k sum J_{l_k} ... J_{l_1}`` when ``K = I``. ``path_sums`` fills the
table of Eq. 12, ``S_k^(m) = K_m S_k^(m-1) + B_m S_{k-1}^(m-1)``, storing each order as
a unit-Frobenius matrix and a log norm so that masses spanning hundreds of decades
neither overflow nor underflow (App A.1: "log-sum-exp form").

Cost and memory (per matrix product of L blocks of size d):
  * FLOPs: the triangle ``sum_m m`` of ``d x d`` matmuls, ``L(L+1)/2 * 2 d^3`` (twice
    that with a non-identity K). The orders are split into ``num_chunks`` static
    groups of blocks; within a group a ``lax.scan`` touches only the orders that
    block group can reach, so the work is the triangle plus ~1/num_chunks.
  * Memory: the state is one ``(L+1, d, d)`` table, O(L d^2), never O(L^2 d^2).
  * Every step is a single GEMM ``B_m @ [U_0 | U_1 | ...]`` of shape
    ``d x d`` by ``d x (a d)`` (the state is stored as ``(d, L+1, d)``) followed by
    one fused pass that rescales, adds, and takes each order's Frobenius norm (the
    state is normalized lazily, see ``_path_sums_single``).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.measure import precision as precision_lib
from rankjax._src.measure import similarity
from rankjax._src.numerics import as_float

Array = jax.Array


# Static block groups of the DP. Each group is one more scan body to compile (about a
# second on a small CPU); the FLOPs are (1 + 1/num_chunks) times the triangle. Large
# products (d >= LARGE_WIDTH and L >= LARGE_DEPTH), where the FLOPs outweigh compile
# time, get LARGE_NUM_CHUNKS: at L=48, d=256 on a 2-core CPU, 8 groups ran the DP in
# 0.76 s against 0.95 s for 4 (medians of 7 interleaved runs under load 5-7; 12 groups:
# 0.77 s). 16 groups do 1.06 of the triangle (8: 1.14) and reached 84% of the same-run
# 2048^3 matmul peak (best of 7; 8 groups 78%) but compile in 3.8 s against 1.7 s, more
# than they save over a typical 8-32 seed study (idle, session 6: 8 groups compile in
# 1.05 s and ran at 78.8% of peak, 12 groups 82.3%, 16 groups 2.09 s and 80.7%, 24 groups
# 77.4%: within the run-to-run noise). The grouping changes only which unreachable
# (zero) orders are multiplied.
DEFAULT_NUM_CHUNKS = 4
LARGE_NUM_CHUNKS = 8
LARGE_WIDTH, LARGE_DEPTH = 128, 32


def default_num_chunks(num_blocks: int, d: int) -> int:
  """``LARGE_NUM_CHUNKS`` for d >= LARGE_WIDTH and L >= LARGE_DEPTH, else DEFAULT."""
  large = d >= LARGE_WIDTH and num_blocks >= LARGE_DEPTH
  return LARGE_NUM_CHUNKS if large else DEFAULT_NUM_CHUNKS


class PathSums(NamedTuple):
  """Per-order path sums: ``exp(log_norm[k]) * unit[k] == S_k`` (with beta^k folded in;
  Transforming Rank Eq. 5, 12).

  Attributes:
    log_norm: ``(..., L+1)`` log Frobenius norm of order k; ``-inf`` for an order
      whose sum is exactly zero.
    unit: ``(..., L+1, d, d)`` the order-k sum divided by its Frobenius norm (zero
      where ``log_norm`` is ``-inf``).
  """

  log_norm: Array
  unit: Array


def chunk_bounds(num_blocks: int, num_chunks: int | None = None) -> list[tuple[int, int]]:
  """Static block groups ``[(start, stop), ...]`` (0-indexed, half open)."""
  if num_chunks is None:
    num_chunks = DEFAULT_NUM_CHUNKS
  num_chunks = max(1, min(num_chunks, num_blocks))
  edges = np.linspace(0, num_blocks, num_chunks + 1).round().astype(int)
  return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _safe_exp_diff(a: Array, s: Array) -> Array:
  """``exp(a - s)`` with ``exp(-inf - anything) = 0`` and no NaN."""
  finite = jnp.isfinite(a)
  s_safe = jnp.where(jnp.isfinite(s), s, 0.0)
  return jnp.where(finite, jnp.exp(jnp.where(finite, a, 0.0) - s_safe), 0.0)


def _safe_log(x: Array) -> Array:
  return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), -jnp.inf)


def _path_sums_single(k_LxDxD: Array | None, b_LxDxD: Array,
                      num_chunks: int | None, max_order: int | None = None) -> PathSums:
  """The DP of Eq. 12 for one product.

  State per order k: an unnormalized matrix ``U_k`` (stored as ``(d, L+1, d)``), a log
  offset ``c_k`` and ``n_k = ||U_k||_F``, with ``S_k = exp(c_k) U_k``; the log mass is
  ``c_k + log n_k``. Each block forms ``U'_k = e^{c_k - s_k} K U_k + e^{c_{k-1} - s_k}
  B U_{k-1}`` with ``s_k = max`` of the two log masses, so ``||U'_k|| <= 1 + ||B||_2``
  (nothing overflows) and the new norms come out of the same fused pass; the state
  is normalized once at the end. Orders beyond the block index have
  ``c = -inf``, ``U = 0`` and stay so.

  With ``max_order = K < L`` the state has K+2 slots: orders 0..K and the tail
  ``R = sum_{k>K} S_k``, which obeys ``R^(m) = K_m R^(m-1) + B_m (R^(m-1) + S_K^(m-1))``
  (Eq. 12 summed over k > K): the slot K+1 recurrence plus ``B_m R``, whose product the
  GEMM over the whole state already forms.
  """
  num_blocks, d, _ = b_LxDxD.shape
  dtype = b_LxDxD.dtype
  truncated = max_order is not None and max_order < num_blocks
  num_orders = max_order + 2 if truncated else num_blocks + 1
  neg_inf = jnp.array(-jnp.inf, dtype)
  unit = jnp.zeros((d, num_orders, d), dtype).at[:, 0, :].set(jnp.eye(d, dtype=dtype))
  offset = jnp.full((num_orders,), neg_inf).at[0].set(0.0)
  norm = jnp.zeros((num_orders,), dtype).at[0].set(jnp.sqrt(jnp.asarray(d, dtype)))

  if num_chunks is None:
    num_chunks = default_num_chunks(num_blocks, d)
  for start, stop in chunk_bounds(num_blocks, num_chunks):
    width = min(stop + 1, num_orders)   # orders 0..stop are reachable after block `stop`
    tail = truncated and width == num_orders
    tail_mask = jnp.zeros((width,), dtype).at[-1].set(1.0) if tail else None

    def step(carry, xs, width=width, tail_mask=tail_mask):
      u_w, c_w, n_w = carry    # (d, width, d), (width,), (width,)
      b_m, k_m = xs
      # One GEMM over the whole (contiguous) state; the product with the last order is
      # not needed, but slicing it off first would copy the state (a strided slice).
      flat = u_w.reshape(d, width * d)
      if k_m is None:
        b_all = (b_m @ flat).reshape(d, width, d)
        k_cur = u_w
      else:
        both = jnp.concatenate([k_m, b_m], axis=0) @ flat
        k_cur = both[:d].reshape(d, width, d)
        b_all = both[d:].reshape(d, width, d)
      b_prev = b_all[:, : width - 1, :]
      ln = c_w + _safe_log(n_w)
      ln_shift = jnp.concatenate([neg_inf[None], ln[:-1]])
      c_shift = jnp.concatenate([neg_inf[None], c_w[:-1]])
      s = jnp.maximum(ln, ln_shift)
      w_skip = _safe_exp_diff(c_w, s)
      w_branch = _safe_exp_diff(c_shift, s)
      b_shift = jnp.concatenate([jnp.zeros((d, 1, d), dtype), b_prev], axis=1)
      v = w_skip[None, :, None] * k_cur + w_branch[None, :, None] * b_shift
      if tail_mask is not None:                  # + B_m R in the tail slot
        v = v + (w_skip * tail_mask)[None, :, None] * b_all
      new_n = jnp.sqrt(jnp.sum(jnp.square(v), axis=(0, 2)))
      new_c = jnp.where(new_n > 0, s, neg_inf)
      return (v, new_c, new_n), None

    xs = (b_LxDxD[start:stop], None if k_LxDxD is None else k_LxDxD[start:stop])
    (u_w, c_w, n_w), _ = jax.lax.scan(
        step, (unit[:, :width, :], offset[:width], norm[:width]), xs)
    unit = unit.at[:, :width, :].set(u_w)
    offset = offset.at[:width].set(c_w)
    norm = norm.at[:width].set(n_w)

  log_norm = offset + _safe_log(norm)
  scale = jnp.where(norm > 0, 1.0 / jnp.where(norm > 0, norm, 1.0), 0.0)
  return PathSums(log_norm, jnp.transpose(unit * scale[None, :, None], (1, 0, 2)))


@precision_lib.measured
def path_sums(a_LxDxD: Array, b: Array | float | None = None, *,
              num_chunks: int | None = None, max_order: int | None = None) -> PathSums:
  """Every order-k path sum of ``prod_l (K_l + B_l)`` (Eq. 5, 11, 12).

  Two call forms:
    ``path_sums(J, beta)``: ``K_l = I``, ``B_l = beta J_l``; then
      ``exp(log_norm[k]) * unit[k] == beta**k * S_k`` of Eq. 5.
    ``path_sums(K, B)``: general skip and branch parts (``post``-type blocks:
      ``K_l = J_R``, ``B_l = beta J_R J_B J_f J_P``, Eq. 18). ``K=None`` means I.

  Args:
    a_LxDxD: ``(..., L, d, d)`` branch Jacobians J (first form) or skip parts K.
    b: a scalar beta (first form; None means 1) or ``(..., L, d, d)`` branch parts.
    num_chunks: number of static block groups (default ``default_num_chunks(L, d)``,
      at most L); more groups waste fewer FLOPs on unreachable orders (the work is
      about ``(1 + 1/num_chunks)`` times the triangle) but compile more scan bodies.
    max_order: carry orders 0..K = ``max_order`` one by one and every higher order as
      one aggregated tail ``R = sum_{k>K} S_k`` (entry K+1 of the result; the
      ``(L+1)``-entry layout when K >= L or None). What is exact: S_0..S_K and R are
      the same recurrence as the full DP (float rounding alone differs), and
      ``reconstruct`` still sums to dh_L/dh_0. What is lost: the masses of the
      individual orders above K (``order_profile``/``mean_order`` then treat the
      tail as one entry). Each block's GEMM covers at most K+2 slots instead of up to
      L+1: at L=48, d=256 (Pre-Norm ReLU, beta=1, one seed) every order k >= 21 holds
      less than 1e-7 of the total mass, and K=22 with 8 block groups multiplies 0.81
      of the triangle's d x d blocks against 1.14 uncapped (0.71x the work).

  Returns:
    ``PathSums`` with ``log_norm`` of shape ``(..., L+1)`` and ``unit`` of shape
    ``(..., L+1, d, d)`` (``K+2`` entries instead of ``L+1`` with ``max_order=K < L``).
  """
  if b is None or jnp.ndim(b) == 0:
    k_arr = None
    beta = 1.0 if b is None else b
    b_arr = jnp.asarray(a_LxDxD)
    b_arr = b_arr * jnp.asarray(beta, b_arr.dtype)
  else:
    k_arr = None if a_LxDxD is None else jnp.asarray(a_LxDxD)
    b_arr = jnp.asarray(b)
    if k_arr is not None and k_arr.shape != b_arr.shape:
      raise ValueError(f"K {k_arr.shape} and B {b_arr.shape} must have the same shape")
  b_arr = as_float(b_arr)
  if k_arr is not None:
    k_arr = k_arr.astype(b_arr.dtype)
  if b_arr.ndim < 3 or b_arr.shape[-1] != b_arr.shape[-2]:
    raise ValueError(f"expected (..., L, d, d) block Jacobians, got {b_arr.shape}")
  if max_order is not None and (not isinstance(max_order, int) or max_order < 0):
    raise ValueError(f"max_order={max_order!r}; expected a non-negative int or None")
  fn = lambda k, bb: _path_sums_single(k, bb, num_chunks, max_order)
  for _ in range(b_arr.ndim - 3):
    fn = jax.vmap(fn)
  return fn(k_arr, b_arr)


# ---------------------------------------------------------------------------
# Order statistics (Fig 3, App A.1)


def order_log_mass(ps: PathSums) -> Array:
  """``log mu_k = log ||beta^k S_k||_F``, k = 0..L (Fig 3a)."""
  return ps.log_norm


def order_profile(ps: PathSums) -> Array:
  """Masses normalized to sum to one, ``mu_k / sum_j mu_j`` (Fig 3b, c)."""
  return jax.nn.softmax(ps.log_norm, axis=-1)


def mean_order(ps: PathSums) -> Array:
  """Mean path order ``<k> = sum_k k mu_k / sum_k mu_k`` (Fig 3d)."""
  prof = order_profile(ps)
  ks = jnp.arange(prof.shape[-1], dtype=prof.dtype)
  return jnp.sum(prof * ks, axis=-1)


@precision_lib.measured
def reconstruct(ps: PathSums) -> Array:
  """``sum_k S_k`` (= dh_L/dh_0), accumulated relative to the largest order."""
  top = jnp.max(ps.log_norm, axis=-1, keepdims=True)
  w = _safe_exp_diff(ps.log_norm, top)
  return jnp.exp(top)[..., None] * jnp.einsum("...k,...kij->...ij", w, ps.unit)


@precision_lib.measured
def reconstruction_error(ps: PathSums, jac_DxD: Array) -> Array:
  """Relative Frobenius error ``||sum_k S_k - J|| / ||J||`` (App A.1: ~1e-15 in f64)."""
  diff = reconstruct(ps) - jac_DxD
  return jnp.linalg.norm(diff, axis=(-2, -1)) / jnp.linalg.norm(jac_DxD, axis=(-2, -1))


# ---------------------------------------------------------------------------
# Branch magnitudes across depth (Sec 4, Fig 5b, Fig 12, App B.3)


@precision_lib.measured
def accumulated_branch(g_LxDxD: Array) -> tuple[Array, Array]:
  """Accumulated branch ``||sum_{l<=k} G_l||_F / sqrt(d)`` and its uncorrelated value.

  ``G_l`` is the branch term of block l relative to the skip (``beta J_B J_f J_P``,
  Eq. 18; the order-one paths). The prediction for uncorrelated blocks is
  ``(sum_{l<=k} ||G_l||_F^2)^{1/2} / sqrt(d)`` (Fig 12b, Eq. 23 at k=1).
  Returns two ``(..., L)`` arrays. The running sum is a ``lax.scan`` (O(L d^2); XLA's
  cumsum over a short axis can lower to an O(L^2) reduce-window on CPU).
  """
  d = g_LxDxD.shape[-1]
  g = jnp.moveaxis(g_LxDxD, -3, 0)

  def step(total, g_l):
    total = total + g_l
    return total, jnp.sqrt(jnp.sum(jnp.square(total), axis=(-2, -1)))

  _, norms = jax.lax.scan(step, jnp.zeros_like(g[0]), g)
  measured = jnp.moveaxis(norms, 0, -1) / jnp.sqrt(d)
  sq = jnp.sum(jnp.square(g_LxDxD), axis=(-2, -1))
  return measured, jnp.sqrt(jnp.cumsum(sq, axis=-1) / d)


@precision_lib.measured
def block_cosines(g_LxDxD: Array) -> Array:
  """Pairwise ``<G_i, G_j> / (||G_i|| ||G_j||)`` between blocks (Fig 12a); (..., L, L)."""
  return similarity.cosine_matrix(g_LxDxD.reshape(*g_LxDxD.shape[:-2], -1))
