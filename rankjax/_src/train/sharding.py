"""Device mesh, sharding by logical axes, multi-host start-up and batches.

The mesh has two axes, ``("data", "fsdp")``. Sharding is by logical axes:

* parameters: each declares its logical axes where it is created
  (``flax.linen.with_logical_partitioning``, ``rankjax._src.models.annotated``; read by
  ``Task.param_axes``): ``embed`` is the d_model axis of the residual stream, ``mlp``
  the hidden width, ``heads`` the H*d_head axis, ``vocab``, ...; ``MESH_RULES`` maps
  ``embed`` to ``fsdp`` and every other logical axis (the stacked ``layers`` axis
  included) to no mesh axis. So each matrix is split over ``fsdp`` along its d_model
  axis and replicated over ``data``; inside the layer scan each layer's slice is
  all-gathered when that layer runs (FSDP / ZeRO-3), and its gradient
  reduce-scattered back. Norm gains and vectors are replicated;
* activations: ``rankjax._src.partitioning.constrain`` pins the residual stream at every
  block input to batch over ``("data", "fsdp")`` (``ACTIVATION_RULES``), so the
  batch is never gathered;
* the optimizer moments are sharded like their parameters; with ``zero1`` they are
  also split over ``data`` (``zero1_spec``: ZeRO stage 1);
* batches arrive as (grad_accum, micro_batch, ...) and are split along the
  micro-batch axis over ``("data", "fsdp")``, all devices together.

A dimension a rule shards but ``fsdp`` does not divide stays whole (``param_spec``).
An unannotated parameter is refused (``Task.param_axes``) unless its task opts into
the fallback (``Task.unannotated_params="fallback"``, for plug-ins): then it is split
along its largest dimension that ``fsdp`` divides (``spec_for``).

Multi-host (the processes joined by ``rankjax._src.distributed``): each process reads its
own shard of the data (``host_batch_size``) and ``global_batch`` assembles the
process-local arrays into global ones.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rankjax._src.errors import UserError
from rankjax._src.models.annotated import UNANNOTATED

AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")

# Parameters read by a gather (a token lookup): all-gathered whole where the loss
# uses them (``gather_lookup_tables``), so the lookup is local and its output keeps
# the batch sharding; otherwise GSPMD gathers the token ids and all-to-alls the
# embedded activations. The learned positions too: sliced and added to every sequence,
# they are read whole like a table (gathered in the compute dtype; their gradient, a sum
# over the batch, is then reduced once).
LOOKUP_TABLES = ("embedding", "pos_embed")
# Logical axis -> mesh axis (absent: not sharded).
MESH_RULES: dict[str, str] = {"embed": "fsdp"}
# Activations: logical axis -> mesh axes (rankjax._src.partitioning.constrain).
ACTIVATION_RULES: dict[str, tuple[str, ...]] = {"batch": BATCH_AXES}


def make_mesh(data: int = 0, fsdp: int = 1, devices: Any = None) -> Mesh:
  """Mesh ``(data, fsdp)`` over all devices; ``data=0`` takes what fsdp leaves."""
  devices = list(devices if devices is not None else jax.devices())
  n = len(devices)
  if data == 0:
    if n % fsdp:
      raise UserError(f"mesh_fsdp={fsdp} does not divide the {n} devices")
    data = n // fsdp
  if data * fsdp != n:
    raise UserError(f"mesh data={data} x fsdp={fsdp} = {data * fsdp} devices, "
                     f"but {n} are available; set mesh_data=0 to use all of them")
  axis_types = (jax.sharding.AxisType.Auto,) * 2
  return jax.make_mesh((data, fsdp), AXES, axis_types=axis_types, devices=devices)


def spec_for(shape: tuple[int, ...], fsdp: int, stacked: bool) -> P:
  """The fallback for an unannotated parameter (a plug-in's opt-in): the largest
  dimension ``fsdp`` divides (ties: the later one), never the stacked layer axis."""
  if fsdp == 1:
    return P()
  first = 1 if stacked and len(shape) > 1 else 0
  best = None
  for axis in range(first, len(shape)):
    if shape[axis] % fsdp == 0 and (best is None or shape[axis] >= shape[best]):
      best = axis
  if best is None:
    return P()
  spec = [None] * len(shape)
  spec[best] = "fsdp"
  return P(*spec)


def _leaf_name(path: tuple[Any, ...]) -> str | None:
  for key in reversed(path):
    name = getattr(key, "key", getattr(key, "name", None))
    if isinstance(name, str):
      return name
  return None


def param_spec(axes: P, shape: tuple[int, ...], mesh_shape: Mapping[str, int]) -> P:
  """The PartitionSpec of a parameter of logical ``axes`` (``Task.param_axes``) by
  ``MESH_RULES``; an unannotated one (``UNANNOTATED``) by ``spec_for``."""
  names = tuple(axes)
  if UNANNOTATED in names:
    return spec_for(shape, mesh_shape["fsdp"], names[:1] == ("layers",))
  spec = []
  for size, name in zip(shape, names):
    mesh_axis = MESH_RULES.get(name)
    ok = mesh_axis is not None and mesh_shape[mesh_axis] > 1 and size % mesh_shape[mesh_axis] == 0
    spec.append(mesh_axis if ok else None)
  return P(*spec) if any(spec) else P()


def gather_lookup_tables(params: Any, mesh: Mesh | None) -> Any:
  """``params`` with every ``LOOKUP_TABLES`` leaf constrained to be replicated (call
  inside the differentiated loss: the forward all-gathers the table once per
  micro-batch, the backward reduces its gradient back to the shards)."""
  if mesh is None or mesh.size == 1:
    return params

  def leaf(path, x):
    if _leaf_name(path) in LOOKUP_TABLES:
      return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P()))
    return x

  return jax.tree_util.tree_map_with_path(leaf, params)


def zero1_spec(spec: P, shape: tuple[int, ...], data: int, fsdp: int, stacked: bool) -> P:
  """ZeRO-1: an optimizer moment's spec with ``data`` added on its largest free
  dimension ``data`` divides (or on its fsdp dimension when that divides by both)."""
  if data == 1 or not shape:
    return spec
  entries = list(spec) + [None] * (len(shape) - len(spec))
  first = 1 if stacked and len(shape) > 1 else 0
  free = [a for a in range(first, len(shape)) if entries[a] is None and shape[a] % data == 0]
  if free:
    entries[max(free, key=lambda a: (shape[a], a))] = "data"
    return P(*entries)
  for a, e in enumerate(entries):
    if e == "fsdp" and shape[a] % (data * fsdp) == 0:
      entries[a] = ("data", "fsdp")
      return P(*entries)
  return spec


def _keys(path: tuple[Any, ...]) -> tuple[Any, ...]:
  return tuple(getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path)


def state_shardings(abstract: Any, mesh: Mesh, axes: Any, zero1: bool = False) -> Any:
  """NamedShardings for every leaf of a TrainState or params pytree (of
  ShapeDtypeStructs), given the parameters' logical ``axes`` (``Task.param_axes``):
  ``state_specs`` on ``mesh``."""
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec),
                      state_specs(abstract, dict(mesh.shape), axes, zero1))


def state_specs(abstract: Any, shape: Mapping[str, int], axes: Any, zero1: bool = False) -> Any:
  """PartitionSpecs of ``state_shardings`` on a mesh of ``shape``: parameters by
  ``param_spec``; an optimizer moment (a leaf whose path ends in a parameter's path, with
  its rank) the same, plus ``data`` with ``zero1``; everything else (step, counts, the
  rng) replicated."""
  by_path = {_keys(p): a for p, a in jax.tree_util.tree_leaves_with_path(axes)}

  def leaf(path, x):
    keys = _keys(path)
    names = next((by_path[keys[i:]] for i in range(len(keys)) if keys[i:] in by_path), None)
    if names is None or len(names) != x.ndim:
      return P()
    spec = param_spec(names, tuple(x.shape), shape)
    if zero1 and "opt_state" in keys[:1]:
      spec = zero1_spec(spec, tuple(x.shape), shape["data"], shape["fsdp"],
                        tuple(names)[:1] == ("layers",) and x.ndim > 1)
    return spec

  return jax.tree_util.tree_map_with_path(leaf, abstract)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """(grad_accum, micro_batch, ...): micro-batch split over all devices."""
  return NamedSharding(mesh, P(None, BATCH_AXES))


def eval_batch_sharding(mesh: Mesh) -> NamedSharding:
  """(batch, ...): split over all devices."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch(batch_size: int, grad_accum: int, mesh: Mesh) -> None:
  """One clear ValueError when the batch cannot be split over devices and hosts."""
  n, hosts = mesh.size, jax.process_count()
  micro = batch_size // grad_accum
  if micro % n:
    raise UserError(
        f"batch_size={batch_size} / grad_accum={grad_accum} = {micro} examples per "
        f"micro-batch is not divisible by the {n} devices "
        f"(mesh data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']})")
  if batch_size % hosts:
    raise UserError(f"batch_size={batch_size} is not divisible by the {hosts} hosts")


def host_batch_size(batch_size: int) -> int:
  """Examples this process reads per update."""
  return batch_size // jax.process_count()


def global_batch(local: Mapping[str, np.ndarray], grad_accum: int,
                 sharding: NamedSharding) -> dict[str, jax.Array]:
  """This host's (B_host, ...) arrays -> global (grad_accum, B/grad_accum, ...) arrays.

  Micro-batch i holds rows ``[i*b, (i+1)*b)`` of each host's batch, ``b = B_host/k``.
  """
  out = {}
  hosts = jax.process_count()
  for key, x in local.items():
    x = np.asarray(x)
    micro = x.reshape(grad_accum, x.shape[0] // grad_accum, *x.shape[1:])
    shape = (grad_accum, micro.shape[1] * hosts, *x.shape[1:])
    out[key] = jax.make_array_from_process_local_data(sharding, micro, shape)
  return out


def all_hosts_have(have: bool) -> bool:
  """Whether every process has ``have`` (one tiny all-gather when there are several),
  so hosts whose evaluation sets give different batch counts stop together instead
  of one waiting forever in the collective eval step."""
  if jax.process_count() == 1:
    return have
  from jax.experimental import multihost_utils
  return bool(np.min(multihost_utils.process_allgather(np.int32(have))))


def global_eval_batch(local: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  hosts = jax.process_count()
  return {k: jax.make_array_from_process_local_data(
      sharding, np.asarray(x), (x.shape[0] * hosts, *x.shape[1:])) for k, x in local.items()}
