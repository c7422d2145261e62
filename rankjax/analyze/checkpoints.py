"""Opening a checkpoint for ``rankjax analyze``: one adapter per model family, weights
placed on the devices a layer at a time.

A ``Model`` is what the analysis needs of a forward pass: the family's functions of one
layer (``DecoderFns`` / ``GPT2Fns``: embeddings, a layer's forward pass, its attention
probabilities, its token sublayers for the Jacobian engine, its X_k / Y_k sites for the
gradients, the head) and the ``Weights``: the non-layer parameters and ``layer(l)``.
``rankjax.analyze.passes`` runs the layers in a Python loop over these, so a pass holds
one layer's parameters at a time when the weights are read per layer. Families:

  * GPT-2 (``config.json`` ``model_type: gpt2``): ``models.gpt2`` and the GPT-2 adapters
    of ``measure.gpt2_jacobians`` (at most 1.5B parameters: loaded whole, float32);
  * the Llama family (llama, mistral, qwen2): ``models.hf_llama`` converts each tensor
    into ``DecoderLM``'s layout, with the DecoderLM adapter of
    ``measure.decoder_jacobians``; read a layer at a time from the memory-mapped
    safetensors files (``layer_at_a_time``) or once, layer by layer, onto the devices;
  * a rankjax training workdir of an LM (``rankjax.load_run``, the newest checkpoint or
    ``step``): the same DecoderLM adapter, every placement.

Placement (``Placement``): with several devices every parameter is sharded over a
``(data=1, fsdp=n)`` mesh by the training code's rules (``train.sharding.param_spec``,
the tensors of one layer named as in a training state); the activations are left to
GSPMD. ``compute_dtype="bfloat16"`` casts matrices and embeddings with the training
code's mixed-precision rule (``numerics.compute_copy``: norm gains stay float32).

Nothing is downloaded; a missing or unsupported checkpoint is one ``ValueError`` /
``FileNotFoundError`` line.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Callable

import jax
import numpy as np

from rankjax import numerics
from rankjax.config import TransformerConfig
from rankjax.measure import decoder_jacobians, gpt2_jacobians
from rankjax.models import gpt2, hf_llama, transformer
from rankjax.train import diagnostics_postnorm

Array = jax.Array
LAYER_AT_A_TIME = ("auto", "on", "off")
RESIDENT_SHARE = 0.5    # auto: weights read per layer above this share of free memory


@dataclasses.dataclass(frozen=True)
class DecoderFns:
  """``DecoderLM``'s functions of one layer (the Llama family and rankjax runs); every
  one is the model's own (``models.transformer``), on one sequence ``(T, d)``."""

  cfg: TransformerConfig

  def embed(self, top: dict, tokens_T: Array) -> Array:
    return transformer.first_layer_input(self.cfg, top, tokens_T[None])[0]

  def forward(self, layer: dict, h_TxD: Array) -> Array:
    return transformer.layer_forward(self.cfg, layer, h_TxD)[1]

  def attention(self, layer: dict, h_TxD: Array) -> Array:
    return transformer.attention_probs(self.cfg, layer, h_TxD)

  def token_terms(self, layer: dict, h_TxD: Array, position) -> tuple:
    return decoder_jacobians.layer_token_terms(self.cfg, layer, h_TxD, position)[1]

  def sites(self, layer: dict, h_TxD: Array, perturbations: dict) -> tuple[Array, dict]:
    return transformer.layer_sites(self.cfg, layer, h_TxD, perturbations)

  def logits(self, top: dict, h_TxD: Array) -> Array:
    return transformer.final_logits(self.cfg, top, h_TxD)

  def gains(self, layer: dict) -> dict:
    """The gain of the norm that reads Y_k (Post-Norm), for Thm 3.6's bound."""
    if self.cfg.norm_position != "post":
      return {1: None, 2: None}
    return {k: layer.get(diagnostics_postnorm.NORM_AFTER_Y[k], {}).get("scale")
            for k in (1, 2)}

  @property
  def eps(self) -> float:
    return float(self.cfg.norm_eps)


@dataclasses.dataclass(frozen=True)
class GPT2Fns:
  """GPT-2's functions of one block (``models.gpt2``, ``measure.gpt2_jacobians``)."""

  heads: int

  def embed(self, top: dict, tokens_T: Array) -> Array:
    return gpt2.embed(top, tokens_T)

  def forward(self, layer: dict, h_TxD: Array) -> Array:
    return gpt2.block_forward(layer, h_TxD, self.heads)[1]

  def attention(self, layer: dict, h_TxD: Array) -> Array:
    return gpt2.attention_probs(layer, h_TxD, self.heads)

  def token_terms(self, layer: dict, h_TxD: Array, position) -> tuple:
    return gpt2_jacobians.layer_token_terms(layer, h_TxD, position, self.heads)[1]

  def sites(self, layer: dict, h_TxD: Array, perturbations: dict) -> tuple[Array, dict]:
    return gpt2.block_sites(layer, h_TxD, self.heads, perturbations)

  def logits(self, top: dict, h_TxD: Array) -> Array:
    return gpt2.logits(top, h_TxD)

  def gains(self, layer: dict) -> dict:
    return {1: None, 2: None}          # Pre-LN: no norm reads Y_k

  @property
  def eps(self) -> float:
    return gpt2.LN_EPS


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where and in which dtype parameters go: the default device, or sharded over
  ``mesh`` by the training rules; matrices cast to ``compute_dtype``."""

  mesh: jax.sharding.Mesh | None = None
  compute_dtype: str = "float32"

  def put(self, tree: dict) -> dict:
    from rankjax.train import sharding
    tree = numerics.compute_copy(tree, self.compute_dtype)
    if self.mesh is None:
      return jax.device_put(tree)
    shape = dict(self.mesh.shape)
    shardings = jax.tree_util.tree_map_with_path(
        lambda path, x: jax.sharding.NamedSharding(
            self.mesh, sharding.param_spec(path, tuple(x.shape), shape, ())), tree)
    return jax.device_put(tree, shardings)


class Weights:
  """The non-layer parameters (``top``) and ``layer(l)`` (0-based) on the devices.

  ``read_layer(l)`` gives layer l's parameters on the host. ``resident``: every layer is
  read and placed once, here; otherwise ``layer(l)`` reads and places it on each call
  and keeps no reference (a pass holds one layer)."""

  def __init__(self, top: dict, read_layer: Callable[[int], dict], num_layers: int,
               placement: Placement, resident: bool):
    self.placement, self.resident, self.num_layers = placement, resident, num_layers
    self._read = read_layer
    self.top = placement.put(top)
    self._layers = [placement.put(read_layer(l)) for l in range(num_layers)] \
        if resident else None

  def layer(self, l: int) -> dict:
    if self._layers is not None:
      return self._layers[l]
    return self.placement.put(self._read(l))


@dataclasses.dataclass(frozen=True)
class Model:
  """A checkpoint's forward pass for the analysis.

  Attributes:
    source: what was opened (path, and the step for a rankjax run).
    family: "gpt2" or "decoder" (DecoderLM: the Llama family and rankjax runs).
    description: config fields, parameter count, stored and compute dtype, how the
      weights are held, for ``analysis.json``.
    vocab_size, max_len, num_layers, num_heads, d_model: the model's sizes.
    tokenizer: a tokenizer file in the checkpoint (``tokenizer.json``, ``*.model``) or None.
    fns: the family's per-layer functions (``DecoderFns`` / ``GPT2Fns``; hashable: the
      passes' jitted functions take it as a static argument and the parameters as
      arguments, so checkpoints of one shape share one compilation).
    weights: ``Weights``.
  """

  source: str
  family: str
  description: dict
  vocab_size: int
  max_len: int
  num_layers: int
  num_heads: int
  d_model: int
  tokenizer: str | None
  fns: DecoderFns | GPT2Fns
  weights: Weights


def _param_count(params) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(params)))


def _tokenizer_in(folder: pathlib.Path) -> str | None:
  for name in ("tokenizer.json", "tokenizer.model"):
    if (folder / name).is_file():
      return str(folder / name)
  return None


def _slicer(stacked: dict) -> Callable[[int], dict]:
  return lambda l: jax.tree.map(lambda x: np.asarray(x[l]), stacked)


def host_available_bytes() -> int:
  """The host memory available without swapping: ``MemAvailable`` of /proc/meminfo (free
  pages plus the page cache that can be dropped: the safetensors files just read count
  as available), else the free pages."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def available_bytes(placement: Placement) -> int:
  """Free memory the weights could use: the devices' (summed over the mesh), or the
  host's available memory on CPU."""
  devices = list(placement.mesh.devices.flat) if placement.mesh is not None else \
      [jax.local_devices()[0]]
  if devices[0].platform == "cpu":
    return host_available_bytes()
  total = 0
  for d in devices:
    stats = d.memory_stats() or {}
    total += int(stats.get("bytes_limit", 0)) - int(stats.get("bytes_in_use", 0))
  return total


def _gpt2(folder: pathlib.Path, hf: dict, placement: Placement, layer_at_a_time: str) -> Model:
  if placement.compute_dtype != "float32":
    raise ValueError("GPT-2 checkpoints are analyzed in float32 (--dtype bfloat16 is for "
                     "the Llama family)")
  if layer_at_a_time == "on":
    raise ValueError("GPT-2 checkpoints (at most 1.5B parameters) are loaded whole; "
                     "--layer-at-a-time on is for the Llama family")
  header, _ = gpt2.read_safetensors_header(folder / "model.safetensors")
  hf_llama.check_dtype(hf, {n: gpt2.safetensors_dtype(i["dtype"]) for n, i in header.items()},
                       folder / "config.json")
  params = gpt2.load_gpt2(folder)
  blocks = params.pop("blocks")
  d = params["wte"].shape[1]
  heads = gpt2.num_heads(folder, d)
  num_layers = int(blocks["fc_w"].shape[0])
  stored = sorted({str(gpt2.safetensors_dtype(i["dtype"])) for i in header.values()})
  return Model(
      source=str(folder), family="gpt2",
      description={"model_type": "gpt2", "num_layers": num_layers, "d_model": d,
                   "num_heads": heads, "d_ff": int(blocks["fc_w"].shape[-1]),
                   "vocab_size": int(params["wte"].shape[0]),
                   "parameters": _param_count(params) + _param_count(blocks),
                   "dtype": "/".join(stored), "compute_dtype": "float32",
                   "weights": "resident"},
      vocab_size=int(params["wte"].shape[0]), max_len=int(params["wpe"].shape[0]),
      num_layers=num_layers, num_heads=heads, d_model=d, tokenizer=_tokenizer_in(folder),
      fns=GPT2Fns(heads),
      weights=Weights(params, _slicer(blocks), num_layers, placement, resident=True))


_DESCRIBED = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "vocab_size",
              "norm_position", "norm_op", "ffn", "pos_embedding", "rope_base",
              "tie_embeddings", "attn_bias")


def _decoder(cfg: TransformerConfig, weights: Weights, parameters: int, stored: str,
             source: str, extra: dict, tokenizer: str | None) -> Model:
  return Model(
      source=source, family="decoder",
      description={**extra, **{f: getattr(cfg, f) for f in _DESCRIBED},
                   "parameters": parameters, "dtype": stored,
                   "compute_dtype": cfg.compute_dtype,
                   "weights": "resident" if weights.resident else "layer at a time"},
      vocab_size=cfg.vocab_size, max_len=cfg.max_seq_len, num_layers=cfg.num_layers,
      num_heads=cfg.num_heads, d_model=cfg.d_model, tokenizer=tokenizer,
      fns=DecoderFns(cfg), weights=weights)


def _llama(folder: pathlib.Path, hf: dict, placement: Placement, layer_at_a_time: str
           ) -> Model:
  files = hf_llama.open_llama(folder, compute_dtype=placement.compute_dtype)
  parameters = int(sum(np.prod(s) for s in files.shapes.values()))
  needed = parameters * np.dtype(placement.compute_dtype).itemsize
  per_layer = layer_at_a_time == "on" or (
      layer_at_a_time == "auto" and needed > RESIDENT_SHARE * available_bytes(placement))
  weights = Weights(hf_llama.read_top(files), lambda l: hf_llama.read_layer(files, l),
                    files.cfg.num_layers, placement, resident=not per_layer)
  stored = "/".join(sorted({str(np.dtype(t)) for t in files.dtypes.values()}))
  extra = {"model_type": hf["model_type"],
           "max_position_embeddings": int(hf.get("max_position_embeddings", 2048))}
  if window := hf_llama.sliding_window(hf):
    extra["sliding_window"] = window
  return _decoder(files.cfg, weights, parameters, stored, str(folder), extra,
                  _tokenizer_in(folder))


def decoder_model(cfg: TransformerConfig, params: dict, source: str = "params", *,
                  placement: Placement | None = None, extra: dict | None = None,
                  tokenizer: str | None = None) -> Model:
  """A ``Model`` of ``DecoderLM`` parameters in memory (``params["layers"]`` stacked),
  resident, in ``placement``'s compute dtype."""
  placement = placement or Placement()
  cfg = dataclasses.replace(cfg, compute_dtype=placement.compute_dtype)
  params = dict(params)
  layers = params.pop("layers")
  weights = Weights(params, _slicer(layers), cfg.num_layers, placement, resident=True)
  return _decoder(cfg, weights, _param_count(params) + _param_count(layers), cfg.param_dtype,
                  source, dict(extra or {}), tokenizer)


def _rankjax_run(workdir: pathlib.Path, step: int | None, placement: Placement,
                 layer_at_a_time: str) -> Model:
  from rankjax.train.run_reader import load_run
  if layer_at_a_time == "on":
    raise ValueError("a rankjax run's checkpoint is restored whole; --layer-at-a-time on "
                     "reads Llama-family safetensors folders")
  run = load_run(str(workdir), step)
  if run.config.model != "lm":
    raise ValueError(f"{workdir}: a {run.config.model!r} run; rankjax analyze reads "
                     "language models")
  tokenizer = run.config.tokenizer if getattr(run.config, "tokenizer", None) else None
  return decoder_model(run.config.lm, run.params, f"{workdir} (step {run.step})",
                       placement=placement, tokenizer=tokenizer,
                       extra={"model_type": "rankjax", "step": int(run.step)})


def open_checkpoint(path: str, step: int | None = None, *,
                    placement: Placement | None = None,
                    layer_at_a_time: str = "auto") -> Model:
  """A Hugging Face checkpoint folder (GPT-2, Llama, Mistral, Qwen2) or a rankjax LM
  training workdir (``step``: default the newest checkpoint). ``layer_at_a_time``:
  "on" reads a Llama-family folder's layers from the files on every pass, "off" places
  them all once, "auto" (default) reads per layer when the weights in the compute
  dtype exceed ``RESIDENT_SHARE`` of the free memory (``available_bytes``)."""
  placement = placement or Placement()
  if layer_at_a_time not in LAYER_AT_A_TIME:
    raise ValueError(f"layer_at_a_time={layer_at_a_time!r}; one of {LAYER_AT_A_TIME}")
  folder = pathlib.Path(path)
  if not folder.is_dir():
    raise FileNotFoundError(f"checkpoint folder {folder} " + (
        "is a file: give the folder holding config.json (Hugging Face) or checkpoints/ "
        "(a rankjax run)" if folder.exists() else "not found"))
  if (folder / "checkpoints").is_dir():
    return _rankjax_run(folder, step, placement, layer_at_a_time)
  if step is not None:
    raise ValueError("--step reads a rankjax run's checkpoints; this is a Hugging Face "
                     "checkpoint folder")
  config = folder / "config.json"
  if not config.is_file():
    raise FileNotFoundError(f"{folder}: neither a Hugging Face checkpoint (config.json) nor "
                            "a rankjax run (checkpoints/)")
  try:
    hf = json.loads(config.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{config}: not JSON ({e})") from None
  kind = hf.get("model_type")
  if kind == "gpt2":
    return _gpt2(folder, hf, placement, layer_at_a_time)
  if kind in hf_llama.MODEL_TYPES:
    return _llama(folder, hf, placement, layer_at_a_time)
  raise ValueError(f"{config}: model_type={kind!r} is not supported (gpt2, "
                   f"{', '.join(hf_llama.MODEL_TYPES)})")
