"""Opening a checkpoint for ``rankjax analyze``: one adapter per model family.

A ``Model`` is what the analysis needs of a forward pass, as jitted functions of one token
sequence ``(T,)``: the residual stream ``(L+1, T, d)`` (embeddings, then each block's
output, before any final norm), the attention probabilities ``(L, H, T, T)`` and the
token's sublayer Jacobians through the Jacobian engine (``measure.engine``). Families:

  * GPT-2 (``config.json`` ``model_type: gpt2``): ``models.gpt2`` and the GPT-2 adapters
    of ``measure.gpt2_jacobians``;
  * the Llama family (llama, mistral, qwen2): converted once into ``DecoderLM``
    (``models.hf_llama``), with the DecoderLM adapter of ``measure.decoder_jacobians``;
  * a rankjax training workdir of an LM (``rankjax.load_run``, the newest checkpoint or
    ``step``): the same DecoderLM adapter, every placement.

Nothing is downloaded; a missing or unsupported checkpoint is one ``ValueError`` /
``FileNotFoundError`` line.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rankjax.measure import decoder_jacobians, engine, gpt2_jacobians, losses
from rankjax.measure import gradients as gradients_lib
from rankjax.train import diagnostics_postnorm
from rankjax.models import gpt2, hf_llama, transformer

Array = jax.Array
SUBLAYER_SITES = ("x1", "y1", "x2", "y2")    # X_k, Y_k of the postnorm paper (Eq. 1)


@dataclasses.dataclass(frozen=True)
class Model:
  """A checkpoint's forward pass for the analysis.

  Attributes:
    source: what was opened (path, and the step for a rankjax run).
    family: "gpt2" or "decoder" (DecoderLM: the Llama family and rankjax runs).
    description: config fields, parameter count and dtype, for ``analysis.json``.
    vocab_size, max_len, num_layers, num_heads, d_model: the model's sizes.
    tokenizer: a tokenizer file in the checkpoint (``tokenizer.json``, ``*.model``) or None.
    streams: ``tokens (T,) -> (L+1, T, d)``.
    attention: ``tokens (T,) -> (L, H, T, T)``.
    token_blocks: ``(tokens (T,), position) -> engine.BlockJacobians`` of the 2L
      sublayers at that token (other tokens held fixed).
    gradients: ``tokens (K, T) -> dict``: with the next-token loss on the K sequences
      (mean cross-entropy of T-1 predictions each), ``diagnostics_postnorm.
      sublayer_factors`` of X_k, Y_k (the branch input after P, the residual sum before
      R) and their gradients (L,) each, the per-layer parameter gradient norm
      ``grad_norm`` (L,), and ``loss``.
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
  streams: Callable[[Array], Array]
  attention: Callable[[Array], Array]
  token_blocks: Callable[[Array, int], engine.BlockJacobians]
  gradients: Callable[[Array], dict]


def _param_count(params) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(params)))


def _tokenizer_in(folder: pathlib.Path) -> str | None:
  for name in ("tokenizer.json", "tokenizer.model"):
    if (folder / name).is_file():
      return str(folder / name)
  return None


# The jitted functions take the parameters as arguments (never as captured constants),
# so checkpoints of one shape (the steps of a run) share one compilation.


@functools.partial(jax.jit, static_argnums=2)
def _gpt2_streams(params, tokens, heads):
  return gpt2.streams(params, tokens, heads)


@functools.partial(jax.jit, static_argnums=2)
def _gpt2_attention(params, tokens, heads):
  def step(h, block):
    return gpt2.block_forward(block, h, heads)[1], gpt2.attention_probs(block, h, heads)
  return jax.lax.scan(step, gpt2.embed(params, tokens), params["blocks"])[1]


@functools.partial(jax.jit, static_argnums=2)
def _gpt2_gradients(params, tokens_KxT, heads):
  """GPT-2's X_k (LN output), Y_k (residual sum) and their gradients by zero
  perturbations added at each site, then ``sublayer_factors``."""
  inputs, targets = tokens_KxT[:, :-1], tokens_KxT[:, 1:]

  def forward(p, pert):
    def one(tokens, e):
      def step(h, xs):
        block, e = xs
        x1 = gpt2.layer_norm(h, block["ln_1_scale"], block["ln_1_bias"]) + e["x1"]
        y1 = h + gpt2.attention(block, x1, heads) + e["y1"]
        x2 = gpt2.layer_norm(y1, block["ln_2_scale"], block["ln_2_bias"]) + e["x2"]
        y2 = y1 + gpt2.ffn(block, x2) + e["y2"]
        return y2, {"x1": x1, "y1": y1, "x2": x2, "y2": y2}
      h, acts = jax.lax.scan(step, gpt2.embed(p, tokens), (p["blocks"], e))
      return gpt2.logits(p, h), acts
    logits, acts = jax.vmap(one, in_axes=(0, 1), out_axes=(0, 1))(inputs, pert)
    return losses.cross_entropy(logits, targets), acts

  shape = (params["blocks"]["fc_w"].shape[0], *inputs.shape, params["wte"].shape[1])
  zeros = {k: jnp.zeros(shape, jnp.float32) for k in SUBLAYER_SITES}
  (loss, acts), (g_params, g_acts) = jax.value_and_grad(
      forward, argnums=(0, 1), has_aux=True)(params, zeros)
  out = diagnostics_postnorm.sublayer_factors(acts, g_acts, gpt2.LN_EPS, {})
  out["grad_norm"] = gradients_lib.layer_grad_norms(g_params, ("blocks",))
  out["loss"] = loss
  return out


def _gpt2(folder: pathlib.Path, hf: dict) -> Model:
  header, _ = gpt2.read_safetensors_header(folder / "model.safetensors")
  hf_llama.check_dtype(hf, {n: gpt2.safetensors_dtype(i["dtype"]) for n, i in header.items()},
                       folder / "config.json")
  params = jax.tree.map(jnp.asarray, gpt2.load_gpt2(folder))
  d = params["wte"].shape[1]
  heads = gpt2.num_heads(folder, d)
  num_layers = int(params["blocks"]["fc_w"].shape[0])
  return Model(
      source=str(folder), family="gpt2",
      description={"model_type": "gpt2", "num_layers": num_layers, "d_model": d,
                   "num_heads": heads, "d_ff": int(params["blocks"]["fc_w"].shape[-1]),
                   "vocab_size": int(params["wte"].shape[0]),
                   "parameters": _param_count(params), "dtype": "float32"},
      vocab_size=int(params["wte"].shape[0]), max_len=int(params["wpe"].shape[0]),
      num_layers=num_layers, num_heads=heads, d_model=d, tokenizer=_tokenizer_in(folder),
      streams=lambda t: _gpt2_streams(params, t, heads),
      attention=lambda t: _gpt2_attention(params, t, heads),
      token_blocks=lambda t, pos: gpt2_jacobians.token_block_jacobians(params, t, pos, heads),
      gradients=lambda t: _gpt2_gradients(params, t, heads))


@functools.partial(jax.jit, static_argnums=0)
def _decoder_streams(cfg, params, tokens):
  h0 = transformer.first_layer_input(cfg, params, tokens[None])[0]
  def step(h, layer):
    out = transformer.layer_forward(cfg, layer, h)[1]
    return out, out
  return jnp.concatenate([h0[None], jax.lax.scan(step, h0, params["layers"])[1]], axis=0)


@functools.partial(jax.jit, static_argnums=0)
def _decoder_attention(cfg, params, tokens):
  _, state = transformer.DecoderLM(cfg).apply(   # return_hidden: no LM head computed
      {"params": params}, tokens[None], capture_probs=True, return_hidden=True,
      mutable=["intermediates"])
  return state["intermediates"]["layers"]["attn"]["attn_probs"][0][:, 0]


@functools.partial(jax.jit, static_argnums=0)
def _decoder_gradients(cfg, params, tokens_KxT):
  targets = tokens_KxT[:, 1:]
  loss, g_params, g_acts, acts = transformer.intermediate_grads(
      transformer.DecoderLM(cfg), params, tokens_KxT[:, :-1],
      lambda z: losses.cross_entropy(z, targets))
  gains = {k: params["layers"].get(diagnostics_postnorm.NORM_AFTER_Y[k], {}).get("scale")
           if cfg.norm_position == "post" else None for k in (1, 2)}
  out = diagnostics_postnorm.sublayer_factors(acts, g_acts, float(cfg.norm_eps), gains)
  out["grad_norm"] = gradients_lib.layer_grad_norms(g_params, ("layers",))
  out["loss"] = loss
  return out


def _decoder(cfg, params, source: str, extra: dict, tokenizer: str | None) -> Model:
  params = jax.tree.map(jnp.asarray, params)
  fields = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "vocab_size",
            "norm_position", "norm_op", "ffn", "pos_embedding", "rope_base", "tie_embeddings",
            "attn_bias")
  return Model(
      source=source, family="decoder",
      description={**extra, **{f: getattr(cfg, f) for f in fields},
                   "parameters": _param_count(params), "dtype": cfg.param_dtype},
      vocab_size=cfg.vocab_size, max_len=cfg.max_seq_len, num_layers=cfg.num_layers,
      num_heads=cfg.num_heads, d_model=cfg.d_model, tokenizer=tokenizer,
      streams=lambda t: _decoder_streams(cfg, params, t),
      attention=lambda t: _decoder_attention(cfg, params, t),
      token_blocks=lambda t, pos: decoder_jacobians.token_block_jacobians(cfg, params, t, pos),
      gradients=lambda t: _decoder_gradients(cfg, params, t))


def _rankjax_run(workdir: pathlib.Path, step: int | None) -> Model:
  from rankjax.train.run_reader import load_run
  run = load_run(str(workdir), step)
  if run.config.model != "lm":
    raise ValueError(f"{workdir}: a {run.config.model!r} run; rankjax analyze reads "
                     "language models")
  tokenizer = run.config.tokenizer if getattr(run.config, "tokenizer", None) else None
  return _decoder(run.config.lm, run.params, f"{workdir} (step {run.step})",
                  {"model_type": "rankjax", "step": int(run.step)}, tokenizer)


def open_checkpoint(path: str, step: int | None = None) -> Model:
  """A Hugging Face checkpoint folder (GPT-2, Llama, Mistral, Qwen2) or a rankjax LM
  training workdir (``step``: default the newest checkpoint)."""
  folder = pathlib.Path(path)
  if not folder.is_dir():
    raise FileNotFoundError(f"checkpoint folder {folder} not found")
  if (folder / "checkpoints").is_dir():
    return _rankjax_run(folder, step)
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
    return _gpt2(folder, hf)
  if kind in hf_llama.MODEL_TYPES:
    cfg, params = hf_llama.load_llama(folder)
    return _decoder(cfg, params, str(folder), {"model_type": kind}, _tokenizer_in(folder))
  raise ValueError(f"{config}: model_type={kind!r} is not supported (gpt2, "
                   f"{', '.join(hf_llama.MODEL_TYPES)})")
