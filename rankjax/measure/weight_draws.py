"""Standard normal draws for the measurement weights, with a choice of bit generator.

Every option draws i.i.d. N(0, 1) (``jax.random.normal``: uniform bits through the
inverse error function); they differ only in the bit generator, so the same key gives
different numbers (the same distribution). ``jacobians.seed_samples`` draws a seed's
weights and inputs in one call of ``standard_normal``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# The bit generators (times: the 25M normals of L=48, d=256, 4x on this 2-core CPU
# under load 5, medians of 7 interleaved runs, jitted):
#   "threefry": JAX's default (partitionable) threefry2x32; the recorded numbers. 0.67 s.
#   "threefry_serial": the same cipher with the pre-0.5 counter layout
#     (``jax.threefry_partitionable(False)``). 0.47 s.
#   "xla_threefry": the same cipher (Threefry-2x32, 20 rounds) run by XLA's own
#     ``RngBitGenerator`` kernel, keyed by four threefry words of the key; the bits go
#     through ``jax.random.normal``'s transform (``_normal_from_bits``). 0.28 s.
#   "rbg", "unsafe_rbg": ``RngBitGenerator`` with the backend's default algorithm
#     (Philox on CPU/GPU; JAX's recommendation for GPU/TPU). About 1.4 s here.
DRAWS = ("threefry", "threefry_serial", "xla_threefry", "rbg", "unsafe_rbg")


def check_draw(draw: str) -> str:
  if draw not in DRAWS:
    raise ValueError(f"draw={draw!r}; choose one of {', '.join(DRAWS)}")
  return draw


def _normal_from_bits(bits: Array, dtype) -> Array:
  """``jax.random.normal``'s float32 transform (``_uniform`` then ``_normal_real`` in
  jax/_src/random/core.py): the top 23 bits as a mantissa in [1, 2), shifted onto
  [nextafter(-1, 0), 1), then ``sqrt(2) erfinv(u)``."""
  ones = jnp.uint32(np.float32(1.0).view(np.uint32))
  unit = jax.lax.bitcast_convert_type((bits >> 9) | ones, jnp.float32) - 1.0   # [0, 1)
  lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
  u = jnp.maximum(lo, unit * (np.float32(1.0) - lo) + lo)     # uniform on [lo, 1)
  return (np.float32(np.sqrt(2.0)) * jax.lax.erf_inv(u)).astype(dtype)


def standard_normal(key: Array, shape: tuple, dtype, draw: str = "threefry") -> Array:
  """I.i.d. N(0, 1) of ``shape`` from ``key`` with the bit generator ``draw`` (``DRAWS``)."""
  check_draw(draw)
  if draw == "threefry":
    return jax.random.normal(key, shape, dtype)
  if draw == "threefry_serial":
    with jax.threefry_partitionable(False):
      return jax.random.normal(key, shape, dtype)
  words = jax.random.bits(key, (4,), jnp.uint32)     # a RngBitGenerator key: 4 words
  if draw == "xla_threefry":
    if jnp.dtype(dtype).itemsize > 4:
      raise ValueError(f"draw='xla_threefry' draws float32 or narrower, not {jnp.dtype(dtype)}")
    size = math.prod(shape)
    _, bits = jax.lax.rng_bit_generator(words, (size,), jnp.uint32,
                                        algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)
    return _normal_from_bits(bits, dtype).reshape(shape)
  return jax.random.normal(jax.random.wrap_key_data(words, impl=draw), shape, dtype)
