"""Block Jacobians, path sums and spectra of any residual network, given as functions.

The engine's adapter for a user's own network (``measure.engine``): stacked block
parameters (a pytree whose leaves have a leading depth axis L) and functions of one
block's parameters and the stream h (d,),

    h_l = post(p_l, skip(p_l, h_{l-1}) + branch(p_l, h_{l-1}))   ("Transforming Rank", Eq. 17)

``skip=None`` is the identity skip, ``post=None`` no post-residual operation (then
K_l = I, Eq. 2). The block Jacobian splits as ``dh_l/dh_{l-1} = K_l + B_l`` with
``K_l = J_post J_skip`` and ``B_l = J_post G_l``, ``G_l = d branch / dh`` (Eq. 18); the
input-output Jacobian is the running product ``T_l = (K_l + B_l) T_{l-1}`` (Eq. 2, 10),
whose order-k path sums (Eq. 5, 11, 12) come from ``paths.path_sums(K, B)``.

G_l is taken from ``branch_jacobian(p, h) -> (d, d)`` when the user knows a closed form,
else by ``jax.jacfwd`` (d forward tangents; exact, cost d JVPs); likewise K from
``skip_jacobian`` and J_post from ``post_jacobian(p, y) -> (d, d)``.

Recipe for a user's own flax model (tested in tests/measure/test_residual_networks.py):
give the block module a ``branch`` method, stack the per-block parameter dicts
(``jax.tree.map(lambda *p: jnp.stack(p), *[params[f"block_{i}"] for i in range(L)])``,
or take an ``nn.scan``'s stacked params as they are), and pass
``branch = lambda p, h: Block(...).apply({"params": p}, h, method=Block.branch)``. A
post-norm block ``h = N(h + f(h))`` is ``branch=f, post=N``.
"""
from __future__ import annotations

from typing import Callable

import jax

from rankjax._src.measure import engine
from rankjax._src.measure import precision as precision_lib

Array = jax.Array
BlockFn = engine.BlockFn
NetworkJacobians = engine.BlockJacobians


def network_block(branch: BlockFn, skip: BlockFn | None = None, *,
                  post: BlockFn | None = None,
                  branch_jacobian: Callable[[object, Array], Array] | None = None,
                  skip_jacobian: Callable[[object, Array], Array] | None = None,
                  post_jacobian: Callable[[object, Array], Array] | None = None
                  ) -> engine.JacobianBlock:
  """The engine's ``JacobianBlock`` of ``post(skip(h) + branch(h))`` from user functions;
  the closed forms ``(p, h) -> (d, d)`` are optional (default ``jax.jacfwd``)."""
  closed_branch = None if branch_jacobian is None else (
      lambda p, h: (branch(p, h), branch_jacobian(p, h)))
  closed_post = None if post_jacobian is None else (
      lambda p, y, m: post_jacobian(p, y) @ m)
  return engine.JacobianBlock(branch=branch, post=post, skip=skip,
                              branch_jacobian=closed_branch, post_jacobian=closed_post,
                              skip_jacobian=skip_jacobian)


@precision_lib.measured
def network_block_jacobians(params, h0_D: Array, branch: BlockFn,
                            skip: BlockFn | None = None, **closed_forms) -> NetworkJacobians:
  """K_l, B_l and G_l of every block along the forward pass from ``h0_D`` (``lax.scan``);
  ``closed_forms``: ``network_block``'s keywords (post and the closed forms)."""
  method = engine.BlockJacobianMethod.CLOSED_FORM   # each part without a closed form: jacfwd
  return engine.block_jacobians(network_block(branch, skip, **closed_forms), params, h0_D,
                                method)


@precision_lib.measured
def running_product(nj: NetworkJacobians) -> Array:
  """``(L, d, d)`` dh_l/dh_0, ``T_l = (K_l + B_l) T_{l-1}`` (Eq. 2, 10)."""
  return engine.input_output_jacobians(nj)


@precision_lib.measured
def network_study(params, h0_D: Array, branch: BlockFn, skip: BlockFn | None = None, *,
                  with_paths: bool = True, num_chunks: int | None = None,
                  **closed_forms) -> dict:
  """The Jacobian study of one input for any residual network (``engine.measurements``):
  ``erank``/``stable_rank`` (L,) of dh_l/dh_0 divided by d (Eq. 3, Sec 2),
  ``branch_to_skip`` (L,) ``||G_l||_F/||I||_F`` (Eq. 4), ``stream_rms`` (L+1,), the
  accumulated branch norms, ``input_output`` (L, d, d), and with path sums
  ``order_log_mass`` (L+1,), ``order_profile``, ``mean_order`` and
  ``reconstruction_error`` (``||sum_k S_k - T_L|| / ||T_L||``, App A.1);
  ``closed_forms``: the keywords of ``network_block``."""
  nj = network_block_jacobians(params, h0_D, branch, skip, **closed_forms)
  return engine.measurements(nj, with_paths=with_paths, num_chunks=num_chunks)
