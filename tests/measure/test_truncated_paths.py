"""Path sums with an order cap and an aggregated tail (paths.path_sums(max_order=K))."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import MLPConfig
from rankjax._src.measure import jacobians, paths
from tests.measure.test_jacobians import _brute_force_orders  # sum over all 2^L paths


def _dense(ps):
  return np.exp(np.asarray(ps.log_norm))[:, None, None] * np.asarray(ps.unit)


# fast: no order kept (K = 0, one chunk), a middle cap over three chunks, and K = L - 1
# (the tail is one order); the other (K, chunks) pairs run with -m slow
FAST_CAPS = ((0, 1), (2, 3), (7, 3))


@pytest.mark.parametrize("max_order,num_chunks", [
    pytest.param(k, c, id=f"{c}-{k}",
                 marks=() if (k, c) in FAST_CAPS else pytest.mark.slow)
    for c in (1, 3) for k in (0, 2, 5, 7)])
def test_capped_orders_and_tail_equal_brute_force(x64, max_order, num_chunks):
  """Orders 0..K equal the brute-force sums and entry K+1 their sum over k > K, in both
  call forms (K = I and a general skip); the reconstruction is dh_L/dh_0."""
  num, d, beta = 8, 5, 0.8
  rng = np.random.default_rng(1)
  j = rng.standard_normal((num, d, d)) / np.sqrt(d)
  k = np.eye(d) + 0.3 * rng.standard_normal((num, d, d)) / np.sqrt(d)
  b = rng.standard_normal((num, d, d)) / np.sqrt(d)
  cases = [((jnp.asarray(j), beta), _brute_force_orders(np.broadcast_to(np.eye(d), j.shape),
                                                          beta * j)),
           ((jnp.asarray(k), jnp.asarray(b)), _brute_force_orders(k, b))]
  for args, ref in cases:
    ps = jax.jit(lambda *a: paths.path_sums(*a, num_chunks=num_chunks,
                                            max_order=max_order))(*args)
    assert ps.log_norm.shape == (max_order + 2,)
    expect = np.concatenate([ref[: max_order + 1], ref[max_order + 1:].sum(0)[None]])
    scale = np.abs(ref).max()
    np.testing.assert_allclose(_dense(ps), expect, atol=1e-12 * scale)
    np.testing.assert_allclose(np.asarray(paths.reconstruct(ps)), ref.sum(0),
                               atol=1e-12 * scale)


def test_no_cap_when_max_order_reaches_depth(x64):
  j = jax.random.normal(jax.random.PRNGKey(0), (6, 4, 4), jnp.float64) / 2
  # one program for the uncapped and the two capped DPs (the same values, bit for bit)
  full, *capped = jax.jit(lambda j: [paths.path_sums(j, 1.0)] + [
      paths.path_sums(j, 1.0, max_order=cap) for cap in (6, 9)])(j)
  for ps in capped:
    np.testing.assert_array_equal(np.asarray(ps.log_norm), np.asarray(full.log_norm))


def test_capped_dp_on_a_study_network_float32_vs_float64(x64):
  """A Pre-Norm ReLU MLP (L=24, d=32): the float32 capped DP against the float64 full
  DP. Orders <= K agree to float32 rounding (relative 1e-4 of the order's own mass),
  the tail equals the sum of the float64 orders above K, and the reconstruction error
  against the float64 running product stays at float32 level (< 1e-5)."""
  cfg = MLPConfig(depth=24, width=32, expansion=4.0, norm_position="pre",
                  param_dtype="float64")

  @jax.jit   # one program: the draw, its block Jacobians, the float64 DP and the product
  def reference(key):
    blocks, h0 = jacobians.seed_samples(cfg, key, 1)
    bj = jacobians.block_jacobians(blocks, h0[0], cfg)
    return (bj.branch, paths.path_sums(bj.branch, 1.0, num_chunks=1),
            jacobians.input_output_jacobians(bj, cfg)[-1])

  branch, ref, prod = reference(jax.random.PRNGKey(2))
  dense64 = _dense(ref)
  cap = 10
  ps = jax.jit(lambda b: paths.path_sums(b, 1.0, max_order=cap, num_chunks=3))(
      branch.astype(jnp.float32))
  got = _dense(ps)
  for kk in range(cap + 1):
    np.testing.assert_allclose(got[kk], dense64[kk], atol=1e-4 * np.abs(dense64[kk]).max())
  tail = dense64[cap + 1:].sum(0)
  np.testing.assert_allclose(got[cap + 1], tail, atol=1e-4 * np.abs(tail).max())
  prod = np.asarray(prod)
  err = np.linalg.norm(np.asarray(paths.reconstruct(ps), np.float64) - prod) / np.linalg.norm(prod)
  assert err < 1e-5


def test_bad_max_order_is_a_clear_error():
  with pytest.raises(ValueError, match="max_order=-1"):
    paths.path_sums(jnp.zeros((3, 2, 2)), 1.0, max_order=-1)
