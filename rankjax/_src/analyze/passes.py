"""The two passes of ``rankjax analyze`` over a ``Model``'s layers, one layer at a time.

  * ``forward_pass``: the stream h_0 .. h_L of every sequence, each layer's attention
    measures and the token sublayers' engine terms (Eq. 18) at the chosen positions,
    from the layer's input stream; h_l stays on the devices between layers, a copy goes
    to the host for the stream measures and the backward pass.
  * ``backward_pass``: the next-token loss and its gradient w.r.t. h_L, then layer by
    layer from the last one the VJP of the layer's X_k / Y_k sites (``fns.sites``, zero
    perturbations): ``diagnostics_postnorm.sublayer_factors`` of that layer and its
    parameter-gradient norm, and the gradient w.r.t. the layer's input.

Each function here is jitted once per configuration and shape (the parameters are arguments)
and traced at the measurement precision (``measure.precision``, 'highest' by default).
A layer's parameters come from ``model.weights.layer(l)``: one layer at a time when the
weights are read per layer. A progress bar per layer goes to stderr when it is a
terminal (tqdm); the per-layer seconds go into ``analysis.json``.
"""
from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.measure import engine, losses
from rankjax._src.measure import gradients as gradients_lib
from rankjax._src.measure import precision as precision_lib
from rankjax._src.models import sites as sites_lib
from rankjax._src.train import diagnostics_postnorm

Array = jax.Array


@functools.partial(jax.jit, static_argnames=("fns", "precision"))
@precision_lib.measured
def _embed(fns, top, tokens_KxT):
  return jax.vmap(lambda t: fns.embed(top, t))(tokens_KxT)


@functools.partial(jax.jit, static_argnames=("fns", "precision"))
@precision_lib.measured
def _forward(fns, layer, h_KxTxD):
  return jax.vmap(lambda h: fns.forward(layer, h))(h_KxTxD)


@functools.partial(jax.jit, static_argnames=("fns", "precision"))
@precision_lib.measured
def _attention(fns, layer, h_KxTxD):
  return jax.vmap(lambda h: fns.attention(layer, h))(h_KxTxD).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("fns", "precision"))
@precision_lib.measured
def _token_terms(fns, layer, h_TxD, position):
  return jax.tree.map(lambda x: x.astype(jnp.float32),
                      fns.token_terms(layer, h_TxD, position))


@functools.partial(jax.jit, static_argnames=("fns", "precision"))
@precision_lib.measured
def _head_gradient(fns, top, h_KxTxD, targets_KxT):
  def loss(h):
    return losses.cross_entropy(jax.vmap(lambda x: fns.logits(top, x))(h), targets_KxT)
  return jax.value_and_grad(loss)(h_KxTxD)


@functools.partial(jax.jit, static_argnames=("fns", "precision"))
@precision_lib.measured
def _layer_backward(fns, layer, h_KxTxD, g_out):
  def sites(p, h, e):
    return jax.vmap(lambda x, ex: fns.sites(p, x, ex))(h, e)

  zeros = sites_lib.zero_perturbations(lambda: sites(layer, h_KxTxD, None)[1])

  (_, acts), vjp = jax.vjp(sites, layer, h_KxTxD, zeros)
  g_layer, g_in, g_sites = vjp((g_out, jax.tree.map(jnp.zeros_like, acts)))
  one = lambda tree: {k: v[None] for k, v in tree.items()}       # a stack of one layer
  gains = {k: None if g is None else g[None] for k, g in fns.gains(layer).items()}
  out = diagnostics_postnorm.sublayer_factors(one(acts), one(g_sites), fns.eps, gains)
  out["grad_norm"] = gradients_lib.layer_grad_norms(
      {"layers": jax.tree.map(lambda x: x[None], g_layer)}, ("layers",))
  return g_in, {k: v[0] for k, v in out.items()}


def _layers(desc: str, n: int):
  from tqdm import tqdm
  return tqdm(range(n), desc=desc, unit="layer", file=sys.stderr, disable=None, leave=False)


def _stack(rows: list):
  return jax.tree.map(lambda *a: np.stack(a), *rows)


def forward_pass(model, seqs_KxT: np.ndarray, positions: list[int], *,
                 keep_streams: bool, attention: bool) -> dict:
  """``{"streams": (L+1, K, T, d) float32 on the host or None, "attention": [per layer
  the (K, H, T, T) probabilities' measures], "token_blocks": {position: engine.
  BlockJacobians of sequence 0}, "seconds": {part: [per layer]}}``."""
  from rankjax._src.analyze import measures as measures_lib
  fns, weights = model.fns, model.weights
  h = _embed(fns, weights.top, jnp.asarray(seqs_KxT))
  streams = [np.asarray(h, np.float32)] if keep_streams else None
  heads, terms = [], {p: [] for p in positions}
  seconds = {"forward": [], "attention": [], "jacobian": []}
  for l in _layers("forward", model.num_layers):
    layer = weights.layer(l)
    if attention:
      t0 = time.perf_counter()
      probs = np.asarray(_attention(fns, layer, h))
      heads.append(measures_lib.attention_measures(probs[:, None])[0])
      seconds["attention"].append(time.perf_counter() - t0)
    if positions:
      t0 = time.perf_counter()
      for p in positions:
        terms[p].append(jax.device_get(_token_terms(fns, layer, h[0], p)))
      seconds["jacobian"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    h = jax.block_until_ready(_forward(fns, layer, h))
    seconds["forward"].append(time.perf_counter() - t0)
    del layer
    if keep_streams:
      streams.append(np.asarray(h, np.float32))
  last = np.asarray(h[0], np.float32)
  blocks = {}
  for p, rows in terms.items():
    attn, ffn, h_in, h_mid = _stack(rows)
    blocks[p] = engine.token_sublayers(attn, ffn, jnp.asarray(h_in), jnp.asarray(h_mid),
                                       jnp.asarray(last[p]))
  return {"streams": np.stack(streams) if keep_streams else None, "attention": heads,
          "token_blocks": blocks, "seconds": {k: v for k, v in seconds.items() if v}}


def backward_pass(model, seqs_KxT: np.ndarray, streams: np.ndarray) -> dict:
  """With the mean next-token cross-entropy of the K sequences (T-1 predictions each,
  the streams' first T-1 tokens: the model is causal): ``{"loss", "layers": [per layer
  the sublayer factors and grad_norm], "seconds": [per layer]}``."""
  fns, weights = model.fns, model.weights
  dtype = jnp.dtype(model.description["compute_dtype"])
  prefix = lambda l: jnp.asarray(streams[l][:, :-1], dtype)
  loss, g = _head_gradient(fns, weights.top, prefix(model.num_layers),
                           jnp.asarray(seqs_KxT[:, 1:]))
  rows, seconds = [None] * model.num_layers, [0.0] * model.num_layers
  for i in _layers("backward", model.num_layers):
    l = model.num_layers - 1 - i
    t0 = time.perf_counter()
    layer = weights.layer(l)
    g, factors = _layer_backward(fns, layer, prefix(l), g)
    rows[l] = {k: float(v) for k, v in sorted(jax.device_get(factors).items())}
    seconds[l] = time.perf_counter() - t0
    del layer
  return {"loss": float(loss), "layers": rows, "seconds": seconds}
