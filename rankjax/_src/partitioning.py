"""Activation sharding constraints by logical axes, for code inside the models.

A model marks an activation with its logical axes::

  h = partitioning.constrain(h, ("batch", "length", "embed"))

Outside ``activation_sharding(mesh, rules)`` (single-device use, the measurement
code, tests of the models) ``constrain`` returns ``h`` unchanged. The training step
traces the loss inside that context (``rankjax._src.train.state.make_step``), so the
residual stream is pinned to ``rules`` (``rankjax._src.train.sharding.ACTIVATION_RULES``:
batch over ``("data", "fsdp")``, every other axis whole) at each block input: GSPMD
then gathers the (small, per-layer) weights rather than the activations.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

_state = threading.local()


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None, rules: Mapping[str, Sequence[str]], *,
                        replicate_indivisible: bool = False) -> Iterator[None]:
  """While tracing inside, ``constrain`` applies ``rules`` on ``mesh``.

  ``replicate_indivisible``: a dimension its mesh axes do not divide (the few examples
  the diagnostics look at) is replicated, and so is an array no rule shards, instead of
  being left to GSPMD (which then split the activations along d_model, as the
  FSDP-sharded weights are, and all-reduced every matmul output).
  """
  previous = getattr(_state, "value", None)
  _state.value = None if mesh is None else (mesh, dict(rules), replicate_indivisible)
  try:
    yield
  finally:
    _state.value = previous


def current() -> tuple[Mesh, dict] | None:
  """The ``(mesh, rules)`` of the enclosing ``activation_sharding``, or None outside it
  (for code that must place a computation itself, e.g. a Pallas kernel under
  ``shard_map``)."""
  value = getattr(_state, "value", None)
  return None if value is None else value[:2]


def axis_size(logical: str) -> int:
  """How many shards the logical axis ``logical`` has under the enclosing
  ``activation_sharding`` (the product of its mesh axes' sizes); 1 outside one."""
  value = getattr(_state, "value", None)
  if value is None:
    return 1
  mesh, rules, _ = value
  n = 1
  for a in rules.get(logical, ()):
    n *= mesh.shape[a]
  return n


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
  """``with_sharding_constraint`` of ``x`` by its logical axes (see module doc).

  When a dimension is not divisible by its mesh axes (e.g. the few examples the
  diagnostics look at) ``x`` is left unconstrained, as it is outside the context, or
  replicated along it under ``replicate_indivisible``.
  """
  value = getattr(_state, "value", None)
  if value is None:
    return x
  mesh, rules, replicate = value
  if len(logical) != x.ndim:
    raise ValueError(f"constrain: {len(logical)} logical axes {tuple(logical)} for an "
                     f"array of shape {x.shape}")
  spec = []
  for size, name in zip(x.shape, logical):
    axes = tuple(rules.get(name, ())) if name is not None else ()
    n = 1
    for a in axes:
      n *= mesh.shape[a]
    if n > 1 and size % n:
      if not replicate:
        return x
      n = 1
    spec.append((axes if len(axes) > 1 else axes[0]) if n > 1 else None)
  if all(s is None for s in spec) and not replicate:
    return x
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))
