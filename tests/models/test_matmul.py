"""models/matmul.py: weight products and lookups whose gradient is formed in float32
under 16-bit operands (so FSDP reduces it in float32), against float64 references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.models import matmul


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_weight_matmul_is_x_at_w_with_a_float32_weight_gradient():
  kx, kw, kg = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (4, 64, 32), jnp.bfloat16)
  w = jax.random.normal(kw, (32, 48), jnp.bfloat16)
  g = jax.random.normal(kg, (4, 64, 48), jnp.bfloat16)
  ours = matmul.weight_matmul(x, w)
  assert ours.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(x @ w, np.float32))
  _, vjp = jax.vjp(matmul.weight_matmul, x, w)
  dx, dw = vjp(g)
  assert dx.dtype == dw.dtype == jnp.bfloat16
  x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
  dw64 = np.einsum("btd,btn->dn", x64, g64)
  dx64 = g64 @ w64.T
  eps = 2.0 ** -8                      # one bfloat16 rounding of the result
  assert _rel(dw, dw64) < eps and _rel(dx, dx64) < eps
  # float32 operands: jax's own product and rule, bit for bit
  x32, w32, g32 = (a.astype(jnp.float32) for a in (x, w, g))
  ref = jax.vjp(lambda a, b: a @ b, x32, w32)[1](g32)
  got = jax.vjp(matmul.weight_matmul, x32, w32)[1](g32)
  for a, b in zip(got, ref):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # "compute": jax's rule for bfloat16 too
  ref16 = jax.vjp(lambda a, b: a @ b, x, w)[1](g)
  got16 = jax.vjp(lambda a, b: matmul.weight_matmul(a, b, "compute"), x, w)[1](g)
  for a, b in zip(got16, ref16):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_lookup_accumulates_the_table_gradient_in_float32():
  """4096 cotangents of 1 on one row: a bfloat16 sum stalls at 256 (2^8 + 1 is not a
  bfloat16), the float32 accumulation gives 4096 exactly; values are table[ids]."""
  table = jnp.arange(12, dtype=jnp.bfloat16).reshape(4, 3)
  ids = jnp.concatenate([jnp.zeros((4096,), jnp.int32), jnp.array([2, 3], jnp.int32)])
  rows, vjp = jax.vjp(lambda t: matmul.lookup(t, ids), table)
  np.testing.assert_array_equal(np.asarray(rows, np.float32),
                                np.asarray(table, np.float32)[np.asarray(ids)])
  (grad,) = vjp(jnp.ones(rows.shape, jnp.bfloat16))
  assert grad.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(grad, np.float32),
                                [[4096] * 3, [0] * 3, [1] * 3, [1] * 3])
  t32 = table.astype(jnp.float32)        # float32 tables: jax's take and its rule
  ref = jax.vjp(lambda t: jnp.take(t, ids, axis=0), t32)[1](jnp.ones((len(ids), 3)))
  got = jax.vjp(lambda t: matmul.lookup(t, ids), t32)[1](jnp.ones((len(ids), 3)))
  np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(ref[0]))


def test_shard_copies_read_as_the_table_and_sum_its_gradients():
  """A tied table read as S copies, one per batch shard, by the lookup and the head (as
  DecoderLM with tied_shards): the loss and the table's gradient of the table itself,
  the two uses' gradients summed (float32 within summation order; a bfloat16 table's
  copies are float32, its gradient rounded once)."""
  from rankjax._src.models import lm_head
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  table = jax.random.normal(k1, (40, 8), jnp.float32)
  ids = jax.random.randint(k2, (4, 6), 0, 37)
  labels = jax.random.randint(k3, (24,), 0, 37)

  def loss(t, shards, chunk, dtype=jnp.float32):
    if shards > 1:
      t = matmul.shard_copies(t, shards)
    h = jnp.tanh(matmul.lookup(t, ids).astype(dtype)).reshape(-1, 8)
    return lm_head.head_cross_entropy(h, jnp.swapaxes(t, -1, -2), labels, 37, chunk)

  for chunk in (0, 6):
    want, want_g = jax.value_and_grad(loss)(table, 1, chunk)
    got, got_g = jax.value_and_grad(loss)(table, 2, chunk)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-5, atol=1e-7)
  t16 = table.astype(jnp.bfloat16)
  copies = matmul.shard_copies(t16, 2)
  assert copies.shape == (2, 40, 8) and copies.dtype == jnp.float32
  np.testing.assert_array_equal(copies[1], np.asarray(t16, np.float32))
  assert matmul.shard_copies(t16, 2, "compute").dtype == jnp.bfloat16
  for chunk in (0, 6):
    want, want_g = jax.value_and_grad(loss)(t16, 1, chunk, jnp.bfloat16)
    got, got_g = jax.value_and_grad(loss)(t16, 2, chunk, jnp.bfloat16)
    assert got_g.dtype == jnp.bfloat16
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert _rel(got_g, np.asarray(want_g, np.float32)) < 2.0 ** -7
