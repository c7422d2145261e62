"""The one float-promotion rule of the library: accumulate in at least float32.

Every statistic, norm and attention logit is accumulated in ``float_dtype(x)``:
float32 for 16-bit and 32-bit floats, float64 for float64 (the x64 checks), and the
default float (``jnp.result_type(float)``) for integers and booleans. Models and
measurements both use it (neither imports the other for it).

The mixed-precision rule lives here too (``compute_copy``): matrices and embeddings are
cast to the compute dtype, norm gains and biases are not (norms compute in float32 and
return their input's dtype); both model families, both training tasks, the training
step's diagnostics (``train.state.run_diagnostics``: they measure the forward pass the
training step computes, bit for bit) and ``rankjax analyze`` use it.
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


# The logical axis of a norm's gain or bias (``rankjax._src.models.annotated``): the kind of
# parameter that keeps its own dtype and is no matmul weight.
NORM = "norm"


def is_norm_param(axes: Any) -> bool:
  """A norm's gain or bias, by the logical axes it was created with (a tuple or
  PartitionSpec of names; ``rankjax._src.train.tasks.Task.param_axes``): they include ``NORM``."""
  return NORM in tuple(axes)


def compute_copy(params: Any, compute_dtype: Any, axes: Any) -> Any:
  """The parameters as a forward pass in ``compute_dtype`` uses them: the mixed-precision
  rule, in one place.

  Every matrix and embedding is cast to ``compute_dtype`` (so under FSDP the all-gathers
  move bfloat16, not float32); norm gains and biases (``is_norm_param`` of their logical
  ``axes``, a tree of PartitionSpecs like ``params``: ``Task.param_axes``) keep their dtype
  (the norms compute in float32). The originals stay the optimizer's. A tree already in
  ``compute_dtype`` comes back as it is (the same leaves).

  Why the embedding tables too, though the model adds token rows and learned positions
  in float32 (``grad_reduce_dtype="float32"``): the looked-up token rows are rounded to
  the compute dtype before anything reads them and a tied head casts its table to the
  compute dtype (``lm_head.head_logits``), so a float32 token table would change no
  value and double the bytes its all-gather moves; only the learned positions (a
  ``max_seq_len x d`` table) are rounded once more than a float32 copy would be.
  """
  dtype = jnp.dtype(compute_dtype)

  def cast(x, names):
    return x if is_norm_param(names) or x.dtype == dtype else x.astype(dtype)

  return jax.tree.map(cast, params, axes)
