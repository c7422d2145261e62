"""Splash attention (the TPU kernel, interpreted on this CPU) against jax.nn's attention,
and its lowering for a TPU (jax.export) without a T x T buffer."""
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from rankjax._src.models import splash_attention


def _qkv(b, t, h, d, dtype=jnp.float32, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(k, (b, t, h, d), dtype) for k in keys)


@pytest.mark.parametrize("d_head", [64, pytest.param(128, marks=pytest.mark.slow)])
def test_forward_equals_dot_product_attention(d_head):
  q, k, v = _qkv(2, 256, 2, d_head)
  scale = 1 / (np.sqrt(d_head) * 1.7)        # tau = 1.7
  out = jax.jit(lambda *a: splash_attention.causal_attention(*a, scale))(q, k, v)
  ref = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-6, rtol=2e-6)


@pytest.mark.slow
def test_gradients_equal_dot_product_attention():
  q, k, v = _qkv(1, 256, 2, 64, seed=1)
  scale = 1 / (8.0 * 0.6)

  def loss(fn):
    return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)))

  ours = jax.jit(jax.grad(loss(lambda *a: splash_attention.causal_attention(*a, scale)),
                          argnums=(0, 1, 2)))(q, k, v)
  ref = jax.grad(loss(lambda *a: jax.nn.dot_product_attention(*a, scale=scale,
                                                              is_causal=True)),
                 argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


def test_a_length_the_blocks_do_not_tile_is_one_line():
  q, k, v = _qkv(1, 96, 2, 64)
  with pytest.raises(ValueError, match="multiple of 128, not 96"):
    splash_attention.causal_attention(q, k, v, 0.1)


def test_lowered_for_tpu_is_a_mosaic_kernel_without_a_txt_buffer():
  """Forward and backward exported for TPU from this CPU: Mosaic custom calls, and no
  tensor with two sequence-length dimensions anywhere in the module."""
  b, t, h, d = 2, 1024, 4, 128
  s = jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16)

  def loss(q, k, v):
    return jnp.sum(splash_attention.causal_attention(q, k, v, 0.1).astype(jnp.float32))

  text = export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))),
                       platforms=["tpu"])(s, s, s).mlir_module()
  assert text.count("tpu_custom_call") >= 2          # forward + backward kernels
  assert not re.search(rf"tensor<(\d+x)*{t}x{t}x", text)


SHARDED = textwrap.dedent("""
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import json
    import numpy as np
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from rankjax._src import partitioning
    from rankjax._src.models import splash_attention
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (4, 128, 2, 64)) for kk in keys)
    sharding = NamedSharding(mesh, P(("data", "fsdp")))
    def f(q, k, v):
      with partitioning.activation_sharding(mesh, {"batch": ("data", "fsdp")}):
        return splash_attention.causal_attention(q, k, v, 0.125)
    fn = jax.jit(f, in_shardings=(sharding,) * 3)
    out = fn(q, k, v)
    ref = jax.nn.dot_product_attention(q, k, v, scale=0.125, is_causal=True)
    text = fn.lower(q, k, v).compile().as_text()
    print("RESULT" + json.dumps({
        "diff": float(jnp.max(jnp.abs(out - ref))),
        "shards": len(out.sharding.device_set),
        "gathers": text.count("all-gather"),
    }))
""")


@pytest.mark.slow
def test_under_the_training_mesh_each_device_runs_its_own_sequences():
  proc = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                        env=dict(os.environ), timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  import json
  out = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT")][-1][6:])
  assert out["diff"] < 2e-6 and out["shards"] == 4 and out["gathers"] == 0, out
