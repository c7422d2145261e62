"""GPT-2 as a DecoderLM configuration: its safetensors files through models.hf (with or
without the ``transformer.`` prefix, the fused c_attn split), its forward pass and
attention Jacobian against closed forms, GPT-2's initialization and the Fig 12 / 8c
script. Its hidden states and logits against transformers: tests/models/test_hf_exact."""
import dataclasses
import json
import pathlib
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from rankjax._src.measure import decoder_jacobians
from rankjax._src.models import hf, norms, transformer

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "hf"
L, D, V, P = 2, 16, 50, 32


def test_reads_a_hand_built_file(tmp_path):
  a = np.arange(6, dtype="<f4").reshape(2, 3)
  b = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
  header = {"__metadata__": {"format": "pt"},
            "b": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
  raw = json.dumps(header).encode()
  path = tmp_path / "x.safetensors"
  path.write_bytes(struct.pack("<Q", len(raw)) + raw + a.tobytes() + b.tobytes())
  out = hf.read_tensors(path)
  assert sorted(out) == ["a", "b"]
  np.testing.assert_array_equal(out["a"], a)
  assert out["b"].dtype == ml_dtypes.bfloat16 and out["b"].tolist() == [1.5, -2.0]
  with pytest.raises(ValueError, match=r"missing tensor\(s\) c"):
    hf.read_tensors(path, ["a", "c"])


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_gpt2_checkpoint_converts(tmp_path, prefix):
  folder = hf.write_random_gpt2(tmp_path / "g", num_layers=L, d_model=D, num_heads=2,
                                vocab_size=V, n_positions=P, prefix=prefix, seed=1)
  tensors = hf.read_tensors(folder / "model.safetensors")
  # GPT2LMHeadModel files may hold the causal mask buffer: not a parameter, ignored
  safetensors.numpy.save_file({**tensors, f"{prefix}h.0.attn.bias":
                               np.tril(np.ones((1, 1, P, P), bool))},
                              str(folder / "model.safetensors"))
  cfg, params = hf.load_hf(folder)
  assert (cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.max_seq_len, cfg.vocab_size) == (
      L, D, 4 * D, P, V)
  t = lambda name: tensors[prefix + name]
  np.testing.assert_array_equal(params["embed"]["embedding"], t("wte.weight"))
  np.testing.assert_array_equal(params["pos_embed"], t("wpe.weight"))
  np.testing.assert_array_equal(params["norm_final"]["bias"], t("ln_f.bias"))
  assert "lm_head" not in params                      # tied
  layers = params["layers"]
  for i in range(L):
    w, b = t(f"h.{i}.attn.c_attn.weight"), t(f"h.{i}.attn.c_attn.bias")
    for j, n in enumerate("qkv"):
      np.testing.assert_array_equal(layers["attn"][f"w_{n}"][i], w[:, j * D:(j + 1) * D])
      np.testing.assert_array_equal(layers["attn"][f"b_{n}"][i], b[j * D:(j + 1) * D])
    for (module, leaf), name in {("attn", "w_o"): "attn.c_proj.weight",
                                 ("attn", "b_o"): "attn.c_proj.bias",
                                 ("ffn", "w_1"): "mlp.c_fc.weight", ("ffn", "b_1"): "mlp.c_fc.bias",
                                 ("ffn", "w_2"): "mlp.c_proj.weight",
                                 ("ffn", "b_2"): "mlp.c_proj.bias",
                                 ("norm_attn_p", "scale"): "ln_1.weight",
                                 ("norm_ffn_p", "bias"): "ln_2.bias"}.items():
      np.testing.assert_array_equal(layers[module][leaf][i], t(f"h.{i}.{name}"))
  # the converted tree is DecoderLM's own
  shapes = jax.eval_shape(lambda: transformer.DecoderLM(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  assert jax.tree.structure(shapes) == jax.tree.structure(params)
  assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(np.shape, params)


def test_ffn_inputs_are_causal_and_follow_the_residual_recursion():
  cfg, params = hf.load_hf(FIXTURES / "gpt2")
  h = decoder_jacobians.ffn_inputs(cfg, params, jnp.array([1, 2, 3, 4]))
  h_changed = decoder_jacobians.ffn_inputs(cfg, params, jnp.array([1, 2, 3, 9]))
  np.testing.assert_allclose(h[:, :3], h_changed[:, :3], rtol=1e-6)
  # Token 0 attends to itself only: the attention output is v (through c_proj).
  a0 = jax.tree.map(lambda a: a[0], params["layers"])
  h0 = params["embed"]["embedding"][1] + params["pos_embed"][0]
  x = norms.normalize(h0, "layer", cfg.norm_eps) * a0["norm_attn_p"]["scale"] \
      + a0["norm_attn_p"]["bias"]
  v = x @ a0["attn"]["w_v"] + a0["attn"]["b_v"]
  expected = h0 + v @ a0["attn"]["w_o"] + a0["attn"]["b_o"]
  np.testing.assert_allclose(h[0, 0], expected, rtol=1e-5, atol=1e-5)


def test_first_token_attention_jacobian_closed_form(x64):
  cfg, params = hf.load_hf(FIXTURES / "gpt2")
  cfg = dataclasses.replace(cfg, param_dtype="float64", compute_dtype="float64")
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
  tokens = jnp.array([3, 1, 4, 1])

  # the first token attends only to itself: Attn(x)_0 = (LN(h_0) W_v + b_v) W_o + b_o, so
  # the Jacobian is W_o^T W_v^T J_LN(h_0) in closed form (Table 2 for J_LN)
  @jax.jit                                 # one compile, not a dozen eager float64 ops
  def closed_form(params):
    a0 = jax.tree.map(lambda a: a[0], params["layers"])
    h0 = params["embed"]["embedding"][3] + params["pos_embed"][0]
    j_ln = norms.jacobian_right(jnp.eye(cfg.d_model), h0, "layer", cfg.norm_eps,
                                scale_D=a0["norm_attn_p"]["scale"])
    return a0["attn"]["w_o"].T @ a0["attn"]["w_v"].T @ j_ln

  first = decoder_jacobians.sublayer_jacobians(cfg, params, tokens, 0)["attention"][0]
  np.testing.assert_allclose(first, closed_form(params), rtol=1e-11, atol=1e-12)


def test_gpt2_init_scales():
  from experiments.transforming_rank import fig12_gpt2_ffn as fig12
  cfg, params = fig12.gpt2_init(jax.random.PRNGKey(0), 4, 128, 512, vocab_size=64,
                                positions=8)
  assert (cfg.num_heads, cfg.ffn, cfg.norm_eps) == (2, "gelu_tanh", 1e-5)
  ffn = params["layers"]["ffn"]
  assert ffn["w_1"].shape == (4, 128, 512) and ffn["w_2"].shape == (4, 512, 128)
  assert abs(float(jnp.std(ffn["w_1"])) - 0.02) < 1e-3
  assert abs(float(jnp.std(ffn["w_2"])) - 0.02 / np.sqrt(8)) < 1e-3
  assert float(jnp.abs(ffn["b_1"]).max()) == 0.0
  assert float(params["layers"]["norm_ffn_p"]["scale"].min()) == 1.0
  shapes = jax.eval_shape(lambda: transformer.DecoderLM(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(jnp.shape, params)


def test_coherence_is_one_for_free_bases_and_large_when_aligned():
  from experiments.transforming_rank import fig12_gpt2_ffn as fig12
  rng = np.random.default_rng(0)
  d, m = 32, 128
  free = np.mean([fig12.singular_vector_coherence(rng.normal(size=(d, m)),
                                                  rng.normal(size=(m, d)), 4)
                  for _ in range(20)], axis=0)
  np.testing.assert_allclose(free, 1.0, atol=0.15)
  w = rng.normal(size=(d, m)) * np.linspace(1, 3, d)[:, None]
  aligned = fig12.singular_vector_coherence(w, w.T, 4)   # same hidden basis
  assert aligned[0] == pytest.approx(m / d, rel=1e-6) and aligned[1] > 5


@pytest.mark.slow   # end to end (~60 compiles); its parts have fast tests here
def test_fig12_runs_on_a_checkpoint(tmp_path):
  from experiments.transforming_rank import fig12_gpt2_ffn as fig12
  folder = hf.write_random_gpt2(tmp_path / "ckpt", num_layers=L, d_model=D, num_heads=2,
                                vocab_size=V, n_positions=P, seed=3)
  res = fig12.run(str(tmp_path / "out"), checkpoints=(str(folder / "model.safetensors"),),
                  prompt_ids=(1, 2, 3, 4), top_k=4)
  inits = {m for m in res["models"] if m.startswith("ckpt0/init/")}   # one per seed
  assert res["pretrained"] and set(res["models"]) == {"ckpt0/pretrained"} | inits
  assert len(inits) >= 3
  assert res["measured"] == []    # the paper's claims are about GPT-2 small / medium
  init = res["models"]["ckpt0/init/0"]
  assert init["cosines"].shape == (L, L) and init["num_layers"] == L and init["d"] == D
  assert (tmp_path / "out" / "fig12_gpt2_ffn.png").is_file()
  with pytest.raises(FileNotFoundError):
    fig12.run(str(tmp_path / "out"), checkpoints=(str(tmp_path / "none"),))
