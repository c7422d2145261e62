"""ResidualMLP: the residual network of Transforming Rank (Eq. 17), as a linen module.

The L blocks' parameters are stored stacked along a leading depth axis
(``params["blocks"]["w_up"]`` has shape (L, d, m)), and the forward pass is one
``lax.scan`` over depth (``blocks.stack_forward``); the block itself is the pure
function ``blocks.block_fn``, which the Jacobian engine differentiates directly.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import with_logical_partitioning as logical

from rankjax._src.config import MLPConfig
from rankjax._src.models import blocks
from rankjax._src.models.annotated import PlainInit
from rankjax._src.numerics import NORM


class ResidualMLP(PlainInit, nn.Module):
  """``h_l = R(h_skip + beta * B(f(P(h_{l-1}))))`` for l = 1..L (Transforming Rank, Eq. 17).

  Call with ``x_BxD`` (or ``x_BxI`` with ``input_dim`` set). Returns h_L, or logits
  when ``num_classes`` is set. With ``capture=True`` every block output h_1..h_L is
  sown into the ``intermediates`` collection as ``stream`` (shape (L, B, d)), and the
  input to the first block as ``h0``.
  """

  cfg: MLPConfig

  @nn.compact
  def __call__(self, x: jax.Array, *, capture: bool = False) -> jax.Array:
    cfg = self.cfg
    dtype = jnp.dtype(cfg.param_dtype)
    if cfg.input_dim is not None:
      w_in = self.param("w_in", logical(_normal(1.0), ("input", "embed")), (cfg.input_dim, cfg.width),
                        dtype)
      x = x @ w_in
    stacked = self.param("blocks", _init_stack(cfg))
    h, hs = blocks.stack_forward(stacked, x, cfg)
    if capture:
      self.sow("intermediates", "h0", x)
      self.sow("intermediates", "stream", hs)
    if cfg.num_classes is not None:
      w_out = self.param("w_out", logical(_normal(1.0), ("embed", "classes")),
                         (cfg.width, cfg.num_classes), dtype)
      h = h @ w_out
    return h


def _normal(scale: float):
  """N(0, scale^2 / fan_in) for a (fan_in, fan_out) matrix."""

  def init(key, shape, dtype=jnp.float32):
    return (scale / math.sqrt(shape[0])) * jax.random.normal(key, shape, dtype)

  return init


# Logical axes of a block's matrices (``blocks.matrix_shapes``); its gains are ``NORM``.
BLOCK_AXES = {"w_up": ("embed", "mlp"), "w_gate": ("embed", "mlp"), "w_down": ("mlp", "embed"),
              "w": ("embed", "mlp")}


def _init_stack(cfg: MLPConfig):
  def init(key):
    stacked = jax.vmap(lambda k: blocks.init_block(k, cfg))(jax.random.split(key, cfg.depth))
    gains = blocks.gain_names(cfg)
    return {name: nn.LogicallyPartitioned(x, ("layers", *((NORM,) if name in gains
                                                          else BLOCK_AXES[name])))
            for name, x in stacked.items()}

  return init
