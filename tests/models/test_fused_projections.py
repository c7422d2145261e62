"""Fused projections (``lm.kernels.fused_projections``): one QKV matmul and one W1|W3 matmul,
the same function as the separate matmuls on the same parameters (forward, gradients,
the captured X_k / Y_k, their gradients and the attention probabilities), for every
placement, with GQA, q/k/v biases and RoPE; and the layer's lowered dots."""

import dataclasses
import re
from collections import Counter

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import NORM_POSITIONS, KernelConfig, TrainConfig, TransformerConfig
from rankjax._src.measure import decoder_jacobians
from rankjax._src.models.transformer import DecoderLM, intermediate_grads, layer_forward
from rankjax._src.train import tasks
from tests.train.conftest import ROOT
from tests.conftest import with_kernels

# GQA (4 query heads, 2 key/value heads), q/k/v biases, RoPE: d=16, d_head=4, so the
# widths are Q 16, K 8, V 8 (fused 32) and d_ff 24 (W1|W3 fused 48): no two alike
# but Q and W_O (both d x d)
BASE = TransformerConfig(vocab_size=37, num_layers=2, d_model=16, num_heads=4,
                         num_kv_heads=2, attn_bias=True, d_ff=24, max_seq_len=12,
                         pos_embedding="rope")


def _tokens(key, b=2, t=9):
  return jax.random.randint(jax.random.key(key), (b, t), 0, BASE.vocab_size)


def _params(cfg, tokens):
  """Init parameters with every leaf moved off its init (the zero biases included)."""
  params = DecoderLM(cfg).init(jax.random.key(0), tokens)["params"]
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape, x.dtype)
                                   for x, k in zip(leaves, keys)])


def _everything(cfg, params, tokens, targets):
  """Logits, loss, parameter gradients, the captured sites and their gradients, and the
  attention probabilities of ``DecoderLM(cfg)``."""
  model = DecoderLM(cfg)

  def loss_fn(logits):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))

  loss, g_params, site_grads, sites = intermediate_grads(model, params, tokens, loss_fn)
  logits, state = model.apply({"params": params}, tokens, capture_probs=True,
                              mutable=["intermediates"])
  probs = state["intermediates"]["layers"]["attn"]["attn_probs"][0]
  return dict(logits=logits, loss=loss, g_params=g_params, site_grads=site_grads,
              sites=sites, probs=probs)


# placement (and FFN): the 48-layer paper model's by default, every placement with both FFNs under slow
CASES = [(p, f) for p in NORM_POSITIONS for f in ("swiglu", "gelu")]
FAST = {("post", "swiglu")}


@pytest.mark.parametrize("position,ffn", [
    c if c in FAST else pytest.param(*c, marks=pytest.mark.slow) for c in CASES])
def test_fused_lm_equals_unfused(position, ffn):
  cfg = dataclasses.replace(BASE, norm_position=position, ffn=ffn)
  fused = with_kernels(cfg, fused_projections=True)
  tokens, targets = _tokens(2), _tokens(3)

  def run():                                               # one compile
    init = lambda c: DecoderLM(c).init(jax.random.key(0), tokens)
    params = _params(cfg, tokens)
    return (init(cfg), init(fused), params, _everything(cfg, params, tokens, targets),
            _everything(fused, params, tokens, targets))

  init_ref, init_fused, params, ref, got = jax.jit(run)()
  # the parameter tree is the same: names, shapes, and the init values
  chex.assert_trees_all_equal(init_fused, init_ref)
  assert set(ref["g_params"]["layers"]["attn"]) == {"w_q", "w_k", "w_v", "w_o",
                                                     "b_q", "b_k", "b_v"}
  np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-6)
  chex.assert_trees_all_close(got["g_params"], ref["g_params"], rtol=1e-4, atol=1e-6)
  chex.assert_trees_all_close(got["sites"], ref["sites"], rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(got["site_grads"], ref["site_grads"], rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(got["probs"], ref["probs"], rtol=1e-5, atol=1e-6)
  # the check can fail: a bias left out of the fused product moves the logits
  nobias = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.zeros_like(x) if "b_q" in jax.tree_util.keystr(path) else x,
      params)
  moved = jax.jit(lambda p: DecoderLM(fused).apply({"params": p}, tokens))(nobias)
  assert np.abs(moved - ref["logits"]).max() > 1e-3


@pytest.mark.slow   # two jacfwd studies compiled: ~15 s
def test_decoder_jacobians_of_the_fused_model_equal_the_unfused():
  """``measure.decoder_jacobians`` differentiates the model's own sublayers: fused,
  the same Jacobians (Pre-Norm, SwiGLU, GQA, biases, RoPE; measured at 'highest')."""
  cfg = dataclasses.replace(BASE, norm_position="pre")
  tokens = _tokens(4, b=1)[0]
  params = jax.jit(_params, static_argnums=0)(cfg, tokens[None])
  ref = decoder_jacobians.sublayer_jacobians(cfg, params, tokens, 5)
  got = decoder_jacobians.sublayer_jacobians(
      with_kernels(cfg, fused_projections=True), params, tokens, 5)
  chex.assert_trees_all_close(got, ref, rtol=1e-5, atol=1e-6)
  assert all(np.abs(v).max() > 1e-2 for v in jax.tree.leaves(ref))


def _weight_dots(cfg) -> Counter:
  """The (rhs) weight shapes of the 2-D-weight dot_generals in one layer's lowered
  forward pass (``transformer.layer_forward``)."""
  params = jax.eval_shape(DecoderLM(cfg).init, jax.random.key(0), _tokens(0))["params"]
  layer = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype),
                       params["layers"])
  h = jax.ShapeDtypeStruct((9, cfg.d_model), jnp.float32)
  text = jax.jit(lambda p, x: layer_forward(cfg, p, x)).lower(layer, h).as_text()
  rhs = re.findall(r"stablehlo\.dot_general[^\n]*:\s*\(tensor<[^>]*>,\s*tensor<(\d+x\d+)x"
                   r"f32>\)", text)
  assert text.count("stablehlo.dot_general") > len(rhs)   # attention's own dots too
  return Counter(rhs)


@pytest.mark.parametrize("ffn", ["swiglu", "gelu"])
def test_layer_has_one_dot_for_qkv_and_one_for_w1_w3(ffn):
  cfg = dataclasses.replace(BASE, ffn=ffn)
  ffn_in = ["16x24", "16x24"] if ffn == "swiglu" else ["16x24"]
  assert _weight_dots(cfg) == Counter(["16x16", "16x8", "16x8", "16x16", *ffn_in, "24x16"])
  fused_ffn = ["16x48"] if ffn == "swiglu" else ["16x24"]
  assert _weight_dots(with_kernels(cfg, fused_projections=True)) == Counter(
      ["16x32", "16x16", *fused_ffn, "24x16"])


@pytest.mark.parametrize("name", ["postnorm_48l_d512_c4", "gpt2_774m"])
def test_paper_configs_fuse(name):
  cfg = config_lib.from_json(TrainConfig, ROOT / "experiments" / "configs" / f"{name}.json")
  assert cfg.model.kernels.fused_projections
  assert not TransformerConfig().kernels.fused_projections    # recorded results keep their bits


@pytest.mark.slow   # three bfloat16 training losses compiled: 8-14 s each
@pytest.mark.parametrize("name", ["postnorm_48l_d512_c4", "gpt2_774m"])
def test_paper_configs_fuse_within_bf16_rounding(name):
  """The paper configs turn fusion on. Shrunk (2 layers, d=64), their bfloat16 training
  loss and gradients equal the unfused ones to within bfloat16's own error (the unfused
  bfloat16 model against float32, measured beside it): the fused backward sums the Q,
  K, V (W1, W3) contributions to dx in one float32-accumulated dot, the unfused one
  adds three bfloat16 products, so the two differ by bfloat16 rounding, not more."""
  cfg = config_lib.from_json(TrainConfig, ROOT / "experiments" / "configs" / f"{name}.json")
  assert cfg.model.kernels.fused_projections and cfg.compute_dtype == "bfloat16"
  lm = dataclasses.replace(with_kernels(cfg.model, loss_chunk=0), num_layers=2, d_model=64,
                           num_heads=2, d_ff=128, vocab_size=300, max_seq_len=32)
  cfg = dataclasses.replace(cfg, model=lm, seq_len=32, batch_size=4, grad_accum=1)
  unfused_lm = with_kernels(lm, fused_projections=False)
  unfused = dataclasses.replace(cfg, model=unfused_lm)
  f32 = dataclasses.replace(cfg, compute_dtype="float32",
                            model=dataclasses.replace(unfused_lm, compute_dtype="float32"))
  batch = {k: jax.random.randint(jax.random.key(i), (4, 32), 0, 300)
           for i, k in enumerate(("inputs", "targets"))}

  def loss_and_grads(c, params):
    task = tasks.make_task(c)
    return jax.value_and_grad(lambda p: task.loss(p, batch, None, deterministic=True)[0])(
        params)

  params = tasks.make_task(cfg).init(jax.random.key(0))
  (lf, gf), (lu, gu), (l32, g32) = jax.jit(lambda p: tuple(
      loss_and_grads(c, p) for c in (cfg, unfused, f32)))(params)
  assert abs(lf - lu) <= 2 * abs(lu - l32) + 1e-6 * abs(lu)
  for path, f, u, r in zip(jax.tree_util.tree_leaves_with_path(gf), jax.tree.leaves(gf),
                           jax.tree.leaves(gu), jax.tree.leaves(g32)):
    assert np.linalg.norm(f - u) <= 1.5 * np.linalg.norm(u - r) + 1e-9, path[0]
  assert np.linalg.norm(jax.tree.leaves(gu)[0] - jax.tree.leaves(g32)[0]) > 0  # bf16 is


def test_fused_projections_must_be_a_bool():
  with pytest.raises(ValueError, match="fused_projections='yes' must be true or false"):
    TransformerConfig(kernels=KernelConfig(fused_projections="yes"))
