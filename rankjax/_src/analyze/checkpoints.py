"""Opening a checkpoint for ``rankjax analyze``: one model family, ``DecoderLM``, its
weights placed on the devices a layer at a time.

A ``Model`` is what the analysis needs of a forward pass: the decoder's functions of one
layer (``DecoderFns``: embeddings, a layer's forward pass, its attention probabilities,
its token sublayers for the Jacobian engine, its X_k / Y_k sites for the gradients, the
head) and the ``Weights``: the non-layer parameters and ``layer(l)``.
``rankjax._src.analyze.passes`` runs the layers in a Python loop over these, so a pass holds
one layer's parameters at a time when the weights are read per layer. Sources:

  * a Hugging Face folder (GPT-2, Llama, Mistral, Qwen2): ``models.hf`` converts each
    tensor into ``DecoderLM``'s layout, read a layer at a time from the memory-mapped
    safetensors files (``layer_at_a_time``) or once, layer by layer, onto the devices;
  * a rankjax training workdir of an LM (``rankjax.load_run``, the newest checkpoint or
    ``step``), every placement.

Both use the DecoderLM adapter of ``measure.decoder_jacobians``.

Placement (``Placement``): with several devices every parameter is sharded over a
``(data=1, fsdp=n)`` mesh by the training code's rules (``train.sharding.param_spec`` of
the logical axes ``DecoderLM`` declares, ``decoder_axes``); the activations are left to
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
import jax.numpy as jnp
import numpy as np

from rankjax._src import numerics
from rankjax._src.config import TransformerConfig
from rankjax._src.measure import decoder_jacobians
from rankjax._src.models import annotated, hf, transformer
from rankjax._src.train import diagnostics_postnorm
from rankjax._src.errors import UserError

Array = jax.Array
LAYER_AT_A_TIME = ("auto", "on", "off")
RESIDENT_SHARE = 0.5    # auto: weights read per layer above this share of free memory


@dataclasses.dataclass(frozen=True)
class DecoderFns:
  """``DecoderLM``'s functions of one layer (Hugging Face folders and rankjax runs);
  every one is the model's own (``models.transformer``), on one sequence ``(T, d)``."""

  cfg: TransformerConfig

  def embed(self, top: dict, tokens_T: Array) -> Array:
    return transformer.first_layer_input(self.cfg, top, tokens_T[None])[0]

  def forward(self, layer: dict, h_TxD: Array) -> Array:
    return transformer.layer_forward(self.cfg, layer, h_TxD)[1]

  def attention(self, layer: dict, h_TxD: Array) -> Array:
    return transformer.attention_probs(self.cfg, layer, h_TxD)

  def token_terms(self, layer: dict, h_TxD: Array, position) -> tuple:
    return decoder_jacobians.layer_token_terms(self.cfg, layer, h_TxD, position)[1]

  def sites(self, layer: dict, h_TxD: Array, perturbations: dict | None
            ) -> tuple[Array, dict]:
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
class Placement:
  """Where and in which dtype parameters go: the default device, or sharded over
  ``mesh`` by the training rules; matrices cast to ``compute_dtype``."""

  mesh: jax.sharding.Mesh | None = None
  compute_dtype: str = "float32"

  def put(self, tree: dict, axes: dict) -> dict:
    """``tree`` placed, given its parameters' logical ``axes`` (``decoder_axes``)."""
    from rankjax._src.train import sharding
    tree = numerics.compute_copy(tree, self.compute_dtype, axes)
    if self.mesh is None:
      return jax.device_put(tree)
    shape = dict(self.mesh.shape)
    shardings = jax.tree.map(lambda x, a: jax.sharding.NamedSharding(
        self.mesh, sharding.param_spec(a, tuple(x.shape), shape)), tree, axes)
    return jax.device_put(tree, shardings)


def decoder_axes(cfg: TransformerConfig) -> tuple[dict, dict]:
  """The logical axes of ``DecoderLM(cfg)``'s parameters, as ``Weights`` holds them:
  (the non-layer ones, one layer's without the stacked ``"layers"`` axis)."""
  model = transformer.DecoderLM(cfg)
  boxed = jax.eval_shape(lambda k: model.init_annotated(
      k, jnp.zeros((1, 1), jnp.int32))["params"], jax.random.key(0))
  axes = dict(annotated.logical_axes(boxed))
  layer = jax.tree.map(lambda a: jax.sharding.PartitionSpec(*tuple(a)[1:]), axes.pop("layers"))
  return axes, layer


class Weights:
  """The non-layer parameters (``top``) and ``layer(l)`` (0-based) on the devices.

  ``read_layer(l)`` gives layer l's parameters on the host. ``resident``: every layer is
  read and placed once, here; otherwise ``layer(l)`` reads and places it on each call
  and keeps no reference (a pass holds one layer)."""

  def __init__(self, top: dict, read_layer: Callable[[int], dict], cfg: TransformerConfig,
               placement: Placement, resident: bool):
    self.placement, self.resident, self.num_layers = placement, resident, cfg.num_layers
    self._read = read_layer
    top_axes, self._layer_axes = decoder_axes(cfg)
    self.top = placement.put(top, top_axes)
    self._layers = [self.layer_placed(l) for l in range(cfg.num_layers)] \
        if resident else None

  def layer_placed(self, l: int) -> dict:
    return self.placement.put(self._read(l), self._layer_axes)

  def layer(self, l: int) -> dict:
    if self._layers is not None:
      return self._layers[l]
    return self.layer_placed(l)


@dataclasses.dataclass(frozen=True)
class Model:
  """A checkpoint's forward pass for the analysis.

  Attributes:
    source: what was opened (path, and the step for a rankjax run).
    family: "decoder" (DecoderLM: every source).
    description: config fields, parameter count, stored and compute dtype, how the
      weights are held, for ``analysis.json``.
    vocab_size, max_len, num_layers, num_heads, d_model: the model's sizes.
    tokenizer: a tokenizer file in the checkpoint (``tokenizer.json``, ``*.model``) or None.
    fns: the per-layer functions (``DecoderFns``; hashable: the
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
  fns: DecoderFns
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


_DESCRIBED = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "vocab_size",
              "norm_position", "norm_op", "ffn", "pos_embedding", "tie_embeddings", "attn_bias", "attn_out_bias", "ffn_bias")


def _decoder(cfg: TransformerConfig, weights: Weights, parameters: int, stored: str,
             source: str, extra: dict, tokenizer: str | None) -> Model:
  return Model(
      source=source, family="decoder",
      description={**extra, **{f: getattr(cfg, f) for f in _DESCRIBED},
                   "rope_base": cfg.rope.base,
                   "parameters": parameters, "dtype": stored,
                   "compute_dtype": cfg.compute_dtype,
                   "weights": "resident" if weights.resident else "layer at a time"},
      vocab_size=cfg.vocab_size, max_len=cfg.max_seq_len, num_layers=cfg.num_layers,
      num_heads=cfg.num_heads, d_model=cfg.d_model, tokenizer=tokenizer,
      fns=DecoderFns(cfg), weights=weights)


def _hf(folder: pathlib.Path, config: dict, placement: Placement, layer_at_a_time: str
        ) -> Model:
  files = hf.open_hf(folder, compute_dtype=placement.compute_dtype)
  used = files.tensor_names()
  parameters = int(sum(np.prod(files.shapes[n]) for n in used))
  needed = parameters * np.dtype(placement.compute_dtype).itemsize
  per_layer = layer_at_a_time == "on" or (
      layer_at_a_time == "auto" and needed > RESIDENT_SHARE * available_bytes(placement))
  weights = Weights(hf.read_top(files), lambda l: hf.read_layer(files, l),
                    files.cfg, placement, resident=not per_layer)
  stored = "/".join(sorted({str(files.dtypes[n]) for n in used}))
  extra = {"model_type": config["model_type"], "max_position_embeddings": files.cfg.max_seq_len
           if files.kind == "gpt2" else int(config.get("max_position_embeddings", 2048))}
  if window := hf.sliding_window(config):
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
  weights = Weights(params, _slicer(layers), cfg, placement, resident=True)
  return _decoder(cfg, weights, _param_count(params) + _param_count(layers), cfg.param_dtype,
                  source, dict(extra or {}), tokenizer)


def _rankjax_run(workdir: pathlib.Path, step: int | None, placement: Placement,
                 layer_at_a_time: str) -> Model:
  from rankjax._src.train.run_reader import load_run
  if layer_at_a_time == "on":
    raise UserError("a rankjax run's checkpoint is restored whole; --layer-at-a-time on "
                     "reads Hugging Face safetensors folders")
  run = load_run(str(workdir), step)
  if run.config.model.kind != "transformer":
    raise UserError(f"{workdir}: a {run.config.model.kind!r} run; rankjax analyze reads "
                     "language models")
  tokenizer = run.config.tokenizer if getattr(run.config, "tokenizer", None) else None
  return decoder_model(run.config.model, run.params, f"{workdir} (step {run.step})",
                       placement=placement, tokenizer=tokenizer,
                       extra={"model_type": "rankjax", "step": int(run.step)})


def open_checkpoint(path: str, step: int | None = None, *,
                    placement: Placement | None = None,
                    layer_at_a_time: str = "auto") -> Model:
  """A Hugging Face checkpoint folder (GPT-2, Llama, Mistral, Qwen2) or a rankjax LM
  training workdir (``step``: default the newest checkpoint). ``layer_at_a_time``:
  "on" reads a Hugging Face folder's layers from the files on every pass, "off" places
  them all once, "auto" (default) reads per layer when the weights in the compute
  dtype exceed ``RESIDENT_SHARE`` of the free memory (``available_bytes``)."""
  placement = placement or Placement()
  if layer_at_a_time not in LAYER_AT_A_TIME:
    raise UserError(f"layer_at_a_time={layer_at_a_time!r}; one of {LAYER_AT_A_TIME}")
  folder = pathlib.Path(path)
  if not folder.is_dir():
    raise FileNotFoundError(f"checkpoint folder {folder} " + (
        "is a file: give the folder holding config.json (Hugging Face) or checkpoints/ "
        "(a rankjax run)" if folder.exists() else "not found"))
  if (folder / "checkpoints").is_dir():
    return _rankjax_run(folder, step, placement, layer_at_a_time)
  if step is not None:
    raise UserError("--step reads a rankjax run's checkpoints; this is a Hugging Face "
                     "checkpoint folder")
  config = folder / "config.json"
  if not config.is_file():
    raise FileNotFoundError(f"{folder}: neither a Hugging Face checkpoint (config.json) nor "
                            "a rankjax run (checkpoints/)")
  try:
    stated = json.loads(config.read_text())
  except json.JSONDecodeError as e:
    raise UserError(f"{config}: not JSON ({e})") from None
  kind = stated.get("model_type") if isinstance(stated, dict) else None
  if kind in hf.MODEL_TYPES:
    return _hf(folder, stated, placement, layer_at_a_time)
  if kind is None and isinstance(stated, dict) and "format" in stated:
    raise UserError(f"{folder} holds a rankjax run that saved no checkpoint yet (no "
                    "checkpoints/): train it first, or wait for its first checkpoint")
  raise UserError(f"{config}: model_type={kind!r} is not supported "
                   f"({', '.join(hf.MODEL_TYPES)})")
