"""FFN branch Jacobians of Llama-family checkpoints (SwiGLU gate/up/down), from safetensors.

A Llama-family decoder (Llama, Mistral, Qwen2, ...: Hugging Face ``LlamaForCausalLM``
layout) is Pre-RMSNorm; its FFN sublayer on the stream h (one token, d) is

    FFN(h) = W_down (silu(W_gate x) * (W_up x)),   x = RMSNorm(h) * w_ln,

with torch ``Linear`` weights stored as (out, in): W_gate, W_up are (m, d), W_down is
(d, m) (the paper's column convention, "Transforming Rank" Sec 2). Its Jacobian in h is
the SwiGLU case of Eq. 9 / 25 with the Pre-Norm input Jacobian (Table 2),

    J = W_down [diag(silu'(g) * u) W_gate + diag(silu(g)) W_up] J_RMS(h),
    g = W_gate x,  u = W_up x,  J_RMS(h) = diag(w_ln) (1/r)(I - v v^T),

``r = sqrt(mean(h^2) + eps)``, ``v = h / (sqrt(d) r)`` (App B.1, Eq. 19). One
``d x m x d`` GEMM per block. ``load_llama_ffn`` reads ``model.safetensors`` or a sharded
checkpoint (``model.safetensors.index.json``); bf16/fp16 tensors are cast to float32.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import re

import jax
import numpy as np

from rankjax.measure import engine
from rankjax.measure import precision as precision_lib
from rankjax.models import activations, gpt2, hf_llama, norms

Array = jax.Array
DEFAULT_RMS_EPS = 1e-5   # LlamaConfig.rms_norm_eps for Llama 2/3; read from config.json

# Our stacked names -> the per-layer names after "model.layers.{i}."
FFN_TENSORS = {"ln_scale": "post_attention_layernorm.weight",
               "gate_w": "mlp.gate_proj.weight", "up_w": "mlp.up_proj.weight",
               "down_w": "mlp.down_proj.weight"}
_LAYER = re.compile(r"(?:model\.)?layers\.(\d+)\.mlp\.gate_proj\.weight$")


def load_llama_ffn(path: str | os.PathLike) -> dict:
  """The FFN tensors of every layer, stacked: ``{"ln_scale": (L, d), "gate_w": (L, m, d),
  "up_w": (L, m, d), "down_w": (L, d, m), "rms_eps": float}`` in float32.

  ``path``: a ``.safetensors`` file or a checkpoint folder (single or sharded); names
  may carry the ``model.`` prefix or not. ``rms_eps`` comes from the folder's
  ``config.json`` (``rms_norm_eps``) when present, else ``DEFAULT_RMS_EPS``.
  Raises FileNotFoundError / ValueError (one line) for a missing or bad checkpoint.
  """
  path = pathlib.Path(path)
  where = hf_llama.tensor_files(path)
  layers = {int(m.group(1)) for n in where if (m := _LAYER.match(n))}
  if not layers:
    raise ValueError(f"{path}: no Llama FFN layers ('model.layers.0.mlp.gate_proj.weight', ...)")
  prefix = "model." if any(n.startswith("model.layers.") for n in where) else ""
  num_layers = max(layers) + 1
  wanted = {(i, k): f"{prefix}layers.{i}.{v}" for i in range(num_layers)
            for k, v in FFN_TENSORS.items()}
  missing = [n for n in wanted.values() if n not in where]
  if missing:
    raise ValueError(f"{path}: missing tensor(s) {', '.join(missing[:4])}"
                     + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
  by_file: dict[pathlib.Path, list[str]] = {}
  for name in wanted.values():
    by_file.setdefault(where[name], []).append(name)
  raw = {}
  for file, names in by_file.items():
    raw.update(gpt2.read_safetensors(file, names))
  m, d = raw[wanted[(0, "gate_w")]].shape
  shapes = {"ln_scale": (d,), "gate_w": (m, d), "up_w": (m, d), "down_w": (d, m)}
  for (i, k), name in wanted.items():
    if raw[name].shape != shapes[k]:
      raise ValueError(f"{path}: {name} has shape {raw[name].shape}, expected {shapes[k]} "
                       f"(d={d}, d_ff={m})")
  out = {k: np.stack([raw[wanted[(i, k)]].astype(np.float32) for i in range(num_layers)])
         for k in FFN_TENSORS}
  eps = DEFAULT_RMS_EPS
  config = (path if path.is_dir() else path.parent) / "config.json"
  if config.is_file():
    try:
      eps = float(json.loads(config.read_text()).get("rms_norm_eps", eps))
    except (json.JSONDecodeError, TypeError, ValueError):
      raise ValueError(f"{config}: not a JSON config with a numeric rms_norm_eps") from None
  out["rms_eps"] = eps
  return out


def llama_ffn_tensors(ffn: dict, prefix: str = "model.") -> dict[str, np.ndarray]:
  """The inverse of ``load_llama_ffn``: per-layer names -> arrays (for writing files)."""
  return {f"{prefix}layers.{i}.{v}": np.asarray(ffn[k][i])
          for k, v in FFN_TENSORS.items() for i in range(np.shape(ffn[k])[0])}


def ffn_branch(block: dict, h_D: Array, eps: float = DEFAULT_RMS_EPS) -> Array:
  """``FFN(RMSNorm(h))`` of one block (SwiGLU)."""
  x = norms.normalize(h_D, "rms", eps) * block["ln_scale"]
  return block["down_w"] @ (activations.silu(block["gate_w"] @ x) * (block["up_w"] @ x))


@precision_lib.measured
def ffn_jacobian(block: dict, h_D: Array, eps: float = DEFAULT_RMS_EPS) -> Array:
  """``J = dFFN(RMSNorm(h))/dh`` in closed form, (d, d) (module docstring; Eq. 9, 19)."""
  x = norms.normalize(h_D, "rms", eps) * block["ln_scale"]
  g, u = block["gate_w"] @ x, block["up_w"] @ x
  dsilu = activations.silu_derivative(g)
  core_MxD = (dsilu * u)[:, None] * block["gate_w"] + activations.silu(g)[:, None] * block["up_w"]
  core_MxD = norms.jacobian_right(core_MxD, h_D, "rms", eps,
                                 scale_D=block["ln_scale"])
  return block["down_w"] @ core_MxD


def ffn_block(eps: float = DEFAULT_RMS_EPS) -> engine.ResidualBlock:
  """The engine's block of a Llama FFN sublayer ``h + FFN(RMSNorm(h))`` (one token;
  Pre-RMSNorm: K = I) with its closed form (``ffn_jacobian``). Its parameters: one
  layer's slice of ``load_llama_ffn``'s arrays (``FFN_TENSORS``)."""
  return engine.ResidualBlock(
      branch=lambda block, h_D: ffn_branch(block, h_D, eps),
      branch_jacobian=lambda block, h_D: (ffn_branch(block, h_D, eps),
                                          ffn_jacobian(block, h_D, eps)))


@functools.partial(jax.jit, static_argnames=("eps", "precision"))
@precision_lib.measured
def ffn_jacobians(blocks: dict, h_LxD: Array, eps: float = DEFAULT_RMS_EPS) -> Array:
  """``J_l`` of every block at its stream ``h_l``, ``(L, d, d)``, jitted (``lax.map``:
  one block's m x d intermediate at a time; ``engine.block_terms`` of ``ffn_block``).
  ``blocks``: ``load_llama_ffn``'s arrays (without ``rms_eps``, which is passed as
  ``eps``)."""
  blocks = {k: blocks[k] for k in FFN_TENSORS}
  block = ffn_block(eps)
  return jax.lax.map(lambda a: engine.block_terms(block, a[0], a[1]).branch, (blocks, h_LxD))
