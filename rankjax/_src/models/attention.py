"""Causal multi-head attention with temperature, rotary positions, grouped K/V and the
P - alpha*C_n intervention: the layer (its parameters, their init, RoPE); the kernels it
runs and which one a call takes are ``rankjax._src.models.attention_kernels``.

Post-Norm collapse paper, Eq. 2: ``Attn(X) = P X W_V W_O`` with
``P = softmax_row(X W_Q (X W_K)^T / sqrt(d_head) / tau + M_causal)``. Corollary 3.3's
intervention replaces P by ``P - alpha * C_n``, where C_n is the causal
prefix-average matrix, ``(C_n)_ij = 1/i`` for ``i >= j`` (1-indexed)
(:func:`prefix_average_matrix`; the kernels apply it on P or, where exact, as
``P V - alpha C_n V`` without any T x T matrix).

``CausalSelfAttention`` asks ``attention_kernels.select`` for the kernel of each call
(:func:`kernel_for`: ``attention_impl``, ``attn_dropout_mask``, ``attn_dropout_kernel``
and the call's needs: captured probabilities, dropout in training, float64, prefix
removal), copies grouped K/V to the query heads only for a kernel that does not take
them, and runs it through ``attention_kernels.attend``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import with_logical_partitioning as logical
from jax.ad_checkpoint import checkpoint_name

from rankjax._src.config import RopeConfig, TransformerConfig
from rankjax._src.models import attention_kernels as kernels
from rankjax._src.models.annotated import PlainInit
from rankjax._src.models.matmul import weight_matmul
from rankjax._src.numerics import float_dtype

ATTENTION_OUT = "attention_out"   # checkpoint_name of the heads' output, before W_O
# read here by the decoder's remat policy, the measures, studies and benchmarks
ATTENTION_RESIDUALS = kernels.ATTENTION_RESIDUALS
causal_probabilities = kernels.causal_probabilities
blocked_attention = kernels.blocked_attention
causal_dropout_attention = kernels.causal_dropout_attention


# the matrices ``init_scale_to="value_ffn"`` scales (TransformerConfig.init_scale_to), and
# those each of its extensions scales; "all" scales every matrix
VALUE_FFN_MATRICES = ("w_v", "w_o", "w_2", "w_3")
INIT_SCALE_MATRICES = {"value_ffn": VALUE_FFN_MATRICES,
                       "value_ffn_qk": (*VALUE_FFN_MATRICES, "w_q", "w_k"),
                       "value_ffn_gate": (*VALUE_FFN_MATRICES, "w_1")}
OUTPUT_PROJECTIONS = ("w_o", "w_2")   # gpt2's 1/sqrt(2N) output projections


def matrix_init(cfg: TransformerConfig, name: str, fan_in: int):
  """The init of weight matrix ``name`` (w_q, w_k, w_v, w_o, w_1, w_2, w_3, lm_head)
  under ``cfg.init``, times ``cfg.init_scale`` in variance where ``cfg.init_scale_to``
  includes it ("all", or ``name`` in :data:`INIT_SCALE_MATRICES` of it).

  paper_collapse (postnorm Sec 2): N(0, 1/(3 fan_in)) -- 1/(3d) for every d-input
  matrix and 1/(3 d_ff) for W_2. gpt2: N(0, 0.02^2), output projections (W_O and the
  FFN's down projection, :data:`OUTPUT_PROJECTIONS`) N(0, (0.02/sqrt(2N))^2) with N the
  number of layers.

  The standard deviation is a Python float (``math.sqrt``) from a concrete config, the
  init of every run. In a program sweeping ``init_scale`` (``rankjax._src.train.runs``) a
  run's step holds a traced value, and flax traces each initializer at apply to check
  the parameter's shape: there the same formula runs on the tracer (``jnp.sqrt``), its
  value unused.
  """
  def init(key, shape, dtype=jnp.float32):
    scale = (cfg.init_scale if cfg.init_scale_to == "all"
             or name in INIT_SCALE_MATRICES[cfg.init_scale_to] else 1.0)
    sqrt = math.sqrt if isinstance(scale, (int, float)) else jnp.sqrt
    if cfg.init == "paper_collapse":
      std = sqrt(scale / (3.0 * fan_in))
    else:
      std = 0.02 * sqrt(scale)
      if name in OUTPUT_PROJECTIONS:
        std /= math.sqrt(2.0 * cfg.num_layers)
    return nn.initializers.normal(stddev=std)(key, shape, dtype)
  return init


def rope_frequencies(d_head: int, cfg: RopeConfig, dtype=jnp.float32) -> jax.Array:
  """The rotation frequencies ``theta_i``, ``(d_head/2,)``, of the RoPE settings ``cfg``
  (``TransformerConfig.rope``): ``base^(-2i/d_head)`` (RoFormer Eq. 34), scaled by
  ``scaling``: "linear" divides every one by ``factor``
  (position interpolation, Chen et al. 2023); "llama3" (Llama 3.1) divides those whose
  wavelength ``2 pi / theta`` exceeds ``original_max_len / low_freq_factor`` by
  ``factor``, keeps those below ``original_max_len / high_freq_factor``, and between
  them interpolates ``(1 - s) theta / factor + s theta`` with ``s = (original_max_len /
  wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)`` (the formula of
  transformers' ``_compute_llama3_parameters``); "yarn" (YaRN, Peng et al. 2023, Eq. 18-19
  "NTK-by-parts") blends ``theta / factor`` and ``theta`` with a ramp over the dimension
  index between ``d(beta_fast)`` and ``d(beta_slow)``, ``d(r) = d_head ln(original_max_len
  / (2 pi r)) / (2 ln base)`` (floored and ceiled when ``truncate``; transformers'
  ``_compute_yarn_parameters``); its attention factor is ``cfg.attention_factor``."""
  base, scaling, factor, original_max_len = cfg.base, cfg.scaling, cfg.factor, cfg.original_max_len
  theta = base ** (-jnp.arange(0, d_head, 2, dtype=dtype) / d_head)
  if scaling == "none":
    return theta
  if scaling == "linear":
    return theta / factor
  if scaling == "yarn":
    dim = lambda r: d_head * math.log(original_max_len / (r * 2 * math.pi)) / (2 * math.log(base))
    low, high = dim(cfg.beta_fast), dim(cfg.beta_slow)
    if cfg.truncate:
      low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_head - 1)
    high = high + 0.001 if low == high else high
    ramp = jnp.clip((jnp.arange(d_head // 2, dtype=dtype) - low) / (high - low), 0, 1)
    return theta / factor * ramp + theta * (1 - ramp)
  if scaling != "llama3":
    raise ValueError(f"rope scaling {scaling!r}; choose none, linear, llama3 or yarn")
  wavelength = 2 * math.pi / theta
  low_freq_factor, high_freq_factor = cfg.low_freq_factor, cfg.high_freq_factor
  low, high = original_max_len / low_freq_factor, original_max_len / high_freq_factor
  s = (original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
  mid = (1 - s) * theta / factor + s * theta
  return jnp.where(wavelength > low, theta / factor, jnp.where(wavelength < high, theta, mid))


def rope(x_BxTxHxD: jax.Array, base: float = 10000.0, theta: jax.Array | None = None
         ) -> jax.Array:
  """Rotary position embedding (RoFormer, Su et al. 2021, Eq. 34; Llama-2's RoPE).

  Position m rotates each pair ``(x_{2i}, x_{2i+1})`` of a head by the angle
  ``m * theta_i``, ``theta_i = base^(-2i/d_head)`` (or the given ``theta``, e.g. a
  scaled ``rope_frequencies``): ``R_m = diag(R(m theta_0), ...)`` with ``R(a) = [[cos a,
  -sin a], [sin a, cos a]]``, so ``<R_m q, R_n k>`` depends on ``m - n`` only. Computed
  in float32 (float64 for float64 input), returned in the input's dtype.
  """
  _, t, _, dh = x_BxTxHxD.shape
  acc = float_dtype(x_BxTxHxD.dtype)
  theta = (base ** (-jnp.arange(0, dh, 2, dtype=acc) / dh) if theta is None
           else theta.astype(acc))                                         # (dh/2,)
  angle = jnp.arange(t, dtype=acc)[:, None] * theta[None, :]             # (T, dh/2)
  cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]      # (T, 1, dh/2)
  x = x_BxTxHxD.astype(acc).reshape(*x_BxTxHxD.shape[:-1], dh // 2, 2)
  even, odd = x[..., 0], x[..., 1]
  out = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  return out.reshape(x_BxTxHxD.shape).astype(x_BxTxHxD.dtype)


@functools.partial(jax.jit, static_argnames=("n", "dtype"))
def prefix_average_matrix(n: int, dtype: Any = jnp.float32) -> jax.Array:
  """The causal prefix-average matrix ``C_n`` (postnorm Eq. (3), Assumption C.2).

  ``(C_n)_ij = 1/i`` for ``i >= j`` and ``0`` otherwise (1-indexed rows ``i``), i.e.
  row ``i`` averages the first ``i`` tokens. Identities used by Thm C.3:
  ``||C_n||_F^2 = H_n`` and ``||Pi_1 C_n||_F^2 = 2 - H_n / n``. Also
  ``rankjax.prefix_average_matrix`` and ``rankjax._src.measure.similarity``'s.

  Args:
    n: sequence length (static).
    dtype: output dtype.

  Returns:
    ``(n, n)`` lower-triangular row-stochastic matrix.
  """
  return kernels.prefix_rows(jnp.arange(n), n, dtype)


def projections(x: jax.Array, weights: dict[str, jax.Array],
                biases: dict[str, jax.Array] | None = None, fused: bool = False,
                grad_reduce_dtype: str = "float32") -> list[jax.Array]:
  """``[x @ W_n (+ b_n) for n in weights]`` (in the dicts' order). ``fused``: one matmul
  with the weights concatenated along their output axis, its product split back.

  The parameters keep their own names and shapes either way (checkpoints, sharding
  rules, the Jacobian adapters and loaders see no difference); the concatenation is
  formed where the layer uses its weights, so under FSDP it joins the layer's gathered
  slices, one copy per layer. One dot of width sum(cols) instead of several narrow ones
  (QKV, and W1|W3 of SwiGLU): fewer, larger matmuls and one read of x. Each product is
  ``matmul.weight_matmul`` (``grad_reduce_dtype``: the weight gradient's dtype)."""
  names = list(weights)
  mm = lambda w: weight_matmul(x, w, grad_reduce_dtype)
  if fused:
    y = mm(jnp.concatenate([weights[n] for n in names], axis=-1))
    if biases is not None:
      y = y + jnp.concatenate([biases[n] for n in names], axis=-1)
    ends = np.cumsum([weights[n].shape[-1] for n in names])[:-1]
    return jnp.split(y, ends.tolist(), axis=-1)
  ys = [mm(weights[n]) for n in names]
  return ys if biases is None else [y + biases[n] for y, n in zip(ys, names)]


def settings(cfg: TransformerConfig) -> kernels.Settings:
  """The attention kernel settings of ``cfg``: ``kernels.attention_impl``,
  ``kernels.attn_dropout_kernel``."""
  return kernels.Settings(cfg.kernels.attention_impl, cfg.kernels.attn_dropout_kernel)


def kernel_for(cfg: TransformerConfig, dtype: Any, t: int, *, capture: bool = False,
               dropout: bool = False) -> kernels.Kernel:
  """The kernel ``CausalSelfAttention`` runs for ``cfg`` at this dtype and T: with
  ``capture`` (the probabilities sown), ``dropout`` (attention dropout in training,
  with ``attn_dropout_mask``'s masks);
  ``kernels.select``, which refuses an explicit ``attention_impl`` that cannot serve it."""
  return kernels.select(settings(cfg), kernels.Need(
      dtype, t, cfg.d_head, capture=capture,
      dropout=cfg.attn_dropout_mask if dropout else None,
      prefix=bool(cfg.prefix_avg_removal)))


class CausalSelfAttention(PlainInit, nn.Module):
  """Multi-head causal self-attention (grouped-query with ``num_kv_heads``; q/k/v biases
  with ``attn_bias``, a bias on the output projection with ``attn_out_bias``). Input and
  output ``(B, T, d)``; the kernel of each call: :func:`kernel_for`.

  With ``capture_probs`` the probabilities (after the P - alpha*C_n change, before
  dropout), shape (B, H, T, T), are sown as ``attn_probs``.
  """

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, *, deterministic: bool = True,
               capture_probs: bool = False) -> jax.Array:
    cfg = self.cfg
    d, heads, dh = cfg.d_model, cfg.num_heads, cfg.d_head
    dtype = x_BxTxD.dtype
    pdt = jnp.dtype(cfg.param_dtype)
    b, t, _ = x_BxTxD.shape

    kv = cfg.kv_heads

    def proj(name, cols=d):
      names = ("heads", "embed") if name == "w_o" else ("embed", "heads")
      return self.param(name, logical(matrix_init(cfg, name, d), names), (d, cols),
                        pdt).astype(dtype)

    counts = {"q": heads, "k": kv, "v": kv}
    weights, biases = {}, {}
    for n, c in counts.items():     # created in this order: w_q, b_q, w_k, ... (init rngs)
      weights[n] = proj(f"w_{n}", c * dh)
      if cfg.attn_bias:
        biases[n] = self.param(f"b_{n}", logical(nn.initializers.zeros, ("heads",)), (c * dh,),
                               pdt).astype(dtype)
    q, k, v = (y.reshape(b, t, c, dh) for y, c in zip(
        projections(x_BxTxD, weights, biases or None, cfg.kernels.fused_projections,
                    cfg.kernels.grad_reduce_dtype),
        counts.values()))
    drop_probs = bool(cfg.attn_dropout_rate) and not deterministic
    kernel = kernel_for(cfg, dtype, t, capture=capture_probs, dropout=drop_probs)
    # grouped-query attention (query head h reads kv head h // group): K/V copied to the
    # query heads before RoPE (the bits of every repeat path) only for a kernel that needs it
    k, v = kernels.kv_for(kernel, heads, k, v)
    if cfg.pos_embedding == "rope":
      theta = None if cfg.rope.scaling == "none" else rope_frequencies(
          dh, cfg.rope, float_dtype(dtype))
      q, k = rope(q, cfg.rope.base, theta), rope(k, cfg.rope.base, theta)
      if cfg.rope.attention_factor != 1.0:
        q, k = q * cfg.rope.attention_factor, k * cfg.rope.attention_factor
    rng = None
    if drop_probs:
      rng = (_DropoutKey(name="Dropout_0")() if kernel.name == "einsum"
             and cfg.attn_dropout_mask == "threefry" else self.make_rng("dropout"))
    request = kernels.Request(
        tau=cfg.tau, alpha=cfg.prefix_avg_removal,
        dropout_rate=cfg.attn_dropout_rate if drop_probs else 0.0,
        dropout_mask=cfg.attn_dropout_mask, rng=rng,
        sow=functools.partial(self.sow, "intermediates", "attn_probs") if capture_probs else None)
    out = kernels.attend(kernel, q, k, v, request)
    out = checkpoint_name(out, ATTENTION_OUT)     # saved by remat="dots" (not recomputed)
    out = weight_matmul(out.reshape(b, t, d), proj("w_o"), cfg.kernels.grad_reduce_dtype)
    if cfg.attn_out_bias:
      out = out + self.param("b_o", logical(nn.initializers.zeros, ("embed",)), (d,),
                             pdt).astype(dtype)
    return out


class _DropoutKey(nn.Module):
  """The dropout key of a child scope: named ``Dropout_0``, the key flax's ``nn.Dropout``
  drew inside ``CausalSelfAttention`` on the einsum path with threefry masks (the masks
  of every recorded run), kept for those bits."""

  def __call__(self) -> jax.Array:
    return self.make_rng("dropout")
