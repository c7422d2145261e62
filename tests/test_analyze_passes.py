"""``rankjax analyze``'s layer-at-a-time passes against whole-model computations: the
DecoderLM's own forward pass, attention capture and Flax-perturbation gradients
(``transformer.intermediate_grads``) for every placement; GPT-2's whole-model
gradient; weights read per layer from sharded safetensors equal to resident ones; the
bf16 compute path (GPT-2 and Llama); and the weights sharded over 8 host devices by the training rules."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src import cli
from rankjax._src.analyze import checkpoints, passes
from rankjax._src.config import TransformerConfig
from rankjax._src.measure import gradients as gr
from rankjax._src.measure import losses
from rankjax._src.models import hf, transformer
from rankjax._src.train import diagnostics_postnorm

from tests.test_analyze import FIXTURES, _ids_file


def _decoder(placement: str, **kw):
  cfg = TransformerConfig(vocab_size=41, num_layers=3, d_model=16, num_heads=2, d_ff=24,
                          max_seq_len=16, norm_position=placement, pos_embedding="rope",
                          init="gpt2", **kw)
  tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, cfg.vocab_size)

  @jax.jit                            # one compile, not ~90 eager ops (~20 ms each)
  def init(tokens):
    params = transformer.DecoderLM(cfg).init(jax.random.key(0), tokens)["params"]
    # perturb the norm gains so that a gain read from the wrong layer would show
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x * (1 + 0.3 * jnp.sin(jnp.arange(x.size).reshape(x.shape)))
        if getattr(p[-1], "key", "") == "scale" else x, params)
  return cfg, init(tokens), np.asarray(tokens, np.int32)


@pytest.mark.parametrize("placement", [
    pytest.param("pre", marks=pytest.mark.slow), "post",
    pytest.param("output", marks=pytest.mark.slow),
    pytest.param("none", marks=pytest.mark.slow)])
def test_decoder_passes_equal_the_whole_model(placement):
  cfg, params, seqs = _decoder(placement)
  model = checkpoints.decoder_model(cfg, params)
  fwd = passes.forward_pass(model, seqs, [], keep_streams=True, attention=False)
  dlm = transformer.DecoderLM(cfg)

  @jax.jit        # the whole-model references in one compile (eager: ~150 tiny programs)
  def whole_model(params, seqs):
    logits = dlm.apply({"params": params}, seqs)
    _, state = dlm.apply({"params": params}, seqs, capture_probs=True,
                         mutable=["intermediates"])
    captured = state["intermediates"]["layers"]["attn"]["attn_probs"][0]      # (L, K, H, T, T)
    targets = seqs[:, 1:]
    loss, g_params, g_acts, acts = transformer.intermediate_grads(
        dlm, params, seqs[:, :-1], lambda z: losses.cross_entropy(z, targets))
    gains = {k: params["layers"].get(diagnostics_postnorm.NORM_AFTER_Y[k], {}).get("scale")
             if placement == "post" else None for k in (1, 2)}
    ref = diagnostics_postnorm.sublayer_factors(acts, g_acts, cfg.norm_eps, gains)
    ref["grad_norm"] = gr.layer_grad_norms(g_params, ("layers",))
    return logits, captured, loss, ref

  ref_logits, captured, loss, ref = whole_model(params, seqs)
  # the head on the last stream = DecoderLM's logits (the streams of every layer feed it)
  logits = jax.vmap(lambda h: transformer.final_logits(cfg, params, h))(fwd["streams"][-1])
  np.testing.assert_allclose(logits, ref_logits, atol=2e-6)
  # attention probabilities of each layer = DecoderLM's captured ones
  for l in range(cfg.num_layers):
    got = passes._attention(model.fns, model.weights.layer(l), jnp.asarray(fwd["streams"][l]))
    np.testing.assert_allclose(got, captured[l], atol=1e-6)
  # gradients: loss, every sublayer factor and the layer gradient norms
  bwd = passes.backward_pass(model, seqs, fwd["streams"])
  np.testing.assert_allclose(bwd["loss"], loss, rtol=1e-6)
  assert set(bwd["layers"][0]) == set(ref)
  for name, values in ref.items():
    got = [row[name] for row in bwd["layers"]]
    np.testing.assert_allclose(got, values, rtol=2e-5, atol=1e-7, err_msg=name)


def test_gpt2_backward_pass_equals_the_stacked_gradient():
  model = checkpoints.open_checkpoint(str(FIXTURES / "gpt2"))
  seqs = np.asarray(np.load(FIXTURES / "gpt2" / "expected.npz")["token_ids"][None], np.int32)
  fwd = passes.forward_pass(model, seqs, [], keep_streams=True, attention=False)
  bwd = passes.backward_pass(model, seqs, fwd["streams"])
  cfg, params = hf.load_hf(FIXTURES / "gpt2")

  def loss(p):
    logits = transformer.DecoderLM(cfg).apply({"params": p}, jnp.asarray(seqs[:, :-1]))
    return losses.cross_entropy(logits, jnp.asarray(seqs[:, 1:]))

  # jitted: one compile, not ~100 eager ops of the stacked forward and its gradient
  value, grads = jax.jit(jax.value_and_grad(loss))(jax.tree.map(jnp.asarray, params))
  np.testing.assert_allclose(bwd["loss"], value, rtol=1e-6)
  np.testing.assert_allclose([r["grad_norm"] for r in bwd["layers"]],
                             gr.layer_grad_norms(grads, ("layers",)), rtol=1e-5)
  # GPT-2 read a layer at a time: the same tensors
  per_layer = checkpoints.open_checkpoint(str(FIXTURES / "gpt2"), layer_at_a_time="on")
  assert per_layer.description["weights"] == "layer at a time"
  np.testing.assert_array_equal(per_layer.weights.layer(1)["attn"]["w_k"],
                                params["layers"]["attn"]["w_k"][1])


def _analysis(out):
  r = json.loads((out / "analysis.json").read_text())
  for k in ("seconds", "seconds_per_layer", "provenance", "model", "source"):
    r.pop(k)
  return r


def test_weights_read_a_layer_at_a_time_give_the_same_analysis(tmp_path, monkeypatch):
  folder = hf.write_random_checkpoint(
      tmp_path / "ckpt", hidden_size=32, num_layers=3, intermediate_size=40, num_heads=4,
      num_kv_heads=2, vocab_size=50, model_type="qwen2", seed=3)
  assert len(list(folder.glob("*.safetensors"))) == 4       # a shard per layer + top
  ids = _ids_file(tmp_path, np.arange(40) % 50)
  reads = []
  read_layer = hf.read_layer
  monkeypatch.setattr(hf, "read_layer", lambda f, i: reads.append(i) or read_layer(f, i))
  results = {}
  for mode in ("on", "off"):
    reads.clear()
    out = tmp_path / mode
    assert cli.main(["analyze", str(folder), "--out", str(out), "--token-ids", ids,
                     "--tokens", "20", "--sequences", "2", "--layer-at-a-time", mode]) == 0
    results[mode] = _analysis(out)
    weights = json.loads((out / "analysis.json").read_text())["model"]["weights"]
    # per layer: each pass reads each layer once (forward 0..L-1, backward L-1..0)
    assert (weights, reads) == (("layer at a time", [0, 1, 2, 2, 1, 0]) if mode == "on"
                                else ("resident", [0, 1, 2]))
  assert results["on"] == results["off"]
  # the loaded weights are the ones written (load_hf: the stacked whole)
  cfg, params = hf.load_hf(folder)
  model = checkpoints.open_checkpoint(str(folder), layer_at_a_time="on")
  np.testing.assert_array_equal(model.weights.layer(1)["attn"]["b_k"],
                                params["layers"]["attn"]["b_k"][1])


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_bfloat16_compute_is_within_bf16_tolerance(tmp_path, name):
  expected = np.load(FIXTURES / name / "expected.npz")
  ids = _ids_file(tmp_path, expected["token_ids"])
  n = len(expected["token_ids"])
  rows = {}
  for dtype in ("float32", "bfloat16"):
    out = tmp_path / dtype
    assert cli.main(["analyze", str(FIXTURES / name), "--out", str(out), "--token-ids",
                     ids, "--tokens", str(n), "--sequences", "1", "--dtype", dtype,
                     "--measures", "stream,gradients"]) == 0
    rows[dtype] = json.loads((out / "analysis.json").read_text())
  assert rows["bfloat16"]["model"]["compute_dtype"] == "bfloat16"
  sim = lambda r: [l["token_similarity"]["mean"] for l in r["layers"]]
  np.testing.assert_allclose(sim(rows["bfloat16"]), sim(rows["float32"]), atol=2e-2)
  np.testing.assert_allclose(rows["bfloat16"]["loss"], rows["float32"]["loss"], rtol=2e-2)
  assert sim(rows["bfloat16"]) != sim(rows["float32"])          # bf16 really computed


_SHARDED = textwrap.dedent("""
    import json, sys
    import jax
    from rankjax._src import cli
    from rankjax._src.analyze import checkpoints
    from rankjax._src.train import sharding
    assert len(jax.devices()) == 8
    folder, ids, out1, out8 = sys.argv[1:]
    args = ["--token-ids", ids, "--tokens", "12", "--sequences", "2"]
    assert cli.main(["analyze", folder, "--out", out1, "--mesh-fsdp", "1", *args]) == 0
    assert cli.main(["analyze", folder, "--out", out8, *args]) == 0
    mesh = sharding.make_mesh(data=1, fsdp=8)
    model = checkpoints.open_checkpoint(folder, placement=checkpoints.Placement(mesh))
    w = model.weights.layer(0)["ffn"]["w_1"]
    print(json.dumps({"spec": str(w.sharding.spec), "shard": list(w.addressable_shards[0].data.shape),
                      "whole": list(w.shape)}))
""")


@pytest.mark.slow
def test_weights_sharded_over_8_host_devices_give_the_same_analysis(tmp_path):
  folder = hf.write_random_checkpoint(
      tmp_path / "ckpt", hidden_size=32, num_layers=2, intermediate_size=64, num_heads=4,
      num_kv_heads=2, vocab_size=48, seed=5)
  ids = _ids_file(tmp_path, np.arange(24) % 48)
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
         "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", _SHARDED, str(folder), ids,
                         str(tmp_path / "one"), str(tmp_path / "eight")],
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  placed = json.loads(proc.stdout.strip().splitlines()[-1])
  assert placed["whole"] == [32, 64] and placed["shard"] != placed["whole"]   # really split
  one, eight = _analysis(tmp_path / "one"), _analysis(tmp_path / "eight")
  flat = lambda r: np.array([v for l in r["layers"] for v in _numbers(l)])
  np.testing.assert_allclose(flat(eight), flat(one), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(eight["loss"], one["loss"], rtol=1e-6)


def _numbers(tree):
  if isinstance(tree, dict):
    for k in sorted(tree):
      yield from _numbers(tree[k])
  elif isinstance(tree, list):
    for v in tree:
      yield from _numbers(v)
  elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
    yield float(tree)


def test_a_jacobian_too_large_for_memory_is_refused_before_any_work(tmp_path, capsys,
                                                                    monkeypatch):
  expected = np.load(FIXTURES / "llama_gqa" / "expected.npz")
  ids = _ids_file(tmp_path, expected["token_ids"])
  model = checkpoints.open_checkpoint(str(FIXTURES / "llama_gqa"))
  from rankjax._src.analyze import cli as analyze_cli
  need = analyze_cli.jacobian_bytes(model, 12)
  assert need == 4 * 32 * (4 * 12 * 12 + 8 * 12 * 32)
  monkeypatch.setattr(checkpoints, "available_bytes",
                      lambda _: analyze_cli.jacobian_bytes(model, 7))
  out = tmp_path / "out"
  assert cli.main(["analyze", str(FIXTURES / "llama_gqa"), "--out", str(out), "--token-ids",
                   ids, "--tokens", "12", "--sequences", "1"]) == 2
  err = capsys.readouterr().err
  assert "use --tokens 7 or fewer" in err and len(err.strip().splitlines()) == 1
  assert not (out / "analysis.json").exists()
  assert cli.main(["analyze", str(FIXTURES / "llama_gqa"), "--out", str(out), "--token-ids",
                   ids, "--tokens", "12", "--sequences", "1", "--measures", "stream"]) == 0


def test_host_memory_counts_the_droppable_page_cache():
  free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  # MemAvailable: free pages plus reclaimable cache, never above the machine's memory
  assert free * 0.9 <= checkpoints.host_available_bytes() <= total
