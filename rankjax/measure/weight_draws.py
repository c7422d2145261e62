"""Standard normal draws for the measurement weights, with a choice of bit generator.

Every option draws i.i.d. N(0, 1) (``jax.random.normal``: uniform bits through the
inverse error function); they differ only in the bit generator, so the same key gives
different numbers (the same distribution). ``jacobians.seed_samples`` draws a seed's
weights and inputs in one call of ``standard_normal``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# The bit generators:
#   "threefry": JAX's default (partitionable) threefry2x32; the recorded numbers.
#   "threefry_serial": threefry2x32 with the pre-0.5 counter layout
#     (``jax.threefry_partitionable(False)``); 0.43 s against 0.74 s (median of 7,
#     interleaved) for the 25M normals of L=48, d=256, 4x on this 2-core CPU under load.
#   "rbg", "unsafe_rbg": XLA's RngBitGenerator keyed by four threefry words of the key
#     (JAX's recommendation for GPU/TPU); on this CPU about 1.8x slower than "threefry".
DRAWS = ("threefry", "threefry_serial", "rbg", "unsafe_rbg")


def check_draw(draw: str) -> str:
  if draw not in DRAWS:
    raise ValueError(f"draw={draw!r}; choose one of {', '.join(DRAWS)}")
  return draw


def standard_normal(key: Array, shape: tuple, dtype, draw: str = "threefry") -> Array:
  """I.i.d. N(0, 1) of ``shape`` from ``key`` with the bit generator ``draw`` (``DRAWS``)."""
  check_draw(draw)
  if draw == "threefry":
    return jax.random.normal(key, shape, dtype)
  if draw == "threefry_serial":
    with jax.threefry_partitionable(False):
      return jax.random.normal(key, shape, dtype)
  words = jax.random.bits(key, (4,), jnp.uint32)     # an rbg key is four uint32 words
  return jax.random.normal(jax.random.wrap_key_data(words, impl=draw), shape, dtype)
