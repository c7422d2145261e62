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

``HARDWARE``: the kinds a plan may target (``rankjax reproduce --plan --target
KIND:N``), each with its memory per device, devices per host and interconnect (the
vendors' spec sheets: NVIDIA's H100 / H200 / A100 SXM, Cloud TPU's system architecture
pages); its bf16 peak is ``spec_peak`` of its device kind (the table above).

| kind | device_kind (jax)      | HBM per device | per host | interconnect                       |
|------|------------------------|----------------|----------|------------------------------------|
| h100 | NVIDIA H100 80GB HBM3  | 80 GB          | 8        | NVLink 4, 900 GB/s per GPU         |
| h200 | NVIDIA H200            | 141 GB         | 8        | NVLink 4, 900 GB/s per GPU         |
| a100 | NVIDIA A100-SXM4-80GB  | 80 GB          | 8        | NVLink 3, 600 GB/s per GPU         |
| v4   | TPU v4                 | 32 GiB         | 4        | ICI, 3D torus                      |
| v5e  | TPU v5 lite            | 16 GB          | 8        | ICI, 2D torus, 400 GB/s per chip   |
| v5p  | TPU v5                 | 95 GB          | 4        | ICI, 3D torus, 4800 Gbps per chip  |
| v6e  | TPU v6 lite            | 32 GB          | 8        | ICI, 2D torus, 800 GB/s per chip   |

(GPU nodes join over InfiniBand / RoCE, slower than NVLink: FSDP beyond 8 GPUs pays it.)

``estimated_mfu``: the MFU a plan's device-hours assume for a step family on a hardware
kind where the device check measured none, each an estimate with its reasoning
(``MFU_ESTIMATES``, the one table):

| step family (config)                      | h100 / h200 / a100    | v4 / v5e / v5p / v6e |
|-------------------------------------------|-----------------------|----------------------|
| 48L d512 (postnorm_48l_d512_c4.json)      | 0.38 (32-44%, middle) | 0.32 (low end)       |
| 774M (gpt2_774m.json)                     | 0.465 (40-53%)        | 0.40                 |
| 774M, attention dropout, hash masks       | 0.42 (34-50%)         | 0.24 (query blocks)  |
| (the softmax study's paper scale)         |                       |                      |
| 774M, attention dropout, threefry masks   | 0.195 (15-24%)        | 0.15                 |
| any other config                          | 0.35                  | 0.35                 |

The ranges are issue 54's review of these steps on one H200 (their FLOPs, the fused
attention and the dropout path's cost, never run on a device); the hash-mask row is
``experiments/benchmarks/dropout_attention.py``'s FLOP / byte estimate of the fused Pallas
kernel (``rankjax._src.models.flash_dropout``, GPU only; a TPU runs the query blocks,
24-36%). A GPU kind takes the
middle of the H200 range (the same kernels; the A100 and H100 have less memory
bandwidth per FLOP, not measured either); a TPU kind its low end (no TPU measurement:
splash attention and ``launch/xla_flags.sh`` never ran on a TPU). Other configs: the
earlier single figure, 0.35 (the same review's 20-45% over the paper steps).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

from rankjax._src.errors import UserError

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


@dataclasses.dataclass(frozen=True)
class Hardware:
  """One kind of accelerator a plan may target (see the module docstring's table)."""
  name: str            # the --target spelling: h100, v5e, ...
  device_kind: str     # as jax.Device.device_kind spells it (spec_peak, the device check)
  memory_bytes: float  # HBM of one device
  per_host: int        # devices a host (node, TPU VM) drives
  interconnect: str

  @property
  def bf16_peak(self) -> float | None:
    return spec_peak(self.device_kind, "bfloat16")


HARDWARE: dict[str, Hardware] = {h.name: h for h in (
    Hardware("h100", "NVIDIA H100 80GB HBM3", 80e9, 8, "NVLink 4, 900 GB/s per GPU"),
    Hardware("h200", "NVIDIA H200", 141e9, 8, "NVLink 4, 900 GB/s per GPU"),
    Hardware("a100", "NVIDIA A100-SXM4-80GB", 80e9, 8, "NVLink 3, 600 GB/s per GPU"),
    Hardware("v4", "TPU v4", 32 * 2**30, 4, "ICI, 3D torus"),
    Hardware("v5e", "TPU v5 lite", 16e9, 8, "ICI, 2D torus, 400 GB/s per chip"),
    Hardware("v5p", "TPU v5", 95e9, 4, "ICI, 3D torus, 4800 Gbps per chip"),
    Hardware("v6e", "TPU v6 lite", 32e9, 8, "ICI, 2D torus, 800 GB/s per chip"),
)}


@dataclasses.dataclass(frozen=True)
class Target:
  """``devices`` devices of one ``hardware`` kind: what ``--target KIND:N`` plans for."""
  hardware: Hardware
  devices: int

  @property
  def hosts(self) -> int:
    return math.ceil(self.devices / self.hardware.per_host)

  def describe(self) -> str:
    hw = self.hardware
    peak = "-" if hw.bf16_peak is None else f"{hw.bf16_peak / 1e12:.0f}"
    return (f"{self.devices} x {hw.name} ({hw.device_kind}: {hw.memory_bytes / 1e9:.0f} GB "
            f"each, {peak} TFLOP/s bf16, {hw.interconnect}; {self.hosts} host"
            f"{'s' if self.hosts > 1 else ''})")


def parse_target(text: str) -> Target:
  """``KIND:N`` (``h200:8``, ``v5e:64``) as a :class:`Target`; anything else one line."""
  kind, _, count = text.strip().lower().partition(":")
  if kind not in HARDWARE or not count.isdigit() or int(count) < 1:
    raise UserError(f"--target {text!r}: write KIND:N with KIND one of {list(HARDWARE)} "
                    "and N a positive device count (e.g. h200:8, v5e:64)")
  return Target(HARDWARE[kind], int(count))


# step family -> (its test on a TrainConfig, the H200 range of issue 54's review)
MFU_ESTIMATES: tuple[tuple[str, Any, tuple[float, float]], ...] = (
    ("48L d512", lambda c: (c.model.num_layers, c.model.d_model) == (48, 512), (0.32, 0.44)),
    ("774M, attention dropout, hash masks", lambda c: (c.model.num_layers, c.model.d_model)
     == (36, 1280) and c.model.attn_dropout_rate > 0 and c.model.attn_dropout_mask == "hash",
     (0.34, 0.50)),
    ("774M, attention dropout", lambda c: (c.model.num_layers, c.model.d_model) == (36, 1280)
     and c.model.attn_dropout_rate > 0, (0.15, 0.24)),
    ("774M", lambda c: (c.model.num_layers, c.model.d_model) == (36, 1280), (0.40, 0.53)),
)
# a family whose H200 range rests on a GPU kernel: its TPU estimate, labelled
TPU_LOW = {"774M, attention dropout, hash masks": (0.24, (
    "estimate for 774M, attention dropout, hash masks on a TPU: the low end of the query "
    "blocks' 24-36% on one H200 (the fused Pallas kernel is GPU-only; "
    "experiments/benchmarks/dropout_attention.py; no TPU measurement)"))}
OTHER_MFU = 0.35     # a config of no family above
GPU_KINDS = ("h100", "h200", "a100")


def hardware_of(device_kind: str) -> Hardware | None:
  """The :data:`HARDWARE` kind of a ``jax.Device.device_kind`` (None: none of them)."""
  kind = device_kind.lower()
  exact = [h for h in HARDWARE.values() if h.device_kind.lower() == kind]
  if exact:
    return exact[0]
  near = [h for h in HARDWARE.values() if h.device_kind.lower() in kind
          or h.name in kind.replace(" ", "")]
  return max(near, key=lambda h: len(h.device_kind)) if near else None


def step_family(cfg) -> str | None:
  """The name of ``cfg``'s step family in :data:`MFU_ESTIMATES`, or None."""
  if getattr(cfg.model, "kind", None) != "transformer":
    return None
  return next((name for name, test, _ in MFU_ESTIMATES if test(cfg)), None)


def estimated_mfu(cfg, device_kind: str) -> tuple[float, str]:
  """``(mfu, source)``: the estimate for ``cfg``'s step family on ``device_kind`` (the
  module docstring's table), its label saying where it comes from."""
  hw = hardware_of(device_kind)
  family = step_family(cfg)
  if family is None:
    return OTHER_MFU, ("estimate for a config of no measured family: issue 54's review "
                       "put the paper steps at 20-45%")
  low, high = next(r for name, _, r in MFU_ESTIMATES if name == family)
  if hw is not None and hw.name not in GPU_KINDS:
    if family in TPU_LOW:    # the GPU range rests on a GPU-only kernel
      return TPU_LOW[family]
    return low, (f"estimate for {family} on {hw.name}: the low end of issue 54's "
                 f"{low:.0%}-{high:.0%} on one H200 (no TPU measurement)")
  return (low + high) / 2, (f"estimate for {family}: the middle of issue 54's "
                            f"{low:.0%}-{high:.0%} on one H200 (not measured)")


# what the device check (experiments/benchmarks/device_check.py) records in a checkout
DEVICE_CHECK_JSON = (pathlib.Path(__file__).resolve().parents[3] / "experiments" / "benchmarks"
                     / "device_check.json")


def mfu_for(cfg, device_kind: str) -> tuple[float, str]:
  """``(mfu, source)`` of ``cfg``'s device-hours on ``device_kind``: the device check's
  measurement where it recorded one on that kind (:func:`measured_mfu`), else the
  estimate for the config's step family on that kind
  (``rankjax._src.train.mfu.estimated_mfu``), each labelled."""
  measured = measured_mfu(device_kind)
  if measured:
    return measured, (f"measured by the device check on {device_kind} (the lower of its "
                      "paper steps; experiments/benchmarks/device_check.json)")
  return estimated_mfu(cfg, device_kind)


def measured_mfu(device_kind: str, path: pathlib.Path | None = None) -> float | None:
  """The training MFU the device check measured on ``device_kind``
  (``experiments/benchmarks/device_check.json``: ``{"train_mfu": {kind: mfu}}``, the lower
  of its two paper steps; written by ``device_check.py``), or None when it never ran
  there."""
  import json
  path = path or DEVICE_CHECK_JSON
  if not path.is_file():
    return None
  return (json.loads(path.read_text()).get("train_mfu") or {}).get(device_kind)
