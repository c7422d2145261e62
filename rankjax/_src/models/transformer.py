"""DecoderLM: the decoder-only Transformer of the Post-Norm collapse and
softmax-sensitivity papers, built from the shared residual block.

Each layer is two sublayers k = 1 (attention) and k = 2 (FFN) of Transforming Rank's
Eq. 17, ``h -> R(h + beta * B(f_k(P(h))))`` (``blocks.residual_sublayer``), with the
(P, B, R) operations of ``cfg.norm_ops``. With the captured names of postnorm Eq. 1:

  X_k = P(h_k)                the sublayer input (after its P norm)
  Y_k = h_k + beta B(f_k(X_k)) the residual sum before the R norm
  h_{k+1} = R(Y_k)            the stream the next sublayer reads

  post:  X_1 = h             Y_1 = X_1 + Attn(X_1)       X_2 = N(Y_1)
         Y_2 = X_2 + FFN(X_2)                            h' = N(Y_2)
  pre:   X_1 = N(h)          Y_1 = h + Attn(X_1)         X_2 = N(Y_1)
         Y_2 = Y_1 + FFN(X_2)                            h' = Y_2
  peri:  pre, with a norm on each sublayer output (B) before the add.

With ``capture=True`` each layer records ``x1, y1, x2, y2`` with a ``sites.Recorder``
and the model returns them beside its output, stacked over layers: (L, B, T, d);
``perturbations`` of those shapes are added at them, so gradients with respect to
them are available: see ``intermediate_grads``.

Norm parameter names say the (sublayer, location) of the norm, whatever the placement:
``norm_attn_p``, ``norm_attn_b``, ``norm_attn_r``, ``norm_ffn_p``, ``norm_ffn_b``,
``norm_ffn_r`` (Post-Norm: ``norm_attn_r`` makes X_2 and ``norm_ffn_r`` the layer's
output; Pre-Norm: ``norm_attn_p`` makes X_1 and ``norm_ffn_p`` X_2). Outside the layers:
``norm_embed`` and ``norm_final`` (``cfg.uses_embed_norm`` / ``uses_final_norm``).
A checkpoint with other names is refused on restore
(``rankjax._src.train.checkpoint.check_param_names``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import with_logical_partitioning as logical

from rankjax._src import partitioning
from rankjax._src.config import TransformerConfig
from rankjax._src.models import activations, blocks
from rankjax._src.models.annotated import PlainInit
from rankjax._src.models import sites as sites_lib
from rankjax._src.models.attention import (ATTENTION_OUT, ATTENTION_RESIDUALS,
                                      CausalSelfAttention, matrix_init, projections)
from rankjax._src.models.lm_head import head_logits
from rankjax._src.models.matmul import lookup, shard_copies, weight_matmul
from rankjax._src.models.norms import Norm
from rankjax._src.numerics import float_dtype

# dots: the matmul outputs, the attention heads' output and the fused kernel's residuals
# (a fused kernel is no dot: without their names the backward pass recomputed the whole
# attention forward)
REMAT_POLICIES = {"dots": jax.checkpoint_policies.save_from_both_policies(
                      jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                      jax.checkpoint_policies.save_only_these_names(ATTENTION_OUT,
                                                                    ATTENTION_RESIDUALS)),
                  "full": jax.checkpoint_policies.nothing_saveable}
# remat="auto" where no memory estimate chose for it (rankjax._src.train.memory.resolve_remat
# chooses at build; a model built from the config alone, or a device reporting no limit)
REMAT_AUTO_FALLBACK = "dots"


def norm_names(cfg: TransformerConfig) -> dict[tuple[str, str], str]:
  """Parameter name of each (sublayer, location) norm that exists: ``norm_<sub>_<loc>``."""
  return {(sub, loc): f"norm_{sub}_{loc}" for sub in ("attn", "ffn")
          for loc, op in zip("pbr", cfg.norm_ops) if op != "none"}


def make_norm(cfg: TransformerConfig, op: str, name: str) -> Norm:
  """The LM's norm: ``op`` with learned gain (and bias: ``cfg.bias_of(op)``)."""
  return Norm(op, gain=True, eps=cfg.norm_eps, param_dtype=jnp.dtype(cfg.param_dtype),
              bias=cfg.bias_of(op), name=name)


def sublayer_norm(cfg: TransformerConfig, sub: str, apply_norm):
  """``norm(loc, x)`` of sublayer ``sub`` ("attn" or "ffn") for ``residual_sublayer``:
  the identity where ``cfg`` has no operation at ``loc``, else
  ``apply_norm(op, name, x)`` with the parameter name of ``norm_names``. The one
  wiring of the norms, used by ``DecoderBlock`` and by ``apply_sublayer``."""
  ops = dict(zip("pbr", cfg.norm_ops))
  names = norm_names(cfg)

  def norm(loc, x):
    name = names.get((sub, loc))
    return x if name is None else apply_norm(ops[loc], name, x)
  return norm


FFN_ACTIVATIONS = {"gelu": activations.gelu, "gelu_tanh": activations.gelu_tanh}


class FeedForward(PlainInit, nn.Module):
  """SwiGLU ``(silu(X W1) * X W3) W2`` (postnorm Eq. 2) or GELU ``gelu(X W1) W2`` (exact
  or tanh form, ``cfg.ffn``), with biases b_1, b_2 (b_3) after each product when
  ``cfg.ffn_bias`` (GPT-2: ``gelu_tanh(X W1 + b1) W2 + b2``); ``cfg.kernels.fused_projections``:
  X [W1 | W3] as one matmul (``attention.projections``)."""

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.cfg
    d, f, dtype, pdt = cfg.d_model, cfg.d_ff, x.dtype, jnp.dtype(cfg.param_dtype)
    w1 = self.param("w_1", logical(matrix_init(cfg, "w_1", d), ("embed", "mlp")), (d, f),
                    pdt).astype(dtype)
    w2 = self.param("w_2", logical(matrix_init(cfg, "w_2", f), ("mlp", "embed")), (f, d),
                    pdt).astype(dtype)
    if cfg.ffn == "swiglu":
      w3 = self.param("w_3", logical(matrix_init(cfg, "w_3", d), ("embed", "mlp")), (d, f),
                      pdt).astype(dtype)
    # created after the matrices: the matrices' init draws do not depend on ffn_bias
    bias = lambda name, n, ax: (self.param(name, logical(nn.initializers.zeros, (ax,)), (n,),
                                           pdt).astype(dtype) if cfg.ffn_bias else None)
    b1, b2 = bias("b_1", f, "mlp"), bias("b_2", d, "embed")
    if cfg.ffn == "swiglu":
      b3 = bias("b_3", f, "mlp")
      gate, up = projections(x, {"1": w1, "3": w3},
                             None if b1 is None else {"1": b1, "3": b3},
                             fused=cfg.kernels.fused_projections,
                             grad_reduce_dtype=cfg.kernels.grad_reduce_dtype)
      hidden = activations.silu(gate) * up
    else:
      z = weight_matmul(x, w1, cfg.kernels.grad_reduce_dtype)
      hidden = FFN_ACTIVATIONS[cfg.ffn](z if b1 is None else z + b1)
    out = weight_matmul(hidden, w2, cfg.kernels.grad_reduce_dtype)
    return out if b2 is None else out + b2


class DecoderBlock(PlainInit, nn.Module):
  """One layer: the attention sublayer then the FFN sublayer (``residual_sublayer``).

  ``__call__(h, perturbations=None) -> (h_out, sites)``: with ``capture`` the layer's
  X_1, Y_1, X_2, Y_2 (``sites.SUBLAYER_SITES``) go through one ``sites.Recorder``
  (each plus ``perturbations[name]`` when given: gradients with respect to them), and
  ``sites`` maps their names to them; without, ``sites`` is None."""

  cfg: TransformerConfig
  capture: bool = False
  capture_probs: bool = False
  deterministic: bool = True

  def _drop(self, x: jax.Array) -> jax.Array:
    if self.cfg.dropout_rate and not self.deterministic:
      return nn.Dropout(self.cfg.dropout_rate)(x, deterministic=False)
    return x

  @nn.compact
  def __call__(self, h: jax.Array, perturbations: dict | None = None):
    h = partitioning.constrain(h, ("batch", "length", "embed"))
    cfg = self.cfg
    attn = CausalSelfAttention(cfg, name="attn")
    ffn = FeedForward(cfg, name="ffn")
    branches = {
        "attn": lambda x: self._drop(attn(x, deterministic=self.deterministic,
                                          capture_probs=self.capture_probs)),
        "ffn": lambda x: self._drop(ffn(x)),
    }
    norm = lambda sub: sublayer_norm(cfg, sub, lambda op, name, x: make_norm(cfg, op, name)(x))
    if not self.capture:
      return layer_with_sites(cfg, branches, norm, h, None), None
    record = sites_lib.Recorder(
        None if perturbations is None else {k: v[None] for k, v in perturbations.items()})
    h = layer_with_sites(cfg, branches, norm, h, record)
    return h, {k: v[0] for k, v in record.stacked().items()}


def layer_with_sites(cfg: TransformerConfig, branches: dict, norm, h: jax.Array, record
                     ) -> jax.Array:
  """One layer's two sublayers on the stream ``h`` (``blocks.residual_sublayer``), with
  ``record`` (a ``sites.Recorder``, or None) called at X_1, Y_1, X_2, Y_2
  (``sites.SUBLAYER_SITES``, postnorm Eq. 1). ``branches[sub]`` is the core f of
  sublayer ``sub`` ("attn", "ffn"), ``norm(sub)`` its ``sublayer_norm``. Without a P
  norm X_k is the stream itself and also the skip (Y_k = X_k + ...): it is recorded
  before the sublayer, so that dL/dX_k includes the skip path. The one wiring of the
  sites, for ``DecoderBlock`` and ``layer_sites``."""
  no_p = cfg.norm_ops[0] == "none"
  for k, sub in enumerate(("attn", "ffn"), start=1):
    tap = None
    if record is not None:
      if no_p:
        h = record(f"x{k}", h)
      tap = lambda name, v, k=k: v if name == "x" and no_p else record(f"{name}{k}", v)
    _, _, h = blocks.residual_sublayer(h, branches[sub], norm(sub), cfg.beta, tap=tap)
  return h


class DecoderLM(PlainInit, nn.Module):
  """Token embeddings (and their norm), ``num_layers`` blocks (one ``nn.scan``), the
  final norm, LM head; the two norms follow ``cfg.uses_embed_norm`` / ``uses_final_norm``.

  ``__call__(tokens_BxT) -> logits_BxTxV`` (float32, or float64 with float64
  params). Options: ``deterministic=False`` turns on
  dropout (needs a ``dropout`` rng); ``capture`` returns ``(output, sites)``, the
  per-layer X_k / Y_k as ``{"x1": (L, B, T, d), ...}``, each plus
  ``perturbations[name]`` when given; ``capture_probs`` sows the attention probabilities (B, H, T, T) per
  layer, stacked as (L, B, H, T, T). ``return_hidden`` returns ``(h_BxTxD, W_DxVp)``,
  the head's input and matrix (padded columns included), for a loss that computes
  the head itself (``rankjax._src.models.lm_head.head_cross_entropy``). With tied embeddings
  and ``tied_shards`` S > 1 (``return_hidden`` only; the training loss passes its
  batch shards) the table is read as S copies, one per batch shard
  (``matmul.shard_copies``): the lookup and the returned ``W`` (S, D, Vp) both read
  copy s for shard s's rows, so the table's two gradients are added on each shard and
  reduced across devices once.
  """

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, tokens_BxT: jax.Array, *, deterministic: bool = True,
               capture: bool = False, perturbations: dict | None = None,
               capture_probs: bool = False, return_hidden: bool = False,
               tied_shards: int = 1):
    cfg = self.cfg
    dtype, pdt = jnp.dtype(cfg.compute_dtype), jnp.dtype(cfg.param_dtype)
    t = tokens_BxT.shape[-1]
    if t > cfg.max_seq_len:
      raise ValueError(f"sequence length {t} exceeds max_seq_len={cfg.max_seq_len}")
    embed_std = cfg.embed_std or (1.0 if cfg.init == "paper_collapse" else 0.02)
    embed = nn.Embed(cfg.padded_vocab_size, cfg.d_model, param_dtype=pdt,
                     embedding_init=logical(nn.initializers.normal(embed_std), ("vocab", "embed")),
                     name="embed")
    table = embed.embedding
    if cfg.tie_embeddings and tied_shards > 1:
      if not return_hidden:
        raise ValueError("tied_shards > 1 returns the head's copies: pass return_hidden=True")
      table = shard_copies(table, tied_shards, cfg.kernels.grad_reduce_dtype)
    rows = lookup(table, tokens_BxT, cfg.kernels.grad_reduce_dtype)   # = embed(tokens)
    h = partitioning.constrain(rows.astype(dtype), ("batch", "length", "embed"))
    if cfg.pos_embedding == "learned":
      pos = self.param("pos_embed", logical(nn.initializers.normal(embed_std), ("length", "embed")),
                       (cfg.max_seq_len, cfg.d_model), pdt)
      if cfg.kernels.grad_reduce_dtype == "float32":   # its gradient, a sum over the batch, in f32
        h = (h.astype(float_dtype(dtype)) + pos[:t].astype(float_dtype(dtype))).astype(dtype)
      else:
        h = h + pos[:t].astype(dtype)
    if cfg.dropout_rate and not deterministic:
      h = nn.Dropout(cfg.dropout_rate)(h, deterministic=False)
    if cfg.uses_embed_norm:
      h = make_norm(cfg, cfg.embed_norm_op, "norm_embed")(h)  # postnorm Eq. 1: X_1^1 = N(Y_0^1)

    block = DecoderBlock
    remat = REMAT_AUTO_FALLBACK if cfg.kernels.remat == "auto" else cfg.kernels.remat
    if remat != "none":
      block = nn.remat(block, static_argnums=(), prevent_cse=False,
                       policy=REMAT_POLICIES[remat])
    stack = nn.scan(
        block,
        variable_axes={"params": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        length=cfg.num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},   # the stacked axis's logical name
        unroll=min(cfg.kernels.scan_unroll, cfg.num_layers),
    )
    if perturbations is not None and not capture:
      raise ValueError("perturbations are added at the captured sites: pass capture=True")
    h, sites = stack(cfg, capture=capture, capture_probs=capture_probs,
                     deterministic=deterministic, name="layers")(h, perturbations)

    if cfg.uses_final_norm:
      h = make_norm(cfg, cfg.norm_op, "norm_final")(h)
    if cfg.tie_embeddings:
      w_DxV = jnp.swapaxes(table, -1, -2)
    else:
      w_DxV = self.param("lm_head", logical(matrix_init(cfg, "lm_head", cfg.d_model),
                                          ("embed", "vocab")),
                         (cfg.d_model, cfg.padded_vocab_size), pdt)
    out = (h, w_DxV) if return_hidden else head_logits(h, w_DxV)[..., :cfg.vocab_size]
    return (out, sites) if capture else out


def sublayer_parts(cfg: TransformerConfig, layer: dict, sub: str):
  """``(f, norm)`` of sublayer ``sub`` ("attn" or "ffn") of one layer, from that layer's
  slice of ``params["layers"]`` (evaluation mode): the branch core ``f`` on a ``(T, d)``
  input and ``norm(loc, x)`` for ``blocks.residual_sublayer``, ``DecoderBlock``'s modules
  and wiring (``sublayer_norm``)."""
  norm = sublayer_norm(cfg, sub, lambda op, name, x: make_norm(cfg, op, None).apply(
      {"params": layer.get(name, {})}, x))
  if sub == "attn":
    mod = CausalSelfAttention(cfg)
    f = lambda x: mod.apply({"params": layer["attn"]}, x[None], deterministic=True)[0]
  else:
    mod = FeedForward(cfg)
    f = lambda x: mod.apply({"params": layer["ffn"]}, x)
  return f, norm


def apply_sublayer(cfg: TransformerConfig, layer: dict, sub: str, h_TxD: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """``(y, h_new)`` of sublayer ``sub`` ("attn" or "ffn") of one layer on a ``(T, d)``
  stream (``sublayer_parts``): ``y = h + beta B(f(P(h)))`` and ``h_new = R(y)``, the
  modules and wiring of ``DecoderBlock`` (tested equal). For the Jacobians of
  ``measure.decoder_jacobians``."""
  f, norm = sublayer_parts(cfg, layer, sub)
  _, y, h_new = blocks.residual_sublayer(h_TxD, f, norm, cfg.beta)
  return y, h_new


def layer_forward(cfg: TransformerConfig, layer: dict, h_TxD: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
  """``(h_mid, h_out)``: the stream after the attention sublayer and after the layer."""
  _, mid = apply_sublayer(cfg, layer, "attn", h_TxD)
  _, out = apply_sublayer(cfg, layer, "ffn", mid)
  return mid, out


def attention_probs(cfg: TransformerConfig, layer: dict, h_TxD: jax.Array) -> jax.Array:
  """The attention probabilities ``(H, T, T)`` of one layer on its input stream (after
  its P norm): what ``DecoderLM`` sows with ``capture_probs`` (tested equal)."""
  _, norm = sublayer_parts(cfg, layer, "attn")
  _, state = CausalSelfAttention(cfg).apply(
      {"params": layer["attn"]}, norm("p", h_TxD)[None], deterministic=True,
      capture_probs=True, mutable=["intermediates"])
  return state["intermediates"]["attn_probs"][0][0]


def layer_sites(cfg: TransformerConfig, layer: dict, h_TxD: jax.Array,
                perturbations: dict | None = None) -> tuple[jax.Array, dict]:
  """``(h_out, sites)`` of one layer on a ``(T, d)`` stream with ``perturbations[name]``
  (if given) added at each of X_1, Y_1, X_2, Y_2: ``DecoderBlock`` with ``capture`` on
  one layer's slice of ``params["layers"]`` (evaluation mode). The gradient w.r.t. a zero
  perturbation is the gradient w.r.t. that site, a layer at a time (``rankjax
  analyze``)."""
  if perturbations is not None:
    perturbations = {k: v[None] for k, v in perturbations.items()}
  h, sites = DecoderBlock(cfg, capture=True).apply({"params": layer}, h_TxD[None],
                                                   perturbations)
  return h[0], {k: v[0] for k, v in sites.items()}


def final_hidden(cfg: TransformerConfig, params: dict, h_TxD: jax.Array) -> jax.Array:
  """The head's input: the final norm of the last layer's output where the placement
  has one (Hugging Face's last ``hidden_states``), else the output itself."""
  if not cfg.uses_final_norm:
    return h_TxD
  return make_norm(cfg, cfg.norm_op, None).apply({"params": params.get("norm_final", {})},
                                                 h_TxD)


def final_logits(cfg: TransformerConfig, params: dict, h_TxD: jax.Array) -> jax.Array:
  """``DecoderLM``'s head on the last layer's output: ``final_hidden``, then the tied
  or untied head; ``params`` needs only the non-layer entries (tested equal to
  ``DecoderLM``)."""
  h_TxD = final_hidden(cfg, params, h_TxD)
  w_DxV = params["embed"]["embedding"].T if cfg.tie_embeddings else params["lm_head"]
  return head_logits(h_TxD, w_DxV)[..., :cfg.vocab_size]


def first_layer_input(cfg: TransformerConfig, params, tokens_BxT: jax.Array) -> jax.Array:
  """The stream entering layer 1 (evaluation mode) from ``DecoderLM`` parameters:
  embeddings, learned positions, the embedding norm; equal to DecoderLM's (tested)."""
  dtype = jnp.dtype(cfg.compute_dtype)
  t = tokens_BxT.shape[-1]
  h = jnp.take(params["embed"]["embedding"], tokens_BxT, axis=0).astype(dtype)
  if cfg.pos_embedding == "learned":
    h = h + params["pos_embed"][:t].astype(dtype)
  if cfg.uses_embed_norm:
    norm = make_norm(cfg, cfg.embed_norm_op, None)
    h = norm.apply({"params": params.get("norm_embed", {})}, h)
  return h


def intermediate_grads(model: DecoderLM, params, tokens_BxT, loss_fn):
  """Loss, parameter gradients and gradients w.r.t. the captured X_k^l / Y_k^l (the
  postnorm paper's sublayer inputs and outputs, Eq. 1; its Fig 5 reads them).

  ``loss_fn(logits_BxTxV) -> scalar``. Returns (loss, param_grads, grads, acts), where
  ``grads`` and ``acts`` map x1, y1, x2, y2 to (L, B, T, d) arrays
  (``sites.loss_gradients``: zero perturbations at the sites, one backward pass).
  """
  def run(p, perturbations):
    return model.apply({"params": p}, tokens_BxT, capture=True, perturbations=perturbations)

  g = sites_lib.loss_gradients(run, loss_fn, params)
  return g.loss, g.param_grads, g.site_grads, g.sites
