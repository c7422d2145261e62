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

RoPE scaling: default, linear, llama3 and yarn (``attention.rope_frequencies``, with
YaRN's attention factor from ``factor`` / ``mscale`` / ``mscale_all_dim`` as transformers
derives it); dynamic NTK is the default RoPE up to ``max_position_embeddings`` (transformers
rescales only beyond it, where ``max_seq_len`` stops). What the config states and
``DecoderLM`` does not have is refused with one line (``ValueError``): other RoPE
scalings (longrope, ...), biases on the output
projection or the FFN, a ``head_dim`` other than ``hidden_size / num_attention_heads``,
an activation other than SiLU. A sliding window (Mistral) is exact up to its length:
``max_seq_len`` is capped at it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re

import jax
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
  if kind == "dynamic":     # dynamic NTK: the default frequencies up to max_position_embeddings
    return out              # (transformers rescales only beyond it; max_seq_len stops there)
  if kind == "yarn":
    max_len = int(hf.get("max_position_embeddings", 2048))
    original = int(merged.get("original_max_position_embeddings") or max_len)
    factor = float(merged.get("factor") or max_len / original)
    mscale = lambda m: 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    attention = merged.get("attention_factor")
    if attention is None:
      m, m_all = merged.get("mscale"), merged.get("mscale_all_dim")
      attention = mscale(m) / mscale(m_all) if m and m_all else mscale(1.0)
    return {**out, "rope_scaling": "yarn", "rope_factor": factor,
            "rope_original_max_len": original,
            "rope_beta_fast": float(merged.get("beta_fast") or 32.0),
            "rope_beta_slow": float(merged.get("beta_slow") or 1.0),
            "rope_truncate": bool(merged.get("truncate", True)),
            "rope_attention_factor": float(attention)}
  raise ValueError(f"rope_type={kind!r} (RoPE scaling) is not implemented; rankjax has "
                   "default, linear, llama3, yarn and dynamic (exact up to "
                   "max_position_embeddings)")


def sliding_window(hf: dict) -> int | None:
  """The attention window a ``config.json`` (as a dict) applies, or None (Mistral: on
  unless ``use_sliding_window`` is false; Qwen2: only when it is true)."""
  window = hf.get("sliding_window")
  if window and hf.get("use_sliding_window", hf.get("model_type") == "mistral"):
    return int(window)
  return None


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
  window = sliding_window(hf)
  if window:
    max_len = min(max_len, window)      # exact up to the window's length
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


_LAYER_TENSORS = {
    "attn": {"w_q": "self_attn.q_proj.weight", "w_k": "self_attn.k_proj.weight",
             "w_v": "self_attn.v_proj.weight", "w_o": "self_attn.o_proj.weight"},
    "ffn": {"w_1": "mlp.gate_proj.weight", "w_3": "mlp.up_proj.weight",
            "w_2": "mlp.down_proj.weight"},
    "norm_attn_p": {"scale": "input_layernorm.weight"},
    "norm_ffn_p": {"scale": "post_attention_layernorm.weight"}}
_QKV_BIAS = {"b_q": "self_attn.q_proj.bias", "b_k": "self_attn.k_proj.bias",
             "b_v": "self_attn.v_proj.bias"}


@dataclasses.dataclass(frozen=True)
class LlamaFiles:
  """An opened Llama-family folder: its config, and where each tensor is.

  ``open_llama`` checks everything it can without reading a weight (config.json, every
  tensor present, no extra layers, the stated dtype against the headers);
  ``read_top`` / ``read_layer`` then read the non-layer tensors or one layer's
  (memory-mapped by ``safetensors``: only those bytes), converted to ``DecoderLM``'s
  layout in float32.
  """

  path: pathlib.Path
  cfg: TransformerConfig
  where: dict            # tensor name -> file
  dtypes: dict           # tensor name -> numpy dtype stored
  shapes: dict           # tensor name -> shape stored

  def layer_names(self, i: int) -> dict[tuple[str, str], str]:
    """``(module, leaf) -> tensor name`` of layer ``i``."""
    tensors = {m: dict(t) for m, t in _LAYER_TENSORS.items()}
    if self.cfg.attn_bias:
      tensors["attn"].update(_QKV_BIAS)
    return {(m, ours): f"model.layers.{i}.{theirs}"
            for m, t in tensors.items() for ours, theirs in t.items()}

  def top_names(self) -> dict[tuple[str, ...], str]:
    names = {("embed", "embedding"): "model.embed_tokens.weight",
             ("norm_final", "scale"): "model.norm.weight"}
    if not self.cfg.tie_embeddings:
      names[("lm_head",)] = "lm_head.weight"
    return names


def open_llama(path: str | os.PathLike, *, compute_dtype: str = "float32") -> LlamaFiles:
  """A Llama-family checkpoint folder (``config.json`` + ``model.safetensors``, or
  sharded with ``model.safetensors.index.json``), checked without reading a weight."""
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
  dtypes, shapes = {}, {}
  for file in sorted(set(where.values())):
    header, _ = gpt2.read_safetensors_header(file)
    for n, info in header.items():
      if n in where:
        dtypes[n] = gpt2.safetensors_dtype(info["dtype"])
        shapes[n] = tuple(int(x) for x in info["shape"])
  files = LlamaFiles(path, cfg, where, dtypes, shapes)
  names = list(files.top_names().values())
  for i in range(cfg.num_layers):
    names += list(files.layer_names(i).values())
  missing = [n for n in names if n not in dtypes]
  if missing:
    raise ValueError(f"{path}: missing tensor(s) {', '.join(missing[:4])}"
                     + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
  extra = sorted({int(m.group(1)) for n in where if (m := _LAYER.match(n))} -
                 set(range(cfg.num_layers)))
  if extra:
    raise ValueError(f"{path}: layers {extra} beyond num_hidden_layers={cfg.num_layers}")
  check_dtype(hf, {n: dtypes[n] for n in names}, config)
  return files


def _read(files: LlamaFiles, names) -> dict[str, np.ndarray]:
  by_file: dict[pathlib.Path, list[str]] = {}
  for name in names:
    by_file.setdefault(files.where[name], []).append(name)
  raw = {}
  for file, wanted in by_file.items():
    raw.update(gpt2.read_safetensors(file, wanted))
  return raw


def read_layer(files: LlamaFiles, i: int) -> dict:
  """Layer ``i``'s ``DecoderLM`` parameters (one slice of ``params["layers"]``)."""
  names = files.layer_names(i)
  raw = _read(files, names.values())
  layer: dict = {}
  for (module, leaf), name in names.items():
    layer.setdefault(module, {})[leaf] = _convert(files.cfg, leaf, name, raw[name], files.path)
  return layer


def read_top(files: LlamaFiles) -> dict:
  """The non-layer parameters: ``embed``, ``norm_final``, and ``lm_head`` when untied."""
  names = files.top_names()
  raw = _read(files, names.values())
  top: dict = {}
  for key, name in names.items():
    a = _convert(files.cfg, key[-1], name, raw[name], files.path)
    if len(key) == 1:
      top[key[0]] = a
    else:
      top.setdefault(key[0], {})[key[1]] = a
  return top


def load_llama(path: str | os.PathLike, *, compute_dtype: str = "float32"
               ) -> tuple[TransformerConfig, dict]:
  """``(cfg, params)`` of a Llama-family checkpoint folder (``open_llama``):
  ``DecoderLM`` parameters in float32 (bf16/fp16 tensors are cast), stacked over
  layers."""
  files = open_llama(path, compute_dtype=compute_dtype)
  params = read_top(files)
  layers = [read_layer(files, i) for i in range(files.cfg.num_layers)]
  params["layers"] = jax.tree.map(lambda *a: np.stack(a), *layers)
  return files.cfg, params


def write_random_checkpoint(folder: str | os.PathLike, *, hidden_size: int, num_layers: int,
                            intermediate_size: int, num_heads: int, num_kv_heads: int,
                            vocab_size: int, dtype: str = "float32", seed: int = 0,
                            model_type: str = "llama", tie_word_embeddings: bool = False,
                            max_position_embeddings: int = 2048) -> pathlib.Path:
  """A random Llama-family checkpoint in Hugging Face layout: ``config.json`` and one
  safetensors shard per layer (plus one for the embeddings, final norm and head) with
  ``model.safetensors.index.json``, written a layer at a time (host memory: one layer).
  Weights ~ N(0, 0.02^2) in transformers' (out, in) layout, norm gains 1 + N(0, 0.1^2).
  For the tests and the memory benchmark (``rankjax analyze`` of a model of any size
  without downloading one)."""
  import ml_dtypes
  import safetensors.numpy
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  store = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
           "float16": np.float16}[dtype]
  rng = np.random.default_rng(seed)
  d, dh = hidden_size, hidden_size // num_heads

  def normal(*shape, std=0.02, mean=0.0):
    return (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(store)

  weight_map = {}

  def shard(name, tensors):
    safetensors.numpy.save_file(tensors, str(folder / name), metadata={"format": "pt"})
    weight_map.update({t: name for t in tensors})

  top = {"model.embed_tokens.weight": normal(vocab_size, d),
         "model.norm.weight": normal(d, std=0.1, mean=1.0)}
  if not tie_word_embeddings:
    top["lm_head.weight"] = normal(vocab_size, d)
  shard("model-top.safetensors", top)
  for i in range(num_layers):
    p = f"model.layers.{i}."
    layer = {p + "self_attn.q_proj.weight": normal(d, d),
             p + "self_attn.k_proj.weight": normal(num_kv_heads * dh, d),
             p + "self_attn.v_proj.weight": normal(num_kv_heads * dh, d),
             p + "self_attn.o_proj.weight": normal(d, d),
             p + "mlp.gate_proj.weight": normal(intermediate_size, d),
             p + "mlp.up_proj.weight": normal(intermediate_size, d),
             p + "mlp.down_proj.weight": normal(d, intermediate_size),
             p + "input_layernorm.weight": normal(d, std=0.1, mean=1.0),
             p + "post_attention_layernorm.weight": normal(d, std=0.1, mean=1.0)}
    if model_type == "qwen2":
      layer.update({p + "self_attn.q_proj.bias": normal(d),
                    p + "self_attn.k_proj.bias": normal(num_kv_heads * dh),
                    p + "self_attn.v_proj.bias": normal(num_kv_heads * dh)})
    shard(f"model-layer-{i:05d}.safetensors", layer)
  (folder / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {}, "weight_map": weight_map}, indent=1))
  (folder / "config.json").write_text(json.dumps({
      "model_type": model_type, "hidden_size": d, "num_hidden_layers": num_layers,
      "intermediate_size": intermediate_size, "num_attention_heads": num_heads,
      "num_key_value_heads": num_kv_heads, "vocab_size": vocab_size, "hidden_act": "silu",
      "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "dtype": dtype,
      "max_position_embeddings": max_position_embeddings,
      "tie_word_embeddings": tie_word_embeddings}, indent=1))
  return folder


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


def _convert(cfg: TransformerConfig, leaf: str, name: str, a: np.ndarray, path) -> np.ndarray:
  """One tensor in ``DecoderLM``'s layout and float32: Linear weights transposed, the
  q/k projections' RoPE pairs permuted, the shape checked against config.json."""
  d, dh, kv = cfg.d_model, cfg.d_head, cfg.kv_heads
  perm = {"w_q": _rope_permutation(cfg.num_heads, dh), "w_k": _rope_permutation(kv, dh)}
  perm.update(b_q=perm["w_q"], b_k=perm["w_k"])
  shapes = {"w_q": (d, d), "w_k": (d, kv * dh), "w_v": (d, kv * dh), "w_o": (d, d),
            "w_1": (d, cfg.d_ff), "w_3": (d, cfg.d_ff), "w_2": (cfg.d_ff, d),
            "b_q": (d,), "b_k": (kv * dh,), "b_v": (kv * dh,), "scale": (d,),
            "embedding": (cfg.vocab_size, d), "lm_head": (d, cfg.vocab_size)}
  out = np.asarray(a, np.float32)
  if out.ndim == 2 and leaf != "embedding":
    out = out.T                                 # torch Linear (out, in) -> (in, out)
  if leaf in perm:
    out = out[..., perm[leaf]]
  if out.shape != shapes[leaf]:
    raise ValueError(f"{path}: {name} has shape {np.asarray(a).shape}, which does not fit "
                     f"config.json (expected {shapes[leaf]} after transposing)")
  return np.ascontiguousarray(out)
