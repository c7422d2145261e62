"""Device mesh, parameter and batch shardings, multi-host start-up and batches.

The mesh has two axes, ``("data", "fsdp")``. Every array of the train state
(parameters and the optimizer moments alike) is sharded over ``fsdp`` along its
largest dimension that ``fsdp`` divides, never along the leading layer axis of a
stacked (scanned) parameter, so a layer's weights are gathered one layer at a time;
arrays with no such dimension are replicated. Parameters are replicated over
``data``. Batches arrive as (grad_accum, micro_batch, ...) and are split along the
micro-batch axis over ``("data", "fsdp")``, all devices together.

Multi-host: ``maybe_initialize_distributed`` calls ``jax.distributed.initialize()``
when the environment says several processes run (SLURM with more than one task, a
multi-worker TPU slice, or ``JAX_COORDINATOR_ADDRESS`` / ``RANKJAX_DISTRIBUTED=1``);
each process then reads its own shard of the data (``host_batch_size``) and
``global_batch`` assembles the process-local arrays into global ones.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rankjax.train.tasks import is_stacked

AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")


def multi_host_env() -> str | None:
  """The reason to call ``jax.distributed.initialize()``, or None on one host."""
  env = os.environ
  if env.get("RANKJAX_DISTRIBUTED") == "1":
    return "RANKJAX_DISTRIBUTED=1"
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return "JAX_COORDINATOR_ADDRESS"
  if int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in env:
    return f"SLURM with {env['SLURM_NTASKS']} tasks"
  hosts = env.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts:
    return f"TPU slice with {hosts.count(',') + 1} workers"
  if int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
    return f"Open MPI with {env['OMPI_COMM_WORLD_SIZE']} processes"
  return None


def maybe_initialize_distributed() -> bool:
  """Calls ``jax.distributed.initialize()`` (cluster auto-detection) when multi-host.

  Must run before any other JAX call. Returns whether it initialized.
  """
  reason = multi_host_env()
  if reason is None or jax.distributed.is_initialized():
    return False
  address = os.environ.get("JAX_COORDINATOR_ADDRESS")
  if address:
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]))
  else:
    jax.distributed.initialize()
  return True


def make_mesh(data: int = 0, fsdp: int = 1, devices: Any = None) -> Mesh:
  """Mesh ``(data, fsdp)`` over all devices; ``data=0`` takes what fsdp leaves."""
  devices = list(devices if devices is not None else jax.devices())
  n = len(devices)
  if data == 0:
    if n % fsdp:
      raise ValueError(f"mesh_fsdp={fsdp} does not divide the {n} devices")
    data = n // fsdp
  if data * fsdp != n:
    raise ValueError(f"mesh data={data} x fsdp={fsdp} = {data * fsdp} devices, "
                     f"but {n} are available; set mesh_data=0 to use all of them")
  axis_types = (jax.sharding.AxisType.Auto,) * 2
  return jax.make_mesh((data, fsdp), AXES, axis_types=axis_types, devices=devices)


def spec_for(shape: tuple[int, ...], fsdp: int, stacked: bool) -> P:
  """Shard the largest dimension ``fsdp`` divides (ties: the later one)."""
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


def state_shardings(abstract: Any, mesh: Mesh, stacked_roots: tuple[str, ...]) -> Any:
  """NamedShardings for every leaf of a state/params pytree (of ShapeDtypeStructs)."""
  fsdp = mesh.shape["fsdp"]

  def leaf(path, x):
    return NamedSharding(mesh, spec_for(tuple(x.shape), fsdp, is_stacked(path, stacked_roots)))

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
    raise ValueError(
        f"batch_size={batch_size} / grad_accum={grad_accum} = {micro} examples per "
        f"micro-batch is not divisible by the {n} devices "
        f"(mesh data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']})")
  if batch_size % hosts:
    raise ValueError(f"batch_size={batch_size} is not divisible by the {hosts} hosts")


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


def global_eval_batch(local: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  hosts = jax.process_count()
  return {k: jax.make_array_from_process_local_data(
      sharding, np.asarray(x), (x.shape[0] * hosts, *x.shape[1:])) for k, x in local.items()}
