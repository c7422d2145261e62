"""Standard normal draws for the measurement weights, with a choice of bit generator.

Every option draws i.i.d. N(0, 1) (``jax.random.normal``: uniform bits through the
inverse error function); they differ only in the bit generator, so the same key gives
different numbers (the same distribution). ``jacobians.seed_samples`` draws a seed's
weights and inputs in one call of ``standard_normal_pieces``.

The default "threefry" gives ``jax.random.normal``'s numbers bit for bit (the recorded
results) from a faster kernel on CPU: ``fast_paths.threefry_bits`` computes the same
cipher unrolled (the plain ``jax.random.bits`` on other platforms).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rankjax import fast_paths

Array = jax.Array
threefry_bits = fast_paths.threefry_bits   # kept name (the unrolled cipher moved there)

# The bit generators. Times: ``jacobians.seed_samples`` of L=48, d=256, 4x (25M normals,
# scaled), jitted, on this 2-core CPU, idle, best of 7 (session 6):
#   "threefry": JAX's default (partitionable) threefry2x32, ``jax.random.normal``'s
#     numbers bit for bit (the recorded results), its bits from ``fast_paths.threefry_bits``.
#     0.081 s (``jax.random.normal`` itself, whose CPU lowering rolls the rounds into a
#     loop: 0.30 s).
#   "threefry_serial": the same cipher with the pre-0.5 counter layout
#     (``jax.threefry_partitionable(False)``), through ``jax.random.normal``. 0.21 s.
#   "xla_threefry": the same cipher (Threefry-2x32, 20 rounds) run by XLA's own
#     ``RngBitGenerator`` kernel, keyed by four threefry words of the key; the bits go
#     through ``jax.random.normal``'s transform (``_normal_from_bits``). 0.12 s.
#   "rbg", "unsafe_rbg": ``RngBitGenerator`` with the backend's default algorithm
#     (Philox on CPU/GPU; JAX's recommendation for GPU/TPU). 0.34 s.
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


def _bits(key: Array, size: int, dtype, draw: str) -> Array | None:
  """The uint32 words ``_normal_from_bits`` turns into ``draw``'s normals of ``dtype``, or
  None for the draws that go through ``jax.random.normal`` whole."""
  if draw == "threefry":
    # jax.random.normal's own bits and transform for float32 (other dtypes draw other bits)
    return fast_paths.threefry_bits(key, size) if jnp.dtype(dtype) == jnp.float32 else None
  if draw == "xla_threefry":
    if jnp.dtype(dtype).itemsize > 4:
      raise ValueError(f"draw='xla_threefry' draws float32 or narrower, not {jnp.dtype(dtype)}")
    words = jax.random.bits(key, (4,), jnp.uint32)     # a RngBitGenerator key: 4 words
    _, bits = jax.lax.rng_bit_generator(words, (size,), jnp.uint32,
                                        algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)
    return bits
  return None


def standard_normal(key: Array, shape: tuple, dtype, draw: str = "threefry") -> Array:
  """I.i.d. N(0, 1) of ``shape`` from ``key`` with the bit generator ``draw`` (``DRAWS``)."""
  check_draw(draw)
  bits = _bits(key, math.prod(shape), dtype, draw)
  if bits is not None:
    return _normal_from_bits(bits, dtype).reshape(shape)
  if draw == "threefry":
    return jax.random.normal(key, shape, dtype)
  if draw == "threefry_serial":
    with jax.threefry_partitionable(False):
      return jax.random.normal(key, shape, dtype)
  words = jax.random.bits(key, (4,), jnp.uint32)
  return jax.random.normal(jax.random.wrap_key_data(words, impl=draw), shape, dtype)


def standard_normal_pieces(key: Array, sizes: list[int], dtype,
                           draw: str = "threefry") -> list[Array]:
  """``standard_normal(key, (sum(sizes),), dtype, draw)`` split into consecutive pieces
  of ``sizes``: the same numbers. For the bit-based draws each piece transforms its own
  slice of the bits, so XLA fuses the transform into the piece's consumer (a scale, a
  reshape) instead of writing the whole float draw and copying it out again (0.12 s
  against 0.17 s for the 25M weights of L=48, d=256 with ``xla_threefry``)."""
  check_draw(draw)
  total = int(sum(sizes))
  bits = _bits(key, total, dtype, draw)
  flat = standard_normal(key, (total,), dtype, draw) if bits is None else bits
  pieces = jnp.split(flat, np.cumsum(sizes)[:-1])
  return pieces if bits is None else [_normal_from_bits(p, dtype) for p in pieces]
