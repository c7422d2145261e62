"""Hugging Face decoder checkpoints (GPT-2 and the Llama family: Llama 2/3, Mistral,
Qwen2) as ``DecoderLM`` parameters: the library's own model, the weights converted once,
read by the ``safetensors`` package (``safe_open``: memory-mapped, only the bytes of the
tensors asked for).

GPT-2 (Radford et al. 2019) is ``DecoderLM`` with ``norm_position="pre"``, LayerNorm
(gain and bias, ``layer_norm_epsilon``), learned positions, biases on every projection
(``attn_bias``, ``attn_out_bias``, ``ffn_bias``), ``ffn="gelu_tanh"`` (``gelu_new``) and a
tied head. Its ``Conv1D`` weights are stored (in, out), ``DecoderLM``'s layout; the fused
``c_attn`` (d, 3d) is split into W_Q | W_K | W_V (and its bias likewise).

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
rescales only beyond it, where ``max_seq_len`` stops). What a config states and
``DecoderLM`` does not have is refused with one line (``ValueError``): other RoPE
scalings (longrope, ...), Llama biases on the output projection or the FFN, a
``head_dim`` other than ``hidden_size / num_attention_heads``, an activation other than
SiLU (Llama) or GELU (GPT-2), GPT-2's attention scalings other than ``1/sqrt(d_head)``.
A sliding window (Mistral) is exact up to its length: ``max_seq_len`` is capped at it.

``open_hf`` checks a folder without reading a weight; ``read_top`` / ``read_layer`` read
the non-layer tensors or one layer's (``rankjax analyze`` holds one layer at a time);
``load_hf`` reads them all. ``write_random_checkpoint`` / ``write_random_gpt2`` write
random folders in Hugging Face layout (tests, benchmarks).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re

import jax
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from rankjax._src.config import RopeConfig, TransformerConfig
from rankjax._src.errors import UserError

LLAMA_TYPES = ("llama", "mistral", "qwen2")
MODEL_TYPES = ("gpt2", *LLAMA_TYPES)
_LAYER = {"llama": re.compile(r"model\.layers\.(\d+)\."),
          "gpt2": re.compile(r"(?:transformer\.)?h\.(\d+)\.")}
# safetensors dtype codes -> numpy
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
          "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
          "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
# GPT-2 activation_function -> TransformerConfig.ffn
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu": "gelu"}


def _rope(hf: dict) -> RopeConfig:
  """The RoPE settings (``TransformerConfig.rope``) of a config.json: the base and the
  scaling (``rope_parameters`` in transformers 5, ``rope_theta`` / ``rope_scaling``
  before)."""
  params = dict(hf.get("rope_parameters") or {})
  scaling = dict(hf.get("rope_scaling") or {})
  merged = {**scaling, **params}
  kind = merged.get("rope_type") or merged.get("type") or "default"
  base = float(merged.get("rope_theta", hf.get("rope_theta", 10000.0)))
  if kind == "default":
    return RopeConfig(base=base)
  if kind == "linear":
    return RopeConfig(base=base, scaling="linear", factor=float(merged["factor"]))
  if kind == "llama3":
    try:
      return RopeConfig(base=base, scaling="llama3", factor=float(merged["factor"]),
                        low_freq_factor=float(merged["low_freq_factor"]),
                        high_freq_factor=float(merged["high_freq_factor"]),
                        original_max_len=int(merged["original_max_position_embeddings"]))
    except (KeyError, TypeError, ValueError):
      raise UserError(f"rope_type='llama3' without its factor, low_freq_factor, "
                       f"high_freq_factor, original_max_position_embeddings: {merged}") from None
  if kind == "dynamic":     # dynamic NTK: the default frequencies up to max_position_embeddings
    return RopeConfig(base=base)  # (transformers rescales only beyond it; max_seq_len stops there)
  if kind == "yarn":
    max_len = int(hf.get("max_position_embeddings", 2048))
    original = int(merged.get("original_max_position_embeddings") or max_len)
    factor = float(merged.get("factor") or max_len / original)
    mscale = lambda m: 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
    attention = merged.get("attention_factor")
    if attention is None:
      m, m_all = merged.get("mscale"), merged.get("mscale_all_dim")
      attention = mscale(m) / mscale(m_all) if m and m_all else mscale(1.0)
    return RopeConfig(base=base, scaling="yarn", factor=factor, original_max_len=original,
                      beta_fast=float(merged.get("beta_fast") or 32.0),
                      beta_slow=float(merged.get("beta_slow") or 1.0),
                      truncate=bool(merged.get("truncate", True)),
                      attention_factor=float(attention))
  raise UserError(f"rope_type={kind!r} (RoPE scaling) is not implemented; rankjax has "
                   "default, linear, llama3, yarn and dynamic (exact up to "
                   "max_position_embeddings)")


def sliding_window(hf: dict) -> int | None:
  """The attention window a ``config.json`` (as a dict) applies, or None (Mistral: on
  unless ``use_sliding_window`` is false; Qwen2: only when it is true)."""
  window = hf.get("sliding_window")
  if window and hf.get("use_sliding_window", hf.get("model_type") == "mistral"):
    return int(window)
  return None


def gpt2_config(hf: dict, *, compute_dtype: str = "float32") -> TransformerConfig:
  """The ``TransformerConfig`` of a GPT-2 ``config.json`` (as a dict; transformers'
  ``GPT2Config`` defaults for what it leaves out)."""
  act = hf.get("activation_function", "gelu_new")
  if act not in GPT2_ACTIVATIONS:
    raise UserError(f"activation_function={act!r}; rankjax's GPT-2 FFN has "
                     f"{', '.join(GPT2_ACTIVATIONS)}")
  if not hf.get("scale_attn_weights", True) or hf.get("scale_attn_by_inverse_layer_idx"):
    raise UserError("scale_attn_weights=false or scale_attn_by_inverse_layer_idx=true: "
                     "rankjax's attention scales the logits by 1/sqrt(d_head) only")
  d = int(hf.get("n_embd", 768))
  return TransformerConfig(
      vocab_size=int(hf.get("vocab_size", 50257)), num_layers=int(hf.get("n_layer", 12)),
      d_model=d, num_heads=int(hf.get("n_head", 12)), attn_bias=True, attn_out_bias=True,
      ffn_bias=True, d_ff=int(hf.get("n_inner") or 4 * d),
      max_seq_len=int(hf.get("n_positions", 1024)), norm_position="pre", norm_op="layer",
      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), ffn=GPT2_ACTIVATIONS[act],
      pos_embedding="learned", tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
      init="gpt2", compute_dtype=compute_dtype, param_dtype="float32")


def hf_config(hf: dict, *, compute_dtype: str = "float32") -> TransformerConfig:
  """The ``TransformerConfig`` of a Hugging Face ``config.json`` (as a dict) of any
  family read here (``MODEL_TYPES``)."""
  if hf.get("model_type") == "gpt2":
    return gpt2_config(hf, compute_dtype=compute_dtype)
  return llama_config(hf, compute_dtype=compute_dtype)


def llama_config(hf: dict, *, compute_dtype: str = "float32") -> TransformerConfig:
  """The ``TransformerConfig`` of a Llama-family ``config.json`` (as a dict)."""
  kind = hf.get("model_type")
  if kind not in LLAMA_TYPES:
    raise UserError(f"model_type={kind!r}; rankjax reads {', '.join(MODEL_TYPES)}")
  if hf.get("hidden_act", "silu") != "silu":
    raise UserError(f"hidden_act={hf['hidden_act']!r}; the Llama family's FFN is SwiGLU (silu)")
  if hf.get("mlp_bias"):
    raise UserError("mlp_bias=true: FFN biases are not implemented")
  if kind != "qwen2" and hf.get("attention_bias"):
    raise UserError("attention_bias=true (a bias on the output projection too) is not "
                     "implemented")
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  if hf.get("head_dim") not in (None, d // heads):
    raise UserError(f"head_dim={hf['head_dim']} differs from hidden_size / "
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
      ffn="swiglu", pos_embedding="rope", rope=_rope(hf),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)), init="gpt2",
      compute_dtype=compute_dtype, param_dtype="float32")


def _rope_permutation(heads: int, dh: int) -> np.ndarray:
  """Output columns of a q/k projection: ours[h, 2i] = hf[h, i], ours[h, 2i+1] =
  hf[h, i + dh/2]."""
  half = np.arange(dh // 2)
  within = np.stack([half, half + dh // 2], axis=1).reshape(-1)          # (dh,)
  return (np.arange(heads)[:, None] * dh + within[None, :]).reshape(-1)


def _header(file: pathlib.Path) -> dict[str, tuple[str, tuple[int, ...]]]:
  """``{name: (dtype code, shape)}`` of one safetensors file (``safe_open``; nothing
  read but the header); a file that is not one is a one-line ``ValueError``."""
  try:
    with safetensors.safe_open(os.fspath(file), framework="numpy") as f:
      return {n: (f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape()))
              for n in f.keys()}
  except safetensors.SafetensorError as e:
    raise UserError(f"{file}: not a readable safetensors file ({e})") from None


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
        raise UserError(f"{index}: not a safetensors index (no 'weight_map')") from None
      files = {name: path / file for name, file in weight_map.items()}
      absent = sorted({f.name for f in files.values() if not f.is_file()})
      if absent:
        raise FileNotFoundError(f"{path}: shard(s) {', '.join(absent[:3])} listed in "
                                f"{index.name} not found")
      return files
    if (path / "pytorch_model.bin").is_file() and not (path / "model.safetensors").is_file():
      raise UserError(f"{path}: PyTorch .bin checkpoints are not read (they need torch); "
                       "use the model.safetensors of the same checkpoint")
    path = path / "model.safetensors"
  if not path.is_file():
    raise FileNotFoundError(f"checkpoint not found: {path} (nor a "
                            "model.safetensors.index.json beside it)")
  return {name: path for name in _header(path)}


_LLAMA_LAYER = {
    ("attn", "w_q"): "self_attn.q_proj.weight", ("attn", "w_k"): "self_attn.k_proj.weight",
    ("attn", "w_v"): "self_attn.v_proj.weight", ("attn", "w_o"): "self_attn.o_proj.weight",
    ("ffn", "w_1"): "mlp.gate_proj.weight", ("ffn", "w_3"): "mlp.up_proj.weight",
    ("ffn", "w_2"): "mlp.down_proj.weight",
    ("norm_attn_p", "scale"): "input_layernorm.weight",
    ("norm_ffn_p", "scale"): "post_attention_layernorm.weight"}
_QKV_BIAS = {("attn", "b_q"): "self_attn.q_proj.bias", ("attn", "b_k"): "self_attn.k_proj.bias",
             ("attn", "b_v"): "self_attn.v_proj.bias"}
# GPT-2: c_attn holds W_Q | W_K | W_V (and their biases) along its output axis
_GPT2_LAYER = {
    ("norm_attn_p", "scale"): "ln_1.weight", ("norm_attn_p", "bias"): "ln_1.bias",
    ("attn", "w_q"): "attn.c_attn.weight", ("attn", "w_k"): "attn.c_attn.weight",
    ("attn", "w_v"): "attn.c_attn.weight", ("attn", "b_q"): "attn.c_attn.bias",
    ("attn", "b_k"): "attn.c_attn.bias", ("attn", "b_v"): "attn.c_attn.bias",
    ("attn", "w_o"): "attn.c_proj.weight", ("attn", "b_o"): "attn.c_proj.bias",
    ("norm_ffn_p", "scale"): "ln_2.weight", ("norm_ffn_p", "bias"): "ln_2.bias",
    ("ffn", "w_1"): "mlp.c_fc.weight", ("ffn", "b_1"): "mlp.c_fc.bias",
    ("ffn", "w_2"): "mlp.c_proj.weight", ("ffn", "b_2"): "mlp.c_proj.bias"}


@dataclasses.dataclass(frozen=True)
class HFFiles:
  """An opened Hugging Face folder: its config, and where each tensor is.

  ``open_hf`` checks everything it can without reading a weight (config.json, every
  tensor present, no extra layers, the stated dtype against the headers);
  ``read_top`` / ``read_layer`` then read the non-layer tensors or one layer's
  (memory-mapped by ``safetensors``: only those bytes), converted to ``DecoderLM``'s
  layout in float32.
  """

  path: pathlib.Path
  kind: str              # config.json's model_type
  cfg: TransformerConfig
  where: dict            # tensor name -> file
  dtypes: dict           # tensor name -> numpy dtype stored
  shapes: dict           # tensor name -> shape stored
  prefix: str = ""       # GPT-2: "transformer." (GPT2LMHeadModel) or "" (GPT2Model)

  def layer_names(self, i: int) -> dict[tuple[str, str], str]:
    """``(module, leaf) -> tensor name`` of layer ``i``."""
    if self.kind == "gpt2":
      return {key: f"{self.prefix}h.{i}.{n}" for key, n in _GPT2_LAYER.items()}
    names = {**_LLAMA_LAYER, **(_QKV_BIAS if self.cfg.attn_bias else {})}
    return {key: f"model.layers.{i}.{n}" for key, n in names.items()}

  def tensor_names(self) -> list[str]:
    """Every tensor the model reads (once each), non-layer ones first."""
    names = list(self.top_names().values())
    for i in range(self.cfg.num_layers):
      names += list(self.layer_names(i).values())
    return list(dict.fromkeys(names))

  def top_names(self) -> dict[tuple[str, ...], str]:
    """``params`` key path -> tensor name of the non-layer parameters."""
    if self.kind == "gpt2":
      p = self.prefix
      names = {("embed", "embedding"): f"{p}wte.weight", ("pos_embed",): f"{p}wpe.weight",
               ("norm_final", "scale"): f"{p}ln_f.weight",
               ("norm_final", "bias"): f"{p}ln_f.bias"}
    else:
      names = {("embed", "embedding"): "model.embed_tokens.weight",
               ("norm_final", "scale"): "model.norm.weight"}
    if not self.cfg.tie_embeddings:
      names[("lm_head",)] = "lm_head.weight"
    return names


def _read_config(path: pathlib.Path) -> dict:
  config = path / "config.json"
  if not config.is_file():
    raise FileNotFoundError(f"{config} not found (a Hugging Face checkpoint folder has one)")
  try:
    hf = json.loads(config.read_text())
  except json.JSONDecodeError as e:
    raise UserError(f"{config}: not JSON ({e})") from None
  if not isinstance(hf, dict):
    raise UserError(f"{config}: not a JSON object")
  return hf


def _missing(path, names) -> ValueError:
  return ValueError(f"{path}: missing tensor(s) {', '.join(names[:4])}"
                    + (f" and {len(names) - 4} more" if len(names) > 4 else ""))


def open_hf(path: str | os.PathLike, *, compute_dtype: str = "float32") -> HFFiles:
  """A Hugging Face checkpoint folder (``config.json`` + ``model.safetensors``, or
  sharded with ``model.safetensors.index.json``; a ``.safetensors`` file stands for its
  folder), checked without reading a weight."""
  path = pathlib.Path(path)
  if path.suffix in (".safetensors", ".bin"):
    path = path.parent
  if path.is_file() or not path.exists():
    raise FileNotFoundError(f"checkpoint folder {path} not found")
  hf = _read_config(path)
  kind = hf.get("model_type")
  if kind not in MODEL_TYPES:
    raise UserError(f"{path / 'config.json'}: model_type={kind!r} is not supported "
                     f"({', '.join(MODEL_TYPES)})")
  cfg = hf_config(hf, compute_dtype=compute_dtype)
  where = tensor_files(path)
  codes, shapes = {}, {}
  for file in sorted(set(where.values())):
    for n, (code, shape) in _header(file).items():
      if n in where:
        codes[n], shapes[n] = code, shape
  prefix = "transformer." if kind == "gpt2" and "transformer.wte.weight" in where else ""
  dtypes = {n: np.dtype(DTYPES[c]) for n, c in codes.items() if c in DTYPES}
  files = HFFiles(path, "gpt2" if kind == "gpt2" else "llama", cfg, where, dtypes, shapes,
                  prefix)
  names = files.tensor_names()
  missing = [n for n in names if n not in codes]
  if missing:
    raise _missing(path, missing)
  unread = sorted({codes[n] for n in names if n not in dtypes})
  if unread:
    raise UserError(f"{path}: tensors of dtype {', '.join(unread)} are not read "
                     f"({', '.join(DTYPES)})")
  extra = sorted({int(m.group(1)) for n in where if (m := _LAYER[files.kind].match(n))} -
                 set(range(cfg.num_layers)))
  if extra:
    raise UserError(f"{path}: layers {extra} beyond the config's {cfg.num_layers}")
  check_dtype(hf, {n: dtypes[n] for n in names}, path / "config.json")
  return files


def read_tensors(file: str | os.PathLike, names=None) -> dict[str, np.ndarray]:
  """The named tensors (all when None) of one safetensors file, in the file's dtype
  (``safe_open``: only those bytes are read)."""
  try:
    with safetensors.safe_open(os.fspath(file), framework="numpy") as f:
      names = list(f.keys()) if names is None else list(names)
      absent = [n for n in names if n not in f.keys()]
      if absent:
        raise _missing(file, absent)
      return {n: f.get_tensor(n) for n in names}
  except safetensors.SafetensorError as e:
    raise UserError(f"{file}: not a readable safetensors file ({e})") from None


def _read(files: HFFiles, names) -> dict[str, np.ndarray]:
  by_file: dict[pathlib.Path, list[str]] = {}
  for name in dict.fromkeys(names):
    by_file.setdefault(files.where[name], []).append(name)
  raw = {}
  for file, wanted in by_file.items():
    raw.update(read_tensors(file, wanted))
  return raw


def read_layer(files: HFFiles, i: int) -> dict:
  """Layer ``i``'s ``DecoderLM`` parameters (one slice of ``params["layers"]``)."""
  names = files.layer_names(i)
  raw = _read(files, names.values())
  layer: dict = {}
  for (module, leaf), name in names.items():
    layer.setdefault(module, {})[leaf] = _convert(files, leaf, name, raw[name])
  return layer


def read_top(files: HFFiles) -> dict:
  """The non-layer parameters: ``embed``, ``norm_final``, ``pos_embed`` (GPT-2) and
  ``lm_head`` when untied."""
  names = files.top_names()
  raw = _read(files, names.values())
  top: dict = {}
  for key, name in names.items():
    a = _convert(files, key[-1], name, raw[name])
    if len(key) == 1:
      top[key[0]] = a
    else:
      top.setdefault(key[0], {})[key[1]] = a
  return top


def load_hf(path: str | os.PathLike, *, compute_dtype: str = "float32"
            ) -> tuple[TransformerConfig, dict]:
  """``(cfg, params)`` of a Hugging Face checkpoint folder (``open_hf``): ``DecoderLM``
  parameters in float32 (bf16/fp16 tensors are cast), stacked over layers."""
  files = open_hf(path, compute_dtype=compute_dtype)
  params = read_top(files)
  layers = [read_layer(files, i) for i in range(files.cfg.num_layers)]
  params["layers"] = jax.tree.map(lambda *a: np.stack(a), *layers)
  return files.cfg, params


SAFETENSORS_OF = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def check_dtype(hf: dict, dtypes: dict[str, np.dtype], config: pathlib.Path) -> None:
  """The tensors' dtype (``dtypes``: name -> dtype) is the one ``config.json`` states
  (``torch_dtype`` / ``dtype``), when it states one (one-line ``ValueError`` otherwise);
  every tensor is read and cast to float32 either way."""
  stated = hf.get("torch_dtype", hf.get("dtype"))
  if stated is None:
    return
  if stated not in SAFETENSORS_OF:
    raise UserError(f"{config}: dtype {stated!r} is not one of {', '.join(SAFETENSORS_OF)}")
  found = sorted({str(np.dtype(t)) for t in dtypes.values()})
  if found != [SAFETENSORS_OF[stated]]:
    raise UserError(f"{config} states dtype {stated}; the safetensors files hold "
                     f"{', '.join(found)}")


_QKV = {"w_q": 0, "w_k": 1, "w_v": 2, "b_q": 0, "b_k": 1, "b_v": 2}


def _convert(files: HFFiles, leaf: str, name: str, a: np.ndarray) -> np.ndarray:
  """One tensor in ``DecoderLM``'s layout and float32: torch ``Linear`` weights
  transposed (GPT-2's ``Conv1D`` are (in, out) already) and the Llama q/k projections'
  RoPE pairs permuted, GPT-2's ``c_attn`` split; the shape checked against config.json."""
  cfg = files.cfg
  d, dh, kv, f = cfg.d_model, cfg.d_head, cfg.kv_heads, cfg.d_ff
  shapes = {"w_q": (d, d), "w_k": (d, kv * dh), "w_v": (d, kv * dh), "w_o": (d, d),
            "w_1": (d, f), "w_3": (d, f), "w_2": (f, d), "b_q": (d,), "b_k": (kv * dh,),
            "b_v": (kv * dh,), "b_o": (d,), "b_1": (f,), "b_2": (d,), "scale": (d,),
            "bias": (d,), "embedding": (cfg.vocab_size, d), "lm_head": (d, cfg.vocab_size),
            "pos_embed": (cfg.max_seq_len, d)}
  out = np.asarray(a, np.float32)
  if files.kind == "gpt2":          # Conv1D weights are (in, out) already
    fused = (d, 3 * d) if leaf.startswith("w_") else (3 * d,)
    stored = fused if leaf in _QKV else (cfg.vocab_size, d) if leaf == "lm_head" \
        else shapes[leaf]
    if np.shape(a) != stored:
      raise UserError(f"{files.path}: {name} has shape {np.shape(a)}, which does not fit "
                       f"config.json (expected {stored})")
    if leaf in _QKV:
      out = np.split(out, 3, axis=-1)[_QKV[leaf]]
    return np.ascontiguousarray(out.T if leaf == "lm_head" else out)
  if out.ndim == 2 and leaf != "embedding":
    out = out.T                                 # torch Linear (out, in) -> (in, out)
  if leaf in ("w_q", "b_q"):
    out = out[..., _rope_permutation(cfg.num_heads, dh)]
  if leaf in ("w_k", "b_k"):
    out = out[..., _rope_permutation(kv, dh)]
  if out.shape != shapes[leaf]:
    raise UserError(f"{files.path}: {name} has shape {np.shape(a)}, which does not fit "
                     f"config.json (expected {shapes[leaf]} after transposing)")
  return np.ascontiguousarray(out)


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



def write_random_gpt2(folder: str | os.PathLike, *, num_layers: int, d_model: int,
                      num_heads: int, vocab_size: int, n_positions: int,
                      d_ff: int | None = None, seed: int = 0, prefix: str = "transformer.",
                      dtype: str = "float32", std: float = 0.02) -> pathlib.Path:
  """A random GPT-2 checkpoint in Hugging Face layout (``config.json``, one
  ``model.safetensors`` with GPT-2's names, ``Conv1D`` weights (in, out), the fused
  ``c_attn``, a tied head): weights and biases ~ N(0, std^2), LayerNorm gains 1 +
  N(0, 0.1^2). For the tests (``rankjax analyze``, fig12 ``--checkpoint``)."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  store = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
           "float16": np.float16}[dtype]
  rng = np.random.default_rng(seed)
  d, m = d_model, d_ff or 4 * d_model

  def normal(*shape, mean=0.0, scale=std):
    return (mean + scale * rng.standard_normal(shape, dtype=np.float32)).astype(store)

  p = prefix
  tensors = {f"{p}wte.weight": normal(vocab_size, d), f"{p}wpe.weight": normal(n_positions, d),
             f"{p}ln_f.weight": normal(d, mean=1.0, scale=0.1), f"{p}ln_f.bias": normal(d)}
  shapes = {"ln_1.bias": (d,), "attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
            "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,), "ln_2.bias": (d,),
            "mlp.c_fc.weight": (d, m), "mlp.c_fc.bias": (m,), "mlp.c_proj.weight": (m, d),
            "mlp.c_proj.bias": (d,)}
  for i in range(num_layers):
    for n in ("ln_1.weight", "ln_2.weight"):
      tensors[f"{p}h.{i}.{n}"] = normal(d, mean=1.0, scale=0.1)
    tensors.update({f"{p}h.{i}.{n}": normal(*s) for n, s in shapes.items()})
  safetensors.numpy.save_file(tensors, str(folder / "model.safetensors"),
                              metadata={"format": "pt"})
  (folder / "config.json").write_text(json.dumps({
      "model_type": "gpt2", "n_embd": d, "n_layer": num_layers, "n_head": num_heads,
      "n_inner": d_ff, "n_positions": n_positions, "vocab_size": vocab_size,
      "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
      "tie_word_embeddings": True, "dtype": dtype}, indent=1))
  return folder
