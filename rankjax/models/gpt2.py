"""GPT-2 weights (Hugging Face ``model.safetensors``) and the forward pass the FFN
Jacobian measurements (``rankjax.measure.gpt2_jacobians``) need ("Transforming Rank",
App B.3 Fig 12, App D.5 Fig 8c).

GPT-2 (Radford et al. 2019) is a Pre-LayerNorm decoder; per layer, on the residual
stream h (T tokens x d),

    h <- h + Attn(LN_1(h))          (causal, biased, d/64 heads)
    h <- h + FFN(LN_2(h)),   FFN(x) = gelu_tanh(x W_fc + b_fc) W_proj + b_proj,

with ``Conv1D`` weights stored as (in, out) so a layer is ``x @ W + b``. The paper's
FFN branch Jacobian of block l is ``J_l = dFFN(LN_2(h))/dh`` at one token of the
stream entering the FFN sublayer; in its notation W_up = W_fc^T (m x d) and
W_down = W_proj^T (d x m), so ``J_l = W_down diag(gelu'(z)) W_up J_LN(h)`` (Eq. 9 with
the Pre-Norm input Jacobian, Table 2).

The forward pass is built from the library's pieces (``norms.normalize`` for the
LayerNorm, ``attention.causal_probabilities`` for the attention); the Jacobians of it
are measurements and live in ``rankjax.measure.gpt2_jacobians``. Parameters are a
plain dict with blocks stacked over depth (``blocks["fc_w"]`` is (L, d, m));
``load_gpt2`` fills it from a checkpoint, ``init_gpt2`` draws GPT-2's initialization.
Files are read and written by the ``safetensors`` package, after a validation of the
header here (the format: an 8-byte little-endian header length, a JSON header of
``{name: {dtype, shape, data_offsets}}``, then the raw little-endian bytes) that turns
a bad file into a one-line ValueError. PyTorch ``.bin`` (pickle)
checkpoints are not read: they need torch.
"""
from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import re
import struct
from typing import Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from rankjax.models import attention as attention_lib
from rankjax.models import norms

Array = jax.Array
HEAD_DIM = 64            # every OpenAI GPT-2 size (small 12 heads of 64, medium 16, ...)
LN_EPS = 1e-5
INIT_STD = 0.02          # GPT-2 / HF GPT2Config.initializer_range
VOCAB_SIZE = 50257
MAX_POSITIONS = 1024

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
           "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
           "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_MAX_HEADER = 100 << 20

# Our stacked block names -> GPT-2's per-layer names (after "h.{i}.").
BLOCK_TENSORS = {
    "ln_1_scale": "ln_1.weight", "ln_1_bias": "ln_1.bias",
    "attn_w": "attn.c_attn.weight", "attn_b": "attn.c_attn.bias",
    "attn_proj_w": "attn.c_proj.weight", "attn_proj_b": "attn.c_proj.bias",
    "ln_2_scale": "ln_2.weight", "ln_2_bias": "ln_2.bias",
    "fc_w": "mlp.c_fc.weight", "fc_b": "mlp.c_fc.bias",
    "proj_w": "mlp.c_proj.weight", "proj_b": "mlp.c_proj.bias",
}
FFN_TENSORS = ("ln_2_scale", "ln_2_bias", "fc_w", "fc_b", "proj_w", "proj_b")


def _block_shapes(d: int, m: int) -> dict[str, tuple[int, ...]]:
  return {"ln_1_scale": (d,), "ln_1_bias": (d,), "attn_w": (d, 3 * d), "attn_b": (3 * d,),
          "attn_proj_w": (d, d), "attn_proj_b": (d,), "ln_2_scale": (d,), "ln_2_bias": (d,),
          "fc_w": (d, m), "fc_b": (m,), "proj_w": (m, d), "proj_b": (d,)}


# ---------------------------------------------------------------------------
# safetensors


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict, int]:
  """``({name: {"dtype", "shape", "data_offsets"}}, start of the data)``, validated.

  Raises FileNotFoundError for a missing file and ValueError (one line) for anything
  that is not a complete safetensors file.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"safetensors file not found: {path}")
  size = path.stat().st_size
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise ValueError(f"{path}: not a safetensors file ({size} bytes, no header length)")
    (n,) = struct.unpack("<Q", head)
    if n > min(size - 8, _MAX_HEADER):
      raise ValueError(f"{path}: not a safetensors file or truncated (header length {n}, "
                       f"file size {size})")
    raw = f.read(n)
  try:
    header = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: not a safetensors file (header is not JSON: {e})") from None
  if not isinstance(header, dict):
    raise ValueError(f"{path}: not a safetensors file (header is not a JSON object)")
  header.pop("__metadata__", None)
  data_size = size - 8 - n
  for name, info in header.items():
    try:
      dtype = np.dtype(_DTYPES[info["dtype"]])
      shape = tuple(int(s) for s in info["shape"])
      begin, end = (int(o) for o in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
      raise ValueError(f"{path}: bad header entry for tensor {name!r}: {info!r}") from None
    if end - begin != math.prod(shape) * dtype.itemsize or begin < 0:
      raise ValueError(f"{path}: tensor {name!r} has {end - begin} bytes for shape {shape} "
                       f"of {info['dtype']}")
    if end > data_size:
      raise ValueError(f"{path}: truncated file: tensor {name!r} ends at byte {end} of "
                       f"{data_size} data bytes")
  return header, 8 + n


def safetensors_dtype(code: str) -> np.dtype:
  """The numpy dtype of a safetensors header's dtype code ("F32", "BF16", ...)."""
  return np.dtype(_DTYPES[code])


def read_safetensors(path: str | os.PathLike,
                     names: list[str] | None = None) -> dict[str, np.ndarray]:
  """Reads the named tensors (all when None) as numpy arrays in the file's dtype.

  The header is validated first (``read_safetensors_header``: one-line errors), then
  the tensors are read by the ``safetensors`` package (``safe_open``, only the named
  tensors' bytes).
  """
  header, _ = read_safetensors_header(path)
  names = sorted(header) if names is None else list(names)
  missing = [n for n in names if n not in header]
  if missing:
    raise ValueError(f"{path}: missing tensor(s) {', '.join(missing[:4])}"
                     + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
  try:
    with safetensors.safe_open(os.fspath(path), framework="numpy") as f:
      return {name: f.get_tensor(name) for name in names}
  except safetensors.SafetensorError as e:
    raise ValueError(f"{path}: unreadable safetensors file: {e}") from None


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
  """Writes ``tensors`` with ``safetensors.numpy.save_file`` (used by tests and for
  converted checkpoints)."""
  codes = {np.dtype(v) for v in _DTYPES.values()}
  arrays = {}
  for name, a in tensors.items():
    a = np.asarray(a)
    if a.dtype not in codes:
      raise ValueError(f"tensor {name!r}: dtype {a.dtype} has no safetensors code")
    arrays[name] = np.ascontiguousarray(a)
  safetensors.numpy.save_file(arrays, os.fspath(path),
                              metadata=None if metadata is None else dict(metadata))


# ---------------------------------------------------------------------------
# GPT-2 checkpoints


def _resolve_checkpoint(path: str | os.PathLike) -> pathlib.Path:
  path = pathlib.Path(path)
  if path.is_dir():
    path = path / "model.safetensors"
  if path.suffix == ".bin":
    raise ValueError(f"{path}: PyTorch .bin checkpoints are not supported (they need torch); "
                     "use the model.safetensors file of the same checkpoint")
  if not path.is_file():
    raise FileNotFoundError(f"GPT-2 checkpoint not found: {path}")
  return path


def load_gpt2(path: str | os.PathLike, *, ffn_only: bool = False) -> dict:
  """GPT-2 parameters from a Hugging Face ``model.safetensors`` (file or its folder).

  Tensor names may carry the ``transformer.`` prefix (``GPT2LMHeadModel``) or not
  (``GPT2Model``, the Hub's ``gpt2`` files). Returns ``{"wte": (V, d), "wpe": (P, d),
  "blocks": {name: (L, ...)}}`` in float32 with the ``BLOCK_TENSORS`` names, Conv1D
  layout kept (``fc_w`` is (L, d, m)); ``ffn_only`` reads just ``FFN_TENSORS`` (Fig 8c).
  Unless ``ffn_only``, also the final norm ``ln_f_scale`` / ``ln_f_bias`` (d,) and the
  LM head ``lm_head`` (V, d) when the file has one untied from ``wte`` (GPT-2's head is
  ``wte``: ``logits``), when present. The head count is in ``config.json``
  (``num_heads``).

  Raises FileNotFoundError or ValueError (one line) for a missing or bad file,
  missing tensors or wrong shapes.
  """
  path = _resolve_checkpoint(path)
  header, _ = read_safetensors_header(path)
  prefix = "transformer." if any(k.startswith("transformer.h.") for k in header) else ""
  layers = {int(m.group(1)) for k in header
            if (m := re.match(re.escape(prefix) + r"h\.(\d+)\.", k))}
  if not layers:
    raise ValueError(f"{path}: no GPT-2 blocks ('{prefix}h.0.mlp.c_fc.weight', ...) in this file")
  num_layers = max(layers) + 1
  keys = FFN_TENSORS if ffn_only else tuple(BLOCK_TENSORS)
  wanted = {(i, k): f"{prefix}h.{i}.{BLOCK_TENSORS[k]}" for i in range(num_layers) for k in keys}
  extra = {} if ffn_only else {"wte": f"{prefix}wte.weight", "wpe": f"{prefix}wpe.weight"}
  raw = read_safetensors(path, list(wanted.values()) + list(extra.values()))
  fc = raw[wanted[(0, "fc_w")]]
  if fc.ndim != 2:
    raise ValueError(f"{path}: {wanted[(0, 'fc_w')]} has shape {fc.shape}, expected (d, d_ff)")
  d, m = fc.shape
  shapes = _block_shapes(d, m)
  for (i, k), name in wanted.items():
    if raw[name].shape != shapes[k]:
      raise ValueError(f"{path}: {name} has shape {raw[name].shape}, expected {shapes[k]} "
                       f"(d={d}, d_ff={m})")
  for k, name in extra.items():
    if raw[name].ndim != 2 or raw[name].shape[1] != d:
      raise ValueError(f"{path}: {name} has shape {raw[name].shape}, expected (*, {d})")
  blocks = {k: np.stack([raw[wanted[(i, k)]] for i in range(num_layers)]).astype(np.float32)
            for k in keys}
  params = {"blocks": blocks}
  params.update({k: raw[name].astype(np.float32) for k, name in extra.items()})
  if not ffn_only:
    heads = {"ln_f_scale": f"{prefix}ln_f.weight", "ln_f_bias": f"{prefix}ln_f.bias",
             "lm_head": "lm_head.weight"}
    present = {k: n for k, n in heads.items() if n in header}
    for k, arr in read_safetensors(path, list(present.values())).items():
      key = next(k2 for k2, n in present.items() if n == k)
      want = params["wte"].shape if key == "lm_head" else (d,)
      if arr.shape != want:
        raise ValueError(f"{path}: {k} has shape {arr.shape}, expected {want}")
      params[key] = arr.astype(np.float32)
  return params


def num_heads(path: str | os.PathLike, d_model: int) -> int:
  """The head count of a GPT-2 checkpoint: ``n_head`` of the ``config.json`` beside its
  safetensors file, else ``default_num_heads(d_model)`` (64-wide heads, every OpenAI
  size). Refuses a config whose LayerNorm epsilon is not GPT-2's 1e-5 (one line)."""
  path = pathlib.Path(path)
  config = (path if path.is_dir() else path.parent) / "config.json"
  if not config.is_file():
    return default_num_heads(d_model)
  try:
    cfg = json.loads(config.read_text())
    heads, eps = int(cfg.get("n_head", default_num_heads(d_model))), float(
        cfg.get("layer_norm_epsilon", LN_EPS))
  except (json.JSONDecodeError, TypeError, ValueError, AttributeError):
    raise ValueError(f"{config}: not a GPT-2 config.json (n_head, layer_norm_epsilon)") from None
  if heads < 1 or d_model % heads:
    raise ValueError(f"{config}: n_head={heads} does not divide n_embd={d_model}")
  if eps != LN_EPS:
    raise ValueError(f"{config}: layer_norm_epsilon={eps}; rankjax's GPT-2 uses {LN_EPS}")
  return heads


def gpt2_tensors(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
  """The inverse of ``load_gpt2``: GPT-2 names -> arrays (for writing checkpoints)."""
  out = {f"{prefix}{k}.weight": np.asarray(params[k]) for k in ("wte", "wpe") if k in params}
  for k, arr in params["blocks"].items():
    for i, a in enumerate(np.asarray(arr)):
      out[f"{prefix}h.{i}.{BLOCK_TENSORS[k]}"] = a
  return out


@functools.partial(jax.jit, static_argnums=(1, 2, 3),
                   static_argnames=("vocab_size", "max_positions"))
def init_gpt2(key: Array, num_layers: int, d_model: int, d_ff: int | None = None, *,
              vocab_size: int = VOCAB_SIZE, max_positions: int = MAX_POSITIONS) -> dict:
  """GPT-2's initialization (HF ``GPT2PreTrainedModel._init_weights``): every matrix
  and embedding N(0, 0.02^2), the two residual output projections (attention and FFN
  ``c_proj``) N(0, (0.02/sqrt(2L))^2) (GPT-2 paper Sec 2.3), biases 0, LN gains 1."""
  d, m = d_model, 4 * d_model if d_ff is None else d_ff
  shapes = _block_shapes(d, m)
  keys = dict(zip(list(shapes) + ["wte", "wpe"], jax.random.split(key, len(shapes) + 2)))
  proj_std = INIT_STD / math.sqrt(2.0 * num_layers)
  blocks = {}
  for k, shape in shapes.items():
    if k.endswith("_scale"):
      blocks[k] = jnp.ones((num_layers,) + shape)
    elif len(shape) == 1:
      blocks[k] = jnp.zeros((num_layers,) + shape)
    else:
      std = proj_std if k in ("attn_proj_w", "proj_w") else INIT_STD
      blocks[k] = std * jax.random.normal(keys[k], (num_layers,) + shape)
  return {"wte": INIT_STD * jax.random.normal(keys["wte"], (vocab_size, d)),
          "wpe": INIT_STD * jax.random.normal(keys["wpe"], (max_positions, d)),
          "blocks": blocks}


# ---------------------------------------------------------------------------
# Forward pass (the Jacobians: rankjax.measure.gpt2_jacobians)


def layer_norm(x: Array, scale: Array, bias: Array, eps: float = LN_EPS) -> Array:
  """GPT-2's LayerNorm: ``norms.normalize(x, "layer", eps) * scale + bias``."""
  return norms.normalize(x, "layer", eps) * scale + bias


def attention(block: dict, x_TxD: Array, num_heads: int) -> Array:
  """Causal self-attention of one block on ``(T, d)`` (biased c_attn / c_proj), through
  the model's ``attention.causal_probabilities``."""
  t, d = x_TxD.shape
  probs_1xHxTxT, v = _probs_and_values(block, x_TxD, num_heads)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs_1xHxTxT, v).reshape(t, d)
  return out @ block["attn_proj_w"] + block["attn_proj_b"]


def _probs_and_values(block: dict, x_TxD: Array, num_heads: int) -> tuple[Array, Array]:
  t, d = x_TxD.shape
  qkv = x_TxD @ block["attn_w"] + block["attn_b"]
  q, k, v = (a.reshape(1, t, num_heads, d // num_heads) for a in jnp.split(qkv, 3, axis=-1))
  return attention_lib.causal_probabilities(q, k), v


def attention_probs(block: dict, h_TxD: Array, num_heads: int) -> Array:
  """The attention probabilities ``(H, T, T)`` of one block on the stream ``h``
  (``attention_branch``'s, query axis -2)."""
  x = layer_norm(h_TxD, block["ln_1_scale"], block["ln_1_bias"])
  return _probs_and_values(block, x, num_heads)[0][0]


def attention_branch(block: dict, h_TxD: Array, num_heads: int) -> Array:
  """The attention branch ``Attn(LN_1(h))`` of one block on the stream ``(T, d)``."""
  return attention(block, layer_norm(h_TxD, block["ln_1_scale"], block["ln_1_bias"]),
                   num_heads)


def ffn(block: dict, x: Array) -> Array:
  """The FFN ``gelu(x W_fc + b_fc) W_proj + b_proj`` on its (normalized) input (GPT-2's
  gelu is the tanh form)."""
  return jax.nn.gelu(x @ block["fc_w"] + block["fc_b"], approximate=True) @ block["proj_w"] \
      + block["proj_b"]


def ffn_branch(block: dict, h_D: Array) -> Array:
  """The FFN branch ``FFN(LN_2(h))`` of one block."""
  return ffn(block, layer_norm(h_D, block["ln_2_scale"], block["ln_2_bias"]))


def default_num_heads(d_model: int) -> int:
  return max(1, d_model // HEAD_DIM)


def embed(params: dict, tokens_T: Array) -> Array:
  """Token plus position embeddings, the stream entering block 1, ``(T, d)``."""
  return params["wte"][tokens_T] + params["wpe"][jnp.arange(tokens_T.shape[0])]


def block_forward(block: dict, h_TxD: Array, num_heads: int) -> tuple[Array, Array]:
  """``(h_mid, h_out)``: the stream after the attention sublayer and after the block."""
  mid = h_TxD + attention_branch(block, h_TxD, num_heads)
  return mid, mid + ffn_branch(block, mid)


def block_sites(block: dict, h_TxD: Array, num_heads: int, perturbations: dict
                ) -> tuple[Array, dict]:
  """``(h_out, sites)`` of one block with ``perturbations[name]`` added at X_1 = LN_1(h),
  Y_1 = h + Attn(X_1), X_2 = LN_2(Y_1), Y_2 = Y_1 + FFN(X_2): the gradient w.r.t. a
  zero perturbation is the gradient w.r.t. that site (``rankjax analyze``)."""
  e = perturbations
  x1 = layer_norm(h_TxD, block["ln_1_scale"], block["ln_1_bias"]) + e["x1"]
  y1 = h_TxD + attention(block, x1, num_heads) + e["y1"]
  x2 = layer_norm(y1, block["ln_2_scale"], block["ln_2_bias"]) + e["x2"]
  y2 = y1 + ffn(block, x2) + e["y2"]
  return y2, {"x1": x1, "y1": y1, "x2": x2, "y2": y2}


def streams(params: dict, tokens_T: Array, heads: int | None = None) -> Array:
  """The residual stream, ``(L+1, T, d)``: the embeddings, then block l's output for
  l = 1..L, before the final norm (``lax.scan`` over the blocks)."""
  heads = default_num_heads(params["wte"].shape[1]) if heads is None else heads
  h0 = embed(params, tokens_T)
  _, hs = jax.lax.scan(lambda h, b: (block_forward(b, h, heads)[1],) * 2, h0,
                       params["blocks"])
  return jnp.concatenate([h0[None], hs], axis=0)


def logits(params: dict, h_TxD: Array) -> Array:
  """``ln_f(h) @ W^T``, (T, V): the LM head on the last block's output, W = ``lm_head``
  when the checkpoint has one, else the tied ``wte``."""
  if "ln_f_scale" not in params:
    raise ValueError("these GPT-2 parameters have no final norm (ln_f): no logits")
  x = layer_norm(h_TxD, params["ln_f_scale"], params["ln_f_bias"])
  return x @ params.get("lm_head", params["wte"]).T
