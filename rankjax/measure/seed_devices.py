"""Where the Jacobian study's seeds run: a mesh of this process's devices and the number
of seeds vmapped together on one device (``jacobians.make_study_fn``).

A study is process-local: its mesh holds ``jax.local_devices()`` only, so several
processes (``jax.distributed``) each measure their own seeds without touching another
process's devices. On CPU one seed runs at a time for d >= 128 (its O(L d^2) working set
stays in cache; vmapping all seeds ran the DP ~1.4x slower); on GPU/TPU seeds are
vmapped in groups that fit in half of the device's free memory.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rankjax.config import MLPConfig


def seed_mesh(num_seeds: int, devices=None) -> Mesh:
  """A 1-D ``seeds`` mesh over this process's devices (``jax.local_devices()``: a study
  is process-local, so several processes each measure their own seeds)."""
  devices = list(jax.local_devices() if devices is None else devices)
  n = max(k for k in range(1, len(devices) + 1) if num_seeds % k == 0)
  return Mesh(np.array(devices[:n]), ("seeds",))


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


