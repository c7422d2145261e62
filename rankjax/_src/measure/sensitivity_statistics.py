"""Attention-row statistics and the gradient-spike rule of the softmax-sensitivity Sec 5.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability"
(``papers/softmax_sensitivity.txt``), Sec 5 ("Attention measurements", "Other
metrics"). The per-row certificate is ``sensitivity_certificates.theta_certificate``.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.scipy.special import entr

from rankjax._src.measure.sensitivity_certificates import CertificateMethod, theta_certificate
from rankjax._src.numerics import as_float

Array = jax.Array


def _summary(x_R: Array, percentiles: Sequence[float]) -> dict[str, Array]:
  values = jnp.percentile(x_R, jnp.asarray(percentiles, x_R.dtype))
  out = {f"p{q:g}": values[i] for i, q in enumerate(percentiles)}
  out["mean"] = jnp.mean(x_R)
  return out


@functools.partial(jax.jit, static_argnames=("num_rows", "min_query", "percentiles",
                                             "method"))
def attention_statistics(probs_BxHxTxT: Array, key: Array, num_rows: int = 512,
                         min_query: int = 16,
                         percentiles: Sequence[float] = (5, 25, 50, 75, 95),
                         method: CertificateMethod = "greedy_prefix") -> dict:
  """Attention-row statistics of Sec 5 ("Attention measurements"); jit-able.

  Samples ``num_rows`` rows without replacement, pooled over batch and heads, with
  query position ``t >= min_query``; each row is restricted to its causal support
  ``j <= t`` (and renormalized there). For each row: the certificate
  ``theta_certificate(row, method)`` (default the paper's ``"greedy_prefix"``; our
  ``"balance"`` is never lower), ``p_max`` and the normalized entropy
  ``H_norm = -sum_j p_j log p_j / log(t + 1)`` (0 when ``t = 0``).

  Args:
    probs_BxHxTxT: attention probabilities (query axis -2, key axis -1).
    key: PRNG key for the row sample.
    num_rows, min_query, percentiles, method: static (``percentiles`` a tuple).
  Returns:
    ``{"theta_cert"|"p_max"|"entropy_norm": {"p5": ..., ..., "mean": ...},
    "rows": {"b", "h", "t", "theta_cert", "p_max", "entropy_norm"}}`` (per-row values
    and the sampled indices).
  """
  B, H, T, T2 = probs_BxHxTxT.shape
  if T != T2:
    raise ValueError(f"expected (B, H, T, T) probabilities, got {probs_BxHxTxT.shape}")
  nq = T - min_query
  pool = B * H * max(nq, 0)
  if num_rows > pool:
    raise ValueError(f"num_rows={num_rows} exceeds the {pool} rows with t >= {min_query}")
  flat = jax.random.choice(key, pool, (num_rows,), replace=False)
  b, h, t = flat // (H * nq), (flat // nq) % H, flat % nq + min_query
  rows_RxT = as_float(probs_BxHxTxT[b, h, t, :])
  rows_RxT = jnp.where(jnp.arange(T)[None, :] <= t[:, None], rows_RxT, 0.0)
  p_RxT = rows_RxT / jnp.sum(rows_RxT, axis=-1, keepdims=True)
  theta = theta_certificate(p_RxT, method)
  p_max = jnp.max(p_RxT, axis=-1)
  log_support = jnp.log((t + 1).astype(p_RxT.dtype))
  entropy = jnp.where(t > 0, jnp.sum(entr(p_RxT), -1) / jnp.where(t > 0, log_support, 1.0),
                      0.0)
  per_row = {"theta_cert": theta, "p_max": p_max, "entropy_norm": entropy}
  out = {name: _summary(v, percentiles) for name, v in per_row.items()}
  out["rows"] = dict(b=b, h=h, t=t, **per_row)
  return out


@functools.partial(jax.jit, static_argnames=("window", "warmup",
                                             "exclude_warmup_from_window"))
def gradient_spikes(grad_norms: Array, window: int = 50, warmup: int = 10,
                    factor: float = 2.0, exclude_warmup_from_window: bool = False) -> Array:
  """Gradient-spike flags (Sec 5, "Other metrics"); jnp, jit-able.

  "A gradient spike is an optimizer update whose pre-clipping norm exceeds twice the
  median of the available preceding updates, using a window of at most 50 updates;
  the first 10 updates are excluded." Update ``t`` (0-based) is a spike when
  ``t >= warmup`` and ``g[t] > factor * median(g[max(0, t - window) : t])``. The
  paper leaves open whether the first updates also leave the window; by default they
  stay in it ("available preceding updates"), ``exclude_warmup_from_window=True``
  drops them. The median of an even count is the mean of the two middle values.

  Args:
    grad_norms: ``(..., N)`` per-update pre-clipping global gradient norms.
  Returns:
    boolean ``(..., N)``.
  """
  g = as_float(grad_norms)
  N = g.shape[-1]
  steps = jnp.arange(N)
  j_NxW = steps[:, None] - 1 - jnp.arange(window)[None, :]
  first = warmup if exclude_warmup_from_window else 0
  valid_NxW = j_NxW >= first
  prev = jnp.where(valid_NxW, g[..., jnp.clip(j_NxW, 0, max(N - 1, 0))], jnp.nan)
  median = jnp.nanmedian(prev, axis=-1)
  return (steps >= warmup) & jnp.any(valid_NxW, -1) & (g > factor * median)
