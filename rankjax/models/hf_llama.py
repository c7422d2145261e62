"""Llama-family checkpoints in Hugging Face layout (Llama 2/3, Mistral, Qwen2) as
``DecoderLM`` parameters: the library's own model, the weights converted once.

A Llama-family decoder is ``DecoderLM`` with ``norm_position="pre"``, RMSNorm (gain, no
bias, ``rms_norm_eps``), a SwiGLU FFN (``w_1`` = gate, ``w_3`` = up, ``w_2`` = down),
RoPE (base ``rope_theta``), grouped-query attention (``num_key_value_heads``), q/k/v
biases for Qwen2, a final norm and a tied or untied head. Conversion:

  * torch ``Linear`` weights are (out, in); ``DecoderLM``'s are (in, out): transposed.
  * RoPE: transformers rotates the pairs ``(x_i, x_{i + d_head/2})`` of a head
    (``rotate_half``), ``attention.rope`` the pairs ``(x_{2i}, x_{2i+1})``, both with
    ``theta_i = base^(-2i/d_head)``. The q and k projections' output columns (and
    biases) are permuted within each head, ``ours[2i] = hf[i]``, ``ours[2i+1] =
    hf[i + d_head/2]``: the same permutation of q and k leaves every ``q . k`` and so the
    model unchanged (it undoes the permutation transformers' conversion script applies
    to Meta's checkpoints).

RoPE scaling: default, linear and llama3 (``attention.rope_frequencies``). What the
config states and ``DecoderLM`` does not have is refused with one line (``ValueError``):
other RoPE scalings (dynamic, yarn, longrope), biases on the output
projection or the FFN, a ``head_dim`` other than ``hidden_size / num_attention_heads``,
an activation other than SiLU. A sliding window (Mistral) is exact up to its length:
``max_seq_len`` is capped at it.
"""
from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np

from rankjax.config import TransformerConfig
from rankjax.models import gpt2

MODEL_TYPES = ("llama", "mistral", "qwen2")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _rope(hf: dict) -> dict:
  """``TransformerConfig`` RoPE fields of a config.json: the base and the scaling
  (``rope_parameters`` in transformers 5, ``rope_theta`` / ``rope_scaling`` before)."""
  params = dict(hf.get("rope_parameters") or {})
  scaling = dict(hf.get("rope_scaling") or {})
  merged = {**scaling, **params}
  kind = merged.get("rope_type") or merged.get("type") or "default"
  out = {"rope_base": float(merged.get("rope_theta", hf.get("rope_theta", 10000.0)))}
  if kind == "default":
    return out
  if kind == "linear":
    return {**out, "rope_scaling": "linear", "rope_factor": float(merged["factor"])}
  if kind == "llama3":
    try:
      return {**out, "rope_scaling": "llama3", "rope_factor": float(merged["factor"]),
              "rope_low_freq_factor": float(merged["low_freq_factor"]),
              "rope_high_freq_factor": float(merged["high_freq_factor"]),
              "rope_original_max_len": int(merged["original_max_position_embeddings"])}
    except (KeyError, TypeError, ValueError):
      raise ValueError(f"rope_type='llama3' without its factor, low_freq_factor, "
                       f"high_freq_factor, original_max_position_embeddings: {merged}") from None
  raise ValueError(f"rope_type={kind!r} (RoPE scaling) is not implemented; rankjax has "
                   "default, linear and llama3")


def llama_config(hf: dict, *, compute_dtype: str = "float32") -> TransformerConfig:
  """The ``TransformerConfig`` of a Hugging Face ``config.json`` (as a dict)."""
  kind = hf.get("model_type")
  if kind not in MODEL_TYPES:
    raise ValueError(f"model_type={kind!r}; rankjax reads {', '.join(MODEL_TYPES)} (and gpt2 "
                     "through models.gpt2)")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"hidden_act={hf['hidden_act']!r}; the Llama family's FFN is SwiGLU (silu)")
  if hf.get("mlp_bias"):
    raise ValueError("mlp_bias=true: FFN biases are not implemented")
  if kind != "qwen2" and hf.get("attention_bias"):
    raise ValueError("attention_bias=true (a bias on the output projection too) is not "
                     "implemented")
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  if hf.get("head_dim") not in (None, d // heads):
    raise ValueError(f"head_dim={hf['head_dim']} differs from hidden_size / "
                     f"num_attention_heads = {d // heads}")
  max_len = int(hf.get("max_position_embeddings", 2048))
  window = hf.get("sliding_window")
  if window and hf.get("use_sliding_window", kind == "mistral"):
    max_len = min(max_len, int(window))      # exact up to the window's length
  return TransformerConfig(
      vocab_size=int(hf["vocab_size"]), num_layers=int(hf["num_hidden_layers"]),
      d_model=d, num_heads=heads, num_kv_heads=int(hf.get("num_key_value_heads", heads)),
      attn_bias=kind == "qwen2", d_ff=int(hf["intermediate_size"]), max_seq_len=max_len,
      norm_position="pre", norm_op="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      ffn="swiglu", pos_embedding="rope", **_rope(hf),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)), init="gpt2",
      compute_dtype=compute_dtype, param_dtype="float32")


def _rope_permutation(heads: int, dh: int) -> np.ndarray:
  """Output columns of a q/k projection: ours[h, 2i] = hf[h, i], ours[h, 2i+1] =
  hf[h, i + dh/2]."""
  half = np.arange(dh // 2)
  within = np.stack([half, half + dh // 2], axis=1).reshape(-1)          # (dh,)
  return (np.arange(heads)[:, None] * dh + within[None, :]).reshape(-1)


def tensor_files(path: str | os.PathLike) -> dict[str, pathlib.Path]:
  """tensor name -> file, for a ``.safetensors`` file, a folder with
  ``model.safetensors``, or a sharded folder (``model.safetensors.index.json``; a
  listed shard that is absent is a ``FileNotFoundError`` naming it)."""
  path = pathlib.Path(path)
  if path.is_dir():
    index = path / "model.safetensors.index.json"
    if index.is_file():
      try:
        weight_map = json.loads(index.read_text())["weight_map"]
      except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{index}: not a safetensors index (no 'weight_map')") from None
      files = {name: path / file for name, file in weight_map.items()}
      absent = sorted({f.name for f in files.values() if not f.is_file()})
      if absent:
        raise FileNotFoundError(f"{path}: shard(s) {', '.join(absent[:3])} listed in "
                                f"{index.name} not found")
      return files
    path = path / "model.safetensors"
  if not path.is_file():
    raise FileNotFoundError(f"checkpoint not found: {path} (nor a "
                            "model.safetensors.index.json beside it)")
  header, _ = gpt2.read_safetensors_header(path)
  return {name: path for name in header}


def load_llama(path: str | os.PathLike, *, compute_dtype: str = "float32"
               ) -> tuple[TransformerConfig, dict]:
  """``(cfg, params)`` of a Llama-family checkpoint folder (``config.json`` +
  ``model.safetensors`` or sharded with ``model.safetensors.index.json``): ``DecoderLM``
  parameters in float32 (bf16/fp16 tensors are cast), stacked over layers."""
  path = pathlib.Path(path)
  config = path / "config.json"
  if not config.is_file():
    raise FileNotFoundError(f"{config} not found (a Hugging Face checkpoint folder has one)")
  try:
    hf = json.loads(config.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{config}: not JSON ({e})") from None
  cfg = llama_config(hf, compute_dtype=compute_dtype)
  where = tensor_files(path)
  layer = {"attn": {"w_q": "self_attn.q_proj.weight", "w_k": "self_attn.k_proj.weight",
                    "w_v": "self_attn.v_proj.weight", "w_o": "self_attn.o_proj.weight"},
           "ffn": {"w_1": "mlp.gate_proj.weight", "w_3": "mlp.up_proj.weight",
                   "w_2": "mlp.down_proj.weight"},
           "norm_attn_p": {"scale": "input_layernorm.weight"},
           "norm_ffn_p": {"scale": "post_attention_layernorm.weight"}}
  if cfg.attn_bias:
    layer["attn"].update(b_q="self_attn.q_proj.bias", b_k="self_attn.k_proj.bias",
                         b_v="self_attn.v_proj.bias")
  names = {("embed", "embedding"): "model.embed_tokens.weight",
           ("norm_final", "scale"): "model.norm.weight"}
  if not cfg.tie_embeddings:
    names[("lm_head",)] = "lm_head.weight"
  for i in range(cfg.num_layers):
    for module, tensors in layer.items():
      for ours, theirs in tensors.items():
        names[("layers", module, ours, i)] = f"model.layers.{i}.{theirs}"
  missing = [n for n in names.values() if n not in where]
  if missing:
    raise ValueError(f"{path}: missing tensor(s) {', '.join(missing[:4])}"
                     + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
  extra = sorted({int(m.group(1)) for n in where if (m := _LAYER.match(n))} -
                 set(range(cfg.num_layers)))
  if extra:
    raise ValueError(f"{path}: layers {extra} beyond num_hidden_layers={cfg.num_layers}")
  raw: dict[str, np.ndarray] = {}
  by_file: dict[pathlib.Path, list[str]] = {}
  for name in names.values():
    by_file.setdefault(where[name], []).append(name)
  for file, wanted in by_file.items():
    raw.update(gpt2.read_safetensors(file, wanted))
  check_dtype(hf, {n: a.dtype for n, a in raw.items()}, config)
  return cfg, _convert(cfg, names, raw, path)


SAFETENSORS_OF = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def check_dtype(hf: dict, dtypes: dict[str, np.dtype], config: pathlib.Path) -> None:
  """The tensors' dtype (``dtypes``: name -> dtype) is the one ``config.json`` states
  (``torch_dtype`` / ``dtype``), when it states one (one-line ``ValueError`` otherwise);
  every tensor is read and cast to float32 either way."""
  stated = hf.get("torch_dtype", hf.get("dtype"))
  if stated is None:
    return
  if stated not in SAFETENSORS_OF:
    raise ValueError(f"{config}: dtype {stated!r} is not one of {', '.join(SAFETENSORS_OF)}")
  found = sorted({str(np.dtype(t)) for t in dtypes.values()})
  if found != [SAFETENSORS_OF[stated]]:
    raise ValueError(f"{config} states dtype {stated}; the safetensors files hold "
                     f"{', '.join(found)}")


def _convert(cfg: TransformerConfig, names: dict, raw: dict, path) -> dict:
  d, dh, kv = cfg.d_model, cfg.d_head, cfg.kv_heads
  perm = {"w_q": _rope_permutation(cfg.num_heads, dh), "w_k": _rope_permutation(kv, dh)}
  perm.update(b_q=perm["w_q"], b_k=perm["w_k"])
  shapes = {"w_q": (d, d), "w_k": (d, kv * dh), "w_v": (d, kv * dh), "w_o": (d, d),
            "w_1": (d, cfg.d_ff), "w_3": (d, cfg.d_ff), "w_2": (cfg.d_ff, d),
            "b_q": (d,), "b_k": (kv * dh,), "b_v": (kv * dh,), "scale": (d,),
            "embedding": (cfg.vocab_size, d), "lm_head": (d, cfg.vocab_size)}
  params: dict = {}
  stacked: dict = {}
  for key, name in names.items():
    a = np.asarray(raw[name], np.float32)
    leaf = key[-2] if key[0] == "layers" else key[-1]
    if a.ndim == 2 and leaf != "embedding":
      a = a.T                                   # torch Linear (out, in) -> (in, out)
    if leaf in perm:
      a = a[..., perm[leaf]]
    if a.shape != shapes[leaf]:
      raise ValueError(f"{path}: {name} has shape {np.asarray(raw[name]).shape}, which "
                       f"does not fit config.json (expected {shapes[leaf]} after transposing)")
    if key[0] == "layers":
      stacked.setdefault(key[1:3], []).append(a)
    elif len(key) == 1:
      params[key[0]] = a
    else:
      params.setdefault(key[0], {})[key[1]] = a
  layers: dict = {}
  for (module, leaf), arrays in stacked.items():
    layers.setdefault(module, {})[leaf] = np.stack(arrays)
  params["layers"] = layers
  return params
