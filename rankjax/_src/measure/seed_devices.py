"""Where the Jacobian study's seeds run: a mesh of this process's devices, the number
of seeds vmapped together on one device (``jacobians.make_study_fn``), and, for a study
split across the processes of a ``jax.distributed`` job, each process's block of seeds
and the gather of every block.

A study's mesh holds ``jax.local_devices()`` only. By default a study is process-local:
several processes each measure their own study without touching another process's
devices (``rankjax reproduce`` runs its scripts on process 0 alone). A study with
``StudyOptions(across_processes=True)`` is called by every process: process p measures
the p-th contiguous block of the seeds (``process_seed_blocks``) on its local devices,
and ``gather_seed_blocks`` hands every process all seeds' results in the seed order
(JAX's ``multihost_utils.process_allgather``). On CPU one seed runs at a time for d >= 128 (its O(L d^2) working set
stays in cache; vmapping all seeds ran the DP ~1.4x slower); on GPU/TPU seeds are
vmapped in groups that fit in half of the device's free memory.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rankjax._src.config import MLPConfig


def seed_mesh(num_seeds: int, devices=None) -> Mesh:
  """A 1-D ``seeds`` mesh over this process's devices (``jax.local_devices()``: a
  process measures its seeds on its own devices, alone or as its block of a study split
  across processes)."""
  devices = list(jax.local_devices() if devices is None else devices)
  n = max(k for k in range(1, len(devices) + 1) if num_seeds % k == 0)
  return Mesh(np.array(devices[:n]), ("seeds",))


def process_seed_blocks(num_seeds: int, process_count: int) -> list[range]:
  """Each process's seeds: contiguous blocks in seed order, the first ``num_seeds %
  process_count`` processes one seed more. A process without a seed is refused."""
  if num_seeds < process_count:
    raise ValueError(f"num_seeds={num_seeds} is fewer than the {process_count} processes "
                     "of this job: a study across processes needs a seed per process")
  size, extra = divmod(num_seeds, process_count)
  starts = [p * size + min(p, extra) for p in range(process_count + 1)]
  return [range(a, b) for a, b in zip(starts[:-1], starts[1:])]


def gather_seed_blocks(local: dict, blocks: list[range]) -> dict:
  """Every process's per-seed arrays (leading axis: this process's block of
  ``blocks``), gathered on every process in seed order as numpy arrays.

  ``process_allgather`` needs one shape on every process, so each block is padded to
  the largest with zeros (never read) and cut back after the gather. Every process of
  the job must call this.
  """
  from jax.experimental import multihost_utils

  width = max(len(b) for b in blocks)
  pad = lambda x: np.pad(np.asarray(x), [(0, width - x.shape[0])] + [(0, 0)] * (x.ndim - 1))
  gathered = multihost_utils.process_allgather(jax.tree.map(pad, local), tiled=False)
  return jax.tree.map(
      lambda g: np.concatenate([g[p, :len(b)] for p, b in enumerate(blocks)]), gathered)


# Per-device memory a study may use when the device does not report its memory
# (``Device.memory_stats()`` is None or lacks ``bytes_limit``).
DEFAULT_DEVICE_MEMORY_BUDGET = 4 << 30


def study_bytes_per_seed(cfg: MLPConfig, num_inputs: int, with_paths: bool) -> int:
  """Working set of one seed in the study, in bytes (an upper estimate): its weights,
  and per input the K, B and G block Jacobians, every dh_l/dh_0, the DP state and the
  running-product/SVD copies, each ``(L or L+1) x d x d``."""
  itemsize = jnp.dtype(cfg.param_dtype).itemsize
  L, d, m = cfg.depth, cfg.width, cfg.hidden_width
  weights = L * d * m * cfg.branch_matrices
  per_input = (3 + 2) * L * d * d + (2 * (L + 1) * d * d if with_paths else 0)
  return itemsize * (weights + num_inputs * per_input)


def default_seed_batch(cfg: MLPConfig, num_inputs: int, local_seeds: int, with_paths: bool,
                       device) -> int:
  """Seeds vmapped together on one device.

  CPU: 1 for d >= 128 (one seed's O(L d^2) working set stays in cache; vmapping all
  seeds ran the DP ~1.4x slower), else every local seed. GPU/TPU: as many seeds as fit
  in half of the device's free memory (``memory_stats()``: ``bytes_limit -
  bytes_in_use``; ``DEFAULT_DEVICE_MEMORY_BUDGET`` where not reported) at
  ``study_bytes_per_seed`` each, at most every local seed.
  """
  if device.platform == "cpu":
    return 1 if cfg.width >= 128 else local_seeds
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:   # some backends raise instead of returning None
    stats = None
  if stats and "bytes_limit" in stats:
    budget = (stats["bytes_limit"] - stats.get("bytes_in_use", 0)) // 2
  else:
    budget = DEFAULT_DEVICE_MEMORY_BUDGET
  per_seed = study_bytes_per_seed(cfg, num_inputs, with_paths)
  return int(max(1, min(local_seeds, budget // max(per_seed, 1))))


