"""DecoderLM: the decoder-only Transformer of the Post-Norm collapse and
softmax-sensitivity papers, with the normalization placement as a field.

Per layer l, with sublayers k = 1 (attention) and k = 2 (FFN), postnorm paper Eq. 1:

  post:  X_1 = h             Y_1 = X_1 + Attn(X_1)       X_2 = N(Y_1)
         Y_2 = X_2 + FFN(X_2)                            h' = N(Y_2)
  pre:   X_1 = N(h)          Y_1 = h + Attn(X_1)         X_2 = N(Y_1)
         Y_2 = Y_1 + FFN(X_2)                            h' = Y_2
  peri:  pre, with a norm on each sublayer output before the add.

So X_k is always the sublayer input (after the norm, for pre/peri) and Y_k the
residual sum before the next norm. With ``capture=True`` each layer sows ``x1, y1, x2,
y2`` (stacked over layers: (L, B, T, d)) into ``intermediates`` and passes them
through ``perturb`` (collection ``perturbations``) so gradients with respect to them
are available: see ``intermediate_grads``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankjax import partitioning
from rankjax.config import TransformerConfig
from rankjax.models.attention import CausalSelfAttention, matrix_init
from rankjax.models.norms import Norm

SUBLAYER_NAMES = ("x1", "y1", "x2", "y2")


class FeedForward(nn.Module):
  """SwiGLU ``(silu(X W1) * X W3) W2`` (postnorm Eq. 2) or GELU ``gelu(X W1) W2``."""

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.cfg
    d, f, dtype, pdt = cfg.d_model, cfg.d_ff, x.dtype, jnp.dtype(cfg.param_dtype)
    w1 = self.param("w_1", matrix_init(cfg, d), (d, f), pdt).astype(dtype)
    w2 = self.param("w_2", matrix_init(cfg, f, output_proj=True), (f, d), pdt).astype(dtype)
    if cfg.ffn == "swiglu":
      w3 = self.param("w_3", matrix_init(cfg, d), (d, f), pdt).astype(dtype)
      hidden = jax.nn.silu(x @ w1) * (x @ w3)
    else:
      hidden = jax.nn.gelu(x @ w1, approximate=False)
    return hidden @ w2


class DecoderBlock(nn.Module):
  """One layer: attention then FFN, each with its residual add and norms."""

  cfg: TransformerConfig
  capture: bool = False
  capture_probs: bool = False
  deterministic: bool = True

  def _norm(self, name: str) -> Norm:
    cfg = self.cfg
    return Norm(cfg.norm_op, gain=True, eps=cfg.norm_eps,
                param_dtype=jnp.dtype(cfg.param_dtype), name=name)

  def _record(self, name: str, value: jax.Array) -> jax.Array:
    if not self.capture:
      return value
    value = self.perturb(name, value)
    self.sow("intermediates", name, value)
    return value

  def _drop(self, x: jax.Array) -> jax.Array:
    if self.cfg.dropout_rate and not self.deterministic:
      return nn.Dropout(self.cfg.dropout_rate)(x, deterministic=False)
    return x

  @nn.compact
  def __call__(self, h: jax.Array, _=None):
    h = partitioning.constrain(h, ("batch", "length", "embed"))
    cfg = self.cfg
    pos = cfg.norm_position
    attn = CausalSelfAttention(cfg, name="attn")
    ffn = FeedForward(cfg, name="ffn")

    x1 = self._record("x1", h if pos == "post" else self._norm("norm_attn_in")(h))
    a = self._drop(attn(x1, deterministic=self.deterministic, capture_probs=self.capture_probs))
    if pos == "peri":
      a = self._norm("norm_attn_out")(a)
    y1 = self._record("y1", (x1 if pos == "post" else h) + a)
    x2 = self._record("x2", self._norm("norm_ffn_in")(y1))
    f = self._drop(ffn(x2))
    if pos == "peri":
      f = self._norm("norm_ffn_out")(f)
    y2 = self._record("y2", (x2 if pos == "post" else y1) + f)
    out = self._norm("norm_out")(y2) if pos == "post" else y2
    return out, None


class DecoderLM(nn.Module):
  """Token embeddings, ``num_layers`` blocks (one ``nn.scan``), final norm, LM head.

  ``__call__(tokens_BxT) -> logits_BxTxV`` (float32, or float64 with float64 params). Options: ``deterministic=False`` turns on
  dropout (needs a ``dropout`` rng); ``capture`` sows and perturbs the per-layer
  X_k / Y_k; ``capture_probs`` also sows the attention probabilities (B, H, T, T) per
  layer, stacked as (L, B, H, T, T).
  """

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, tokens_BxT: jax.Array, *, deterministic: bool = True,
               capture: bool = False, capture_probs: bool = False) -> jax.Array:
    cfg = self.cfg
    dtype, pdt = jnp.dtype(cfg.compute_dtype), jnp.dtype(cfg.param_dtype)
    t = tokens_BxT.shape[-1]
    if t > cfg.max_seq_len:
      raise ValueError(f"sequence length {t} exceeds max_seq_len={cfg.max_seq_len}")
    embed_std = cfg.embed_std or (1.0 if cfg.init == "paper_collapse" else 0.02)
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, param_dtype=pdt,
                     embedding_init=nn.initializers.normal(embed_std), name="embed")
    h = partitioning.constrain(embed(tokens_BxT).astype(dtype), ("batch", "length", "embed"))
    if cfg.pos_embedding == "learned":
      pos = self.param("pos_embed", nn.initializers.normal(embed_std),
                       (cfg.max_seq_len, cfg.d_model), pdt)
      h = h + pos[:t].astype(dtype)
    if cfg.dropout_rate and not deterministic:
      h = nn.Dropout(cfg.dropout_rate)(h, deterministic=False)

    block = DecoderBlock
    if cfg.remat:
      block = nn.remat(block, static_argnums=())
    stack = nn.scan(
        block,
        variable_axes={"params": 0, "intermediates": 0, "perturbations": 0},
        split_rngs={"params": True, "dropout": True},
        length=cfg.num_layers,
    )
    h, _ = stack(cfg, capture=capture, capture_probs=capture_probs,
                 deterministic=deterministic, name="layers")(h, None)

    if cfg.final_norm:
      h = Norm(cfg.norm_op, gain=True, eps=cfg.norm_eps, param_dtype=pdt, name="norm_final")(h)
    if cfg.tie_embeddings:
      logits = embed.attend(h.astype(pdt))
    else:
      w = self.param("lm_head", matrix_init(cfg, cfg.d_model), (cfg.d_model, cfg.vocab_size), pdt)
      logits = h @ w.astype(dtype)
    return logits.astype(jnp.promote_types(jnp.float32, pdt))


def intermediate_grads(model: DecoderLM, params, tokens_BxT, loss_fn):
  """Loss, parameter gradients and gradients w.r.t. the captured X_k^l / Y_k^l.

  ``loss_fn(logits_BxTxV) -> scalar``. Returns (loss, param_grads, grads, acts), where
  ``grads`` and ``acts`` map x1, y1, x2, y2 to (L, B, T, d) arrays (Flax ``perturb``).
  """
  def shapes():
    _, state = model.apply({"params": params}, tokens_BxT, capture=True,
                           mutable=["perturbations"])
    return state["perturbations"]

  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(shapes))

  def loss(p, perturbations):
    logits, state = model.apply({"params": p, "perturbations": perturbations}, tokens_BxT,
                                capture=True, mutable=["intermediates"])
    return loss_fn(logits), state["intermediates"]

  (value, inter), (g_params, g_pert) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
      params, zeros)
  layer_grads = {k: g_pert["layers"][k] for k in SUBLAYER_NAMES}
  layer_acts = {k: inter["layers"][k][0] for k in SUBLAYER_NAMES}
  return value, g_params, layer_grads, layer_acts
