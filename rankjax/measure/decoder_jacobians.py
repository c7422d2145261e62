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

These are the decoder's analogue of ``gpt2_jacobians.sublayer_jacobians`` (the Pre-LN GPT-2 FFN
and attention Jacobians of App B.3 / D.5) for any ``cfg.norm_ops``.
``sequence_jacobians`` gives the whole-sequence attention Jacobians
``d [.]_t / d h_s`` over all positions (memory ``L T^2 d^2``: small T).

The sublayers are the model's own (``transformer.apply_sublayer``: ``DecoderBlock``'s
modules and norm wiring on one layer's slice of ``params["layers"]``);
``transformer.layer_forward`` composes them and is tested equal to ``DecoderBlock``.
Attention has no closed form here: every Jacobian is ``jax.jacfwd`` (d tangents at a
position).
Evaluation mode (no dropout).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rankjax.config import TransformerConfig
from rankjax.measure import precision as precision_lib
from rankjax.models import transformer

Array = jax.Array
SUBLAYERS = ("attention", "ffn")


def _sublayer(cfg: TransformerConfig, layer: dict, which: str, h_TxD: Array
              ) -> tuple[Array, Array]:
  """``(branch, h_new)``: ``branch = beta B(f(P(h))) = Y - h`` and ``h_new = R(Y)``
  (``transformer.apply_sublayer``, the model's own sublayer)."""
  y, h_new = transformer.apply_sublayer(cfg, layer, "attn" if which == "attention" else "ffn",
                                        h_TxD)
  return y - h_TxD, h_new


def _check(cfg: TransformerConfig, params: dict, tokens_T: Array) -> None:
  if not isinstance(cfg, TransformerConfig):
    raise ValueError(f"expected a TransformerConfig, got {type(cfg).__name__}")
  if "layers" not in params:
    raise ValueError("expected DecoderLM params (a 'layers' entry); pass variables['params']")
  if jnp.ndim(tokens_T) != 1:
    raise ValueError(f"expected one token sequence (T,), got shape {jnp.shape(tokens_T)}")


def _first_stream(cfg, params, tokens_T):
  return transformer.first_layer_input(cfg, params, tokens_T[None])[0]


@functools.partial(jax.jit, static_argnames=("cfg", "precision"))
@precision_lib.measured
def _token_jacobians(cfg, params, tokens_T, position):
  def step(h_TxD, layer):
    def at(which, stream):
      def fn(x_D):
        branch, h_new = _sublayer(cfg, layer, which, stream.at[position].set(x_D))
        return branch[position], h_new[position]
      return jax.jacfwd(fn)(stream[position])

    attn, attn_sub = at("attention", h_TxD)
    mid, out = transformer.layer_forward(cfg, layer, h_TxD)
    ffn, ffn_sub = at("ffn", mid)
    return out, (attn, ffn, attn_sub, ffn_sub)

  _, (attn, ffn, attn_sub, ffn_sub) = jax.lax.scan(
      step, _first_stream(cfg, params, tokens_T), params["layers"])
  return {"attention": attn, "ffn": ffn, "attention_sublayer": attn_sub,
          "ffn_sublayer": ffn_sub}


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
  t = jnp.shape(tokens_T)[0]
  if isinstance(position, int) and not -t <= position < t:
    raise ValueError(f"position {position} is outside a sequence of {t} tokens")
  return _token_jacobians(cfg, params, jnp.asarray(tokens_T), jnp.asarray(position) % t,
                          precision=precision)


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
