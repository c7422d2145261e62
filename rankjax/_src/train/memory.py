"""Peak memory per device of a training step, estimated; ``lm.kernels.remat="auto"`` chosen by it.

``estimate`` is the one estimate of the library, for planning away from the target
devices (the experiments' plan and refusals on a CPU, ``rankjax._src.train.plan``)
where nothing is compiled: a ``--plan --target KIND:N`` plans by XLA:CPU's analysis of
the step compiled on N host devices instead (``rankjax._src.train.plan_memory``, labelled
uncorrected), and falls back to this estimate beyond its device cap or with
``RANKJAX_PLAN_MEMORY=estimate``.
On the devices themselves the peak is XLA's own: ``resolve_remat`` replaces
``remat="auto"`` by the cheapest policy whose compiled step's peak
(``loop.compiled_peak_bytes``: ``memory_analysis`` of the compiled program) fits in
``AUTO_SHARE`` of a device's memory (``memory_stats()['bytes_limit']``): none (no
recompute), then dots, then full. Where the device reports no limit (XLA:CPU) it keeps
``transformer.REMAT_AUTO_FALLBACK``. The estimate is not calibrated against a device
compiler (nor is XLA:CPU's analysis of the same step, which computes bfloat16 matmuls
in float32: on the 48-layer d=512 step with remat none on 8 host devices it gives 27.9
GB, the estimate 11.2 GB); the device check records each paper step's compiled peak. The choice is a pure function of the config, the
device count and that limit, so a resumed run on the same devices gets the same policy;
the checkpoint's config keeps "auto" (``rankjax train`` prints the choice at start-up).
Each process reads its own first device's limit: the hosts of a job are assumed alike
(same devices, same XLA memory settings), as they must compile the same step.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from rankjax._src.config import TrainConfig
from rankjax._src.models.transformer import REMAT_AUTO_FALLBACK

AUTO_SHARE = 0.85          # of a device's memory a remat="auto" choice may plan to use
AUTO_ORDER = ("none", "dots", "full")     # cheapest recompute first


def param_count(cfg: TrainConfig) -> int:
  """Parameters of ``cfg``'s model (``jax.eval_shape`` of its init: nothing allocated)."""
  from rankjax._src.train import tasks
  shapes = jax.eval_shape(tasks.make_task(cfg).init, jax.random.key(0))
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))


def estimate(cfg: TrainConfig, num_devices: int, params: int, remat: str | None = None
             ) -> dict[str, float]:
  """Estimated peak bytes per device of the training step (an estimate, not a
  measurement: the device check measures it), for ``params`` parameters and the remat
  policy ``remat`` (default ``cfg.model.kernels.remat``; "auto" counts as its fallback).

  State: float32 parameters, gradients and AdamW's two moments (16 bytes a parameter)
  plus a compute-dtype copy, split over ``mesh_fsdp`` devices (all of them when it is 0
  or larger than the count). Activations of one micro-batch (``batch_size / grad_accum``
  split over the devices), in the compute dtype per layer: ``remat=dots`` keeps the
  matmul outputs, about (5 d + 2 d_ff) per token (SwiGLU's gate and up; GELU: d_ff
  once), ``none`` about 3x that, ``full`` the layer input (d); the chunked head adds
  ``loss_chunk`` x vocabulary float32 logits and their gradient (the whole micro-batch's
  when ``loss_chunk`` is 0). An MLP keeps width x depth x (1 + expansion) per example.
  """
  width = 2 if cfg.compute_dtype == "bfloat16" else 4
  fsdp = cfg.mesh_fsdp if 0 < cfg.mesh_fsdp <= num_devices else num_devices
  state = params * (16 + (width if width != 4 else 0)) / max(fsdp, 1)
  micro = cfg.batch_size / max(cfg.grad_accum, 1) / max(num_devices, 1)
  if cfg.model.kind == "transformer":
    lm = cfg.model
    policy = remat or lm.kernels.remat
    policy = REMAT_AUTO_FALLBACK if policy == "auto" else policy
    dots = 5 * lm.d_model + (2 if lm.ffn == "swiglu" else 1) * lm.d_ff
    per_token = {"dots": dots, "none": 3 * dots, "full": lm.d_model}[policy]
    tokens = micro * cfg.seq_len
    acts = per_token * tokens * lm.num_layers * width
    head_rows = lm.kernels.loss_chunk if lm.kernels.loss_chunk else tokens
    head = 2 * min(head_rows, tokens) * lm.padded_vocab_size * 4
  else:
    m = cfg.model
    acts = micro * m.width * m.depth * (1 + m.expansion) * 4
    head = 0.0
  return {"parameters": float(params), "state": float(state), "activations": float(acts),
          "head": float(head), "total": float(state + acts + head),
          "devices": float(num_devices), "fsdp": float(fsdp)}


def device_limit() -> float | None:
  """Bytes XLA may allocate on one local device (``memory_stats()['bytes_limit']``), or
  None where the device reports none (XLA:CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  limit = stats.get("bytes_limit")
  return float(limit) if limit else None


def choose_remat(cfg: TrainConfig, num_devices: int, params: int, limit: float | None
                 ) -> tuple[str, dict[str, float]]:
  """``(policy, {policy: estimated peak bytes per device})``: the first of
  ``AUTO_ORDER`` whose estimate fits in ``AUTO_SHARE * limit`` (full when none fits),
  ``REMAT_AUTO_FALLBACK`` when ``limit`` is None."""
  peaks = {p: estimate(cfg, num_devices, params, p)["total"] for p in AUTO_ORDER}
  if limit is None:
    return REMAT_AUTO_FALLBACK, peaks
  fits = [p for p in AUTO_ORDER if peaks[p] <= AUTO_SHARE * limit]
  return (fits[0] if fits else AUTO_ORDER[-1]), peaks


def choose_remat_compiled(cfg: TrainConfig, limit: float,
                          measure: Callable[[TrainConfig], float | None]
                          ) -> tuple[str, dict[str, float]]:
  """``(policy, {policy: compiled peak bytes per device})``: the first of ``AUTO_ORDER``
  whose peak by ``measure`` (XLA's analysis of the step compiled with that policy:
  ``rankjax._src.train.loop.compiled_peak_bytes``) fits in ``AUTO_SHARE * limit``, measured
  in that order and no further than the first that fits (full when none does)."""
  peaks: dict[str, float] = {}
  for policy in AUTO_ORDER:
    peak = measure(with_remat(cfg, policy))
    if peak is None:
      raise ValueError("the backend gives no memory analysis of the compiled step")
    peaks[policy] = peak
    if peak <= AUTO_SHARE * limit:
      return policy, peaks
  return AUTO_ORDER[-1], peaks


def with_remat(cfg: TrainConfig, policy: str) -> TrainConfig:
  kernels = dataclasses.replace(cfg.model.kernels, remat=policy)
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kernels=kernels))


def resolve_remat(cfg: TrainConfig, num_devices: int, limit: float | None,
                  params: int | None = None,
                  measure: Callable[[TrainConfig], float | None] | None = None
                  ) -> tuple[TrainConfig, str | None]:
  """``(cfg with lm.kernels.remat="auto" replaced by the chosen policy, the one line that says
  the choice and the peaks)``; ``(cfg, None)`` when there is nothing to choose.
  ``num_devices``: the job's devices; ``limit``: ``device_limit()``; ``params``: the
  parameter count when the caller has it (else ``param_count``); ``measure``: the peak
  bytes of a config's compiled step (``loop.compiled_peak_bytes``): with a limit, the
  choice reads XLA's own analysis (:func:`choose_remat_compiled`), else the estimate
  (:func:`choose_remat`)."""
  if cfg.model.kind != "transformer" or cfg.model.kernels.remat != "auto":
    return cfg, None
  if measure is not None and limit is not None:
    policy, peaks = choose_remat_compiled(cfg, limit, measure)
    kind = "compiled peak GB per device (XLA's memory analysis)"
  else:
    params = param_count(cfg) if params is None else params
    policy, peaks = choose_remat(cfg, num_devices, params, limit)
    kind = "estimated peak GB per device"
  gb = ", ".join(f"{p} {peaks[p] / 1e9:.1f}" for p in AUTO_ORDER if p in peaks)
  budget = ("the device reports no memory limit: the fallback" if limit is None else
            f"{AUTO_SHARE:.0%} of {limit / 1e9:.1f} GB = {AUTO_SHARE * limit / 1e9:.1f} GB")
  line = f"remat auto -> {policy} ({kind}: {gb}; {budget})"
  return with_remat(cfg, policy), line
