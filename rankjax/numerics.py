"""The one float-promotion rule of the library: accumulate in at least float32.

Every statistic, norm and attention logit is accumulated in ``float_dtype(x)``:
float32 for 16-bit and 32-bit floats, float64 for float64 (the x64 checks), and the
default float (``jnp.result_type(float)``) for integers and booleans. Models and
measurements both use it (neither imports the other for it).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def float_dtype(x: Any) -> jnp.dtype:
  """At least float32 for an array or dtype ``x`` (integers get the default float)."""
  dtype = jnp.dtype(x) if isinstance(x, (jnp.dtype, type, str)) else jnp.asarray(x).dtype
  if not jnp.issubdtype(dtype, jnp.floating):
    return jnp.result_type(float)
  return jnp.promote_types(dtype, jnp.float32)


def as_float(x: Any) -> jax.Array:
  """``x`` as an array of ``float_dtype(x)``."""
  x = jnp.asarray(x)
  return x.astype(float_dtype(x.dtype))
