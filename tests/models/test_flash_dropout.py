"""The fused flash attention with hash dropout (``rankjax._src.models.flash_dropout``), in
Pallas' interpreter on this CPU: the function and gradients of the query-block path
``attention.causal_dropout_attention`` (the same masks), plain causal attention at rate
0, the model's dispatch (``attn_dropout_kernel``), and the CUDA lowering."""

import dataclasses
import math
import os
import re
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from unittest import mock

from rankjax._src.config import KernelConfig, TransformerConfig
from rankjax._src.errors import UserError
from rankjax._src.models import attention, flash_dropout
from tests.conftest import with_kernels


def _qkv(t, dtype=jnp.float32, b=2, h=2, d=16):
  return [jax.random.normal(jax.random.key(i), (b, t, h, d), dtype) for i in range(3)]


def _value_and_grads(f):
  loss = lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v).astype(jnp.float32)))
  return jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)))


def _against_blocks(t, rate, block, dtype=jnp.float32, rtol=1e-5, atol=1e-5):
  q, k, v = _qkv(t, dtype)
  key, scale = jax.random.key(5), 0.3
  flash = lambda q, k, v: flash_dropout.causal_attention(q, k, v, scale, rate, key, block)
  blocks = lambda q, k, v: attention.causal_dropout_attention(q, k, v, scale, 0.0, rate,
                                                              key, block)
  (of, gf), (ob, gb) = _value_and_grads(flash)(q, k, v), _value_and_grads(blocks)(q, k, v)
  chex.assert_trees_all_close((of, gf), (ob, gb), rtol=rtol, atol=atol)
  return of


def test_flash_is_the_query_block_path_when_t_is_no_multiple_of_the_block():
  """T = 40 with blocks of 16 (padded to 48: the last block partly padding), rate 0.3:
  the output and dQ, dK, dV of ``causal_dropout_attention`` with the same key (the same
  hash masks), float32; and the dropout does drop (rate 0 gives another output)."""
  out = _against_blocks(40, 0.3, 16)
  q, k, v = _qkv(40)
  undropped = flash_dropout.causal_attention(q, k, v, 0.3, 0.0, None, 16)
  assert float(jnp.max(jnp.abs(out - undropped))) > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("t,rate,block", [(64, 0.1, 16), (32, 0.5, 32)])
def test_flash_is_the_query_block_path_whole_blocks(t, rate, block):
  _against_blocks(t, rate, block)


@pytest.mark.slow
def test_flash_is_the_query_block_path_bfloat16():
  """bf16 inputs: both round the probabilities to bf16 for P V (the flash kernel before
  the normalization, the blocks after): agreement to bf16's precision."""
  _against_blocks(32, 0.2, 16, jnp.bfloat16, rtol=3e-2, atol=3e-2)


def test_flash_without_dropout_is_causal_attention():
  """Rate 0: XLA's causal ``dot_product_attention`` and its gradients (no masks
  involved), T = 32 in two blocks."""
  q, k, v = _qkv(32)
  flash = lambda q, k, v: flash_dropout.causal_attention(q, k, v, 0.25, block=16)
  plain = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=0.25, is_causal=True,
                                                       implementation="xla")
  chex.assert_trees_all_close(_value_and_grads(flash)(q, k, v),
                              _value_and_grads(plain)(q, k, v), rtol=1e-5, atol=1e-5)


def test_flash_refuses_shapes_it_does_not_take():
  q = jnp.zeros((1, 8, 1, 24))
  with pytest.raises(UserError, match="d_head"):
    flash_dropout.causal_attention(q, q, q, 0.2, 0.1, jax.random.key(0))
  q = jnp.zeros((1, 8, 1, 16))
  with pytest.raises(UserError, match="dropout key"):
    flash_dropout.causal_attention(q, q, q, 0.2, 0.1, None)


CFG = TransformerConfig(vocab_size=37, num_layers=2, d_model=32, num_heads=2, d_ff=24,
                        max_seq_len=24, attn_dropout_rate=0.3, attn_dropout_mask="hash",
                        kernels=KernelConfig(attn_dropout_kernel="pallas"))


def _uses_pallas(cfg, tokens, params):
  from rankjax._src.models.transformer import DecoderLM
  jaxpr = jax.make_jaxpr(lambda p: DecoderLM(cfg).apply(
      p, tokens, deterministic=False, rngs={"dropout": jax.random.key(9)}))(params)
  return "pallas_call" in str(jaxpr)


def test_model_dispatch_takes_the_flash_kernel_where_it_applies():
  """``kernels.attn_dropout_kernel``: pallas takes the kernel (here in the interpreter), blocks
  and auto on this CPU do not; prefix removal, threefry masks and evaluation never take
  it (the traced programs)."""
  from rankjax._src.models.transformer import DecoderLM
  tokens = jax.random.randint(jax.random.key(3), (2, 20), 0, 37)
  params = jax.jit(DecoderLM(CFG).init)(jax.random.key(0), tokens)
  assert _uses_pallas(CFG, tokens, params)
  for change in (with_kernels(CFG, attn_dropout_kernel="blocks"),
                 with_kernels(CFG, attn_dropout_kernel="auto"),
                 dataclasses.replace(CFG, prefix_avg_removal=0.3),
                 dataclasses.replace(CFG, attn_dropout_mask="threefry")):
    assert not _uses_pallas(change, tokens, params), change
  flash = lambda cfg, dtype: attention.kernel_for(cfg, dtype, 20, dropout=True).name
  assert flash(CFG, jnp.bfloat16) == "flash"
  assert flash(dataclasses.replace(CFG, d_model=48), jnp.float32) == "hash_blocks"
  with pytest.raises(ValueError, match="attn_dropout_kernel"):
    TransformerConfig(kernels=KernelConfig(attn_dropout_kernel="triton"))


@pytest.mark.slow
def test_model_flash_and_query_block_paths_agree():
  """DecoderLM in training, the same dropout key: the flash kernel and the query blocks
  give the same logits and parameter gradients (T = 20: padded to 32)."""
  from rankjax._src.models.transformer import DecoderLM
  tokens = jax.random.randint(jax.random.key(3), (2, 20), 0, 37)
  params = jax.jit(DecoderLM(CFG).init)(jax.random.key(0), tokens)

  def run(cfg):
    f = lambda p: DecoderLM(cfg).apply(p, tokens, deterministic=False,
                                       rngs={"dropout": jax.random.key(9)})
    return jax.jit(lambda p: (f(p), jax.grad(lambda p: jnp.sum(jnp.sin(f(p))))(p)))(params)
  chex.assert_trees_all_close(run(CFG), run(with_kernels(CFG, attn_dropout_kernel="blocks")),
                              rtol=2e-5, atol=2e-5)


def test_flash_lowers_for_cuda_as_two_triton_kernels_without_a_t_by_t_buffer():
  """``jax.export`` for CUDA from this CPU of a bf16 value-and-gradient at T = 1024: the
  forward and backward Triton custom calls (their Triton IR built here; its compilation
  to PTX needs the GPU), and no tensor with a T x T (or T x T-sized) shape anywhere."""
  from jax import export
  t = 1024

  def step(q, k, v, key):
    f = lambda q, k, v: jnp.sum(flash_dropout.causal_attention(
        q, k, v, 0.125, 0.1, key, interpret=False).astype(jnp.float32) ** 2)
    return jax.value_and_grad(f, (0, 1, 2))(q, k, v)
  x = jax.ShapeDtypeStruct((2, t, 4, 64), jnp.bfloat16)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  exported = export.export(
      jax.jit(step), platforms=["cuda"],
      disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
  )(x, x, x, key)
  text = exported.mlir_module()
  assert re.findall(r"custom_call @([^(]+)\(", text) == ["__gpu$xla.gpu.triton"] * 2
  assert re.findall(r'name = "(flash_dropout_\w+)"', text) == ["flash_dropout_forward",
                                                                "flash_dropout_backward"]
  shapes = {tuple(int(n) for n in s.split("x"))
            for s in re.findall(r"tensor<((?:\d+x)*\d+)x\w+>", text)}
  assert max(math.prod(s) for s in shapes) == 2 * t * 4 * 64     # q, k, v, o and theirs
  assert not [s for s in shapes if list(s).count(t) >= 2]


@pytest.mark.parametrize("remat,forwards", [("none", 1), ("dots", 1), ("full", 2)])
def test_model_remat_dots_runs_the_flash_forward_once(remat, forwards):
  """Under ``remat="dots"`` the kernel's residuals are named (``ATTENTION_RESIDUALS``):
  the gradient's program, lowered for CUDA, runs the forward kernel once per layer scan
  as without remat; "full" saves nothing and runs it twice (the count tells them apart)."""
  from jax import export
  from rankjax._src.models.transformer import DecoderLM
  cfg = dataclasses.replace(with_kernels(CFG, remat=remat, attn_dropout_kernel="auto"),
                            compute_dtype="bfloat16")
  tokens = jnp.zeros((2, 20), jnp.int32)
  params = jax.eval_shape(DecoderLM(cfg).init, jax.random.key(0), tokens)
  f = lambda p, rng: jnp.sum(DecoderLM(cfg).apply(p, tokens, deterministic=False,
                                                   rngs={"dropout": rng}))
  with mock.patch.object(flash_dropout.jax, "default_backend", lambda: "gpu"):
    text = export.export(
        jax.jit(jax.grad(f)), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(params, jax.random.key(1)).mlir_module()
  assert text.count('name = "flash_dropout_forward"') == forwards
  assert text.count('name = "flash_dropout_backward"') == 1


def test_device_check_times_the_softmax_step_on_the_flash_kernel():
  """The device check's softmax study step (774M, bf16, d_head 64, T 1024, hash masks)
  takes the fused kernel under a GPU backend, the query blocks on this CPU."""
  import sys
  sys.path.insert(0, "experiments/benchmarks")
  try:
    import device_check
  finally:
    sys.path.pop(0)
  cfg = device_check.step_config("gpt2_774m.json", False, sets=device_check.SOFTMAX_SETS)
  assert device_check.dropout_kernel(cfg) == "query blocks (hash)"
  with mock.patch.object(jax, "default_backend", lambda: "gpu"):
    assert device_check.dropout_kernel(cfg) == "flash_dropout"


SHARDED = textwrap.dedent("""
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import json
    import numpy as np
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from rankjax._src import partitioning
    from rankjax._src.models import attention, flash_dropout
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (4, 32, 2, 16)) for kk in keys)
    key = jax.random.key(7)
    sharding = NamedSharding(mesh, P(("data", "fsdp")))
    def f(q, k, v):
      with partitioning.activation_sharding(mesh, {"batch": ("data", "fsdp")}):
        return flash_dropout.causal_attention(q, k, v, 0.25, 0.3, key, 16)
    fn = jax.jit(f, in_shardings=(sharding,) * 3)
    out = fn(q, k, v)
    ref = attention.causal_dropout_attention(q, k, v, 0.25, 0.0, 0.3, key, 16)
    # lowered for 4 GPUs: the Triton calls see one device's sequences, (1, T, H, D)
    from jax import export
    def g(q, k, v):
      with partitioning.activation_sharding(mesh, {"batch": ("data", "fsdp")}):
        return flash_dropout.causal_attention(q, k, v, 0.25, 0.3, key, 16, interpret=False)
    x = jax.ShapeDtypeStruct((4, 32, 2, 16), jnp.bfloat16, sharding=sharding)
    text = export.export(
        jax.jit(g), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(x, x, x).mlir_module()
    calls = [l for l in text.splitlines() if "xla.gpu.triton" in l and "custom_call" in l]
    print("RESULT" + json.dumps({
        "diff": float(jnp.max(jnp.abs(out - ref))),
        "shards": len(out.sharding.device_set),
        "calls": len(calls),
        "local": all("tensor<1x32x2x16xbf16>" in l and "tensor<4x32x2x16xbf16>" not in l
                     for l in calls),
    }))
""")


@pytest.mark.slow
def test_under_the_training_mesh_each_device_runs_its_own_sequences_and_masks():
  """4 host devices, the batch split over (data, fsdp): each device runs the kernel on
  its own sequences with their (batch, head) words, the masks and output those of the
  unsharded query blocks; lowered for 4 GPUs, the Triton call's operands are one
  device's sequences (no gather of the batch onto each device)."""
  proc = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                        env=dict(os.environ), timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  import json
  out = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT")][-1][6:])
  assert out["diff"] < 1e-5 and out["shards"] == 4, out
  assert out["calls"] == 1 and out["local"], out


@pytest.mark.slow
def test_training_step_lowered_for_cuda_runs_the_kernel_without_a_t_by_t_buffer():
  """The softmax study's step as the device check builds it (774M config, hash dropout
  0.1, bf16), shrunk to 2 layers of d=128 at T = 64, through ``rankjax._src.train.loop.build``
  and lowered for CUDA with a GPU backend's dispatch: one forward and one backward
  Triton kernel (remat dots), no (T, T) tensor."""
  import sys
  from jax import export
  from rankjax._src.train import sharding as shard_lib
  from rankjax._src.train.loop import build
  sys.path.insert(0, "experiments/benchmarks")
  try:
    import device_check
  finally:
    sys.path.pop(0)
  t = 64
  with mock.patch.object(jax, "default_backend", lambda: "gpu"):
    cfg = device_check.step_config("gpt2_774m.json", False, sets=device_check.SOFTMAX_SETS)
    lm = dataclasses.replace(with_kernels(cfg.model, remat="dots", attention_impl="xla"),
                             num_layers=2, d_model=128, num_heads=2, d_ff=256,
                             vocab_size=300, max_seq_len=t)
    cfg = dataclasses.replace(cfg, seq_len=t, batch_size=2, model=lm)
    c = build(cfg)
    tokens = np.zeros((2, t + 1), np.int32)
    batch = shard_lib.global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}, 1,
                                   c.batch_sharding)
    text = export.export(
        c.step, platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(c.init(), batch).mlir_module()
  assert text.count('name = "flash_dropout_forward"') == 1
  assert text.count('name = "flash_dropout_backward"') == 1
  assert not re.search(rf"tensor<(\d+x)*{t}x{t}x", text)
