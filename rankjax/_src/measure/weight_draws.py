"""Standard normal draws for the measurement weights, with a choice of bit generator.

Every option draws i.i.d. N(0, 1) (``jax.random.normal``: uniform bits through the
inverse error function); they differ only in the bit generator, so the same key gives
different numbers (the same distribution). ``jacobians.seed_samples`` draws a seed's
weights and inputs in one call of ``standard_normal_pieces``.

Every draw is made at float32 and cast to the requested dtype (float64 widens exactly,
bfloat16 rounds to nearest), so at one key every dtype gets the same numbers: a float32
vs float64 study compares precision, not two weight draws. (``jax.random.normal`` at
float64 draws other bits, hence other weights. The float32 draw's 23-bit uniforms stop
at 5.22 and -5.42, a tail of 1.2e-7 of N(0, 1)'s mass that float64 would resolve.)

The default "threefry" gives ``jax.random.normal``'s numbers bit for bit (the recorded
results) from a faster kernel on CPU: ``fast_paths.threefry_bits`` computes the same
cipher unrolled (the plain ``jax.random.bits`` on other platforms).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src import fast_paths

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


# The dtype every draw is made at, whatever dtype it is cast to.
DRAW_DTYPE = jnp.float32


def _normal_from_bits(bits: Array, dtype) -> Array:
  """``jax.random.normal``'s float32 transform (``_uniform`` then ``_normal_real`` in
  jax/_src/random/core.py): the top 23 bits as a mantissa in [1, 2), shifted onto
  [nextafter(-1, 0), 1), then ``sqrt(2) erfinv(u)``."""
  ones = jnp.uint32(np.float32(1.0).view(np.uint32))
  unit = jax.lax.bitcast_convert_type((bits >> 9) | ones, jnp.float32) - 1.0   # [0, 1)
  lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
  u = jnp.maximum(lo, unit * (np.float32(1.0) - lo) + lo)     # uniform on [lo, 1)
  return (np.float32(np.sqrt(2.0)) * jax.lax.erf_inv(u)).astype(dtype)


def _bits(key: Array, size: int, draw: str) -> Array | None:
  """The uint32 words ``_normal_from_bits`` turns into ``draw``'s float32 normals, or None
  for the draws that go through ``jax.random.normal`` whole."""
  if draw == "threefry":
    return fast_paths.threefry_bits(key, size)    # jax.random.normal's float32 bits
  if draw == "xla_threefry":
    words = jax.random.bits(key, (4,), jnp.uint32)     # a RngBitGenerator key: 4 words
    _, bits = jax.lax.rng_bit_generator(words, (size,), jnp.uint32,
                                        algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)
    return bits
  return None


def _normal_float32(key: Array, shape: tuple, draw: str) -> Array:
  """``draw``'s float32 N(0, 1) of ``shape`` through ``jax.random.normal``."""
  if draw == "threefry_serial":
    with jax.threefry_partitionable(False):
      return jax.random.normal(key, shape, DRAW_DTYPE)
  words = jax.random.bits(key, (4,), jnp.uint32)
  return jax.random.normal(jax.random.wrap_key_data(words, impl=draw), shape, DRAW_DTYPE)


def standard_normal(key: Array, shape: tuple, dtype, draw: str = "threefry") -> Array:
  """I.i.d. N(0, 1) of ``shape`` from ``key`` with the bit generator ``draw`` (``DRAWS``),
  drawn at float32 and cast to ``dtype``: the same numbers for every dtype."""
  check_draw(draw)
  bits = _bits(key, math.prod(shape), draw)
  if bits is not None:
    return _normal_from_bits(bits, dtype).reshape(shape)
  return _normal_float32(key, shape, draw).astype(dtype)


def standard_normal_pieces(key: Array, sizes: list[int], dtype,
                           draw: str = "threefry") -> list[Array]:
  """``standard_normal(key, (sum(sizes),), dtype, draw)`` split into consecutive pieces
  of ``sizes``: the same numbers. For the bit-based draws each piece transforms its own
  slice of the bits, so XLA fuses the transform into the piece's consumer (a scale, a
  reshape) instead of writing the whole float draw and copying it out again (0.12 s
  against 0.17 s for the 25M weights of L=48, d=256 with ``xla_threefry``)."""
  check_draw(draw)
  total = int(sum(sizes))
  bits = _bits(key, total, draw)
  flat = _normal_float32(key, (total,), draw) if bits is None else bits
  pieces = jnp.split(flat, np.cumsum(sizes)[:-1])
  if bits is None:
    return [p.astype(dtype) for p in pieces]
  return [_normal_from_bits(p, dtype) for p in pieces]
