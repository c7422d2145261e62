"""The module-doc recipe of rankjax.measure.flax_capture on the nanodo-style model of
experiments/benchmarks/plain_flax.py (unchanged), checked against an independent
block-by-block forward, autodiff of the loss w.r.t. each stream, and probabilities
recomputed from the parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.benchmarks.plain_flax import Block, PlainLM
from rankjax.measure import flax_capture as fc
from rankjax.measure import gradients as gr
from rankjax.measure.similarity import token_similarity

L, D, H, T, V, B = 3, 16, 2, 20, 32, 2


@pytest.fixture(scope="module")
def setup():
  model = PlainLM(V, D, H, 2 * D, L, T)
  key = jax.random.key(0)
  tokens = jax.random.randint(key, (B, T + 1), 0, V)
  params = model.init(key, tokens[:, :-1])["params"]
  x, y = tokens[:, :-1], tokens[:, 1:]
  loss = lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  sites = {
      "x1": fc.site(fc.module_named("Block"), "input"),
      "f1": fc.site(fc.nth_call_in_block("DenseGeneral", 1), "output"),
      "y2": fc.site(fc.module_named("Block"), "output"),
      "qkv": fc.site(fc.nth_call_in_block("DenseGeneral", 0), "output"),
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


def test_streams_and_their_gradients_match_block_by_block(setup):
  model, params, x, y, loss, out = setup
  streams = _streams(model, params, x)
  np.testing.assert_allclose(out.values["x1"], jnp.stack(streams[:-1]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.values["y2"], jnp.stack(streams[1:]), rtol=1e-5, atol=1e-6)
  for l in range(L):
    g = jax.grad(_loss_from_layer(model, params, y, loss, l))(streams[l])
    np.testing.assert_allclose(out.grads["x1"][l], g, rtol=1e-4, atol=1e-8, err_msg=str(l))
  # dL/dY_2^l is dL/dX_1^{l+1} (the same tensor)
  np.testing.assert_allclose(out.grads["y2"][:-1], out.grads["x1"][1:], rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(out.output, model.apply({"params": params}, x), rtol=1e-5, atol=1e-6)


def test_residual_statistics_and_attention_of_the_recipe(setup):
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
  streams = _streams(model, params, x)
  for l in range(L):      # recomputed from the parameters
    p = params[f"Block_{l}"]
    h = streams[l]
    hn = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-6)
    hn = hn * p["LayerNorm_0"]["scale"]
    q = jnp.einsum("btd,dhk->bthk", hn, p["DenseGeneral_0"]["kernel"][:, 0])
    k = jnp.einsum("btd,dhk->bthk", hn, p["DenseGeneral_0"]["kernel"][:, 1])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
    ref = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((T, T), bool)), logits, -1e30), -1)
    np.testing.assert_allclose(probs[l], ref, rtol=1e-4, atol=1e-6)
  att = fc.attention_statistics(probs, jax.random.key(1), num_rows=16, min_query=4)
  assert att["p_max_mean"].shape == (L,)
  assert np.all((att["entropy_norm_mean"] >= 0) & (att["entropy_norm_mean"] <= 1))
  assert np.all(att["theta_cert_p50"] >= 0)


def test_a_site_that_matches_nothing_is_one_line(setup):
  model, params, x, *_ = setup
  with pytest.raises(ValueError, match=r"capture sites \['nope'\] matched no module call"):
    fc.capture(model, {"params": params}, x, {"nope": fc.site(fc.module_named("Conv"))})
