"""The step a user would otherwise write: a plain flax decoder LM, nanodo-style.

google-deepmind/nanodo's ``model.py`` / ``train.py`` way: Pre-LayerNorm blocks without
bias, causal multi-head attention by einsum, a GELU MLP, learned positions, tied
embeddings, float32; blocks unrolled (a Python loop, no scan), no capture, no
diagnostics plumbing, the loss and the gradient norm as the only metrics. The update is
AdamW with global-norm clipping and the same warmup-cosine schedule as rankjax, so both
sides do the same arithmetic per step.

``make(...)`` returns ``(init_state, step)`` with ``step(state, tokens_BxT1) -> (state,
loss)`` jitted with the state donated. Used by ``train_throughput.py``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class Block(nn.Module):
  d: int
  heads: int
  d_ff: int
  num_layers: int

  @nn.compact
  def __call__(self, x_BxTxD):
    b, t, d = x_BxTxD.shape
    dh = d // self.heads
    init = nn.initializers.normal(0.02)
    out_init = nn.initializers.normal(0.02 / (2 * self.num_layers) ** 0.5)
    h = nn.LayerNorm(use_bias=False)(x_BxTxD)
    qkv = nn.DenseGeneral((3, self.heads, dh), use_bias=False, kernel_init=init)(h)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    att_BxHxTxT = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(dh)
    mask = jnp.tril(jnp.ones((t, t), bool))
    att_BxHxTxT = jax.nn.softmax(jnp.where(mask, att_BxHxTxT, -1e30), axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", att_BxHxTxT, v)
    x_BxTxD = x_BxTxD + nn.DenseGeneral(d, axis=(-2, -1), use_bias=False,
                                        kernel_init=out_init)(o)
    h = nn.LayerNorm(use_bias=False)(x_BxTxD)
    h = jax.nn.gelu(nn.Dense(self.d_ff, use_bias=False, kernel_init=init)(h), approximate=False)
    return x_BxTxD + nn.Dense(d, use_bias=False, kernel_init=out_init)(h)


class PlainLM(nn.Module):
  vocab: int
  d: int
  heads: int
  d_ff: int
  num_layers: int
  max_len: int

  @nn.compact
  def __call__(self, tokens_BxT):
    embed = nn.Embed(self.vocab, self.d, embedding_init=nn.initializers.normal(0.02))
    pos = self.param("pos", nn.initializers.normal(0.02), (self.max_len, self.d))
    x = embed(tokens_BxT) + pos[: tokens_BxT.shape[1]]
    for _ in range(self.num_layers):
      x = Block(self.d, self.heads, self.d_ff, self.num_layers)(x)
    return embed.attend(nn.LayerNorm(use_bias=False)(x))


def make(vocab: int, d: int, heads: int, d_ff: int, num_layers: int, seq_len: int,
         learning_rate: float, warmup: int, total: int, clip: float, weight_decay: float):
  model = PlainLM(vocab, d, heads, d_ff, num_layers, seq_len)
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, total)
  tx = optax.chain(optax.clip_by_global_norm(clip),
                   optax.adamw(schedule, b1=0.9, b2=0.95, eps=1e-8, weight_decay=weight_decay,
                               mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)))

  def init_state(key):
    params = model.init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]
    return params, tx.init(params)

  def loss_fn(params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @jax.jit
  def _step(state, tokens):
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  step = jax.jit(_step, donate_argnums=(0,))
  return jax.jit(init_state), step
