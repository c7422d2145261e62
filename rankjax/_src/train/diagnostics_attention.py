"""The ``attention`` diagnostic: attention-row statistics of the softmax-sensitivity
paper (Sec 5, "Attention measurements"; App D.1) during training.

At chosen layers (default: first, middle and last, the paper's {0, N/2, N-1}) an
evaluation-mode forward pass (dropout off) on the diagnostic examples gives the
attention probabilities; ``num_rows`` rows (all, when fewer exist) pooled over
batch and heads with query position ``t >= min_query`` are sampled and, on each row's
causal support, the certificate theta_cert, p_max and the normalized entropy are
computed (``rankjax._src.measure.sensitivity.attention_statistics``). Per layer the 5/25/50/75/95th
percentiles and the mean are kept:

  ``<stat>_<p5|p25|p50|p75|p95|mean>``: (num_layers_sampled,) for stat in
  ``theta_cert`` (the paper's greedy-prefix certificate), ``theta_balance`` (our
  balance certificate, never lower, on the same rows), ``p_max``, ``entropy_norm``;
  ``p_max_uniform_mean``: mean of 1/(t+1) over the sampled rows (the uniform-support
  baseline the paper compares the plateaued Post-LN runs with);
  ``layers``: the sampled layer indices.

Per-block parameter-gradient norms (App D, "layerwise gradient norms") are not
repeated here: the built-in ``basic`` diagnostic logs them as ``basic/grad_norm``.

Rows of layer ``layers[i]`` at update s are drawn with ``row_key(s, i)``, so a test or
a reader can recompute the very same rows from captured probabilities.

Memory. The probabilities are computed one layer at a time (the blocks of the
``nn.scan`` stack applied in a Python loop, probabilities captured only at the
sampled layers): peak extra memory is the sampled layers' (B, H, T, T) tensors, not the
(L, B, H, T, T) stack of ``DecoderLM.apply(..., capture_probs=True)``. At the paper's
scale (L = 36, H = 20, T = 1024, 4 diagnostic examples) the full stack would be
36 * 4 * 20 * 1024^2 * 4 B = 12 GB in float32; the three sampled layers are 1 GB. The cost is one
extra forward pass of the diagnostic examples per diagnostics step.

Use: train with ``--set 'diagnostics=["basic","attention"]'`` ("attention" is in
``rankjax._src.train.diagnostics.BUILTIN``). ``register_attention`` registers variants
(other layers, row counts) under other names.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from rankjax._src.measure import sensitivity as sens
from rankjax._src.models.transformer import DecoderBlock, first_layer_input
from rankjax._src.train import diagnostics as diag_lib
from rankjax._src.errors import UserError

Array = jax.Array

PERCENTILES = (5, 25, 50, 75, 95)
STATS = ("theta_cert", "theta_balance", "p_max", "entropy_norm")
ROW_SEED = 20240606  # fixed: the rows depend on the update and the layer only


def default_layers(num_layers: int) -> tuple[int, ...]:
  """First, middle and last layer (the paper's {0, N/2, N-1}), without repeats."""
  return tuple(sorted({0, num_layers // 2, num_layers - 1}))


def row_key(step: Array | int, layer_slot: int) -> Array:
  """The PRNG key of the rows sampled at update ``step`` for the i-th sampled layer."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(ROW_SEED), step), layer_slot)


def layer_probs(model: Any, params: Any, tokens_BxT: Array,
                layers: Sequence[int]) -> list[Array]:
  """Attention probabilities (B, H, T, T) at ``layers`` of a ``DecoderLM``.

  Deterministic (evaluation-mode) forward, one block at a time, so only the sampled
  layers' probabilities exist at once. Equal to slicing the stack that
  ``model.apply(..., capture_probs=True, mutable=["intermediates"])`` sows under
  ``intermediates/layers/attn/attn_probs`` (tested).
  """
  cfg = model.cfg
  h = first_layer_input(cfg, params, tokens_BxT)
  wanted = set(int(l) for l in layers)
  out: dict[int, Array] = {}
  for l in range(max(wanted) + 1):
    layer_params = jax.tree.map(lambda x, l=l: x[l], params["layers"])
    capture = l in wanted
    block = DecoderBlock(cfg, capture_probs=capture, deterministic=True)
    if capture:
      (h, _), state = block.apply({"params": layer_params}, h, mutable=["intermediates"])
      out[l] = state["intermediates"]["attn"]["attn_probs"][0]
    else:
      h, _ = block.apply({"params": layer_params}, h)
  return [out[int(l)] for l in layers]


def attention_summary(probs_BxHxTxT: Array, key: Array, num_rows: int = 512,
                      min_query: int = 16) -> dict[str, Array]:
  """Flat per-layer statistics (scalars) of one layer's probabilities, see module doc."""
  B, H, T, _ = probs_BxHxTxT.shape
  n = min(num_rows, B * H * max(T - min_query, 0))
  if n < 1:
    raise UserError(f"no attention rows with t >= {min_query} in a sequence of length {T}")
  greedy = sens.attention_statistics(probs_BxHxTxT, key, num_rows=n, min_query=min_query,
                                     percentiles=PERCENTILES, method="greedy_prefix")
  balance = sens.attention_statistics(probs_BxHxTxT, key, num_rows=n, min_query=min_query,
                                      percentiles=PERCENTILES, method="balance")
  out = {}
  for name, src, stat in (("theta_cert", greedy, "theta_cert"),
                          ("theta_balance", balance, "theta_cert"),
                          ("p_max", greedy, "p_max"),
                          ("entropy_norm", greedy, "entropy_norm")):
    for k, v in src[stat].items():
      out[f"{name}_{k}"] = v
  t = greedy["rows"]["t"]
  out["p_max_uniform_mean"] = jnp.mean(1.0 / (t + 1).astype(jnp.float32))
  return out


def attention_diagnostic(d: diag_lib.DiagInputs, layers: Sequence[int] | None = None,
                         num_rows: int = 512, min_query: int = 16) -> dict[str, Array]:
  """The ``attention`` diagnostic's values for one ``DiagInputs`` (LM only)."""
  if d.kind != "transformer":
    raise UserError(f"the attention diagnostic needs a transformer model, got {d.kind!r}")
  num_layers = d.model.cfg.num_layers
  layers = tuple(layers) if layers is not None else default_layers(num_layers)
  if not layers or min(layers) < 0 or max(layers) >= num_layers:
    raise UserError(f"layers {layers} out of range for {num_layers} layers")
  probs_LxBxHxTxT = jnp.stack(layer_probs(d.model, d.params, d.batch["inputs"], layers))
  keys = jnp.stack([row_key(d.step, i) for i in range(len(layers))])
  # one traced copy of the statistics for all layers (compile time), mapped over layers
  out = jax.lax.map(lambda a: attention_summary(a[0], a[1], num_rows, min_query),
                    (probs_LxBxHxTxT, keys))
  out = {k: v.astype(jnp.float32) for k, v in out.items()}
  out["layers"] = jnp.asarray(layers, jnp.int32)
  return out


def register_attention(name: str = "attention", layers: Sequence[int] | None = None,
                       num_rows: int = 512, min_query: int = 16) -> None:
  """Registers an attention-statistics diagnostic under ``name``."""

  def fn(d: diag_lib.DiagInputs) -> dict[str, Array]:
    return attention_diagnostic(d, layers, num_rows, min_query)

  fn.__doc__ = attention_diagnostic.__doc__
  diag_lib.register(name, fn)


def attention(d: diag_lib.DiagInputs) -> dict[str, Array]:
  """The built-in "attention" diagnostic: ``attention_diagnostic`` with its defaults
  (layers 0, L/2, L-1; 512 rows; queries from position 16)."""
  return attention_diagnostic(d, None, 512, 16)
