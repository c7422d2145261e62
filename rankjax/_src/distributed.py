"""Multi-host start-up: JAX's own distributed runtime, joined when the environment says
several processes run.

``maybe_initialize_distributed`` calls ``jax.distributed.initialize()`` when the
environment says so (SLURM with more than one task, a multi-worker TPU slice, or
``JAX_COORDINATOR_ADDRESS`` / ``RANKJAX_DISTRIBUTED=1``); every command that may run on
several hosts (``rankjax train``, ``reproduce``, ``measure``) calls it before any other
JAX call. ``wait_for_every_process`` is a named barrier of the joined processes.
"""

from __future__ import annotations

import os
from typing import Mapping

import jax


def _tpu_chips() -> int:
  """TPU chips attached to this machine (PCI scan; starts no backend)."""
  try:
    from jax._src import hardware_utils
    return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
  except Exception:  # noqa: BLE001 - a JAX without the helper: no TPU detection
    return 0


def multi_host_env(env: Mapping[str, str] | None = None) -> str | None:
  """The reason to call ``jax.distributed.initialize()``, or None on one host."""
  env = os.environ if env is None else env
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
  if env is os.environ and "JAX_PLATFORMS" not in env and _tpu_chips() > 0:
    return "Cloud TPU VM (JAX asks the TPU metadata server for the workers)"
  return None


def _tasks_per_node(env: Mapping[str, str]) -> int:
  """SLURM tasks on this node: SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE
  ("8(x2),4"; this node's entry is not known, so the first)."""
  if env.get("SLURM_NTASKS_PER_NODE"):
    return int(env["SLURM_NTASKS_PER_NODE"])
  first = env.get("SLURM_TASKS_PER_NODE", "1").split(",")[0]
  return int(first.split("(")[0] or 1)


def slurm_local_device_ids(env: Mapping[str, str]) -> list[int] | None:
  """The GPU ordinals this SLURM task drives, for ``jax.distributed.initialize``.

  JAX's SLURM detection sets ``local_device_ids=[SLURM_LOCALID]``, wrong in both
  launcher modes: with one task per GPU and ``--gpus-per-task=1`` each task sees
  one GPU (ordinal 0) so local ranks 1-7 ask for a missing device; with one task
  per node it drives 1 of 8 GPUs. Here:

  * ``RANKJAX_LOCAL_DEVICE_IDS="0,1"`` wins when set;
  * one task per node: every visible GPU (``CUDA_VISIBLE_DEVICES``, else
    ``SLURM_GPUS_ON_NODE``);
  * several tasks per node, each bound to its own GPUs (``--gpus-per-task=N``: SLURM
    sets ``SLURM_GPUS_PER_TASK`` and narrows ``CUDA_VISIBLE_DEVICES`` to them, fewer
    than ``SLURM_GPUS_ON_NODE``): every GPU the task sees;
  * several tasks per node that all see the node's GPUs: the task's
    ``SLURM_LOCALID``-th equal block of them.

  None when not under SLURM or the GPU count is unknown (JAX's default).
  """
  if env.get("RANKJAX_LOCAL_DEVICE_IDS"):
    return [int(i) for i in env["RANKJAX_LOCAL_DEVICE_IDS"].split(",")]
  if "SLURM_PROCID" not in env:
    return None
  visible = env.get("CUDA_VISIBLE_DEVICES")
  if visible:
    count = len([v for v in visible.split(",") if v.strip()])
  elif env.get("SLURM_GPUS_ON_NODE"):
    count = int(env["SLURM_GPUS_ON_NODE"])
  else:
    return None
  tasks = _tasks_per_node(env)
  on_node = int(env.get("SLURM_GPUS_ON_NODE") or 0)
  own = (count == 1 or env.get("SLURM_GPUS_PER_TASK", "").isdigit()
         and int(env["SLURM_GPUS_PER_TASK"]) == count
         or (visible is not None and 0 < count < on_node))
  if tasks <= 1 or own:
    return list(range(count))
  per_task = max(count // tasks, 1)
  local = int(env.get("SLURM_LOCALID", "0"))
  return list(range(local * per_task, (local + 1) * per_task))


def maybe_initialize_distributed() -> bool:
  """Calls ``jax.distributed.initialize()`` (cluster auto-detection) when multi-host.

  Must run before any other JAX call. Explicit ``JAX_COORDINATOR_ADDRESS`` /
  ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` win; under SLURM the local devices are
  ``slurm_local_device_ids``; on a Cloud TPU VM JAX's own detection finds the
  workers (a single-worker VM then trains alone). Returns whether it initialized.
  """
  reason = multi_host_env()
  if reason is None or jax.distributed.is_initialized():
    return False
  env = os.environ
  local = slurm_local_device_ids(env)
  address = env.get("JAX_COORDINATOR_ADDRESS")
  if address:
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=int(env["JAX_NUM_PROCESSES"]),
        process_id=int(env["JAX_PROCESS_ID"]), local_device_ids=local)
  elif reason.startswith("Cloud TPU VM"):
    try:
      jax.distributed.initialize()
    except (ValueError, RuntimeError) as e:  # one worker: nothing to join
      import logging
      logging.getLogger("rankjax._src.train").info("single TPU worker (%s)", e)
      return False
  else:
    jax.distributed.initialize(local_device_ids=local)
  return True


def wait_for_every_process(name: str, timeout_s: float = 7 * 24 * 3600) -> None:
  """Blocks until every process of the job reaches ``name`` (nothing on one process).

  A barrier of JAX's distributed runtime (its coordination service), not a device
  collective: a process may wait here for hours while process 0 analyses what all of
  them trained (``rankjax reproduce``); exiting instead would end that process's part
  of the job before process 0 is done (its shutdown barrier times out).
  """
  if jax.process_count() <= 1:
    return
  from jax._src import distributed
  distributed.global_state.client.wait_at_barrier(name, int(timeout_s * 1000))


def barrier(name: str) -> None:
  """Waits until every process reaches ``name`` (nothing to wait for on one): a device
  collective (``sync_global_devices``), for the short waits around a checkpoint's
  files; ``wait_for_every_process`` for the long ones."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
