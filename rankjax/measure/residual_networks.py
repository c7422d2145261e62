"""Block Jacobians, path sums and spectra of any residual network.

A residual network is given as stacked block parameters (a pytree whose leaves have a
leading depth axis L) and functions of one block's parameters and the stream h (d,):

    h_l = skip(p_l, h_{l-1}) + branch(p_l, h_{l-1})       ("Transforming Rank", Eq. 17)

``skip=None`` means the identity skip (K_l = I, Eq. 2); otherwise K_l = d skip / dh.
The block Jacobian splits as ``dh_l/dh_{l-1} = K_l + B_l`` (Eq. 18) and the
input-output Jacobian is the running product ``T_l = (K_l + B_l) T_{l-1}`` (Eq. 2, 10),
whose order-k path sums (Eq. 5, 11, 12) come from ``paths.path_sums(K, B)``.

B_l is taken from ``branch_jacobian(p, h) -> (d, d)`` when the user knows a closed form,
else by ``jax.jacfwd`` (d forward tangents of one ``jax.linearize``; exact, cost d JVPs).

Recipe for a user's own flax model (tested in tests/measure/test_residual_networks.py):
give the block module a ``branch`` method, stack the per-block parameter dicts
(``jax.tree.map(lambda *p: jnp.stack(p), *[params[f"block_{i}"] for i in range(L)])``,
or take an ``nn.scan``'s stacked params as they are), and pass
``branch = lambda p, h: Block(...).apply({"params": p}, h, method=Block.branch)``. A block
that is not ``skip + branch`` (post-norm ``h = N(h + f(h))``) is given by its forward
map ``block`` and the closed-form split ``K = J_N``, ``B = J_N J_f`` (Eq. 18).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from rankjax.measure import host_svd, paths, spectra
from rankjax.measure import precision as precision_lib
from rankjax.numerics import as_float

Array = jax.Array
BlockFn = Callable[[object, Array], Array]


class NetworkJacobians(NamedTuple):
  """skip: (L, d, d) K_l or None (identity); branch: (L, d, d) B_l; stream: (L+1, d)."""

  skip: Array | None
  branch: Array
  stream: Array


@precision_lib.measured
def network_block_jacobians(params, h0_D: Array, branch: BlockFn,
                            skip: BlockFn | None = None, *,
                            branch_jacobian: Callable[[object, Array], Array] | None = None,
                            skip_jacobian: Callable[[object, Array], Array] | None = None,
                            block: BlockFn | None = None) -> NetworkJacobians:
  """K_l and B_l of every block along the forward pass from ``h0_D`` (``lax.scan``).

  Args:
    params: stacked block parameters (leading axis L on every leaf).
    h0_D: the first block's input (d,).
    branch: ``branch(p, h)``, the branch term of a block.
    skip: ``skip(p, h)``; None: the identity (K_l = I, not stored).
    branch_jacobian, skip_jacobian: closed forms ``(p, h) -> (d, d)`` of B_l and K_l;
      default ``jax.jacfwd`` of ``branch`` / ``skip``.
    block: the block's forward map when it is not ``skip + branch`` (then give the
      split through ``branch_jacobian``/``skip_jacobian``, e.g. post-norm
      ``h = N(h + f(h))`` with ``K = J_N``, ``B = J_N J_f``, Eq. 18).
  """
  if block is not None and branch_jacobian is None:
    raise ValueError("with block=..., give the split: branch_jacobian (and skip_jacobian "
                     "unless K_l = I)")
  has_k = skip is not None or skip_jacobian is not None

  def step(h, p):
    if block is not None:
      h_new = block(p, h)
    else:
      h_new = (h if skip is None else skip(p, h)) + branch(p, h)
    b = branch_jacobian(p, h) if branch_jacobian is not None else \
        jax.jacfwd(lambda x: branch(p, x))(h)
    k = None
    if has_k:
      k = skip_jacobian(p, h) if skip_jacobian is not None else \
          jax.jacfwd(lambda x: skip(p, x))(h)
    return h_new, (k, b, h_new)

  _, (k, b, hs) = jax.lax.scan(step, h0_D, params)
  return NetworkJacobians(k, b, jnp.concatenate([h0_D[None], hs], axis=0))


@precision_lib.measured
def running_product(nj: NetworkJacobians) -> Array:
  """``(L, d, d)`` dh_l/dh_0, ``T_l = (K_l + B_l) T_{l-1}`` (Eq. 2, 10)."""
  d = nj.branch.shape[-1]

  def step(t, xs):
    k, b = xs
    t_new = b @ t + (t if k is None else k @ t)
    return t_new, t_new

  _, ts = jax.lax.scan(step, jnp.eye(d, dtype=nj.branch.dtype), (nj.skip, nj.branch))
  return ts


@precision_lib.measured
def network_study(params, h0_D: Array, branch: BlockFn, skip: BlockFn | None = None, *,
                  with_paths: bool = True, num_chunks: int | None = None, **split) -> dict:
  """The Jacobian study of one input for any residual network (the fields of
  ``jacobians.JacobianStudy`` that need no MLP config): ``erank``/``stable_rank`` (L,)
  of dh_l/dh_0 divided by d (Eq. 3, Sec 2), ``branch_to_skip`` (L,) ``||B_l||_F/||I||_F``
  (Eq. 4; relative to an identity skip), ``stream_rms`` (L+1,), and with path sums
  ``order_log_mass`` (L+1,), ``order_profile``, ``mean_order`` and
  ``reconstruction_error`` (``||sum_k S_k - T_L|| / ||T_L||``, App A.1); ``split``:
  the keywords of ``network_block_jacobians``."""
  nj = network_block_jacobians(params, h0_D, branch, skip, **split)
  d = nj.branch.shape[-1]
  ts = running_product(nj)
  sv = host_svd.singular_values_threaded(as_float(ts))
  out = {"erank": spectra.effective_rank_from_singular_values(sv) / d,
         "stable_rank": spectra.stable_rank_from_singular_values(sv) / d,
         "branch_to_skip": jnp.linalg.norm(nj.branch, axis=(-2, -1)) / jnp.sqrt(d),
         "stream_rms": jnp.sqrt(jnp.mean(jnp.square(nj.stream), axis=-1)),
         "input_output": ts}
  if with_paths:
    ps = paths.path_sums(nj.skip, nj.branch, num_chunks=num_chunks)
    out.update(order_log_mass=ps.log_norm, order_profile=paths.order_profile(ps),
               mean_order=paths.mean_order(ps),
               reconstruction_error=paths.reconstruction_error(ps, ts[-1]))
  return out
