"""The per-layer measures of ``rankjax analyze``: pure functions of a model's arrays
(streams, attention probabilities, block Jacobians), each the library's one formula.

  * ``stream_measures``: token similarity (postnorm Def 2.1) of the embeddings and of
    each layer's output (layer 0 = the first block, as in training's diagnostics); the
    mean spike ``||mean_t h||`` with its noise floor and the coherence
    ``cos(m_l, m_{l+1})`` of the branch means ``m_l = mean_t`` (layer l's output minus
    its input) (Transforming Rank Sec 5, Fig 7).
  * ``attention_measures``: per head, percentiles over rows (queries t >= 1, restricted
    to their causal support) of the normalized entropy, p_max and the certificate
    ``theta_certificate`` (softmax paper App D.2, greedy prefix), and the exact
    ``theta(p)`` (Def 3.1) for the rows of at most ``MAX_ENUMERATE_L`` keys, with the
    certificate over those same rows beside it (``theta_cert_exact_rows``: a lower
    bound row by row, so percentile by percentile); which rows each covers:
    ``attention_rows``. theta values are clipped to [0, 1] (float32 rounding gave
    1 + 2e-7).
  * ``jacobian_measures``: at one token, the attention and FFN sublayer Jacobians
    ``J_R (I + G)`` (Eq. 18) and the whole block's (their product), each with effective
    and stable rank (Eq. 3) and top singular values (Fig 8c, 12); through depth the
    erank of the token's input-output Jacobian and, where defined, the path-order profile
    (App A.1).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.measure import engine, representations, sensitivity, similarity, spectra
from rankjax._src.measure.sensitivity_exact import MAX_ENUMERATE_L

Array = jax.Array
PERCENTILES = (5, 25, 50, 75, 95)
TOP_SINGULAR_VALUES = 8


def _percentiles(x: np.ndarray) -> dict[str, float]:
  x = np.asarray(x, np.float64).reshape(-1)
  if not x.size:
    return {}
  out = {f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}
  out["mean"] = float(x.mean())
  return out


def _stream_row(sim, spike, floor, i: int) -> dict:
  return {"token_similarity": {"mean": float(sim[:, i].mean()), "min": float(sim[:, i].min()),
                               "max": float(sim[:, i].max())},
          "mean_spike": float(spike[:, i].mean()), "mean_noise_floor": float(floor[:, i].mean())}


def stream_measures(streams_KxLxTxD: np.ndarray) -> dict:
  """The streams h_0 (embeddings) .. h_L of K sequences: ``{"embeddings": {...},
  "layers": [...]}``, layer l (0 = the first block) measured on its output h_{l+1}:
  token similarity (mean and min-max over the sequences), mean spike, its noise floor,
  and on layers 0..L-2 the branch-mean coherence ``cos(m_l, m_{l+1})``."""
  h = jnp.asarray(streams_KxLxTxD)
  sim = np.asarray(similarity.token_similarity(h))                       # (K, L+1)
  spike = np.asarray(representations.mean_spike(h))
  floor = np.asarray(representations.mean_noise_floor(h))
  means = jnp.mean(h[:, 1:] - h[:, :-1], axis=-2)                        # (K, L, d)
  coherence = np.asarray(representations.consecutive_cosine(means))      # (K, L-1)
  layers = []
  for l in range(h.shape[1] - 1):
    row = {"layer": l, **_stream_row(sim, spike, floor, l + 1)}
    if l < coherence.shape[1]:
      row["branch_mean_coherence"] = float(coherence[:, l].mean())
    layers.append(row)
  return {"embeddings": _stream_row(sim, spike, floor, 0), "layers": layers}


@jax.jit
def _row_measures(probs_HxTxT: Array) -> dict[str, Array]:
  t = probs_HxTxT.shape[-1]
  support = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]            # (T, T) causal
  p = jnp.where(support, probs_HxTxT, 0.0)
  p = p / jnp.sum(p, axis=-1, keepdims=True)
  log_support = jnp.log(jnp.arange(1, t + 1, dtype=p.dtype))
  entropy = jnp.sum(jax.scipy.special.entr(p), -1) / jnp.where(log_support > 0, log_support, 1.0)
  return {"entropy_norm": entropy[:, 1:], "p_max": jnp.max(p, -1)[:, 1:],
          "theta_cert": jnp.clip(sensitivity.theta_certificate(p)[:, 1:], 0.0, 1.0)}


@jax.jit
def _exact_theta(probs_HxTxT: Array) -> Array:
  """theta(p) of the rows t = 1 .. MAX_ENUMERATE_L - 1 (support t + 1 <= the limit),
  clipped to [0, 1]."""
  n = min(probs_HxTxT.shape[-1], MAX_ENUMERATE_L)
  p = probs_HxTxT[:, 1:n, :n]
  support = jnp.arange(n)[None, :] <= jnp.arange(1, n)[:, None]
  p = jnp.where(support, p, 0.0)
  return jnp.clip(sensitivity.theta_exact(p / jnp.sum(p, -1, keepdims=True)), 0.0, 1.0)


def attention_rows(tokens: int) -> dict[str, str]:
  """Which rows (queries) each statistic of ``attention_measures`` covers, for
  sequences of ``tokens`` tokens (``analysis.json``'s ``attention_rows``)."""
  n = min(tokens, MAX_ENUMERATE_L)
  return {"entropy_norm, p_max, theta_cert": f"every query t = 1 .. {tokens - 1} "
                                             "(t + 1 keys each)",
          "theta_exact, theta_cert_exact_rows": f"the queries t = 1 .. {n - 1} (at most "
                                                f"{MAX_ENUMERATE_L} keys: theta(p) is "
                                                "enumerated over subsets)",
          "clipped": "theta values clipped to [0, 1] (float32 rounding)"}


def attention_measures(probs_KxLxHxTxT: np.ndarray) -> list[list[dict]]:
  """Per layer, per head: percentiles over the rows of every sequence (queries t >= 1)
  of ``entropy_norm``, ``p_max``, ``theta_cert``; ``theta_exact`` over the rows of at
  most ``MAX_ENUMERATE_L`` keys (beyond them the certificate is the measure) and
  ``theta_cert_exact_rows``, the certificate over those same rows
  (``attention_rows``)."""
  probs = np.asarray(probs_KxLxHxTxT)
  k, num_layers, heads = probs.shape[:3]
  out = []
  for l in range(num_layers):
    rows = [jax.device_get(_row_measures(jnp.asarray(probs[s, l]))) for s in range(k)]
    exact = [np.asarray(_exact_theta(jnp.asarray(probs[s, l]))) for s in range(k)]
    layer = []
    for h in range(heads):
      entry = {name: _percentiles(np.concatenate([r[name][h] for r in rows]))
               for name in ("entropy_norm", "p_max", "theta_cert")}
      entry["theta_exact"] = _percentiles(np.concatenate([e[h] for e in exact]))
      entry["theta_cert_exact_rows"] = _percentiles(np.concatenate(
          [r["theta_cert"][h, :e.shape[-1]] for r, e in zip(rows, exact)]))
      entry["head"] = h
      layer.append(entry)
    out.append(layer)
  return out


def _spectrum(m: np.ndarray) -> dict:
  sv = np.linalg.svd(np.asarray(m, np.float64), compute_uv=False)
  return {"erank": float(spectra.effective_rank_from_singular_values(sv)),
          "stable_rank": float(spectra.stable_rank_from_singular_values(sv)),
          "top_singular_values": [float(x) for x in sv[:TOP_SINGULAR_VALUES]]}


def jacobian_measures(bj: engine.BlockJacobians, *, with_paths: bool = True) -> dict:
  """At one token: per layer the attention and FFN sublayer Jacobians ``J_R (I + G)``,
  their branch parts G and the whole block's Jacobian (FFN sublayer @ attention
  sublayer), each ``_spectrum``; and the token's input-output Jacobian through the 2L
  sublayers (``engine.measurements``: erank / d after each sublayer, entry 2l layer l's
  attention and 2l+1 its FFN; path-order profile and mean order with path sums).
  ``erank`` / ``stable_rank`` are absolute; the keys ending ``_over_d`` are divided by d."""
  sub = np.asarray(engine.sublayer_jacobian(bj.skip, bj.branch))          # (2L, d, d)
  g = np.asarray(bj.relative_branch)
  layers = []
  for l in range(sub.shape[0] // 2):
    layers.append({"attention_sublayer": _spectrum(sub[2 * l]),
                   "ffn_sublayer": _spectrum(sub[2 * l + 1]),
                   "attention_branch": _spectrum(g[2 * l]), "ffn_branch": _spectrum(g[2 * l + 1]),
                   "block": _spectrum(sub[2 * l + 1] @ sub[2 * l])})
  m = jax.device_get(jax.jit(engine.measurements, static_argnames="with_paths")(
      bj, with_paths=with_paths))
  depth = {"erank_over_d": np.asarray(m["erank"]).tolist(),
           "stable_rank_over_d": np.asarray(m["stable_rank"]).tolist()}
  if with_paths:
    depth.update(order_profile=np.asarray(m["order_profile"]).tolist(),
                 mean_order=float(m["mean_order"]),
                 reconstruction_error=float(m["reconstruction_error"]))
  return {"layers": layers, "through_depth": depth}
