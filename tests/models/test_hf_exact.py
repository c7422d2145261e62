"""rankjax's forward pass equals transformers' on tiny random checkpoints, each one a
DecoderLM converted by models.hf: GPT-2 (learned positions, LayerNorm with bias, biases
on every projection, gelu_tanh, tied head), Llama with grouped-query attention and an
untied head, Qwen2 with q/k/v biases and a tied head, Llama 3.1's and YaRN's RoPE
scaling with one key/value head.

The fixtures (tests/fixtures/hf/<model>/: config.json, model.safetensors, expected.npz,
versions.json) are written by scripts/make_hf_fixtures.py with transformers and the CPU
build of torch (versions in versions.json); rankjax reads only the files. Tolerance:
max abs difference <= 1e-5 in float32, on activations of order 1-10 (weights
drawn at std 0.2): float32 reassociation between torch's and XLA's kernels is ~1e-6.
The slow test regenerates the fixtures with transformers and compares again.
"""
import os
import pathlib
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from rankjax._src.models import hf, transformer

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "hf"
ROOT = pathlib.Path(__file__).parents[2]
TOL = 1e-5
FAMILIES = ["gpt2", "llama_gqa", "qwen2", "llama3_rope", "qwen2_yarn"]


def _streams(cfg, params, tokens):
  """transformers' ``hidden_states`` by the model's own functions: the first layer's
  input, every layer's output (``transformer.layer_forward``, tested equal to
  DecoderBlock), the last one after the final norm; (L+1, T, d)."""
  h = transformer.first_layer_input(cfg, params, tokens[None])[0]
  out = [h]
  for l in range(cfg.num_layers):
    h = transformer.layer_forward(cfg, jax.tree.map(lambda a: a[l], params["layers"]), h)[1]
    out.append(h)
  out[-1] = transformer.final_hidden(cfg, params, h)
  return jnp.stack(out)


def _check(folder: pathlib.Path) -> None:
  expected = np.load(folder / "expected.npz")
  cfg, params = hf.load_hf(folder)
  tokens = expected["token_ids"]
  hs = np.asarray(jax.jit(_streams, static_argnums=0)(cfg, params, tokens))
  ref = expected["hidden_states"]              # transformers: the last one after the norm
  assert hs.shape == ref.shape and np.abs(ref).max() > 1.0
  np.testing.assert_allclose(hs, ref, rtol=0, atol=TOL)
  logits = jax.jit(lambda p, t: transformer.DecoderLM(cfg).apply(   # one compile, not
      {"params": p}, t[None])[0])(params, tokens)                    # dozens of eager ops
  np.testing.assert_allclose(np.asarray(logits), expected["logits"], rtol=0, atol=TOL)


@pytest.mark.parametrize("name", FAMILIES)
def test_hidden_states_and_logits_equal_transformers(name):
  _check(FIXTURES / name)


def _rewrite(src: pathlib.Path, dst: pathlib.Path, cast=None, shards: int = 1,
             config: dict | None = None) -> None:
  """A copy of a fixture folder, its tensors cast and/or split into shard files with an
  index (the Hugging Face layout of large checkpoints)."""
  import json
  import shutil
  shutil.copytree(src, dst)
  tensors = hf.read_tensors(dst / "model.safetensors")
  if cast is not None:
    tensors = {k: v.astype(cast) for k, v in tensors.items()}
  (dst / "model.safetensors").unlink()
  names = sorted(tensors)
  weight_map = {}
  for i in range(shards):
    part = f"model-{i + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
    chunk = names[i::shards]
    safetensors.numpy.save_file({k: tensors[k] for k in chunk}, str(dst / part))
    weight_map.update({k: part for k in chunk})
  if shards > 1:
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  if config:
    stated = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**stated, **config}))


def test_sharded_bf16_checkpoints_and_their_errors(tmp_path):
  import ml_dtypes
  src = FIXTURES / "llama_gqa"
  _rewrite(src, tmp_path / "sharded", shards=3)
  _check(tmp_path / "sharded")                 # the same model from 3 shards
  # bf16 weights: within bf16 tolerance of transformers' float32 outputs (each weight
  # rounded to 8 mantissa bits, 2^-9 relative: a few 1e-2 on outputs of order 1-5)
  _rewrite(src, tmp_path / "bf16", cast=ml_dtypes.bfloat16, config={"dtype": "bfloat16"})
  cfg, params = hf.load_hf(tmp_path / "bf16")
  expected = np.load(src / "expected.npz")
  logits = transformer.DecoderLM(cfg).apply({"params": params}, expected["token_ids"][None])[0]
  err = np.abs(np.asarray(logits) - expected["logits"]).max()
  assert 1e-4 < err < 0.1, err
  with pytest.raises(ValueError, match="states dtype float32; the safetensors files hold bfloat16"):
    _rewrite(src, tmp_path / "wrong", cast=ml_dtypes.bfloat16, config={"dtype": "float32"})
    hf.load_hf(tmp_path / "wrong")
  (tmp_path / "sharded" / "model-00002-of-00003.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors listed"):
    hf.load_hf(tmp_path / "sharded")


def test_llama_config_refusals():
  base = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
          "num_hidden_layers": 1, "intermediate_size": 48, "vocab_size": 10}
  cfg = hf.llama_config(base)
  assert (cfg.kv_heads, cfg.tie_embeddings, cfg.attn_bias) == (4, False, False)
  for extra, match in [({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3"),
                       ({"rope_parameters": {"rope_type": "longrope"}}, "longrope"),
                       ({"attention_bias": True}, "output projection"),
                       ({"head_dim": 16}, "head_dim"), ({"hidden_act": "gelu"}, "silu"),
                       ({"model_type": "falcon"}, "model_type")]:
    with pytest.raises(ValueError, match=match):
      hf.llama_config({**base, **extra})
  # dynamic NTK is the default RoPE up to max_position_embeddings (transformers rescales
  # beyond it only); YaRN's attention factor from mscale / mscale_all_dim (DeepSeek form)
  dynamic = hf.llama_config({**base, "rope_scaling": {"rope_type": "dynamic",
                                                            "factor": 2.0}})
  assert (dynamic.rope.scaling, dynamic.max_seq_len) == ("none", 2048)
  yarn = hf.llama_config({**base, "rope_scaling": {
      "rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
      "original_max_position_embeddings": 4096, "beta_fast": 16}})
  m = lambda k: 0.1 * k * np.log(40.0) + 1
  assert (yarn.rope.scaling, yarn.rope.beta_fast, yarn.rope.original_max_len) == ("yarn", 16, 4096)
  np.testing.assert_allclose(yarn.rope.attention_factor, m(1.0) / m(0.707), rtol=1e-12)
  mistral = hf.llama_config({**base, "model_type": "mistral", "sliding_window": 8,
                                   "max_position_embeddings": 64})
  assert mistral.max_seq_len == 8


def test_gpt2_config_and_refusals(tmp_path):
  cfg = hf.gpt2_config({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2,
                        "n_positions": 16, "vocab_size": 61, "layer_norm_epsilon": 1e-5})
  assert (cfg.norm_position, cfg.norm_op, cfg.norm_eps, cfg.ffn, cfg.pos_embedding) == (
      "pre", "layer", 1e-5, "gelu_tanh", "learned")
  assert (cfg.attn_bias, cfg.attn_out_bias, cfg.ffn_bias, cfg.tie_embeddings, cfg.d_ff) == (
      True, True, True, True, 128)
  base = {"model_type": "gpt2", "n_embd": 32, "n_head": 4}
  for extra, match in [({"n_head": 5}, "not divisible"),
                       ({"activation_function": "relu"}, "activation_function"),
                       ({"scale_attn_by_inverse_layer_idx": True}, "1/sqrt"),
                       ({"scale_attn_weights": False}, "1/sqrt")]:
    with pytest.raises(ValueError, match=match):
      hf.gpt2_config({**base, **extra})
  # a GPT-2 folder: one-line errors for bad or incomplete files
  folder = hf.write_random_gpt2(tmp_path / "g", num_layers=2, d_model=16, num_heads=2,
                                vocab_size=50, n_positions=8, prefix="")
  cfg, params = hf.load_hf(folder / "model.safetensors")    # the file stands for its folder
  assert params["layers"]["attn"]["w_q"].shape == (2, 16, 16)
  tensors = hf.read_tensors(folder / "model.safetensors")
  np.testing.assert_array_equal(params["layers"]["attn"]["w_v"][1],
                                tensors["h.1.attn.c_attn.weight"][:, 32:])
  np.testing.assert_array_equal(params["layers"]["ffn"]["b_2"][0], tensors["h.0.mlp.c_proj.bias"])
  good = (folder / "model.safetensors").read_bytes()
  (folder / "model.safetensors").write_bytes(good[:-100])
  with pytest.raises(ValueError, match="not a readable safetensors file"):
    hf.load_hf(folder)
  (folder / "model.safetensors").write_bytes(b"junk")
  with pytest.raises(ValueError, match="not a readable safetensors file"):
    hf.load_hf(folder)
  safetensors.numpy.save_file({k: v for k, v in tensors.items() if k != "h.1.mlp.c_fc.bias"},
                              str(folder / "model.safetensors"))
  with pytest.raises(ValueError, match=r"missing tensor\(s\) h\.1\.mlp\.c_fc\.bias"):
    hf.load_hf(folder)
  safetensors.numpy.save_file({**tensors, "h.1.mlp.c_proj.weight": np.zeros((64, 17), np.float32)},
                              str(folder / "model.safetensors"))
  with pytest.raises(ValueError, match=r"h\.1\.mlp\.c_proj\.weight has shape \(64, 17\)"):
    hf.load_hf(folder)
  (folder / "model.safetensors").unlink()
  (folder / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(ValueError, match="need torch"):
    hf.load_hf(folder)


@pytest.mark.slow
def test_regenerated_fixtures_match(tmp_path):
  """Regenerates the fixtures with transformers (the Python in RANKJAX_HF_PYTHON, which
  .ci/run installs with torch==2.13.0, the CPU build) and compares again."""
  python = os.environ.get("RANKJAX_HF_PYTHON")
  if not python:
    pytest.skip("RANKJAX_HF_PYTHON (a Python with transformers and torch) is not set")
  subprocess.run([python, str(ROOT / "scripts" / "make_hf_fixtures.py"), str(tmp_path)],
                 check=True, timeout=600)
  for name in FAMILIES:
    _check(tmp_path / name)
  # the committed files are what it writes
  for name in FAMILIES:
    for f in ("expected.npz",):
      a, b = np.load(tmp_path / name / f), np.load(FIXTURES / name / f)
      for k in a.files:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=TOL)
