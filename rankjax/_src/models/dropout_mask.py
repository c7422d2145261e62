"""Counter-based dropout masks for the attention probabilities: a uint32 hash of (key,
batch, head, query index, key index), drawn where a block of probabilities is formed.

``attn_dropout_mask="hash"`` (``TransformerConfig``) takes these masks instead of
threefry's (``jax.random.bernoulli``). Entry ``(b, h, i, j)`` of a (B, H, T, T) mask is

    keep[b, h, i, j] = fmix32(fmix32((i T + j) XOR s0[b, h]) XOR s1[b, h]) >= r

with ``fmix32`` MurmurHash3's 32-bit finalizer (a bijection of uint32: xor-shift 16,
times 0x85EBCA6B, xor-shift 13, times 0xC2B2AE35, xor-shift 16), ``s0, s1`` two uint32
words per (batch, head) drawn once from the dropout key (``jax.random.bits``, 2 B H
words: the only bits the key's PRNG draws), and ``r = round(rate 2^32)``. So the mask
is a function of the key and the entry's indices alone: any block of rows and columns
reads the same entries (the backward pass's recomputation and the einsum path get the
masks the forward pass used), and no PRNG state runs through the blocks.

Keep probability: ``1 - r / 2^32``, within ``2^-33`` (1.2e-10) of ``1 - rate`` (the
rounding of r), against a sampling spread of ``sqrt(rate (1 - rate) / n)`` over n
entries. The masks differ from threefry's (the default, ``"threefry"``, keeps the bits
of every recorded run): a run with ``"hash"`` draws other masks, of the same law up to
the hash's quality. The second xor and round decorrelate slabs whose first-round words
coincide (an ``s0`` difference below ``T^2`` makes two slabs' first rounds shifted
copies). One entry costs about 20 uint32 operations (the counter, two finalizers of 8,
the xors and the compare), against about 50 per 32-bit word for threefry-2x32 (20 rounds
of add, rotate and xor per two words) and ``bernoulli``'s conversion to a float. The counter ``i T + j`` needs ``T^2 <= 2^32``
(T <= 65536), checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAX_SEQ = 1 << 16   # i T + j in uint32


def fmix32(x: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer on uint32 (wrapping arithmetic): a bijection whose
  output bits each depend on every input bit."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def streams(key: jax.Array, batch: int, heads: int) -> jax.Array:
  """The per-(batch, head) words ``(s0, s1)``, ``(2, B, H, 1, 1)`` uint32, from the
  dropout key (any PRNG implementation)."""
  return jax.random.bits(key, (2, batch, heads), jnp.uint32)[..., None, None]


def threshold(rate: float) -> int:
  """``r = round(rate 2^32)``: an entry is kept when its hash is at least r."""
  return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def keep(words: jax.Array, rows: jax.Array, cols: jax.Array, t: int, rate: float
         ) -> jax.Array:
  """The keep mask, ``(B, H, len(rows), len(cols))`` bool, of the entries ``(rows,
  cols)`` of a T-token sequence, for ``words = streams(key, B, H)`` (module docstring)."""
  if t > MAX_SEQ:
    raise ValueError(f"hash dropout masks need T <= {MAX_SEQ}; got {t}")
  counter = (rows.astype(jnp.uint32)[:, None] * jnp.uint32(t)
             + cols.astype(jnp.uint32)[None, :])
  bits = fmix32(fmix32(counter ^ words[0]) ^ words[1])
  return bits >= jnp.uint32(threshold(rate))


def keep_probability(rate: float) -> float:
  """The exact keep probability of a hash mask entry, ``1 - r / 2^32``."""
  return 1.0 - threshold(rate) / 2.0 ** 32


