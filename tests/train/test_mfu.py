"""The spec-peak table and MFU arithmetic (rankjax.train.mfu)."""

import jax.numpy as jnp
import pytest

from rankjax.train import mfu


@pytest.mark.parametrize("kind, dtype, peak", [
    ("NVIDIA H200", jnp.bfloat16, 989e12),
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
    ("NVIDIA H100 PCIe", "bfloat16", 756e12),
    ("NVIDIA A100-SXM4-80GB", jnp.float32, 19.5e12),
    ("TPU v4", "bfloat16", 275e12),
    ("TPU v5 lite", "bfloat16", 197e12),
    ("TPU v5", "bfloat16", 459e12),
    ("TPU v5p", "bfloat16", 459e12),
    ("TPU v6 lite", "bfloat16", 918e12),
])
def test_spec_peak_per_device_kind(kind, dtype, peak):
  assert mfu.spec_peak(kind, dtype) == peak


@pytest.mark.parametrize("kind, dtype", [
    ("cpu", "float32"), ("TPU v5 lite", "float32"), ("TPU v4 lite", "bfloat16"),
    ("Some Future GPU", "bfloat16")])
def test_no_peak_gives_no_mfu(kind, dtype):
  peak = mfu.spec_peak(kind, dtype)
  assert peak is None
  assert mfu.mfu(1e12, 1.0, 1, peak) is None


def test_mfu_arithmetic():
  # 8 H200s doing 3.956e15 model FLOPs per step in 1 s: half the bf16 peak.
  peak = mfu.spec_peak("NVIDIA H200", "bfloat16")
  assert mfu.mfu(0.5 * 8 * 989e12, 1.0, 8, peak) == pytest.approx(0.5)
  assert mfu.mfu(1e12, 0.0, 1, peak) is None
