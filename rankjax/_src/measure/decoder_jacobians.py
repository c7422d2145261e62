"""Per-token sublayer Jacobians of ``rankjax.DecoderLM`` (every norm placement).

Each layer of the decoder is two residual sublayers of "Transforming Rank" Eq. 17,
``h -> R(h + beta B(f_k(P(h))))`` with f_1 the causal self-attention and f_2 the FFN
(``models.transformer``). At a position t, with the other tokens' streams held fixed:

  * the branch Jacobian ``d [beta B(f_k(P(h)))]_t / d h_t`` (the term added to the
    skip; ``attention``, ``ffn``), and
  * the sublayer Jacobian ``d R(Y_k)_t / d h_t = J_R (I + branch)`` (Eq. 18;
    ``attention_sublayer``, ``ffn_sublayer``), the factor of the token's stream
    Jacobian through the layer: the FFN acts on each token alone, so
    ``d h'_t / d h_t = ffn_sublayer @ attention_sublayer`` at fixed other tokens.

For any ``cfg.norm_ops``: GPT-2 and the Llama family are DecoderLM configurations
(``models.hf``), so their FFN and attention Jacobians (App B.3 / D.5) are these.
``sequence_jacobians`` gives the whole-sequence attention Jacobians
``d [.]_t / d h_s`` over all positions (memory ``L T^2 d^2``: small T).

The sublayers are the model's own (``transformer.apply_sublayer``: ``DecoderBlock``'s
modules and norm wiring on one layer's slice of ``params["layers"]``);
``transformer.layer_forward`` composes them and is tested equal to ``DecoderBlock``.
Attention has no closed form here: every Jacobian is ``jax.jacfwd`` (d tangents at a
position), through the Jacobian engine (``token_sublayer`` is the DecoderLM's adapter);
``token_block_jacobians`` gives the engine's K, B, G of all 2L sublayers at a token, for
``engine.measurements`` (erank of the token's stream Jacobian, path sums).
Evaluation mode (no dropout).

The FFN branch of a Pre-Norm layer (P a norm, no B or R norm: GPT-2, Llama) has a
closed form, ``ffn_jacobian``: with x = P(h) and the weights stored (in, out),

  GELU:    J = beta W_2^T diag(act'(z)) W_1^T J_P(h),           z = x W_1 + b_1
  SwiGLU:  J = beta W_2^T [diag(silu'(g) * u) W_1^T + diag(silu(g)) W_3^T] J_P(h),
           g = x W_1 + b_1,  u = x W_3 + b_3

(Eq. 9 / 25 with the Pre-Norm input Jacobian, Table 2; J_P of LayerNorm / RMSNorm with
its gain, App B.1 Eq. 19): one d x d_ff x d GEMM. ``ffn_inputs`` gives the stream each
layer's FFN sublayer reads; ``ffn_jacobians`` every layer's J at it (Fig 12, Fig 8c).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rankjax._src.config import TransformerConfig
from rankjax._src.measure import engine
from rankjax._src.measure import precision as precision_lib
from rankjax._src.models import activations, blocks, norms, transformer

Array = jax.Array
SUBLAYERS = ("attention", "ffn")


def _sublayer(cfg: TransformerConfig, layer: dict, which: str, h_TxD: Array
              ) -> tuple[Array, Array]:
  """``(branch, h_new)``: ``branch = beta B(f(P(h))) = Y - h`` and ``h_new = R(Y)``
  (``transformer.apply_sublayer``, the model's own sublayer)."""
  y, h_new = transformer.apply_sublayer(cfg, layer, "attn" if which == "attention" else "ffn",
                                        h_TxD)
  return y - h_TxD, h_new


def token_sublayer(cfg: TransformerConfig, layer: dict, which: str, h_TxD: Array,
                   position: Array | int) -> engine.JacobianBlock:
  """The engine's block of sublayer ``which`` ("attention" or "ffn") at token
  ``position``, the other tokens of the stream ``h_TxD`` held fixed: branch
  ``x -> [beta B(f(P(h)))]_t`` with ``h_t = x``, R the sublayer's post-residual norm on
  the token (None where the placement has none). Its K and B (Eq. 18) are the token's
  sublayer Jacobian ``J_R (I + G)`` split into skip and branch; ``jax.jacfwd`` (no
  closed form: attention mixes tokens; the FFN sublayer is token-wise and is evaluated
  on the token alone, so its d tangents carry no other tokens). The block reads no
  stacked parameters."""
  sub = "attn" if which == "attention" else "ffn"
  _, norm = transformer.sublayer_parts(cfg, layer, sub)
  has_r = (sub, "r") in transformer.norm_names(cfg)

  def branch(_, x_D):
    if sub == "ffn":      # token-wise (norms over features, the FFN per token): the token
      return _sublayer(cfg, layer, which, x_D[None])[0][0]      # alone, no (T, d_ff) tangents
    return _sublayer(cfg, layer, which, h_TxD.at[position].set(x_D))[0][position]

  return engine.JacobianBlock(branch=branch,
                              post=(lambda _, y_D: norm("r", y_D)) if has_r else None)


def _check(cfg: TransformerConfig, params: dict, tokens_T: Array) -> None:
  if not isinstance(cfg, TransformerConfig):
    raise ValueError(f"expected a TransformerConfig, got {type(cfg).__name__}")
  if "layers" not in params:
    raise ValueError("expected DecoderLM params (a 'layers' entry); pass variables['params']")
  if jnp.ndim(tokens_T) != 1:
    raise ValueError(f"expected one token sequence (T,), got shape {jnp.shape(tokens_T)}")


def _first_stream(cfg, params, tokens_T):
  return transformer.first_layer_input(cfg, params, tokens_T[None])[0]


def layer_token_terms(cfg: TransformerConfig, layer: dict, h_TxD: Array,
                      position: Array | int) -> tuple[Array, tuple]:
  """One layer at token ``position`` of its input stream ``h_TxD``: ``(h_out,
  (attn, ffn, h_in_t, h_mid_t))``, the engine's ``BlockTerms`` of its two sublayers
  (``token_sublayer``, jacfwd) and the token's stream entering the layer and after its
  attention sublayer. ``token_block_jacobians`` scans it over the layers; ``rankjax
  analyze`` calls it a layer at a time."""
  jacfwd = engine.BlockJacobianMethod.JACFWD

  def at(which, stream):
    block = token_sublayer(cfg, layer, which, stream, position)
    return engine.block_terms(block, None, stream[position], method=jacfwd)

  attn = at("attention", h_TxD)
  mid, out = transformer.layer_forward(cfg, layer, h_TxD)
  ffn = at("ffn", mid)
  return out, (attn, ffn, h_TxD[position], mid[position])


@functools.partial(jax.jit, static_argnames=("cfg", "precision"))
@precision_lib.measured
def _token_terms(cfg, params, tokens_T, position):
  def step(h_TxD, layer):
    return layer_token_terms(cfg, layer, h_TxD, position)

  out, (attn, ffn, h_in, h_mid) = jax.lax.scan(
      step, _first_stream(cfg, params, tokens_T), params["layers"])
  return attn, ffn, h_in, h_mid, out[position]


def _position(tokens_T, position):
  t = jnp.shape(tokens_T)[0]
  if isinstance(position, int) and not -t <= position < t:
    raise ValueError(f"position {position} is outside a sequence of {t} tokens")
  return jnp.asarray(position) % t


def token_block_jacobians(cfg: TransformerConfig, params: dict, tokens_T: Array,
                          position: Array | int, *, precision: str | None = None
                          ) -> engine.BlockJacobians:
  """The engine's ``BlockJacobians`` of the token at ``position`` through the 2L
  sublayers (attention, FFN of layer 1, ...), the other tokens held fixed: K, B, G
  (Eq. 18) per sublayer and the token's stream h_0 .. h_2L (layer l's input at 2l, its
  attention output at 2l+1). ``engine.measurements`` of it gives the erank of the token's
  stream Jacobian through depth and its path sums (identity K under Pre-Norm)."""
  _check(cfg, params, tokens_T)
  attn, ffn, h_in, h_mid, last = _token_terms(cfg, params, jnp.asarray(tokens_T),
                                              _position(tokens_T, position),
                                              precision=precision)
  return engine.token_sublayers(attn, ffn, h_in, h_mid, last)


def sublayer_jacobians(cfg: TransformerConfig, params: dict, tokens_T: Array,
                       position: Array | int, *, precision: str | None = None
                       ) -> dict[str, Array]:
  """Per-token Jacobians of every layer at ``position`` (may be traced), ``(L, d, d)``:

    ``attention``: ``d [beta B(Attn(P(h)))]_t / d h_t``, other tokens fixed;
    ``ffn``: ``d [beta B(FFN(P(h')))]_t / d h'_t`` at the FFN sublayer's input h';
    ``attention_sublayer``, ``ffn_sublayer``: ``d R(Y_k)_t / d h_t`` (Eq. 18).

  ``params`` are ``DecoderLM`` parameters (``variables["params"]``), ``tokens_T`` one
  int sequence ``(T,)``; jitted, matmuls at ``precision`` ('highest' by default).
  """
  _check(cfg, params, tokens_T)
  attn, ffn, *_ = _token_terms(cfg, params, jnp.asarray(tokens_T),
                               _position(tokens_T, position), precision=precision)
  return {"attention": attn.relative_branch, "ffn": ffn.relative_branch,
          "attention_sublayer": engine.sublayer_jacobian(attn.skip, attn.branch),
          "ffn_sublayer": engine.sublayer_jacobian(ffn.skip, ffn.branch)}


@functools.partial(jax.jit, static_argnames=("cfg", "precision"))
@precision_lib.measured
def _sequence_jacobians(cfg, params, tokens_T):
  def step(h_TxD, layer):
    branch, sub = jax.jacfwd(lambda x: _sublayer(cfg, layer, "attention", x))(h_TxD)
    _, out = transformer.layer_forward(cfg, layer, h_TxD)
    return out, (branch, sub)

  _, (branch, sub) = jax.lax.scan(step, _first_stream(cfg, params, tokens_T),
                                  params["layers"])
  return {"attention": branch, "attention_sublayer": sub}


def sequence_jacobians(cfg: TransformerConfig, params: dict, tokens_T: Array, *,
                       precision: str | None = None) -> dict[str, Array]:
  """Whole-sequence attention Jacobians of every layer, ``(L, T, d, T, d)`` each:
  ``attention[l, t, :, s, :] = d [beta B(Attn(P(h)))]_t / d h_s`` (zero for s > t,
  causal) and ``attention_sublayer`` the same for ``R(Y_1)``; ``jax.jacfwd`` over all
  T d inputs, for small T. The diagonal blocks s = t are ``sublayer_jacobians``'s."""
  _check(cfg, params, tokens_T)
  return _sequence_jacobians(cfg, params, jnp.asarray(tokens_T), precision=precision)


def _check_pre_ffn(cfg: TransformerConfig) -> None:
  p, b, r = cfg.norm_ops
  if b != "none" or r != "none" or p not in ("rms", "layer"):
    raise ValueError(f"the FFN Jacobian's closed form is for a Pre-Norm layer (an rms or "
                     f"layer norm at P only); this config's (P, B, R) is {cfg.norm_ops}")


@precision_lib.measured
def ffn_jacobian(cfg: TransformerConfig, layer: dict, h_D: Array) -> Array:
  """``d [beta FFN(P(h))] / dh`` of one Pre-Norm layer at one token's stream ``h``
  (the FFN sublayer's input), ``(d, d)``, in closed form (module docstring; Eq. 9 / 25
  with Table 2's J_P); ``layer`` is one slice of ``params["layers"]``."""
  _check_pre_ffn(cfg)
  ffn, op = layer["ffn"], cfg.norm_ops[0]
  _, norm = transformer.sublayer_parts(cfg, layer, "ffn")
  x = norm("p", h_D)
  bias = lambda n: ffn.get(f"b_{n}", 0.0)
  z = x @ ffn["w_1"] + bias(1)
  if cfg.ffn == "swiglu":
    u = x @ ffn["w_3"] + bias(3)
    core_MxD = ((activations.silu_derivative(z) * u)[:, None] * ffn["w_1"].T
                + activations.silu(z)[:, None] * ffn["w_3"].T)
  else:
    act = transformer.FFN_ACTIVATIONS[cfg.ffn]
    core_MxD = blocks.derivative(act, z)[:, None] * ffn["w_1"].T
  gains = layer["norm_ffn_p"]
  core_MxD = norms.jacobian_right(core_MxD, h_D, op, cfg.norm_eps, scale_D=gains["scale"])
  return cfg.beta * (ffn["w_2"].T @ core_MxD)


def ffn_block(cfg: TransformerConfig) -> engine.JacobianBlock:
  """The engine's block of a Pre-Norm FFN sublayer ``h + beta FFN(P(h))`` (one token;
  K = I) with its closed form (``ffn_jacobian``); its parameters are one layer's slice
  of ``params["layers"]``."""
  _check_pre_ffn(cfg)

  def branch(layer, h_D):
    return _sublayer(cfg, layer, "ffn", h_D[None])[0][0]

  return engine.JacobianBlock(
      branch=branch,
      branch_jacobian=lambda layer, h_D: (branch(layer, h_D), ffn_jacobian(cfg, layer, h_D)))


@functools.partial(jax.jit, static_argnames=("cfg", "precision"))
@precision_lib.measured
def ffn_inputs(cfg: TransformerConfig, params: dict, tokens_T: Array) -> Array:
  """The stream entering each layer's FFN sublayer (after its attention sublayer),
  ``(L, T, d)``, for one token sequence ``(T,)``."""
  def step(h_TxD, layer):
    mid, out = transformer.layer_forward(cfg, layer, h_TxD)
    return out, mid

  _, mids = jax.lax.scan(step, _first_stream(cfg, params, tokens_T), params["layers"])
  return mids


@functools.partial(jax.jit, static_argnames=("cfg", "precision"))
@precision_lib.measured
def ffn_jacobians(cfg: TransformerConfig, layers: dict, h_LxD: Array) -> Array:
  """``ffn_jacobian`` of every layer at its stream ``h_l``, ``(L, d, d)`` (``lax.map``:
  one layer's d x d_ff intermediate in memory at a time); ``layers`` is
  ``params["layers"]``."""
  return jax.lax.map(lambda a: ffn_jacobian(cfg, *a), (layers, h_LxD))
