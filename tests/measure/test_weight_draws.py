"""Bit generators of the measurement weights (rankjax._src.measure.weight_draws)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import MLPConfig
from rankjax._src.measure import jacobians, paths, weight_draws

N = 1 << 18
# The integer bits are exact everywhere. Their float transform (uniform, erf_inv) is the
# same formula as jax.random.normal's but compiled in another program, where a compiler
# may contract or vectorize it differently: held to 2 ulp (equal bit for bit on the AMD
# EPYC and Intel Xeon CPUs this ran on).
MAX_ULP = 2


@pytest.mark.parametrize("draw", weight_draws.DRAWS)
def test_every_draw_is_standard_normal(draw):
  """Mean, variance, kurtosis and the two-sided 2-sigma tail mass match N(0, 1) within
  5 standard errors of each estimator at n = 2^18 (independent closed forms: var of x
  is 1, of x^2 is 2, of x^4 is 96, of 1[|x|>2] is p(1-p) with p = 0.0455003)."""
  x = np.asarray(jax.jit(lambda k: weight_draws.standard_normal(k, (N,), jnp.float32, draw))(
      jax.random.PRNGKey(7)), np.float64)
  se = lambda var: 5 * np.sqrt(var / N)
  assert abs(x.mean()) < se(1.0)
  assert abs(np.mean(x ** 2) - 1.0) < se(2.0)
  assert abs(np.mean(x ** 4) - 3.0) < se(96.0)
  p = 0.04550026
  assert abs(np.mean(np.abs(x) > 2.0) - p) < se(p * (1 - p))
  # neighbouring draws are uncorrelated (a lag-1 correlation within 5 standard errors)
  assert abs(np.mean(x[1:] * x[:-1])) < se(1.0)


def test_xla_threefry_uses_the_jax_normal_transform():
  """The same bits through ``_normal_from_bits`` give ``jax.random.normal``'s numbers."""
  key = jax.random.PRNGKey(11)
  bits = jax.random.bits(key, (4096,), jnp.uint32)
  np.testing.assert_array_max_ulp(
      np.asarray(weight_draws._normal_from_bits(bits, jnp.float32)),
      np.asarray(jax.random.normal(key, (4096,), jnp.float32)), MAX_ULP)


@pytest.mark.parametrize("draw", weight_draws.DRAWS)
def test_every_dtype_draws_the_float32_numbers(x64, draw):
  """float64 is the float32 draw widened (exact) and bfloat16 the float32 draw rounded to
  nearest, whole and in pieces: at one key every dtype gets the same numbers."""
  key = jax.random.PRNGKey(6)
  sizes = (7, 1, 40)
  both = jax.jit(lambda k, dtype: (
      weight_draws.standard_normal(k, (sum(sizes),), dtype, draw),
      jnp.concatenate(weight_draws.standard_normal_pieces(k, sizes, dtype, draw))),
      static_argnums=1)
  ref, ref_pieces = (np.asarray(a) for a in both(key, jnp.float32))
  for dtype in (jnp.float64, jnp.bfloat16):
    for got, want in zip(both(key, dtype), (ref, ref_pieces)):
      assert got.dtype == dtype
      if dtype == jnp.float64:   # exactly float32 numbers, those of the float32 draw
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32), np.asarray(got))
        np.testing.assert_array_max_ulp(np.asarray(got).astype(np.float32), want, MAX_ULP)
      else:
        np.testing.assert_array_equal(np.asarray(got, np.float32),
                                      np.asarray(jnp.asarray(want).astype(dtype), np.float32))


def test_float32_and_float64_studies_measure_the_same_weights(x64):
  """The issue-45 check: at one key a float64 study measures the float32 study's weights
  and inputs widened, so the two agree to float32 rounding (the seed-to-seed spread of
  erank_L/d at this size is ~1e-2)."""
  cfg32 = MLPConfig(depth=6, width=16, expansion=2.0, norm_position="pre")
  cfg64 = dataclasses.replace(cfg32, param_dtype="float64")
  key = jax.random.PRNGKey(8)
  (b32, h32), (b64, h64) = (jax.jit(lambda k, c=c: jacobians.seed_samples(c, k, 2))(key)
                            for c in (cfg32, cfg64))
  assert h64.dtype == jnp.float64 and b64["w_up"].dtype == jnp.float64
  np.testing.assert_array_max_ulp(np.asarray(h64).astype(np.float32), np.asarray(h32), MAX_ULP)
  for name in b32:   # the scale alpha/sqrt(fan_in) is rounded to float32 in one of them
    np.testing.assert_array_max_ulp(np.asarray(b64[name]).astype(np.float32),
                                    np.asarray(b32[name]), MAX_ULP + 1)
  study = lambda cfg: jacobians.mlp_jacobian_study(cfg, key, num_inputs=2, num_seeds=2,
                                                   num_chunks=1, return_samples=True)[1]
  s32, s64 = study(cfg32), study(cfg64)
  assert s64["erank"].dtype == jnp.float64
  for field in ("erank", "stable_rank", "stream_rms"):
    np.testing.assert_allclose(np.asarray(s64[field]), np.asarray(s32[field]), rtol=1e-5,
                               err_msg=field)


_standard_normal = jax.jit(weight_draws.standard_normal, static_argnums=(1, 2, 3))


def test_draws_are_deterministic_and_differ():
  key = jax.random.PRNGKey(3)
  out = {d: np.asarray(_standard_normal(key, (64,), jnp.float32, d))
         for d in weight_draws.DRAWS}
  for d in weight_draws.DRAWS:   # the same compiled program again: the same bits
    np.testing.assert_array_equal(
        out[d], np.asarray(_standard_normal(key, (64,), jnp.float32, d)))
  np.testing.assert_array_max_ulp(out["threefry"], np.asarray(
      jax.random.normal(key, (64,), jnp.float32)), MAX_ULP)   # the default: jax's numbers
  for d in weight_draws.DRAWS[1:]:
    assert not np.allclose(out[d], out["threefry"])


def test_bad_draw_is_a_clear_error():
  cfg = MLPConfig(depth=2, width=4, norm_position="pre")
  with pytest.raises(ValueError, match="draw='philox'"):
    weight_draws.standard_normal(jax.random.PRNGKey(0), (3,), jnp.float32, "philox")
  with pytest.raises(ValueError, match="draw='philox'"):
    jacobians.make_study_fn(cfg, draw="philox")


def test_study_with_a_draw_measures_that_draw():
  """The study under draw="threefry_serial" equals the per-sample measurements of the
  weights ``seed_samples`` draws with it (seed s from split(key, S)[s])."""
  cfg = MLPConfig(depth=4, width=16, expansion=2.0, norm_position="pre")
  key = jax.random.PRNGKey(5)
  _, samples = jacobians.mlp_jacobian_study(cfg, key, num_inputs=2, num_seeds=2,
                                            num_chunks=1, return_samples=True,
                                            draw="threefry_serial")
  base = dataclasses.replace(cfg, alpha=1.0, beta=1.0)

  @jax.jit   # one program for both seeds' reference measurements
  def reference(k):
    blocks, h0 = jacobians.seed_samples(base, k, 2, draw="threefry_serial")
    return jax.vmap(lambda h: jacobians.sample_measurements(blocks, h, base, num_chunks=1))(h0)

  for s, k in enumerate(jax.random.split(key, 2)):
    ref = reference(k)
    np.testing.assert_allclose(samples["erank"][s], ref["erank"], rtol=1e-5)
    np.testing.assert_allclose(samples["order_log_mass"][s], ref["order_log_mass"],
                               rtol=1e-5, atol=1e-5)
  default = jacobians.mlp_jacobian_study(cfg, key, num_inputs=2, num_seeds=2, num_chunks=1)
  assert not np.allclose(np.asarray(default.stream_rms),
                         np.asarray(jnp.mean(samples["stream_rms"], axis=(0, 1))))


def test_default_chunks_grow_with_the_problem():
  assert paths.default_num_chunks(48, 256) == paths.LARGE_NUM_CHUNKS
  assert paths.default_num_chunks(16, 256) == paths.DEFAULT_NUM_CHUNKS
  assert paths.default_num_chunks(48, 64) == paths.DEFAULT_NUM_CHUNKS


@pytest.mark.parametrize("seed", [0, 7, 2 ** 31 + 5])
def test_unrolled_threefry_is_jax_random_bit_for_bit(seed):
  """``threefry_bits`` (the cipher unrolled) gives ``jax.random.bits``' words, raw and
  typed keys, odd sizes, under vmap; so the default draw is ``jax.random.normal``."""
  raw = jax.random.PRNGKey(seed)
  for key in (raw, jax.random.wrap_key_data(raw)):
    for n in (1, 2, 3, 1001):
      np.testing.assert_array_equal(np.asarray(weight_draws.threefry_bits(key, n)),
                                    np.asarray(jax.random.bits(key, (n,), jnp.uint32)))
  keys = jax.random.split(raw, 3)
  np.testing.assert_array_max_ulp(
      np.asarray(jax.jit(jax.vmap(lambda k: weight_draws.standard_normal(
          k, (5, 7), jnp.float32)))(keys)),
      np.asarray(jax.vmap(lambda k: jax.random.normal(k, (5, 7), jnp.float32))(keys)), MAX_ULP)


def test_pieces_are_the_split_draw():
  key = jax.random.PRNGKey(4)
  sizes = (5, 1, 17)
  # per draw, the whole draw and its pieces in one compiled program
  both = jax.jit(lambda k, draw: (
      weight_draws.standard_normal(k, (sum(sizes),), jnp.float32, draw),
      weight_draws.standard_normal_pieces(k, sizes, jnp.float32, draw)), static_argnums=1)
  for draw in weight_draws.DRAWS:
    whole, pieces = both(key, draw)
    whole = np.asarray(whole)
    np.testing.assert_array_max_ulp(np.concatenate([np.asarray(p) for p in pieces]), whole,
                                    MAX_ULP)
  with jax.enable_x64(True):   # float64: jax.random.normal's float32 draw, widened
    whole = weight_draws.standard_normal(key, (6,), jnp.float64)
    np.testing.assert_array_max_ulp(np.asarray(whole).astype(np.float32),
                                    np.asarray(jax.random.normal(key, (6,), jnp.float32)),
                                    MAX_ULP)
