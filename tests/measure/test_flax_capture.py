"""The module-doc recipe of rankjax._src.measure.flax_capture on the nanodo-style model of
experiments/benchmarks/plain_flax.py (unchanged), checked against an independent
block-by-block forward, autodiff of the loss w.r.t. each stream, and probabilities
recomputed from the parameters."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import flax.linen as nn
import pytest

from experiments.benchmarks.plain_flax import Block, PlainLM
from rankjax._src.measure import flax_capture as fc
from rankjax._src.measure import gradients as gr
from rankjax._src.measure.similarity import token_similarity

L, D, H, T, V, B = 3, 16, 2, 20, 32, 2


@pytest.fixture(scope="module")
def setup():
  model = PlainLM(V, D, H, 2 * D, L, T)
  key = jax.random.key(0)
  tokens = jax.random.randint(key, (B, T + 1), 0, V)
  params = jax.jit(model.init)(key, tokens[:, :-1])["params"]
  x, y = tokens[:, :-1], tokens[:, 1:]
  loss = lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  sites = {
      "x1": fc.site(fc.module_named("Block"), "input"),
      "f1": fc.site(fc.nth_call_in_block("DenseGeneral", 1, block="Block"), "output"),
      "y2": fc.site(fc.module_named("Block"), "output"),
      "qkv": fc.site(fc.nth_call_in_block("DenseGeneral", 0), "output"),   # block inferred
  }
  out = jax.jit(lambda p: fc.capture(model, {"params": p}, x, sites, loss))(params)
  return model, params, x, y, loss, out


def _streams(model, params, x):
  """Independent forward: embedding, then each Block applied with its own params."""
  h = params["Embed_0"]["embedding"][x] + params["pos"][: x.shape[1]]
  streams = [h]
  for l in range(L):
    h = Block(D, H, 2 * D, L).apply({"params": params[f"Block_{l}"]}, h)
    streams.append(h)
  return streams


def _loss_from_layer(model, params, y, loss, l):
  """The loss as a function of the stream entering block l."""
  def f(h):
    for j in range(l, L):
      h = Block(D, H, 2 * D, L).apply({"params": params[f"Block_{j}"]}, h)
    scale = params["LayerNorm_0"]["scale"]
    hn = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-6) * scale
    return loss(hn @ params["Embed_0"]["embedding"].T)
  return f


@pytest.fixture(scope="module")
def reference(setup):
  """The independent streams and dL/dX_1^l, computed in one compiled program."""
  model, params, x, y, loss, _ = setup

  @jax.jit
  def compute(params):
    streams = _streams(model, params, x)
    grads = [jax.grad(_loss_from_layer(model, params, y, loss, l))(streams[l]) for l in range(L)]
    return streams, grads, model.apply({"params": params}, x)

  return compute(params)


def test_streams_and_their_gradients_match_block_by_block(setup, reference):
  model, params, x, y, loss, out = setup
  streams, grads, logits = reference
  np.testing.assert_allclose(out.values["x1"], jnp.stack(streams[:-1]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.values["y2"], jnp.stack(streams[1:]), rtol=1e-5, atol=1e-6)
  for l in range(L):
    np.testing.assert_allclose(out.grads["x1"][l], grads[l], rtol=1e-4, atol=1e-8, err_msg=str(l))
  # dL/dY_2^l is dL/dX_1^{l+1} (the same tensor)
  np.testing.assert_allclose(out.grads["y2"][:-1], out.grads["x1"][1:], rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(out.output, logits, rtol=1e-5, atol=1e-6)


def test_residual_statistics_and_attention_of_the_recipe(setup, reference):
  model, params, x, y, loss, out = setup
  acts, grads = out.values, out.grads
  y1 = acts["x1"] + acts["f1"]
  stats = fc.residual_statistics({"x1": acts["x1"], "y1": y1, "x2": y1, "y2": acts["y2"]},
                                 {"x1": grads["x1"], "y1": grads["f1"], "x2": grads["f1"],
                                  "y2": grads["y2"]})
  for l in range(L):      # numpy, float64, from the captured tensors
    xl = np.asarray(acts["x1"][l], np.float64)
    tsim = np.mean([T * np.sum(xl[b].mean(0) ** 2) / np.sum(xl[b] ** 2) for b in range(B)])
    assert stats["tsim_x1"][l] == pytest.approx(tsim, rel=1e-5)
    a1 = np.linalg.norm(np.asarray(grads["x1"][l])) / np.linalg.norm(np.asarray(grads["f1"][l]))
    assert stats["alpha_1"][l] == pytest.approx(a1, rel=1e-5)
  np.testing.assert_allclose(stats["tsim_y2"], jnp.mean(token_similarity(acts["y2"]), -1))
  np.testing.assert_allclose(stats["contraction_2"],
                             stats["alpha_2"] * gr.rms_factor_stats(acts["y2"])[0], rtol=1e-6)

  qkv = acts["qkv"]                                  # (L, B, T, 3, H, dh)
  probs = fc.causal_probs(qkv[..., 0, :, :], qkv[..., 1, :, :])
  assert probs.shape == (L, B, H, T, T)

  @jax.jit                # recomputed from the parameters, one compile for the layers
  def recomputed(params, streams):
    refs = []
    for l in range(L):
      p = params[f"Block_{l}"]
      h = streams[l]
      hn = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-6)
      hn = hn * p["LayerNorm_0"]["scale"]
      q = jnp.einsum("btd,dhk->bthk", hn, p["DenseGeneral_0"]["kernel"][:, 0])
      k = jnp.einsum("btd,dhk->bthk", hn, p["DenseGeneral_0"]["kernel"][:, 1])
      logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
      refs.append(jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((T, T), bool)), logits, -1e30),
                                 -1))
    return refs

  for l, ref in enumerate(recomputed(params, reference[0])):
    np.testing.assert_allclose(probs[l], ref, rtol=1e-4, atol=1e-6)
  att = fc.attention_statistics(probs, jax.random.key(1), num_rows=16, min_query=4)
  assert att["p_max_mean"].shape == (L,)
  assert np.all((att["entropy_norm_mean"] >= 0) & (att["entropy_norm_mean"] <= 1))
  assert np.all(att["theta_cert_p50"] >= 0)


def test_a_site_that_matches_nothing_is_one_line(setup):
  model, params, x, *_ = setup
  with pytest.raises(ValueError, match=r"capture sites \['nope'\] matched no module call"):
    fc.capture(model, {"params": params}, x, {"nope": fc.site(fc.module_named("Conv"))})


class NamedBlock(nn.Module):
  """A block whose submodules have names of their own; the last layer has no FFN."""
  d: int
  ffn: bool = True

  @nn.compact
  def __call__(self, x):
    x = x + nn.Dense(self.d, name="attn_out")(nn.LayerNorm(name="ln_attn")(x))
    if self.ffn:
      x = x + nn.Dense(self.d, name="ffn_out")(nn.LayerNorm(name="ln_ffn")(x))
    return x


class NamedModel(nn.Module):
  layers: int
  d: int
  last_ffn: bool = True

  @nn.compact
  def __call__(self, x):
    for l in range(self.layers):
      x = NamedBlock(self.d, ffn=self.last_ffn or l < self.layers - 1, name=f"layer{l}")(x)
    return nn.LayerNorm()(x)      # the model's final norm: flax names it LayerNorm_0


@pytest.fixture(scope="module")
def named():
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  model = NamedModel(3, 8)
  return model, jax.jit(model.init)(jax.random.key(1), x), x


def test_nth_call_matches_by_type_and_call_order_not_automatic_names(named):
  model, variables, x = named
  sites = {"ln2": fc.site(fc.nth_call_in_block("LayerNorm", 1, block="NamedBlock")),
           "ln1": fc.site(fc.nth_call_in_block("LayerNorm", 0, block="NamedBlock"), "input")}
  out = fc.capture(model, variables, x, sites)
  assert out.values["ln2"].shape == (3, 2, 5, 8)     # one per layer, not the final norm
  _, state = model.apply(variables, x, capture_intermediates=True)
  inter = state["intermediates"]
  for l in range(3):
    np.testing.assert_array_equal(out.values["ln2"][l], inter[f"layer{l}"]["ln_ffn"]["__call__"][0])
  np.testing.assert_array_equal(out.values["ln1"][0], x)


def test_an_ambiguous_nth_call_raises_naming_what_it_found(named):
  """Without a block, the first LayerNorm call of each parent is each layer's ln_attn
  and the model's own final norm: two kinds of parent, so no silent (1, ...) tensor."""
  model, variables, x = named
  with pytest.raises(ValueError, match=r"ambiguous.*inside NamedBlock: layer0/ln_attn, "
                                       r"layer1/ln_attn, layer2/ln_attn; inside NamedModel: "
                                       r"LayerNorm_0.*block='NamedBlock'"):
    fc.capture(model, variables, x, {"ln": fc.site(fc.nth_call_in_block("LayerNorm", 0))})


def test_an_nth_call_missing_in_some_layer_raises_naming_it(named):
  _, _, x = named
  model = NamedModel(3, 8, last_ffn=False)
  variables = jax.jit(model.init)(jax.random.key(1), x)
  with pytest.raises(ValueError, match=r"captured 2 calls \(layer0/ln_ffn, layer1/ln_ffn\) "
                                       r"but NamedBlock ran 3 times; layer2 made fewer than 2"):
    fc.capture(model, variables, x,
               {"ln": fc.site(fc.nth_call_in_block("LayerNorm", 1, block="NamedBlock"))})


def test_wrong_shapes_get_a_shape_message():
  q = jnp.zeros((2, 8, 2, 4))                       # one layer, no layer axis
  with pytest.raises(ValueError, match=r"\(layers, batch, tokens, heads, head_dim\); got q "
                                       r"\(2, 8, 2, 4\).*add the layer axis"):
    fc.causal_probs(q, q)
  with pytest.raises(ValueError, match=r"got q \(1, 2, 8, 2, 4\) and k \(1, 2, 8, 2, 3\)"):
    fc.causal_probs(q[None], jnp.zeros((1, 2, 8, 2, 3)))
  for shape in ((2, 2, 8, 8), (1, 2, 2, 8, 7)):
    with pytest.raises(ValueError, match=r"\(layers, batch, heads, tokens, tokens\).*got "
                                         + re.escape(str(shape))):
      fc.attention_statistics(jnp.zeros(shape), jax.random.key(0))
