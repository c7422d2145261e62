"""Llama-family (SwiGLU) FFN Jacobians from safetensors files the tests write."""
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from rankjax.measure import llama_ffn
from rankjax.models import gpt2

L, D, M = 3, 16, 40


def _ffn(seed=0) -> dict:
  rng = np.random.default_rng(seed)
  out = {"ln_scale": 1.0 + 0.2 * rng.normal(size=(L, D)),
         "gate_w": rng.normal(size=(L, M, D)) / np.sqrt(D),
         "up_w": rng.normal(size=(L, M, D)) / np.sqrt(D),
         "down_w": rng.normal(size=(L, D, M)) / np.sqrt(M)}
  return {k: v.astype(np.float32) for k, v in out.items()}


def _write_sharded(folder, ffn, dtype=ml_dtypes.bfloat16, eps=1e-6):
  tensors = llama_ffn.llama_ffn_tensors(ffn)
  tensors["model.embed_tokens.weight"] = np.zeros((7, D), np.float32)
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  weight_map = {}
  for file, group in shards.items():
    gpt2.write_safetensors(folder / file, {n: tensors[n].astype(dtype) for n in group})
    weight_map.update({n: file for n in group})
  (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  (folder / "config.json").write_text(json.dumps({"rms_norm_eps": eps}))


def test_sharded_bf16_checkpoint_round_trips(tmp_path):
  ffn = _ffn()
  _write_sharded(tmp_path, ffn)
  loaded = llama_ffn.load_llama_ffn(tmp_path)
  assert loaded["rms_eps"] == 1e-6
  for k in llama_ffn.FFN_TENSORS:
    assert loaded[k].dtype == np.float32 and loaded[k].shape == ffn[k].shape
    np.testing.assert_array_equal(loaded[k], ffn[k].astype(ml_dtypes.bfloat16).astype(np.float32))


def test_single_file_without_prefix(tmp_path):
  ffn = _ffn(1)
  gpt2.write_safetensors(tmp_path / "model.safetensors", llama_ffn.llama_ffn_tensors(ffn, ""))
  loaded = llama_ffn.load_llama_ffn(tmp_path / "model.safetensors")
  assert loaded["rms_eps"] == llama_ffn.DEFAULT_RMS_EPS
  np.testing.assert_array_equal(loaded["down_w"], ffn["down_w"])


def test_ffn_jacobians_match_jacfwd(x64, tmp_path):
  gpt2.write_safetensors(tmp_path / "model.safetensors", llama_ffn.llama_ffn_tensors(_ffn(2)))
  loaded = llama_ffn.load_llama_ffn(tmp_path)
  blocks = {k: jnp.asarray(loaded[k], jnp.float64) for k in llama_ffn.FFN_TENSORS}
  h_LxD = jax.random.normal(jax.random.PRNGKey(0), (L, D), jnp.float64) * 3.0
  jac = llama_ffn.ffn_jacobians(blocks, h_LxD, eps=1e-3)
  assert jac.shape == (L, D, D) and jac.dtype == jnp.float64
  for l in range(L):
    block = {k: v[l] for k, v in blocks.items()}
    ref = jax.jacfwd(lambda h: llama_ffn.ffn_branch(block, h, 1e-3))(h_LxD[l])
    np.testing.assert_allclose(jac[l], ref, rtol=1e-11, atol=1e-12)


def test_bad_checkpoints_raise_one_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="not found"):
    llama_ffn.load_llama_ffn(tmp_path / "nope")
  ffn = _ffn()
  tensors = llama_ffn.llama_ffn_tensors(ffn)
  del tensors["model.layers.1.mlp.up_proj.weight"]
  gpt2.write_safetensors(tmp_path / "model.safetensors", tensors)
  with pytest.raises(ValueError, match=r"missing tensor\(s\) model\.layers\.1\.mlp\.up_proj"):
    llama_ffn.load_llama_ffn(tmp_path)
  gpt2.write_safetensors(tmp_path / "other.safetensors", {"w": np.zeros(3, np.float32)})
  with pytest.raises(ValueError, match="no Llama FFN layers"):
    llama_ffn.load_llama_ffn(tmp_path / "other.safetensors")
  tensors = llama_ffn.llama_ffn_tensors(ffn)
  tensors["model.layers.2.mlp.down_proj.weight"] = np.zeros((D, M + 1), np.float32)
  gpt2.write_safetensors(tmp_path / "wrong.safetensors", tensors)
  with pytest.raises(ValueError, match=r"down_proj\.weight has shape \(16, 41\)"):
    llama_ffn.load_llama_ffn(tmp_path / "wrong.safetensors")
