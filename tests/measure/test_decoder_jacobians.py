"""DecoderLM per-token and whole-sequence sublayer Jacobians (measure.decoder_jacobians)
against direct ``jax.jacobian`` (reverse mode) of the model's own DecoderBlock in float64.

Everything runs in float64 (a float64 model takes the einsum attention path, whose
logits stay float64), so forward- and reverse-mode Jacobians agree to float64 rounding:
the tolerance is ``TOL`` times the largest entry."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import TransformerConfig
from rankjax._src.measure import decoder_jacobians as dj
from rankjax._src.models import transformer

TINY = dict(vocab_size=37, num_layers=2, d_model=8, num_heads=2, d_ff=12, max_seq_len=8,
            param_dtype="float64", compute_dtype="float64", norm_eps=1e-6)
CONFIGS = [dict(norm_position=p) for p in ("pre", "post", "output", "peri", "none")] + [
    dict(norm_position="pre", norm_op="layer", norm_bias=True, pos_embedding="rope",
         ffn="gelu", beta=0.5)]
# GPT-2 (models.hf.gpt2_config): learned positions, LayerNorm with bias, every linear
# bias, gelu_tanh, tied head
GPT2 = dict(norm_position="pre", norm_op="layer", pos_embedding="learned", ffn="gelu_tanh",
            attn_bias=True, attn_out_bias=True, ffn_bias=True, tie_embeddings=True,
            norm_eps=1e-5)
# Llama-style SwiGLU with FFN biases, beta != 1
SWIGLU = dict(norm_position="pre", norm_op="rms", pos_embedding="rope", ffn="swiglu",
              ffn_bias=True, attn_bias=True, beta=0.7)
CONFIGS.append(GPT2)
T, POS = 5, 3
TOL = 1e-10   # float64 throughout (the attention logits too)


def close(a, b):
  a, b = np.asarray(a), np.asarray(b)
  np.testing.assert_allclose(a, b, rtol=0, atol=TOL * max(np.abs(b).max(), 1.0))


def _setup(kw):
  cfg = TransformerConfig(**{**TINY, **kw})
  tokens = jax.random.randint(jax.random.key(1), (T,), 0, cfg.vocab_size)
  params = _init_params(cfg, tokens)
  return cfg, tokens, params


def _init_params(cfg, tokens):
  @jax.jit                      # one compile, not ~60 eager ops (~20 ms each)
  def init(tokens):
    params = transformer.DecoderLM(cfg).init(jax.random.key(0), tokens[None])["params"]
    # perturb every gain and bias (norms' and projections') so that they enter the
    # Jacobians
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.3 * jax.random.normal(jax.random.key(len(str(path))), x.shape,
                                                    x.dtype)
        if getattr(path[-1], "key", None) in ("scale", "bias")
        or str(getattr(path[-1], "key", "")).startswith("b_") else x, params)
  return init(tokens)


def _layers(cfg, params, tokens):
  """Each layer's params and input stream, by the real DecoderBlock."""
  @jax.jit                                         # one compile, not dozens of eager ops
  def layers(params, tokens):
    h = transformer.first_layer_input(cfg, params, tokens[None])[0]
    out = []
    for l in range(cfg.num_layers):
      layer = jax.tree.map(lambda x: x[l], params["layers"])
      out.append((layer, h))
      h = block_out(cfg, layer, h)
    return out
  return layers(params, tokens)


def block_out(cfg, layer, h_TxD):
  return transformer.DecoderBlock(cfg).apply({"params": layer}, h_TxD[None])[0][0]


def block_y(cfg, layer, h_TxD, name):
  _, sites = transformer.DecoderBlock(cfg, capture=True).apply({"params": layer}, h_TxD[None])
  return sites[name][0]


def _at(fn, h_TxD, t):
  return lambda x: fn(h_TxD.at[t].set(x))[t]


# fast: Pre-LayerNorm with a bias, RoPE, GELU and beta != 1; the placements (RMS Pre-,
# Post-, Output-, Peri-Norm, none) run with -m slow
@pytest.mark.parametrize("kw", [kw if "norm_op" in kw else
                                pytest.param(kw, marks=pytest.mark.slow) for kw in CONFIGS],
                         ids=lambda kw: "-".join(map(str, kw.values())))
def test_token_jacobians_match_the_model(x64, kw):
  cfg, tokens, params = _setup(kw)
  got = dj.sublayer_jacobians(cfg, params, tokens, POS)
  d, eye = cfg.d_model, np.eye(cfg.d_model)

  @jax.jit   # the references of one layer in one program (both layers share it)
  def reference(layer, h):
    _, out = transformer.layer_forward(cfg, layer, h)
    # Y_1 = h + beta B(Attn(P(h))), captured by the model
    dy1 = jax.jacobian(_at(lambda x: block_y(cfg, layer, x, "y1"), h, POS))(h[POS])
    # Y_2 = h' + beta B(FFN(P(h'))) with h' = R(Y_1): dY_2/dh = (I + ffn) attention_sublayer
    dy2 = jax.jacobian(_at(lambda x: block_y(cfg, layer, x, "y2"), h, POS))(h[POS])
    # the layer, directly: ffn_sublayer @ attention_sublayer
    dout = jax.jacobian(_at(lambda x: block_out(cfg, layer, x), h, POS))(h[POS])
    return out, block_out(cfg, layer, h), dy1, dy2, dout

  for l, (layer, h) in enumerate(_layers(cfg, params, tokens)):
    out, out_ref, dy1, dy2, dout = reference(layer, h)
    np.testing.assert_allclose(np.asarray(out), np.asarray(out_ref), rtol=1e-12, atol=1e-12)
    attn, ffn = np.asarray(got["attention"][l]), np.asarray(got["ffn"][l])
    attn_sub, ffn_sub = np.asarray(got["attention_sublayer"][l]), np.asarray(got["ffn_sublayer"][l])
    assert attn.shape == ffn.shape == (d, d)
    close(attn, np.asarray(dy1) - eye)
    close((eye + ffn) @ attn_sub, dy2)
    close(ffn_sub @ attn_sub, dout)


@pytest.mark.parametrize("kw", [CONFIGS[0], pytest.param(CONFIGS[1], marks=pytest.mark.slow)],
                         ids=lambda kw: kw["norm_position"])
def test_sequence_jacobians_match_the_model(x64, kw):
  cfg, tokens, params = _setup(kw)
  seq = dj.sequence_jacobians(cfg, params, tokens)
  tok = dj.sublayer_jacobians(cfg, params, tokens, POS)
  d = cfg.d_model
  reference = jax.jit(lambda layer, h: jax.jacobian(lambda x: block_y(cfg, layer, x, "y1"))(h))
  for l, (layer, h) in enumerate(_layers(cfg, params, tokens)):
    branch = np.asarray(seq["attention"][l])
    assert branch.shape == (T, d, T, d)
    dy1 = np.asarray(reference(layer, h))
    close(branch, dy1 - np.eye(T * d).reshape(T, d, T, d))
    np.testing.assert_allclose(branch[POS, :, POS], np.asarray(tok["attention"][l]), atol=1e-12)
    np.testing.assert_allclose(np.asarray(seq["attention_sublayer"][l])[POS, :, POS],
                               np.asarray(tok["attention_sublayer"][l]), atol=1e-12)
    causal = np.triu(np.ones((T, T), bool), 1)          # s > t
    assert np.all(branch.transpose(0, 2, 1, 3)[causal] == 0)


def test_traced_position_and_bad_input(x64):
  cfg, tokens, params = _setup(CONFIGS[0])
  a = dj.sublayer_jacobians(cfg, params, tokens, 2)
  b = jax.jit(lambda p: dj.sublayer_jacobians(cfg, params, tokens, p))(jnp.asarray(2))
  np.testing.assert_allclose(np.asarray(a["ffn"]), np.asarray(b["ffn"]), rtol=1e-12)
  with pytest.raises(ValueError, match="outside a sequence"):
    dj.sublayer_jacobians(cfg, params, tokens, T)
  with pytest.raises(ValueError, match="one token sequence"):
    dj.sublayer_jacobians(cfg, params, tokens[None], 0)
  with pytest.raises(ValueError, match="'layers'"):
    dj.sublayer_jacobians(cfg, {"embed": params["embed"]}, tokens, 0)


@pytest.mark.parametrize("kw", [GPT2, SWIGLU], ids=["gpt2", "swiglu"])
def test_ffn_closed_form_matches_jacfwd(x64, kw):
  """``ffn_jacobian`` (Eq. 9 / 25 with Table 2's J_P) against jacfwd of the model's own
  FFN branch at every layer's FFN input; ``ffn_inputs`` against the model's streams."""
  cfg, tokens, params = _setup(kw)
  h_LxTxD = dj.ffn_inputs(cfg, params, tokens)
  mids = [transformer.layer_forward(cfg, layer, h)[0] for layer, h in _layers(cfg, params, tokens)]
  np.testing.assert_allclose(np.asarray(h_LxTxD), np.stack(mids), rtol=1e-12, atol=1e-12)
  got = dj.ffn_jacobians(cfg, params["layers"], h_LxTxD[:, POS])
  block = dj.ffn_block(cfg)
  ref = jax.jit(jax.vmap(jax.jacfwd(block.branch, argnums=1)))(params["layers"],
                                                                h_LxTxD[:, POS])
  assert got.shape == (cfg.num_layers, cfg.d_model, cfg.d_model)
  close(got, ref)
  # the token's FFN branch of sublayer_jacobians (jacfwd of the sublayer) is the same J
  close(dj.sublayer_jacobians(cfg, params, tokens, POS)["ffn"], got)
  with pytest.raises(ValueError, match="Pre-Norm"):
    dj.ffn_block(TransformerConfig(**{**TINY, "norm_position": "post"}))
