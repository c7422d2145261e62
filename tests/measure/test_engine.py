"""The Jacobian engine (measure.engine) and its adapters, against ``jax.jacfwd`` of the
whole forward pass in float64 (where forward and reverse mode, closed forms and autodiff
agree to float64 rounding: tolerances 1e-10 relative to the largest entry)."""
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import TransformerConfig
from rankjax._src.measure import decoder_jacobians, engine, matrix_free, spectra
from rankjax._src.models import hf, norms, transformer

L, D = 4, 6
TOL = 1e-10
FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "hf"


def close(a, b, tol=TOL):
  a, b = np.asarray(a), np.asarray(b)
  np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(np.abs(b).max(), 1.0))


def _toy(grouped: bool):
  """h_l = LN(0.5 h_start + tanh(W_l h)) with scale; grouped: skips every second block."""
  @jax.jit                                            # one compile for the draws
  def draw():
    w = jax.random.normal(jax.random.key(0), (L, D, D), jnp.float64) * 0.6
    scale = 1.0 + 0.2 * jax.random.normal(jax.random.key(1), (L, D), jnp.float64)
    flags = jnp.arange(1, L + 1) % 2 == 0
    return {"w": w, "scale": scale, "closes": flags}
  params = draw()
  post = lambda p, y: norms.normalize(y, "layer", 1e-6) * p["scale"]
  block = engine.JacobianBlock(
      branch=lambda p, h: jnp.tanh(p["w"] @ h),
      post=post, skip=lambda p, h: 0.5 * h,
      closes=(lambda p: p["closes"]) if grouped else None,
      branch_jacobian=lambda p, h: (jnp.tanh(p["w"] @ h),
                                    (1 - jnp.tanh(p["w"] @ h) ** 2)[:, None] * p["w"]),
      post_jacobian=lambda p, y, m: norms.jacobian_left(m, y, "layer", 1e-6, p["scale"]),
      skip_jacobian=lambda p, h: 0.5 * jnp.eye(D))
  return block, params, jnp.linspace(-1.0, 1.2, D)


@pytest.mark.parametrize("grouped", [False, True])
def test_closed_form_and_jacfwd_give_the_network_jacobian(x64, grouped):
  block, params, h0 = _toy(grouped)
  closed = jax.jit(lambda p, h: engine.block_jacobians(block, p, h, "closed_form"))(params, h0)
  auto = jax.jit(lambda p, h: engine.block_jacobians(block, p, h, "jacfwd"))(params, h0)
  for a, b in zip(closed[:3], auto[:3]):
    close(a, b)
  # jitted (each a compile, not dozens of eager float64 ops)
  ts = jax.jit(engine.input_output_jacobians)(closed)
  ref = jax.jit(jax.jacfwd(lambda x: engine.forward(block, params, x)))(h0)   # (L, d, d)
  close(ts, ref)
  close(closed.stream[1:], jax.jit(lambda p, x: engine.forward(block, p, x))(params, h0))
  if not grouped:   # the product form: its path sums rebuild T_L (App A.1)
    out = jax.jit(engine.measurements)(closed)
    assert float(out["reconstruction_error"]) < 1e-12
    close(out["erank"] * D, jax.jit(spectra.effective_rank)(ts))
  terms = jax.jit(lambda p, h: engine.block_terms(block, jax.tree.map(lambda x: x[0], p), h))
  assert terms(params, h0).skip is not None


@pytest.mark.slow   # network_rank_estimates (test_matrix_free) runs the same path by default
def test_matrix_free_is_not_a_block_method_but_estimates_the_rank(x64):
  block, params, h0 = _toy(False)
  with pytest.raises(ValueError, match="matrix_free_ranks"):
    engine.block_jacobians(block, params, h0, "matrix_free")
  ts = engine.input_output_jacobians(engine.block_jacobians(block, params, h0))
  est = matrix_free.matrix_free_ranks(block, params, h0, jax.random.key(2), layers=(2,),
                                 num_probes=4, num_steps=D)
  # D Lanczos steps on a D x D Gram matrix: every eigenvalue exact
  np.testing.assert_allclose(est.spectral_sq, [np.linalg.norm(ts[1], 2) ** 2], rtol=1e-8)
  with pytest.raises(ValueError, match="layers"):
    matrix_free.matrix_free_ranks(block, params, h0, jax.random.key(2), layers=(L + 1,))


TINY = dict(vocab_size=37, num_layers=2, d_model=8, num_heads=2, d_ff=12, max_seq_len=8,
            param_dtype="float64", compute_dtype="float64", norm_eps=1e-6)


@pytest.mark.parametrize("placement", ["pre", pytest.param("post", marks=pytest.mark.slow)])
def test_decoder_token_product_is_the_whole_network_jacobian(x64, placement):
  """Causal attention: token t's stream depends on tokens s <= t only, so the product of
  its per-layer Jacobians (other tokens held fixed) is d h_L,t / d h_0,t of the model."""
  cfg = TransformerConfig(**TINY, norm_position=placement)
  tokens = jax.random.randint(jax.random.key(1), (5,), 0, cfg.vocab_size)
  params = jax.jit(transformer.DecoderLM(cfg).init)(jax.random.key(0), tokens[None])["params"]
  pos = 3
  bj = decoder_jacobians.token_block_jacobians(cfg, params, tokens, pos)
  assert bj.branch.shape == (2 * cfg.num_layers, 8, 8) and bj.stream.shape == (5, 8)
  assert (bj.skip is None) == (placement == "pre")
  h0 = jax.jit(lambda p, t: transformer.first_layer_input(cfg, p, t[None])[0])(params, tokens)

  def network(x_D):
    h = h0.at[pos].set(x_D)
    for l in range(cfg.num_layers):
      h = transformer.layer_forward(cfg, jax.tree.map(lambda a: a[l], params["layers"]), h)[1]
    return h[pos]

  close(jax.jit(engine.input_output_jacobians)(bj)[-1], jax.jit(jax.jacfwd(network))(h0[pos]))
  close(bj.stream[-1], jax.jit(network)(h0[pos]))
  out = jax.jit(engine.measurements)(bj)
  assert float(out["reconstruction_error"]) < 1e-10
  jac = decoder_jacobians.sublayer_jacobians(cfg, params, tokens, pos)
  close(jac["attention"], bj.relative_branch[0::2])
  k = np.eye(8) if bj.skip is None else bj.skip
  close(jac["ffn_sublayer"], (k + bj.branch)[1::2])      # J_R (I + G), Eq. 18


def test_gpt2_and_llama_adapters(x64):
  """GPT-2 (a DecoderLM configuration: biases everywhere, LayerNorm, learned positions)
  through the decoder adapter, against jacfwd of the network; a Llama FFN sublayer's
  closed form (Eq. 9, 19) through the engine against jacfwd of its branch."""
  cfg, params = hf.load_hf(FIXTURES / "gpt2")
  cfg = dataclasses.replace(cfg, param_dtype="float64", compute_dtype="float64")
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params)
  tokens = jnp.array([1, 5, 2, 7])
  pos = 2
  bj = decoder_jacobians.token_block_jacobians(cfg, params, tokens, pos)
  h0 = jax.jit(lambda p: transformer.first_layer_input(cfg, p, tokens[None])[0])(params)

  def network(x_D):
    h = h0.at[pos].set(x_D)
    for l in range(cfg.num_layers):
      h = transformer.layer_forward(cfg, jax.tree.map(lambda a: a[l], params["layers"]), h)[1]
    return h[pos]

  close(jax.jit(engine.input_output_jacobians)(bj)[-1], jax.jit(jax.jacfwd(network))(h0[pos]))
  # Llama FFN: the closed form through the engine against jacfwd of the branch
  lcfg, lparams = hf.load_hf(FIXTURES / "llama_gqa")
  layer = jax.tree.map(lambda x: jnp.asarray(x[0], jnp.float64), lparams["layers"])
  block = decoder_jacobians.ffn_block(lcfg)
  h = jnp.linspace(-1.0, 1.0, lcfg.d_model)
  got = jax.jit(lambda p, x: engine.block_terms(block, p, x).branch)(layer, h)
  close(got, jax.jit(jax.jacfwd(block.branch, argnums=1))(layer, h))
