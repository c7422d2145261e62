"""GPT-2 safetensors loading, the FFN branch Jacobian, and the Fig 12 / 8c script."""
import json
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from rankjax.measure import gpt2_jacobians
from rankjax.models import gpt2

L, D, M, V, P = 2, 16, 64, 50, 32


def _params(seed: int = 0) -> dict:
  """GPT-2-shaped numpy params with non-trivial LN gains and biases."""
  rng = np.random.default_rng(seed)
  shapes = gpt2._block_shapes(D, M)
  blocks = {k: rng.normal(size=(L,) + s).astype(np.float32) * (0.3 if len(s) == 2 else 0.1)
            for k, s in shapes.items()}
  blocks["ln_1_scale"] += 1.0
  blocks["ln_2_scale"] += 1.0
  return {"wte": rng.normal(size=(V, D)).astype(np.float32),
          "wpe": rng.normal(size=(P, D)).astype(np.float32), "blocks": blocks}


def _write(path, params, prefix="", drop=(), extra=None):
  tensors = gpt2.gpt2_tensors(params, prefix)
  for name in drop:
    del tensors[name]
  tensors.update(extra or {})
  gpt2.write_safetensors(path, tensors, metadata={"format": "pt"})
  return tensors


def test_reads_a_hand_built_file(tmp_path):
  a = np.arange(6, dtype="<f4").reshape(2, 3)
  b = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
  header = {"__metadata__": {"format": "pt"},
            "b": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
  raw = json.dumps(header).encode()
  path = tmp_path / "x.safetensors"
  path.write_bytes(struct.pack("<Q", len(raw)) + raw + a.tobytes() + b.tobytes())
  out = gpt2.read_safetensors(path)
  assert sorted(out) == ["a", "b"]
  np.testing.assert_array_equal(out["a"], a)
  assert out["b"].dtype == ml_dtypes.bfloat16 and out["b"].tolist() == [1.5, -2.0]


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_gpt2_checkpoint_round_trips(tmp_path, prefix):
  params = _params()
  mask = np.tril(np.ones((1, 1, P, P), bool))
  path = tmp_path / "model.safetensors"
  tensors = _write(path, params, prefix, extra={f"{prefix}h.0.attn.bias": mask})
  back = gpt2.read_safetensors(path)
  assert sorted(back) == sorted(tensors)
  for name, a in tensors.items():
    assert back[name].dtype == a.dtype and back[name].shape == a.shape
    np.testing.assert_array_equal(back[name], a)
  assert back[f"{prefix}h.1.mlp.c_fc.weight"].shape == (D, M)
  loaded = gpt2.load_gpt2(tmp_path)   # the folder works too
  np.testing.assert_array_equal(loaded["wte"], params["wte"])
  np.testing.assert_array_equal(loaded["wpe"], params["wpe"])
  assert sorted(loaded["blocks"]) == sorted(gpt2.BLOCK_TENSORS)
  for k, a in params["blocks"].items():
    np.testing.assert_array_equal(loaded["blocks"][k], a)
  ffn = gpt2.load_gpt2(path, ffn_only=True)
  assert sorted(ffn) == ["blocks"] and sorted(ffn["blocks"]) == sorted(gpt2.FFN_TENSORS)


def test_bad_checkpoints_raise_one_clear_error(tmp_path):
  params = _params()
  good = tmp_path / "good.safetensors"
  _write(good, params)
  with pytest.raises(FileNotFoundError, match="not found"):
    gpt2.load_gpt2(tmp_path / "nope.safetensors")
  trunc = tmp_path / "trunc.safetensors"
  trunc.write_bytes(good.read_bytes()[:-100])
  with pytest.raises(ValueError, match="truncated"):
    gpt2.load_gpt2(trunc)
  junk = tmp_path / "junk.safetensors"
  junk.write_bytes(b"this is not a safetensors file at all")
  with pytest.raises(ValueError, match="not a safetensors file"):
    gpt2.load_gpt2(junk)
  short = tmp_path / "short.safetensors"
  short.write_bytes(b"\x01\x02")
  with pytest.raises(ValueError, match="not a safetensors file"):
    gpt2.read_safetensors(short)
  missing = tmp_path / "missing.safetensors"
  _write(missing, params, drop=("h.1.mlp.c_fc.bias",))
  with pytest.raises(ValueError, match=r"missing tensor\(s\) h\.1\.mlp\.c_fc\.bias"):
    gpt2.load_gpt2(missing)
  wrong = tmp_path / "wrong.safetensors"
  _write(wrong, params, extra={"h.1.mlp.c_proj.weight": np.zeros((M, D + 1), np.float32)})
  with pytest.raises(ValueError, match=r"h\.1\.mlp\.c_proj\.weight has shape \(64, 17\)"):
    gpt2.load_gpt2(wrong)
  other = tmp_path / "other.safetensors"
  gpt2.write_safetensors(other, {"w": np.zeros(3, np.float32)})
  with pytest.raises(ValueError, match="no GPT-2 blocks"):
    gpt2.load_gpt2(other)
  with pytest.raises(ValueError, match="not supported"):
    gpt2.load_gpt2(tmp_path / "pytorch_model.bin")


def test_ffn_jacobian_matches_jacfwd(x64):
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), _params(1))
  h_LxTxD = gpt2_jacobians.ffn_inputs(params, jnp.array([3, 1, 4, 1, 5]), num_heads=2)
  assert h_LxTxD.shape == (L, 5, D) and h_LxTxD.dtype == jnp.float64
  jac_LxDxD = gpt2_jacobians.ffn_jacobians(params["blocks"], h_LxTxD[:, -1])
  refs = jax.jit(lambda blocks, h: [jax.jacfwd(lambda x, l=l: gpt2.ffn_branch(
      jax.tree.map(lambda a: a[l], blocks), x))(h[l, -1]) for l in range(L)])(
          params["blocks"], h_LxTxD)       # every layer's reference in one compile
  for l in range(L):
    np.testing.assert_allclose(jac_LxDxD[l], refs[l], rtol=1e-11, atol=1e-12)


def test_ffn_inputs_are_causal_and_follow_the_residual_recursion():
  params = jax.tree.map(jnp.asarray, _params(2))
  h = gpt2_jacobians.ffn_inputs(params, jnp.array([1, 2, 3, 4]), num_heads=2)
  h_changed = gpt2_jacobians.ffn_inputs(params, jnp.array([1, 2, 3, 9]), num_heads=2)
  np.testing.assert_allclose(h[:, :3], h_changed[:, :3], rtol=1e-6)
  # Token 0 attends to itself only: attention output is v (through c_proj).
  b0 = jax.tree.map(lambda a: a[0], params["blocks"])
  x = gpt2.layer_norm(params["wte"][1] + params["wpe"][0], b0["ln_1_scale"], b0["ln_1_bias"])
  v = (x @ b0["attn_w"] + b0["attn_b"])[2 * D:]
  expected = params["wte"][1] + params["wpe"][0] + v @ b0["attn_proj_w"] + b0["attn_proj_b"]
  np.testing.assert_allclose(h[0, 0], expected, rtol=1e-5, atol=1e-5)


def test_gpt2_init_scales():
  params = jax.jit(lambda k: gpt2.init_gpt2(k, 4, 128, vocab_size=64, max_positions=8))(
      jax.random.PRNGKey(0))                            # one compile, not eager ops
  b = params["blocks"]
  assert b["fc_w"].shape == (4, 128, 512) and b["proj_w"].shape == (4, 512, 128)
  assert abs(float(jnp.std(b["fc_w"])) - 0.02) < 1e-3
  assert abs(float(jnp.std(b["proj_w"])) - 0.02 / np.sqrt(8)) < 1e-3
  assert float(jnp.abs(b["fc_b"]).max()) == 0.0 and float(b["ln_2_scale"].min()) == 1.0


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
  path = tmp_path / "model.safetensors"
  _write(path, _params(3), prefix="transformer.")
  res = fig12.run(str(tmp_path / "out"), checkpoints=(str(path),), prompt_ids=(1, 2, 3, 4),
                  top_k=4)
  inits = {m for m in res["models"] if m.startswith("ckpt0/init/")}   # one per seed
  assert res["pretrained"] and set(res["models"]) == {"ckpt0/pretrained"} | inits
  assert len(inits) >= 3
  assert res["measured"] == []    # the paper's claims are about GPT-2 small / medium
  init = res["models"]["ckpt0/init/0"]
  assert init["cosines"].shape == (L, L) and init["num_layers"] == L and init["d"] == D
  assert (tmp_path / "out" / "fig12_gpt2_ffn.png").is_file()
  with pytest.raises(FileNotFoundError):
    fig12.run(str(tmp_path / "out"), checkpoints=(str(tmp_path / "none.safetensors"),))


def test_sublayer_and_sequence_jacobians(x64):
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), _params(3))
  tokens = jnp.array([3, 1, 4, 1])
  seq = gpt2_jacobians.sequence_jacobians(params, tokens, num_heads=2)       # (L, T, d, T, d)
  assert seq.shape == (L, 4, D, 4, D)
  seq = np.asarray(seq)                     # sliced by numpy: no eager program per slice
  for t in range(4):
    per = gpt2_jacobians.sublayer_jacobians(params, tokens, t, num_heads=2)
    np.testing.assert_allclose(per["attention"], seq[:, t, :, t, :], rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(seq[:, t, :, t + 1:, :], 0.0)    # causal
  h_LxTxD = gpt2_jacobians.ffn_inputs(params, tokens, num_heads=2)
  np.testing.assert_allclose(per["ffn"],
                             gpt2_jacobians.ffn_jacobians(params["blocks"], h_LxTxD[:, 3]),
                             rtol=1e-12, atol=1e-13)

  # the first token attends only to itself: Attn(x)_0 = v_0 W_proj + b, so the Jacobian is
  # W_proj^T W_v^T J_LN(h_0) in closed form (Table 2 for J_LN)
  @jax.jit                                 # one compile, not a dozen eager float64 ops
  def closed_form(params):
    b0 = jax.tree.map(lambda a: a[0], params["blocks"])
    h0 = params["wte"][3] + params["wpe"][0]
    w_v = b0["attn_w"][:, 2 * D:]
    j_ln = jax.jacfwd(lambda x: gpt2.layer_norm(x, b0["ln_1_scale"], b0["ln_1_bias"]))(h0)
    return b0["attn_proj_w"].T @ w_v.T @ j_ln

  first = gpt2_jacobians.sublayer_jacobians(params, tokens, 0, num_heads=2)["attention"][0]
  np.testing.assert_allclose(first, closed_form(params), rtol=1e-11, atol=1e-12)
