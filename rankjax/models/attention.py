"""Causal multi-head attention with temperature and the P - alpha*C_n intervention.

Post-Norm collapse paper, Eq. 2: ``Attn(X) = P X W_V W_O`` with
``P = softmax_row(X W_Q (X W_K)^T / sqrt(d_head) / tau + M_causal)``. Corollary 3.3's
intervention replaces P by ``P - alpha * C_n``, where C_n is the causal
prefix-average matrix, ``(C_n)_ij = 1/i`` for ``i >= j`` (1-indexed).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankjax.config import TransformerConfig
from rankjax.measure.similarity import prefix_average_matrix


def matrix_init(cfg: TransformerConfig, fan_in: int, output_proj: bool = False):
  """The init of a weight matrix under ``cfg.init`` (times ``cfg.init_scale`` in variance).

  paper_collapse (postnorm Sec 2): N(0, 1/(3 fan_in)) -- 1/(3d) for every d-input
  matrix and 1/(3 d_ff) for W_2. gpt2: N(0, 0.02^2), output projections (W_O and the
  FFN's down projection) N(0, (0.02/sqrt(2N))^2) with N the number of layers.
  """
  if cfg.init == "paper_collapse":
    std = math.sqrt(cfg.init_scale / (3.0 * fan_in))
  else:
    std = 0.02 * math.sqrt(cfg.init_scale)
    if output_proj:
      std /= math.sqrt(2.0 * cfg.num_layers)
  return nn.initializers.normal(stddev=std)


class CausalSelfAttention(nn.Module):
  """Multi-head causal self-attention, no biases. Input and output ``(B, T, d)``.

  With ``capture_probs`` the probabilities (after the P - alpha*C_n change, before
  dropout), shape (B, H, T, T), are sown as ``attn_probs``.
  """

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, *, deterministic: bool = True,
               capture_probs: bool = False) -> jax.Array:
    cfg = self.cfg
    d, heads, dh = cfg.d_model, cfg.num_heads, cfg.d_head
    dtype = x_BxTxD.dtype
    pdt = jnp.dtype(cfg.param_dtype)
    b, t, _ = x_BxTxD.shape

    def proj(name, output_proj=False):
      return self.param(name, matrix_init(cfg, d, output_proj), (d, d), pdt).astype(dtype)

    q = (x_BxTxD @ proj("w_q")).reshape(b, t, heads, dh)
    k = (x_BxTxD @ proj("w_k")).reshape(b, t, heads, dh)
    v = (x_BxTxD @ proj("w_v")).reshape(b, t, heads, dh)
    logits_BxHxTxT = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    logits_BxHxTxT = logits_BxHxTxT / (math.sqrt(dh) * cfg.tau)
    causal = jnp.tril(jnp.ones((t, t), bool))
    logits_BxHxTxT = jnp.where(causal, logits_BxHxTxT, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits_BxHxTxT, axis=-1)
    if cfg.prefix_avg_removal:
      probs = probs - cfg.prefix_avg_removal * prefix_average_matrix(t, probs.dtype)
    if capture_probs:
      self.sow("intermediates", "attn_probs", probs)
    if cfg.attn_dropout_rate and not deterministic:
      probs = nn.Dropout(cfg.attn_dropout_rate)(probs, deterministic=False)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(dtype), v).reshape(b, t, d)
    return out @ proj("w_o", output_proj=True)
