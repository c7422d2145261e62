"""DecoderLM: settings grid, placement semantics, causality, init statistics,
P - alpha*C_n intervention, captured intermediates and their gradients."""

import dataclasses
import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import KernelConfig, TransformerConfig
from rankjax._src.models import norms
from rankjax._src.models.attention import CausalSelfAttention, prefix_average_matrix
from rankjax._src.models.transformer import DecoderLM, intermediate_grads

TINY = dict(vocab_size=37, num_layers=2, d_model=16, num_heads=2, d_ff=24, max_seq_len=12)


def _tokens(b=2, t=8, key=0, vocab=37):
  return jax.random.randint(jax.random.key(key), (b, t), 0, vocab)


def _init(cfg, tokens, key=0):
  return jax.jit(DecoderLM(cfg).init)(jax.random.key(key), tokens)


def _init_apply(cfg, tokens, **kw):
  """Init and apply (kw: apply's keywords) in one compile: (variables, output)."""
  model = DecoderLM(cfg)

  def run(key):
    variables = model.init(key, tokens)
    return variables, model.apply(variables, tokens, **kw)

  return jax.jit(run)(jax.random.key(0))


SETTINGS = list(itertools.product(
    ("pre", "post", "peri"), ("rms", "layer"), ("swiglu", "gelu"), ("learned", "none"),
    (True, False), ("paper_collapse", "gpt2")))[::5]
# three settings by default that hold every value of every axis; the rest are slow
FAST_SETTINGS = {("pre", "rms", "swiglu", "learned", True, "paper_collapse"),
                 ("post", "layer", "swiglu", "none", False, "gpt2"),
                 ("peri", "rms", "gelu", "learned", False, "gpt2")}


@pytest.mark.parametrize("position,op,ffn,pos_emb,tie,init", [
    c if c in FAST_SETTINGS else pytest.param(*c, marks=pytest.mark.slow) for c in SETTINGS])
def test_settings_build_and_are_finite(position, op, ffn, pos_emb, tie, init):
  cfg = TransformerConfig(**TINY, norm_position=position, norm_op=op, ffn=ffn,
                          pos_embedding=pos_emb, tie_embeddings=tie, init=init)
  tokens = _tokens()
  variables, logits = _init_apply(cfg, tokens)
  chex.assert_shape(logits, (2, 8, 37))
  chex.assert_tree_all_finite(logits)
  assert ("lm_head" in variables["params"]) == (not tie)


def test_dropout_and_bfloat16_run():
  cfg = TransformerConfig(**TINY, dropout_rate=0.1, attn_dropout_rate=0.1,
                          compute_dtype="bfloat16", kernels=KernelConfig(remat="full"))
  tokens = _tokens()
  variables = _init(cfg, tokens)
  model = DecoderLM(cfg)
  apply = jax.jit(lambda r: model.apply(variables, tokens, deterministic=False,
                                        rngs={"dropout": r}))   # one compile, two keys
  a = apply(jax.random.key(1))
  b = apply(jax.random.key(2))
  assert a.dtype == jnp.float32
  chex.assert_tree_all_finite(a)
  assert not np.allclose(a, b)
  assert jax.tree.leaves(variables)[0].dtype == jnp.float32


def _captured(cfg, tokens):
  """The captured sites at init (init and apply in one compile)."""
  _, (_, sites) = _init_apply(cfg, tokens, capture=True)
  return sites


def test_post_renormalizes_the_stream_and_pre_does_not():
  tokens = _tokens()
  post = TransformerConfig(**TINY, norm_position="post", norm_eps=0.0)
  acts = _captured(post, tokens)
  # X_2 = N(Y_1) has unit RMS rows (gain 1 at init); Y_1 = X_1 + Attn(X_1) does not.
  np.testing.assert_allclose(norms.rms(acts["x2"])[..., 0], 1.0, rtol=1e-5)
  np.testing.assert_allclose(norms.rms(acts["x1"][1])[..., 0], 1.0, rtol=1e-5)
  assert not np.allclose(norms.rms(acts["y1"])[..., 0], 1.0, rtol=1e-3)

  pre = dataclasses.replace(post, norm_position="pre")
  acts = _captured(pre, tokens)
  np.testing.assert_allclose(norms.rms(acts["x1"])[..., 0], 1.0, rtol=1e-5)
  # the stream passed between layers is Y_2, not renormalized
  assert not np.allclose(norms.rms(acts["y2"])[..., 0], 1.0, rtol=1e-3)
  # Pre-Norm: layer l+1 reads the un-normalized Y_2 of layer l through its input norm
  np.testing.assert_allclose(acts["x1"][1], norms.normalize(acts["y2"][0], "rms"),
                             rtol=1e-5, atol=1e-6)


def test_peri_normalizes_sublayer_outputs():
  cfg = TransformerConfig(**TINY, norm_position="peri", norm_eps=0.0)
  acts = _captured(cfg, _tokens())
  # Y_2 - Y_1 is the normalized FFN output: unit RMS rows at gain 1
  np.testing.assert_allclose(norms.rms(acts["y2"] - acts["y1"])[..., 0], 1.0, rtol=1e-4)


@pytest.mark.parametrize("position", ["pre", pytest.param("post", marks=pytest.mark.slow),
                                      pytest.param("peri", marks=pytest.mark.slow)])
def test_causality(position):
  """Position i's logits do not depend on any later position (through its learned
  position embedding, one row per position), and do depend on every earlier one."""
  cfg = TransformerConfig(**TINY, norm_position=position, pos_embedding="learned")
  tokens = _tokens(b=1, t=8)
  variables = _init(cfg, tokens)
  model = DecoderLM(cfg)

  def out_at(pos_embed, i):
    p = dict(variables["params"], pos_embed=pos_embed)
    return model.apply({"params": p}, tokens)[0, i].sum()

  grad_at = jax.jit(jax.grad(out_at))   # i traced: one compile for every position
  for i in (0, 3, 6):
    g = jnp.abs(grad_at(variables["params"]["pos_embed"], jnp.asarray(i))).sum(-1)  # (max_len,)
    assert float(g[i + 1:].max()) == 0.0
    assert float(g[: i + 1].min()) > 0.0


def test_attention_is_causal_without_position_embeddings():
  cfg = TransformerConfig(**TINY)
  x = jax.random.normal(jax.random.key(0), (1, 8, 16))
  attn = CausalSelfAttention(cfg)
  params = jax.jit(attn.init)(jax.random.key(1), x)
  jac = jax.jit(jax.jacfwd(lambda v: attn.apply(params, v)[0, 2]))(x)  # (d, 1, T, d)
  assert float(jnp.abs(jac[:, :, 3:]).max()) == 0.0
  assert float(jnp.abs(jac[:, :, :3]).min(axis=(0, 1, 3)).max()) > 0.0


def test_paper_collapse_init_statistics():
  d, f = 256, 768
  cfg = TransformerConfig(vocab_size=64, num_layers=2, d_model=d, num_heads=4, d_ff=f,
                          max_seq_len=8, init="paper_collapse", ffn="swiglu")
  p = _init(cfg, _tokens(1, 4, vocab=64))["params"]["layers"]
  targets = {("attn", "w_q"): 1 / (3 * d), ("attn", "w_k"): 1 / (3 * d),
             ("attn", "w_v"): 1 / (3 * d), ("attn", "w_o"): 1 / (3 * d),
             ("ffn", "w_1"): 1 / (3 * d), ("ffn", "w_3"): 1 / (3 * d),
             ("ffn", "w_2"): 1 / (3 * f)}
  for (mod, name), target in targets.items():
    var = float(jnp.var(p[mod][name]))
    assert abs(var / target - 1) < 0.05, (name, var, target)


def test_gpt2_init_statistics():
  n, d, f = 3, 256, 1024
  cfg = TransformerConfig(vocab_size=64, num_layers=n, d_model=d, num_heads=4, d_ff=f,
                          max_seq_len=8, init="gpt2", ffn="gelu", norm_op="layer")
  p = _init(cfg, _tokens(1, 4, vocab=64))["params"]
  out_std = 0.02 / math.sqrt(2 * n)
  for (mod, name), std in {("attn", "w_q"): 0.02, ("attn", "w_o"): out_std,
                           ("ffn", "w_1"): 0.02, ("ffn", "w_2"): out_std}.items():
    var = float(jnp.var(p["layers"][mod][name]))
    assert abs(var / std**2 - 1) < 0.05, (name, var, std**2)
  assert abs(float(jnp.std(p["embed"]["embedding"])) / 0.02 - 1) < 0.05


def test_prefix_average_matrix():
  c = np.asarray(prefix_average_matrix(4))
  np.testing.assert_allclose(c, [[1, 0, 0, 0], [1 / 2, 1 / 2, 0, 0],
                                 [1 / 3, 1 / 3, 1 / 3, 0], [1 / 4] * 4])


def test_prefix_average_removal():
  cfg = TransformerConfig(**TINY)
  x = jax.random.normal(jax.random.key(0), (2, 8, 16))
  attn = CausalSelfAttention(cfg)
  params = jax.jit(attn.init)(jax.random.key(1), x)
  plain = attn.apply(params, x)
  # alpha = 0 equals plain attention
  zero = CausalSelfAttention(dataclasses.replace(cfg, prefix_avg_removal=0.0))
  np.testing.assert_array_equal(zero.apply(params, x), plain)
  one = CausalSelfAttention(dataclasses.replace(cfg, prefix_avg_removal=1.0))
  # alpha = 1 on an all-equal input: P = C_n exactly, so P - C_n = 0 and the output is 0
  same = jnp.broadcast_to(x[:, :1], x.shape)
  np.testing.assert_allclose(one.apply(params, same), 0.0, atol=1e-6)
  assert float(jnp.abs(one.apply(params, x)).max()) > 1e-3


def test_seq_len_above_max_is_refused():
  cfg = TransformerConfig(**TINY)
  with pytest.raises(ValueError, match="exceeds max_seq_len=12"):
    _init(cfg, _tokens(1, 13))


# slow: test_lm_block's test_intermediate_grads_with_output_placement_match_direct is
# the fast test of intermediate_grads
@pytest.mark.slow
@pytest.mark.parametrize("position", ["pre", "post"])
def test_intermediate_grads_match_direct_grad(position):
  """dL/dX_k^l from Flax perturb equals a direct jax.grad through a re-run of the layer."""
  cfg = TransformerConfig(**TINY, norm_position=position, final_norm=True)
  tokens = _tokens()
  variables = _init(cfg, tokens)
  targets = _tokens(key=5)

  def loss_fn(logits):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))

  value, g_params, grads, acts, (direct_value, direct_params) = jax.jit(lambda p: (
      *intermediate_grads(DecoderLM(cfg), p, tokens, loss_fn),
      jax.value_and_grad(lambda q: loss_fn(DecoderLM(cfg).apply({"params": q}, tokens)))(p)
  ))(variables["params"])      # one compile for both
  np.testing.assert_allclose(value, direct_value, rtol=1e-6)
  chex.assert_trees_all_close(g_params, direct_params, rtol=1e-5, atol=1e-7)
  for k in ("x1", "y1", "x2", "y2"):
    chex.assert_shape(grads[k], (2, 2, 8, 16))
  # direct check for the last layer's Y_2: logits depend on Y_2 of the last layer only
  # through the final norms (post: N_out then N_final; pre: N_final) and the head.
  p = variables["params"]
  y2_last = acts["y2"][-1]

  def head(y):
    if position == "post":
      y = norms.normalize(y, "rms", cfg.norm_eps) * p["layers"]["norm_ffn_r"]["scale"][-1]
    y = norms.normalize(y, "rms", cfg.norm_eps) * p["norm_final"]["scale"]
    return loss_fn(y @ p["lm_head"])

  np.testing.assert_allclose(grads["y2"][-1], jax.grad(head)(y2_last), rtol=1e-4, atol=1e-7)
