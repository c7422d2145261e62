"""The one Jacobian engine: block Jacobians, input-output Jacobians, spectra and path sums
of any residual network ("Transforming Rank", Sec 2, Eq. 2, 17-18, App A.1).

A network is stacked block parameters (a pytree whose leaves have a leading depth axis
L) and a ``JacobianBlock``: functions of one block's parameters ``p`` and the stream
``h`` (d,) for the block of Eq. 17,

    h_l = R(skip(h_start) + branch(h_{l-1})),

``branch = beta B(f(P(h)))`` the term added to the skip, ``R`` the post-residual
operation (``post``; None: identity), ``skip`` the skip map (None: identity) and
``h_start`` the input of the current skip group (``closes``; None: a skip around every
block, ``h_start = h_{l-1}``). Its Jacobian splits as (Eq. 18)

    dh_l/dh_start = K_l = J_R J_skip   (times 1 on closing blocks, 0 inside a group),
    dh_l/dh_{l-1} = B_l = J_R G_l,     G_l = J_branch,

``K_l = I`` (not stored) when there is no R, no skip map and no grouping. The
input-output Jacobian is the running product ``T_l = K_l T_start + B_l T_{l-1}`` (Eq. 2,
10: ``T_l = (K_l + B_l) T_{l-1}`` with a skip around every block), its order-k path sums
(Eq. 5, 11, 12) are ``paths.path_sums(K, B)``, its spectra the singular values of T_l.

Model families are thin adapters that build a ``JacobianBlock``: the residual MLP
(``jacobians.mlp_block``, closed form), any residual network given as functions
(``residual_networks``), a ``DecoderLM`` sublayer at one token (``decoder_jacobians``: every placement, and a
Pre-Norm FFN sublayer in closed form; GPT-2 and the Llama family are DecoderLM
configurations). The pretrained-checkpoint analysis builds on those adapters.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src import fast_paths
from rankjax._src.measure import paths, spectra
from rankjax._src.measure import precision as precision_lib
from rankjax._src.numerics import as_float

Array = jax.Array
Params = Any
BlockFn = Callable[[Params, Array], Array]


class BlockJacobianMethod(enum.Enum):
  """How the engine obtains the Jacobians; all three are exact up to rounding except the
  matrix-free estimates (stochastic, with standard errors). Per block, d = width,
  m = the branch's hidden width:

  CLOSED_FORM: the adapter's ``branch_jacobian`` (for an MLP branch Eq. 9, 25:
    ``J_f = W_down^T diag(sigma'(pre)) W_up^T`` in the code's row layout, one
    ``d x m x d`` GEMM, 2 d^2 m FLOPs) and ``post_jacobian`` (norm Jacobians as their
    rank-one/two updates, Eq. 19-20, Table 2, O(d^2)). About half the FLOPs of JACFWD.
    Falls back to JACFWD for a part the adapter gives no closed form for.
  JACFWD: ``jax.jacfwd`` of the branch, the post operation and the skip: d forward
    tangents each, each the cost of one forward pass of that part (4 d^2 m FLOPs for an
    MLP branch). Works for any block (attention has no closed form here); used to check
    CLOSED_FORM.
  MATRIX_FREE: no d x d matrix is formed: erank and stable rank of T_l from Lanczos on
    ``T^T T`` (one JVP and one VJP of the first l blocks per step) with stochastic Lanczos
    quadrature (``matrix_free``); for d >= 2048, where T_l (d^2 floats per layer) or the
    path-sum DP (L^2 d^3 FLOPs) no longer fit. ``block_jacobians`` does not take it;
    ``matrix_free.matrix_free_ranks`` does.
  """

  CLOSED_FORM = "closed_form"
  JACFWD = "jacfwd"
  MATRIX_FREE = "matrix_free"


@dataclasses.dataclass(frozen=True)
class JacobianBlock:
  """One block ``h -> R(skip(h_start) + branch(h))`` of Eq. 17 as the Jacobian engine
  sees it: its functions and their closed forms (the model's block is
  ``models.blocks.residual_sublayer``).

  Attributes:
    branch: ``branch(p, h) -> (d,)``, the term added to the skip (beta included).
    post: ``post(p, y) -> (d,)``, R; None: the identity.
    skip: ``skip(p, h) -> (d,)``; None: the identity.
    closes: ``closes(p) -> bool`` (may read a per-block flag stored in the stacked
      parameters): whether the block adds the skip of its group (Fig 1 spacing; inner
      blocks are ``R(branch(h))``). None: every block has its skip, ``h_start = h``.
    branch_jacobian: closed form ``(p, h) -> (branch(p, h), G)`` with ``G = d branch /
      dh`` (d, d); used by CLOSED_FORM, else ``jax.jacfwd`` of ``branch``.
    post_jacobian: closed form ``(p, y, M) -> J_R(y) @ M`` (applied, so a norm's
      Jacobian costs O(d^2) per column block); used by CLOSED_FORM.
    skip_jacobian: closed form ``(p, h) -> J_skip`` (d, d); used by CLOSED_FORM.
  """

  branch: BlockFn
  post: BlockFn | None = None
  skip: BlockFn | None = None
  closes: Callable[[Params], Array] | None = None
  branch_jacobian: Callable[[Params, Array], tuple[Array, Array]] | None = None
  post_jacobian: Callable[[Params, Array, Array], Array] | None = None
  skip_jacobian: BlockFn | None = None

  @property
  def identity_skip(self) -> bool:
    """K_l = I for every block (no R, no skip map, a skip around every block)."""
    return self.post is None and self.skip is None and self.closes is None


class BlockJacobians(NamedTuple):
  """Block Jacobians along one forward pass (one input).

  Attributes:
    skip: ``(L, d, d)`` K_l, or None when every K_l is the identity.
    branch: ``(L, d, d)`` B_l = J_R G_l.
    relative_branch: ``(L, d, d)`` G_l, the branch term inside ``J_R (J_skip + G_l)``
      (its Frobenius norm over ``||I||_F`` is the branch-to-skip ratio r_l, Eq. 4, 21).
    stream: ``(L+1, d)`` h_0 .. h_L.
    closes: ``(L,)`` booleans of a grouped network (``JacobianBlock.closes``), else None.
  """

  skip: Array | None
  branch: Array
  relative_branch: Array
  stream: Array
  closes: Array | None = None


class BlockTerms(NamedTuple):
  """One block's output h_l, K_l (None: identity), B_l and G_l."""

  out: Array
  skip: Array | None
  branch: Array
  relative_branch: Array


def _closes(block: JacobianBlock, p) -> Array:
  return jnp.asarray(True) if block.closes is None else jnp.asarray(block.closes(p))


def block_output(block: JacobianBlock, p, h: Array, h_start: Array | None = None) -> Array:
  """h_l from h_{l-1} = ``h`` and the group input ``h_start`` (default ``h``)."""
  h_start = h if h_start is None else h_start
  y = _residual_sum(block, p, block.branch(p, h), h_start)
  return y if block.post is None else block.post(p, y)


def _residual_sum(block: JacobianBlock, p, u: Array, h_start: Array) -> Array:
  """``skip(h_start) + u`` (``u`` alone on a block that closes no skip group)."""
  s = h_start if block.skip is None else block.skip(p, h_start)
  return s + u if block.closes is None else jnp.where(_closes(block, p), s + u, u)


def block_terms(block: JacobianBlock, p, h: Array, h_start: Array | None = None,
                method: BlockJacobianMethod | str = BlockJacobianMethod.CLOSED_FORM
                ) -> BlockTerms:
  """h_l, K_l, B_l and G_l of one block (Eq. 18) at ``h`` (and ``h_start``)."""
  method = BlockJacobianMethod(method)
  if method is BlockJacobianMethod.MATRIX_FREE:
    raise ValueError("matrix-free estimates form no block Jacobian; "
                     "use matrix_free.matrix_free_ranks")
  closed = method is BlockJacobianMethod.CLOSED_FORM
  h_start = h if h_start is None else h_start
  if closed and block.branch_jacobian is not None:
    u, g = block.branch_jacobian(p, h)
  else:
    u, g = block.branch(p, h), jax.jacfwd(lambda x: block.branch(p, x))(h)
  closes = _closes(block, p)
  y = _residual_sum(block, p, u, h_start)
  if block.post is None:
    out, apply_r = y, (lambda m: m)
  elif closed and block.post_jacobian is not None:
    out, apply_r = block.post(p, y), (lambda m: block.post_jacobian(p, y, m))
  else:
    out, j_r = block.post(p, y), jax.jacfwd(lambda x: block.post(p, x))(y)
    apply_r = lambda m: j_r @ m
  b = apply_r(g)
  if block.identity_skip:
    return BlockTerms(out, None, b, g)
  d = h.shape[-1]
  if block.skip is None:
    j_s = jnp.eye(d, dtype=h.dtype)
  elif closed and block.skip_jacobian is not None:
    j_s = block.skip_jacobian(p, h_start)
  else:
    j_s = jax.jacfwd(lambda x: block.skip(p, x))(h_start)
  if block.closes is not None:
    j_s = j_s * closes.astype(h.dtype)
  return BlockTerms(out, apply_r(j_s), b, g)


def sublayer_jacobian(skip: Array | None, branch: Array) -> Array:
  """``K + B``, the whole block (or sublayer) Jacobian (Eq. 18); K None is the identity."""
  if skip is not None:
    return skip + branch
  return branch + jnp.eye(branch.shape[-1], dtype=branch.dtype)


def token_sublayers(attn: BlockTerms, ffn: BlockTerms, h_in: Array, h_mid: Array,
                    last: Array) -> BlockJacobians:
  """A transformer token's 2L sublayers (attention, FFN of layer 1, ...) as one
  ``BlockJacobians``, from the per-layer terms of each sublayer ((L, ...) each) and the
  token's stream entering each layer, after its attention sublayer, and after the last
  layer (h_0 .. h_2L)."""
  pair = lambda a, b: None if a is None else jnp.stack([a, b], axis=1).reshape(-1, *a.shape[1:])
  stream = jnp.concatenate([pair(h_in, h_mid), last[None]], axis=0)
  return BlockJacobians(pair(attn.skip, ffn.skip), pair(attn.branch, ffn.branch),
                        pair(attn.relative_branch, ffn.relative_branch), stream)


def _scan_blocks(block: JacobianBlock, params, h0_D: Array, one):
  def step(carry, p):
    h, h_start = carry
    terms = one(p, h, h_start)
    out = terms[0]
    h_start = out if block.closes is None else jnp.where(_closes(block, p), out, h_start)
    return (out, h_start), terms
  return jax.lax.scan(step, (h0_D, h0_D), params)[1]


@precision_lib.measured
def block_jacobians(block: JacobianBlock, params, h0_D: Array,
                    method: BlockJacobianMethod | str = BlockJacobianMethod.CLOSED_FORM
                    ) -> BlockJacobians:
  """K_l, B_l and G_l of every block along the forward pass from ``h0_D`` (``lax.scan``
  over depth; ``vmap`` over inputs)."""
  method = BlockJacobianMethod(method)
  hs, k, b, g = _scan_blocks(block, params, h0_D,
                             lambda p, h, s: block_terms(block, p, h, s, method))
  closes = None if block.closes is None else jax.vmap(block.closes)(params)
  return BlockJacobians(k, b, g, jnp.concatenate([h0_D[None], hs], axis=0), closes)


def forward(block: JacobianBlock, params, h0_D: Array) -> Array:
  """``(L, d)`` h_1 .. h_L (the plain forward pass the Jacobians are taken along)."""
  return _scan_blocks(block, params, h0_D,
                      lambda p, h, s: (block_output(block, p, h, s),))[0]


@precision_lib.measured
def input_output_jacobians(bj: BlockJacobians) -> Array:
  """``(L, d, d)`` dh_l/dh_0 for l = 1..L by the running product (Eq. 2, 10):
  ``T_l = K_l T_start + B_l T_{l-1}``, ``T_start`` the Jacobian of the current skip
  group's input; with a skip around every block ``T_l = (K_l + B_l) T_{l-1}``."""
  d = bj.branch.shape[-1]
  eye = jnp.eye(d, dtype=bj.branch.dtype)
  if bj.closes is None:
    def step(t, xs):
      k, b = xs
      t_new = (b if k is None else k + b) @ t + (t if k is None else 0.0)
      return t_new, t_new
    return jax.lax.scan(step, eye, (bj.skip, bj.branch))[1]

  def grouped(carry, xs):
    t, t_start = carry
    k, b, closes = xs
    t_new = k @ t_start + b @ t
    return (t_new, jnp.where(closes, t_new, t_start)), t_new
  return jax.lax.scan(grouped, (eye, eye), (bj.skip, bj.branch, bj.closes))[1]


def check_layers(layers: tuple[int, ...], depth: int) -> np.ndarray:
  """``layers`` (1..depth, static) as 0-based indices; a clear error otherwise."""
  idx = np.asarray(tuple(layers), dtype=int)
  if idx.ndim != 1 or idx.size == 0 or idx.min() < 1 or idx.max() > depth:
    raise ValueError(f"spectra_layers must be layers in [1, {depth}], got {tuple(layers)}")
  return idx - 1


@precision_lib.measured
def measurements(bj: BlockJacobians, *, with_paths: bool = True,
                 num_chunks: int | None = None, reference: Array | None = None,
                 spectra_layers: tuple[int, ...] | None = None) -> dict:
  """Every per-sample measurement of a study from one input's block Jacobians:

    ``erank`` / ``stable_rank`` (L,): erank(dh_l/dh_0)/d, st(dh_l/dh_0)/d (Eq. 3); at
    ``spectra_layers`` only (static l in 1..L, in that order) when given: one singular
    value decomposition per listed layer instead of L (a network whose rank is read at
    its last layer needs one);
    ``stream_rms`` (L+1,): rms(h_l);
    ``branch_to_skip`` (L,): r_l = ||G_l||_F / ||I||_F (Eq. 4, 21);
    ``accumulated_branch``, ``accumulated_uncorrelated`` (L,): Fig 5b, 12b;
    with path sums (``with_paths``; they need the product form ``prod (K_l + B_l)``: a
    skip around every block, or none at all; the adapter knows which):
    ``order_log_mass`` (L+1,) log ||S_k||_F, ``order_profile``, ``mean_order`` and
    ``reconstruction_error`` ``||sum_k S_k - ref|| / ||ref||`` (App A.1), ``ref`` the
    running product's T_L unless ``reference`` (e.g. ``jax.jacfwd`` of the network) is
    given; without path sums the path fields are NaN;
    ``input_output`` (L, d, d): T_l itself.
  """
  d = bj.branch.shape[-1]
  ts = input_output_jacobians(bj)
  at = ts if spectra_layers is None else ts[check_layers(spectra_layers, ts.shape[0])]
  # a singular-value decomposition per layer measured (a thread per core on CPU)
  sv = fast_paths.singular_values(as_float(at))
  acc, unc = paths.accumulated_branch(bj.relative_branch)
  out = {"erank": spectra.effective_rank_from_singular_values(sv) / d,
         "stable_rank": spectra.stable_rank_from_singular_values(sv) / d,
         "stream_rms": jnp.sqrt(jnp.mean(jnp.square(bj.stream), axis=-1)),
         "branch_to_skip": jnp.linalg.norm(bj.relative_branch, axis=(-2, -1)) / math.sqrt(d),
         "accumulated_branch": acc, "accumulated_uncorrelated": unc,
         "input_output": ts}
  num_blocks = bj.branch.shape[0]
  if with_paths:
    ps = paths.path_sums(bj.skip, bj.branch, num_chunks=num_chunks)
    ref = ts[-1] if reference is None else reference
    out.update(order_log_mass=ps.log_norm, order_profile=paths.order_profile(ps),
               mean_order=paths.mean_order(ps),
               reconstruction_error=paths.reconstruction_error(ps, ref))
  else:
    nan = jnp.full((num_blocks + 1,), jnp.nan, ts.dtype)
    out.update(order_log_mass=nan, order_profile=nan, mean_order=nan[0],
               reconstruction_error=nan[0])
  return out
