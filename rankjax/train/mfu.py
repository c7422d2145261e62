"""Model FLOPs utilization against the device's spec peak (maxtext / levanter style).

MFU = model FLOPs per second per device / the device's published dense peak at the
compute dtype. Model FLOPs are ``Task.flops_per_example`` (PaLM App B: 6N per token
plus 12 L T d for attention), so rematerialized recomputation does not count. The
loop logs ``mfu`` with causal attention's products at half (6 L T d, what a causal
kernel computes; MaxText's count) and ``mfu_full_attention`` with them whole (PaLM's).

The peaks are the vendors' dense (no sparsity) numbers per chip:

| device          | bf16 TFLOP/s | f32 TFLOP/s (non-tensor-core)          |
|-----------------|--------------|----------------------------------------|
| A100 (SXM)      | 312          | 19.5                                   |
| H100 SXM / H200 | 989          | 67                                     |
| H100 PCIe       | 756          | 51                                     |
| TPU v4          | 275          | -                                      |
| TPU v5e         | 197          | -                                      |
| TPU v5p         | 459          | -                                      |
| TPU v6e         | 918          | -                                      |

TPUs publish no float32 peak (float32 matmuls run as several bf16 MXU passes), and a
CPU has no spec peak here: for those ``spec_peak`` returns None and the loop logs no
MFU (the benchmarks measure a same-run matmul peak instead).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# (substring of jax's device_kind, lower case) -> {dtype name: FLOP/s}; first match wins.
SPEC_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("h100 pcie", {"bfloat16": 756e12, "float32": 51e12}),
    ("h200", {"bfloat16": 989e12, "float32": 67e12}),
    ("h100", {"bfloat16": 989e12, "float32": 67e12}),
    ("a100", {"bfloat16": 312e12, "float32": 19.5e12}),
    ("tpu v6 lite", {"bfloat16": 918e12}),
    ("tpu v6e", {"bfloat16": 918e12}),
    ("tpu v5 lite", {"bfloat16": 197e12}),
    ("tpu v5e", {"bfloat16": 197e12}),
    ("tpu v5p", {"bfloat16": 459e12}),
    ("tpu v5", {"bfloat16": 459e12}),
    ("tpu v4 lite", {}),   # v4i: an inference chip with its own peak; no entry
    ("tpu v4", {"bfloat16": 275e12}),
)


def spec_peak(device_kind: str, dtype) -> float | None:
  """The published dense peak FLOP/s of one device of ``device_kind`` at ``dtype``.

  ``device_kind`` as ``jax.Device.device_kind`` spells it ("NVIDIA H200", "TPU v5 lite").
  None when the kind or the dtype has no entry in ``SPEC_PEAKS``.
  """
  kind = device_kind.lower()
  name = jnp.dtype(dtype).name
  for key, peaks in SPEC_PEAKS:
    if key in kind:
      return peaks.get(name)
  return None


def mfu(flops_per_step: float, step_time_s: float, num_devices: int,
        peak_per_device: float | None) -> float | None:
  """Model FLOPs utilization of one step: FLOPs / time / (devices * peak); None w/o peak."""
  if peak_per_device is None or step_time_s <= 0:
    return None
  return flops_per_step / step_time_s / (num_devices * peak_per_device)


def local_spec_peak(dtype) -> float | None:
  """``spec_peak`` of this process's first device (all devices of a run are one kind)."""
  return spec_peak(jax.devices()[0].device_kind, dtype)
