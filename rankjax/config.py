"""Frozen dataclass configs with validation, JSON round trips and ``key=value`` overrides.

Every model is configured by one of these. Bad input raises ``ValueError`` naming the
field and, where the field takes one of a set of values, the allowed values.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import types
import typing
from typing import Any, Literal, Mapping, Sequence, TypeVar

NormPosition = Literal["pre", "post", "output", "peri", "none"]
NormOp = Literal["rms", "layer", "mean", "detached_rms", "none"]
LMFFN = Literal["swiglu", "gelu", "gelu_tanh"]
LMInit = Literal["paper_collapse", "gpt2"]
InitScaleTo = Literal["all", "value_ffn", "value_ffn_qk", "value_ffn_gate"]
PosEmbedding = Literal["learned", "rope", "none"]
RopeScaling = Literal["none", "linear", "llama3", "yarn"]
DType = Literal["float32", "float64", "bfloat16"]
RematPolicy = Literal["none", "dots", "full", "auto"]
AttentionImpl = Literal["auto", "xla", "cudnn", "splash", "einsum"]
PRNGImpl = Literal["threefry", "rbg", "unsafe_rbg"]
GradReduceDType = Literal["float32", "compute"]
MLPActivation = Literal["relu", "gelu", "silu", "abs", "tanh", "swiglu"]
BranchMatrices = Literal[1, 2]
Optimizer = Literal["adamw", "adam"]
LRSchedule = Literal["cosine", "constant"]
ComputeDType = Literal["float32", "bfloat16"]

NORM_POSITIONS = typing.get_args(NormPosition)
NORM_OPS = typing.get_args(NormOp)
MLP_ACTIVATIONS = typing.get_args(MLPActivation)

# Where the shorthand ``norm_position`` puts ``norm_op`` inside a residual block
# R(h + beta * B(f(P(h)))) (Transforming Rank, Eq. 17): P, B and/or R.
NORM_LOCATIONS = {"pre": ("P",), "post": ("R",), "output": ("B",), "peri": ("P", "B"),
                  "none": ()}

C = TypeVar("C")


def _choice(name: str, value: Any, allowed: Sequence[Any]) -> None:
  is_bool = isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed)
  if is_bool or value not in allowed:      # true is not the choice 1
    raise ValueError(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")


def _literal_choices(cfg: Any) -> None:
  """Checks every ``Literal``-typed field of the dataclass ``cfg`` (also ``X | None``).

  The one place the typed string choices are validated: the allowed values are the
  ``Literal``'s arguments, so the annotation is the whole specification.
  """
  hints = typing.get_type_hints(type(cfg))
  for f in dataclasses.fields(cfg):
    hint, optional = hints[f.name], False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
      args = [a for a in typing.get_args(hint) if a is not type(None)]
      optional = len(args) < len(typing.get_args(hint))
      hint = args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is Literal:
      value = getattr(cfg, f.name)
      if not (optional and value is None):
        _choice(f.name, value, typing.get_args(hint))


def norm_ops_of(position: str, op: str, overrides: Sequence[str | None]) -> tuple[str, str, str]:
  """(P, B, R) operations from the ``norm_position`` shorthand and per-location overrides."""
  where = NORM_LOCATIONS[position]
  ops = [op if loc in where else "none" for loc in "PBR"]
  return tuple(o if o is not None else d for o, d in zip(overrides, ops))


def norm_position_of(ops: Sequence[str]) -> str:
  """The placement name of (P, B, R) operations (``norm_ops``): the ``norm_position``
  whose locations hold a norm, or ``"P+R"``-style locations when none matches."""
  where = tuple(loc for loc, op in zip("PBR", ops) if op != "none")
  names = {v: k for k, v in NORM_LOCATIONS.items()}
  return names.get(where, "+".join(where))


def _positive(name: str, value: Any) -> None:
  if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
    raise ValueError(f"{name}={value!r} must be a positive number")


def _positive_int(name: str, value: Any) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
    raise ValueError(f"{name}={value!r} must be a positive integer")


def _non_negative(name: str, value: Any) -> None:
  if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
    raise ValueError(f"{name}={value!r} must be a non-negative number")


def _non_negative_int(name: str, value: Any) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 0:
    raise ValueError(f"{name}={value!r} must be an integer >= 0")


def _rate(name: str, value: Any) -> None:
  _non_negative(name, value)
  if value >= 1:
    raise ValueError(f"{name}={value!r} must lie in [0, 1)")


def _field(default: Any, *, resumable: bool = False, build: bool = True) -> Any:
  """A config field with its run-control metadata (read by ``fields_with``):

  resumable: the field may change when a run resumes (it does not change the
    trajectory; ``rankjax.train.checkpoint.check_workdir_config``).
  build: ``rankjax.train.loop.build`` reads it (runs differing only in fields with
    ``build=False`` share one compiled build).
  """
  return dataclasses.field(default=default, metadata={"resumable": resumable, "build": build})


def fields_with(cls: type, key: str, value: bool) -> tuple[str, ...]:
  """Names of ``cls``'s fields whose metadata ``key`` (``_field``) is ``value``;
  fields without metadata count as ``resumable=False, build=True``."""
  default = {"resumable": False, "build": True}[key]
  return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(key, default) == value)


class JsonConfig:
  """``Config.from_json(path_or_text)`` / ``cfg.to_json(path=None)`` on every config
  (the module functions ``from_json(cls, ...)`` / ``to_json(cfg, ...)`` do the same)."""

  @classmethod
  def from_json(cls, path_or_text):
    return from_json(cls, path_or_text)

  def to_json(self, path=None) -> str:
    return to_json(self, path)


@dataclasses.dataclass(frozen=True)
class MLPConfig(JsonConfig):
  """Residual MLP of "Transforming Rank" (its Eq. 17): ``h = R(h + beta * B(f(P(h))))``.

  Attributes:
    depth: number of blocks L.
    width: model dimension d.
    expansion: m/d, the width expansion of the two-matrix branch (M=2).
    branch_matrices: M in {1, 2}. M=2: ``W_down sigma(W_up z)``; M=1: ``sigma(W z)``.
    activation: relu, gelu, silu, abs, tanh, or the gated swiglu
      (``silu(W_gate z) * W_up z``, one more matrix of the same shape as W_up).
    norm_position: shorthand placing ``norm_op``: pre -> P, post -> R, output -> B,
      peri -> P and B, none -> nowhere.
    norm_op: rms, layer, mean (mean subtraction), detached_rms (x / sg(rms(x))), none.
    p_norm, b_norm, r_norm: operation at the branch input P, branch output B and
      post-residual R; each overrides the shorthand at its location when set.
    norm_gain: learned gain in the norms (the theory uses gain 1: False).
    norm_eps: epsilon inside the norms (the theory uses 0).
    alpha: init scale; every branch matrix is N(0, alpha^2 / fan_in).
    beta: branch scale.
    skip_every: k; a skip connection around every group of k blocks (k=1: the usual
      residual net; 0: no skip connections at all, a plain deep MLP).
    input_dim, num_classes: optional input layer (input_dim -> d) and output layer
      (d -> num_classes) for classification; both N(0, 1/fan_in).
    param_dtype: dtype of the parameters (float64 needs jax_enable_x64).
  """

  depth: int = 48
  width: int = 256
  expansion: float = 4.0
  branch_matrices: BranchMatrices = 2
  activation: MLPActivation = "relu"
  norm_position: NormPosition = "pre"
  norm_op: NormOp = "rms"
  p_norm: NormOp | None = None
  b_norm: NormOp | None = None
  r_norm: NormOp | None = None
  norm_gain: bool = False
  norm_eps: float = 0.0
  alpha: float = 1.0
  beta: float = 1.0
  skip_every: int = 1
  input_dim: int | None = None
  num_classes: int | None = None
  param_dtype: DType = "float32"

  def __post_init__(self):
    _literal_choices(self)
    _positive_int("depth", self.depth)
    _positive_int("width", self.width)
    _positive("expansion", self.expansion)
    _non_negative("norm_eps", self.norm_eps)
    _non_negative("alpha", self.alpha)
    _non_negative("beta", self.beta)
    if not isinstance(self.skip_every, int) or self.skip_every < 0:
      raise ValueError(f"skip_every={self.skip_every!r} must be an integer >= 0 (0: no skips)")
    if self.input_dim is not None:
      _positive_int("input_dim", self.input_dim)
    if self.num_classes is not None:
      _positive_int("num_classes", self.num_classes)
    if self.hidden_width < 1:
      raise ValueError(f"expansion={self.expansion!r} gives a hidden width below 1")

  @property
  def hidden_width(self) -> int:
    """m, the width inside a two-matrix branch (d for M=1)."""
    if self.branch_matrices == 1:
      return self.width
    return int(round(self.expansion * self.width))

  @property
  def norm_ops(self) -> tuple[str, str, str]:
    """The operations (P, B, R) after applying the shorthand and the overrides."""
    return norm_ops_of(self.norm_position, self.norm_op, (self.p_norm, self.b_norm, self.r_norm))

  @property
  def branch_to_skip_nominal(self) -> float:
    """beta * alpha^M, the nominal branch-to-skip ratio (paper Sec 3)."""
    return self.beta * self.alpha**self.branch_matrices


@dataclasses.dataclass(frozen=True)
class TransformerConfig(JsonConfig):
  """Decoder-only LM of the Post-Norm collapse and softmax-sensitivity papers.

  Each layer is two residual sublayers of the shared block (Transforming Rank Eq. 17),
  attention then FFN: ``h -> R(h + beta * B(f(P(h))))`` (``rankjax.models.blocks``).

  Attributes:
    vocab_size: 257 matches the default byte-level tokenizer (256 bytes + end of doc).
    norm_position: shorthand placing ``norm_op`` in both sublayers, as in
      ``MLPConfig``: pre -> P, post -> R (the original ``X = Norm(X + Sublayer(X))``,
      postnorm Eq. 1), output -> B, peri -> P and B, none -> nowhere.
    norm_op: rms, layer, mean, detached_rms or none; learned gain where the op
      rescales (rms, layer, detached_rms), epsilon ``norm_eps``.
    p_norm, b_norm, r_norm: the operation at P, B, R of both sublayers; each
      overrides the shorthand at its location when set.
    norm_bias: a learned bias after the gain of every norm that has a gain. None (the
      default): LayerNorm has one, as flax's ``nn.LayerNorm``, GPT-2's and the softmax
      paper's LayerNorm do, and the other ops (RMSNorm) have none; True: every norm with
      a gain; False: none (gain-only LayerNorm). ``bias_of(op)`` resolves it.
    embed_norm, final_norm: a norm (gain, bias; ``embed_norm_op`` and ``norm_op``) on
      the embeddings and on the last layer's output before the LM head. None follows the placement rule:
      when the FFN's R norm is set (post) every sublayer reads a norm's output, the
      first layer's input included (postnorm Eq. 1, ``X_1^1 = RMS(Y_0^1)``), and the
      last layer's R norm is the last norm (no second norm in a row): embed norm on,
      final norm off. Otherwise (pre, peri, output) the stream is never renormalized:
      no embed norm, a final norm (GPT-2 / Llama); none: neither. True/False force it.
    num_kv_heads: key/value heads of grouped-query attention (Ainslie et al. 2023; Llama
      2 70B, Llama 3, Mistral, Qwen2): query head h reads key/value head
      ``h // (num_heads / num_kv_heads)``. None: one per query head (multi-head).
    attn_bias: biases on the query, key and value projections (Qwen2, GPT-2).
    attn_out_bias: a bias on the attention's output projection W_O (GPT-2).
    ffn_bias: biases on the FFN's projections (W_1, W_2, and W_3 of SwiGLU; GPT-2).
    ffn: swiglu (``(silu(X W1) * X W3) W2``, paper Eq. 2), gelu (``gelu(X W1) W2``,
      the exact GELU) or gelu_tanh (the same with GELU's tanh approximation, GPT-2's
      ``gelu_new``: ``z/2 (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))``, Hendrycks &
      Gimpel 2016 Sec. 2).
    beta: branch scale of both sublayers (1 in both papers).
    tau: attention temperature; logits are ``q.k / (sqrt(d_head) * tau)``.
    pos_embedding: learned absolute positions, rope (rotary positions on q and k of
      every head, Su et al. 2021 Eq. 34, base ``rope_base``; Llama-2) or none
      (causal attention alone).
    rope_scaling: the RoPE frequencies' scaling (``attention.rope_frequencies``): none;
      linear (position interpolation: every frequency divided by ``rope_factor``); llama3
      (Llama 3.1: wavelengths above ``rope_original_max_len / rope_low_freq_factor``
      divided by ``rope_factor``, below ``rope_original_max_len / rope_high_freq_factor``
      kept, interpolated between); yarn (YaRN, Peng et al. 2023: a linear ramp between
      interpolated and kept frequencies over the dimensions rotating between
      ``rope_beta_fast`` and ``rope_beta_slow`` times in ``rope_original_max_len``,
      floored/ceiled with ``rope_truncate``).
    rope_attention_factor: multiplies q and k after the rotation (transformers'
      ``attention_scaling``; YaRN's ``0.1 ln(factor) + 1``), 1 otherwise.
    init: paper_collapse (every matrix N(0, 1/(3d)), W_2 N(0, 1/(3 d_ff)); postnorm
      paper Sec 2) or gpt2 (N(0, 0.02^2), output projections 0.02/sqrt(2N)).
    init_scale: multiplies the init variance of the matrices ``init_scale_to`` names
      (Fig 1's x1, x2, x4 sweep).
    init_scale_to: "all" (every matrix: W_Q, W_K, W_V, W_O, W_1, W_2, W_3 and an untied
      head) or "value_ffn" (W_V, W_O, W_2, W_3 only: the matrices of sigma_W^2 = d
      sigma_V^2 sigma_O^2 and xi = d d_ff sigma_W2^2 sigma_W3^2 (postnorm Sec 2, Thm
      3.2 / 3.4), leaving the logits' W_Q, W_K and the gate's W_1 at the standard init:
      the other reading of the paper's "sublayer initialization variance"); and, to
      separate what the theorems do not carry, "value_ffn_qk" (those and W_Q, W_K) and
      "value_ffn_gate" (those and W_1).
    embed_std: std of the token (and position) embeddings; None -> 1.0 for
      paper_collapse (unit-RMS rows, as after a norm) and 0.02 for gpt2.
    prefix_avg_removal: alpha of the P - alpha*C_n intervention (Cor 3.3); 0 = off.
    dropout_rate: dropout on sublayer outputs and embeddings; attn_dropout_rate on
      the attention probabilities.
    compute_dtype: activations' dtype (bfloat16 for mixed precision); parameters
      stay in ``param_dtype``; softmax, norms and logits are computed in float32.
    remat: rematerialization of each layer in the backward pass: none, dots (save
      the matmul outputs and the attention heads' output, recompute the rest) or full
      (save only the layer input), or auto: at build, the cheapest of none, dots,
      full whose estimated peak fits in 85% of a device's memory
      (``rankjax.train.memory``; dots where the device reports no limit, as on CPU).
      Old configs' true / false read as full / none.
    attention_impl: the attention kernel (``rankjax.models.attention``): auto (cuDNN
      flash attention on GPU when it applies, Pallas splash attention on TPU when the
      sequence length is a multiple of 128, XLA otherwise), xla, cudnn (GPU only),
      splash (``rankjax.models.splash_attention``; interpreted off TPU), or einsum (the explicit probability matrix; always used for captured
      probabilities and attention-probability dropout).
    vocab_multiple: the embedding table and LM head get ``padded_vocab_size`` rows,
      ``vocab_size`` rounded up to this multiple (128: whole tiles for the head's
      matmul); the pad logits are masked to -inf, so losses and outputs are those of
      the unpadded model (the pad rows get no gradient but weight decay).
    loss_chunk: the training loss computes the LM head and its float32
      log-sum-exp over chunks of this many tokens (a fused loss whose chunks form
      their gradients in the forward pass: ``models.lm_head``), never holding all
      B*T*V float32 logits; 0: one chunk.
    prng_impl: the PRNG implementation of the dropout keys: threefry (jax's
      default), rbg or unsafe_rbg (cheaper on accelerators for dropout-heavy runs).
    fused_projections: Q, K, V as one matmul and SwiGLU's W1, W3 as one, the weights
      concatenated along their output axis where the layer uses them and the product
      split (``attention.projections``); the parameters keep their names and shapes.
      The same function up to float rounding (tested); off by default so recorded
      results keep their bits, on in the paper configs (fewer, wider matmuls).
    grad_reduce_dtype: under a 16-bit compute dtype, "float32" forms each weight's
      (and the embedding's) gradient in float32, so FSDP reduces it across devices in
      float32 and rounds the sum once (``models.matmul``); "compute": jax's own rule,
      bf16 partial sums (half the bytes). Float32 compute is the same either way.
    scan_unroll: layers per iteration of the layer scan (the parameters stay stacked
      either way; ``num_layers`` unrolls it fully, which lets XLA fuse across layers
      and slice the stacked weights statically, at the cost of compile time).
  """

  vocab_size: int = 257
  num_layers: int = 48
  d_model: int = 512
  num_heads: int = 4
  num_kv_heads: int | None = None
  attn_bias: bool = False
  attn_out_bias: bool = False
  ffn_bias: bool = False
  d_ff: int = 1536
  max_seq_len: int = 2048
  norm_position: NormPosition = "post"
  norm_op: NormOp = "rms"
  p_norm: NormOp | None = None
  b_norm: NormOp | None = None
  r_norm: NormOp | None = None
  norm_eps: float = 1e-6
  norm_bias: bool | None = None
  embed_norm: bool | None = None
  final_norm: bool | None = None
  ffn: LMFFN = "swiglu"
  beta: float = 1.0
  tau: float = 1.0
  pos_embedding: PosEmbedding = "none"
  rope_base: float = 10000.0
  rope_scaling: RopeScaling = "none"
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  rope_beta_fast: float = 32.0
  rope_beta_slow: float = 1.0
  rope_truncate: bool = True
  rope_attention_factor: float = 1.0
  init: LMInit = "paper_collapse"
  init_scale: float = 1.0
  init_scale_to: InitScaleTo = "all"
  embed_std: float | None = None
  tie_embeddings: bool = False
  prefix_avg_removal: float = 0.0
  dropout_rate: float = 0.0
  attn_dropout_rate: float = 0.0
  compute_dtype: DType = "float32"
  param_dtype: DType = "float32"
  remat: RematPolicy = "none"
  attention_impl: AttentionImpl = "auto"
  vocab_multiple: int = 1
  loss_chunk: int = 0
  prng_impl: PRNGImpl = "threefry"
  scan_unroll: int = 1
  fused_projections: bool = False
  grad_reduce_dtype: GradReduceDType = "float32"

  def __post_init__(self):
    if isinstance(self.remat, bool):                 # configs written before the policy field
      object.__setattr__(self, "remat", "full" if self.remat else "none")
    _literal_choices(self)
    _positive_int("vocab_size", self.vocab_size)
    _positive_int("num_layers", self.num_layers)
    _positive_int("d_model", self.d_model)
    _positive_int("num_heads", self.num_heads)
    _positive_int("d_ff", self.d_ff)
    _positive_int("max_seq_len", self.max_seq_len)
    if self.d_model % self.num_heads:
      raise ValueError(
          f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    if self.num_kv_heads is not None:
      _positive_int("num_kv_heads", self.num_kv_heads)
      if self.num_heads % self.num_kv_heads:
        raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                         f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")
    for name in ("attn_bias", "attn_out_bias", "ffn_bias", "fused_projections"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")
    _non_negative("norm_eps", self.norm_eps)
    if not isinstance(self.tie_embeddings, bool):
      raise ValueError(f"tie_embeddings={self.tie_embeddings!r} must be true or false")
    if not (self.norm_bias is None or isinstance(self.norm_bias, bool)):
      raise ValueError(f"norm_bias={self.norm_bias!r} must be true, false or null "
                       "(null: LayerNorm has a bias, RMSNorm none)")
    for name in ("embed_norm", "final_norm"):
      if getattr(self, name) not in (None, True, False):
        raise ValueError(f"{name}={getattr(self, name)!r} must be true, false or null "
                         "(null: the placement's rule)")
    _non_negative("beta", self.beta)
    _positive("tau", self.tau)
    _positive("rope_base", self.rope_base)
    _positive("rope_factor", self.rope_factor)
    _positive_int("rope_original_max_len", self.rope_original_max_len)
    _positive("rope_attention_factor", self.rope_attention_factor)
    if self.rope_scaling == "yarn" and not 0 < self.rope_beta_slow < self.rope_beta_fast:
      raise ValueError("rope_scaling='yarn' needs 0 < rope_beta_slow < rope_beta_fast; got "
                       f"{self.rope_beta_slow}, {self.rope_beta_fast}")
    if self.rope_scaling == "llama3" and not (
        0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
      raise ValueError("rope_scaling='llama3' needs 0 < rope_low_freq_factor < "
                       f"rope_high_freq_factor; got {self.rope_low_freq_factor}, "
                       f"{self.rope_high_freq_factor}")
    if self.pos_embedding == "rope" and self.d_head % 2:
      raise ValueError(f"pos_embedding='rope' needs an even d_head; got {self.d_head}")
    _positive("init_scale", self.init_scale)
    if self.embed_std is not None:
      _positive("embed_std", self.embed_std)
    _non_negative("prefix_avg_removal", self.prefix_avg_removal)
    _rate("dropout_rate", self.dropout_rate)
    _rate("attn_dropout_rate", self.attn_dropout_rate)
    _positive_int("vocab_multiple", self.vocab_multiple)
    _non_negative_int("loss_chunk", self.loss_chunk)
    _positive_int("scan_unroll", self.scan_unroll)

  def bias_of(self, op: str) -> bool:
    """Whether a norm ``op`` of this LM has a learned bias (``norm_bias``; None: only
    LayerNorm)."""
    return op == "layer" if self.norm_bias is None else self.norm_bias

  @property
  def d_head(self) -> int:
    return self.d_model // self.num_heads

  @property
  def kv_heads(self) -> int:
    """Key/value heads (``num_kv_heads``, default ``num_heads``)."""
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the embedding table and columns of the LM head (``vocab_multiple``)."""
    m = self.vocab_multiple
    return -(-self.vocab_size // m) * m

  @property
  def norm_ops(self) -> tuple[str, str, str]:
    """The operations (P, B, R) of each sublayer after the shorthand and the overrides."""
    return norm_ops_of(self.norm_position, self.norm_op, (self.p_norm, self.b_norm, self.r_norm))

  @property
  def uses_embed_norm(self) -> bool:
    """Whether the embeddings are normalized (``embed_norm``, or the placement's rule)."""
    if self.embed_norm is not None:
      return self.embed_norm
    return self.norm_ops[2] != "none"

  @property
  def embed_norm_op(self) -> str:
    """The embedding norm's operation: the R operation (it plays the R norm of a layer
    0, postnorm Eq. 1), or ``norm_op`` when there is no R norm."""
    return self.norm_ops[2] if self.norm_ops[2] != "none" else self.norm_op

  @property
  def uses_final_norm(self) -> bool:
    """Whether a norm precedes the LM head (``final_norm``, or the placement's rule)."""
    if self.final_norm is not None:
      return self.final_norm
    return self.norm_ops[2] == "none" and any(op != "none" for op in self.norm_ops)


@dataclasses.dataclass(frozen=True)
class TrainConfig(JsonConfig):
  """What to train and how (``rankjax train``; ``rankjax.train.loop.train``).

  ``model`` is ``"lm"`` (uses ``lm``, reads text) or ``"mlp"`` (uses ``mlp`` as a
  classifier on flattened images; ``mlp.input_dim`` and ``mlp.num_classes`` must match
  the data set). Defaults are the papers' optimizer settings (postnorm Sec 4, softmax
  App D): AdamW(0.9, 0.95, eps 1e-8), weight decay 0.1 on matrices, linear warmup then
  cosine decay, global-norm clipping at 1.0.

  Attributes:
    optimizer: adamw (decoupled weight decay on parameters with two or more
      dimensions, not counting the stacked layer axis) or adam (plain Adam, the MLP
      studies; needs weight_decay=0).
    learning_rate: peak learning rate.
    lr_schedule: cosine (linear warmup to the peak, cosine decay to
      ``min_lr_ratio * learning_rate`` at ``total_steps``) or constant (after warmup).
    warmup_steps: updates of linear warmup; update s (1-based) uses ``peak * s/warmup``.
    clip_norm: global-norm clipping threshold (0: no clipping). The pre-clip norm is
      logged every step as ``grad_norm``.
    batch_size: global batch (examples per update, over all hosts and micro-batches).
    grad_accum: micro-batches per update; ``batch_size / grad_accum`` examples each,
      which must divide over the devices.
    seq_len: tokens per example (LM).
    compute_dtype: float32, or bfloat16 activations/matmuls with float32 parameters,
      gradients and optimizer state (for the LM this sets ``lm.compute_dtype``).
    seed: parameter init, dropout keys and data order.
    dataset, data_dir, tokenizer: passed to ``rankjax.data.make_iterator``; dataset
      None is the kind's default (text: the offline Shakespeare corpus; images:
      cifar10 when prepared in data_dir, else the offline fallback), tokenizer None
      is byte-level (257 ids: the LM's vocab_size must be at least that).
    mesh_data, mesh_fsdp: device mesh (data, fsdp); mesh_data=0 uses all devices
      not taken by fsdp. Parameters are sharded over fsdp (the d_model axis of every
      matrix, ``rankjax.train.sharding.PARAM_RULES``), the batch over both.
    zero1: also shard the optimizer moments over ``data`` (ZeRO stage 1).
    compilation_cache_dir: JAX persistent compilation cache (a restart after a
      preemption loads the compiled step instead of compiling it); "" = off.
    log_every: console / TensorBoard cadence (metrics.jsonl gets every step).
    diag_every: run the diagnostics step at update 1 and every ``diag_every``
      updates (0: never).
    diagnostics: names of registered diagnostics (``rankjax.train.diagnostics``).
    diag_examples: examples of the last micro-batch the diagnostics see (0: all).
    checkpoint_every: save every N updates (and at the end and on SIGTERM).
    checkpoint_minutes: also save when this many minutes have passed since the newest
      checkpoint (at the first update when there is none; after a resume, since the
      restored step was written) and no save is still being written (0: off): for
      preemptible pods, where a preemption without warning loses the updates since the
      last save. Process 0's clock decides; every process agrees on the step (Orbax's
      ``ContinuousCheckpointingPolicy``, through the coordination service).
    max_to_keep: checkpoints kept on disk (the diagnostics history is in each).
    async_checkpointing: write checkpoints in the background.
    eval_every: evaluate on ``eval_batches`` batches of ``eval_split`` every N
      updates (0: never).
    image_every: TensorBoard's per-layer profile images at update 1 and on the first
      diagnostics step of every N updates (drawing one is ~0.3-0.8 s of host time in the
      loop: at every diagnostics step of a 40000-update run with diag_every=1 that would
      be hours); scalars, histograms and the saved arrays at every diagnostics step.
    stop_at: train only updates up to this one of the ``total_steps`` schedule (the
      learning-rate schedule is the full run's), save and stop (status "stopped"); a
      later run without it (or with a larger one) continues exactly. 0: off.
    stop_on_collapse: stop (save; status "collapsed"; why, in the workdir's
      ``stopped.json`` and ``load_run(...).stopped``) once some layer's token similarity
      ``basic/tsim_y2`` has been at or above the collapse alarm's 0.95 at this many
      consecutive diagnostics steps (LM runs with the ``basic`` diagnostic); a run
      with a non-finite loss stops anyway (``NonFiniteLossError``). 0: off.
    label_frequency: also log, at every update, the frequency loss (postnorm Def 3.7)
      of the update's labels, pooled (``label_freq_aggregate``) and per sequence
      (``label_freq_per_sequence``): Sec 4.3's references for the collapsed loss,
      computed in the step rather than by re-reading the data (LM only).
  """

  model: str = "lm"
  lm: TransformerConfig = dataclasses.field(default_factory=TransformerConfig)
  mlp: MLPConfig = dataclasses.field(default_factory=MLPConfig)
  optimizer: Optimizer = "adamw"
  learning_rate: float = 6e-4
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  lr_schedule: LRSchedule = "cosine"
  warmup_steps: int = 2000
  total_steps: int = 40000
  min_lr_ratio: float = 0.0
  clip_norm: float = 1.0
  batch_size: int = 256
  grad_accum: int = 1
  seq_len: int = 2048
  compute_dtype: ComputeDType = "float32"
  seed: int = 0
  dataset: str | None = _field(None, build=False)
  data_dir: str | None = _field(None, build=False)
  tokenizer: str | None = _field(None, build=False)
  mesh_data: int = _field(0, resumable=True)
  mesh_fsdp: int = _field(1, resumable=True)
  zero1: bool = _field(False, resumable=True)
  compilation_cache_dir: str = _field("", resumable=True, build=False)
  log_every: int = _field(10, resumable=True, build=False)
  diag_every: int = 0
  diagnostics: tuple[str, ...] = ("basic",)
  diag_examples: int = 8
  checkpoint_every: int = _field(1000, resumable=True, build=False)
  checkpoint_minutes: float = _field(0.0, resumable=True, build=False)
  max_to_keep: int = _field(3, resumable=True, build=False)
  async_checkpointing: bool = _field(True, resumable=True, build=False)
  eval_every: int = _field(0, resumable=True, build=False)
  eval_batches: int = _field(10, resumable=True, build=False)
  eval_split: str = _field("validation", resumable=True, build=False)
  image_every: int = _field(100, resumable=True, build=False)
  label_frequency: bool = False
  stop_at: int = _field(0, resumable=True, build=False)
  stop_on_collapse: int = _field(0, resumable=True, build=False)

  def __post_init__(self):
    # Which names train is rankjax.train.tasks' registry (require_task): configs import
    # nothing above them.
    if not isinstance(self.model, str) or not self.model:
      raise ValueError(f"model={self.model!r} must be the non-empty name of a task")
    _literal_choices(self)
    _positive("learning_rate", self.learning_rate)
    _rate("b1", self.b1)
    _rate("b2", self.b2)
    _positive("eps", self.eps)
    _non_negative("weight_decay", self.weight_decay)
    if self.optimizer == "adam" and self.weight_decay:
      raise ValueError(f"weight_decay={self.weight_decay!r} needs optimizer='adamw'; "
                       "plain adam has no weight decay (set weight_decay=0)")
    _non_negative_int("warmup_steps", self.warmup_steps)
    _positive_int("total_steps", self.total_steps)
    _non_negative_int("stop_at", self.stop_at)
    if self.warmup_steps > self.total_steps:
      raise ValueError(f"warmup_steps={self.warmup_steps} exceeds total_steps={self.total_steps}")
    _non_negative("min_lr_ratio", self.min_lr_ratio)
    if self.min_lr_ratio > 1:
      raise ValueError(f"min_lr_ratio={self.min_lr_ratio!r} must lie in [0, 1]")
    _non_negative("clip_norm", self.clip_norm)
    _positive_int("batch_size", self.batch_size)
    _positive_int("grad_accum", self.grad_accum)
    _positive_int("seq_len", self.seq_len)
    if self.batch_size % self.grad_accum:
      raise ValueError(
          f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}")
    if self.model == "lm":
      if self.seq_len > self.lm.max_seq_len:
        raise ValueError(
            f"seq_len={self.seq_len} exceeds the model's lm.max_seq_len={self.lm.max_seq_len}")
      if self.lm.compute_dtype not in ("float32", self.compute_dtype):
        raise ValueError(
            f"lm.compute_dtype={self.lm.compute_dtype!r} conflicts with "
            f"compute_dtype={self.compute_dtype!r}; set the training option compute_dtype")
    if not isinstance(self.label_frequency, bool):
      raise ValueError(f"label_frequency={self.label_frequency!r} must be true or false")
    if self.label_frequency and self.model != "lm":
      raise ValueError(f"label_frequency=true needs model='lm' (sequences of labels), "
                       f"not {self.model!r}")
    if not isinstance(self.seed, int) or isinstance(self.seed, bool):
      raise ValueError(f"seed={self.seed!r} must be an integer")
    if self.dataset is not None and (not isinstance(self.dataset, str) or not self.dataset):
      raise ValueError(f"dataset={self.dataset!r} must be a data set name or null (the default)")
    _non_negative_int("mesh_data", self.mesh_data)
    _positive_int("mesh_fsdp", self.mesh_fsdp)
    _positive_int("log_every", self.log_every)
    _non_negative_int("diag_every", self.diag_every)
    if isinstance(self.diagnostics, str) or not all(
        isinstance(n, str) and n for n in self.diagnostics):
      raise ValueError(f"diagnostics={self.diagnostics!r} must be a list of diagnostic names")
    object.__setattr__(self, "diagnostics", tuple(self.diagnostics))
    _non_negative_int("diag_examples", self.diag_examples)
    _non_negative_int("stop_on_collapse", self.stop_on_collapse)
    if self.stop_on_collapse and not (self.model == "lm" and self.diag_every
                                      and "basic" in self.diagnostics):
      raise ValueError(f"stop_on_collapse={self.stop_on_collapse} reads the basic "
                       "diagnostic's token similarity: it needs model='lm', diag_every > 0 "
                       "and 'basic' in diagnostics")
    _positive_int("checkpoint_every", self.checkpoint_every)
    _non_negative("checkpoint_minutes", self.checkpoint_minutes)
    _positive_int("max_to_keep", self.max_to_keep)
    if not isinstance(self.async_checkpointing, bool):
      raise ValueError(f"async_checkpointing={self.async_checkpointing!r} must be true or false")
    _non_negative_int("eval_every", self.eval_every)
    _positive_int("eval_batches", self.eval_batches)
    _positive_int("image_every", self.image_every)

  @property
  def micro_batch_size(self) -> int:
    return self.batch_size // self.grad_accum


# ---------------------------------------------------------------------------
# dict / JSON round trips and key=value overrides


def to_dict(cfg: Any) -> dict[str, Any]:
  return dataclasses.asdict(cfg)


def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
  """Builds ``cls`` from a (nested) dict; unknown keys raise ValueError."""
  if not isinstance(data, Mapping):
    raise ValueError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(data) - set(fields))
  if unknown:
    raise ValueError(
        f"unknown {cls.__name__} field(s) {unknown}; known fields: {sorted(fields)}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, value in data.items():
    sub = _dataclass_type(hints[name])
    kwargs[name] = from_dict(sub, value) if sub is not None else value
  return cls(**kwargs)


def to_json(cfg: Any, path: str | pathlib.Path | None = None) -> str:
  """The JSON text of ``cfg``; with ``path`` (local or an ``etils.epath`` URL) also
  written there."""
  text = json.dumps(to_dict(cfg), indent=2, sort_keys=True)
  if path is not None:
    from etils import epath
    epath.Path(path).write_text(text + "\n")
  return text


def from_json(cls: type[C], path_or_text: str | pathlib.Path) -> C:
  """Loads ``cls`` from a JSON file path or a JSON string."""
  text = str(path_or_text)
  if not text.lstrip().startswith("{"):
    from rankjax import storage
    path = storage.as_path(text, "config file")
    if not path.is_file():
      raise ValueError(f"config file {path} " + ("is a folder, not a JSON file"
                                                 if path.is_dir() else "does not exist"))
    text = path.read_text()
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"config is not valid JSON: {e}") from None
  return from_dict(cls, data)


def _json_or_text(raw: str) -> Any:
  try:
    return json.loads(raw)
  except json.JSONDecodeError:
    return raw


def override(cfg: C, assignments: Sequence[str], option: str = "--set") -> C:
  """Applies ``key=value`` strings (``--set``; ``option`` names the flag in errors);
  dotted keys reach nested configs.

  Values are parsed as JSON when possible (``depth=48``, ``beta=0.5``,
  ``p_norm=null``, ``norm_gain=true``), otherwise taken as strings. A list field
  takes ``a,b`` (each item parsed the same way) or a JSON list (``["a", "b"]``).
  ``cfg`` is valid, so a config the assignments make invalid is refused naming
  ``option`` (and both list syntaxes when a list field was set).
  """
  data = to_dict(cfg)
  lists = []
  for item in assignments:
    if "=" not in item:
      raise ValueError(f"{option} expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    value = _json_or_text(raw)
    node, parts = data, key.strip().split(".")
    for part in parts[:-1]:
      if not isinstance(node.get(part), dict):
        raise ValueError(f"unknown config key {key!r} in {option}")
      node = node[part]
    if parts[-1] not in node:
      raise ValueError(
          f"unknown config key {key!r} in {option}; known keys: {sorted(node)}")
    if isinstance(node[parts[-1]], (list, tuple)):
      lists.append(key.strip())
      if not isinstance(value, list):
        value = [_json_or_text(v.strip()) for v in raw.split(",") if v.strip()]
    node[parts[-1]] = value
  try:
    return from_dict(type(cfg), data)
  except ValueError as e:
    syntax = (f" (a list is written {option} {lists[0]}=a,b or {option} "
              f"'{lists[0]}=[\"a\", \"b\"]')" if lists else "")
    raise ValueError(f"{option}: {e}{syntax}") from None


def diff(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
  """Flat {dotted.key: (a_value, b_value)} of the fields where two configs differ."""
  out: dict[str, tuple[Any, Any]] = {}

  def walk(x, y, prefix):
    for k in sorted(set(x) | set(y)):
      xv, yv = x.get(k), y.get(k)
      if isinstance(xv, dict) and isinstance(yv, dict):
        walk(xv, yv, f"{prefix}{k}.")
      elif xv != yv:
        out[f"{prefix}{k}"] = (xv, yv)

  walk(to_dict(a), to_dict(b), "")
  return out


def _dataclass_type(hint: Any) -> type | None:
  if dataclasses.is_dataclass(hint):
    return hint
  if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
    for arg in typing.get_args(hint):
      if dataclasses.is_dataclass(arg):
        return arg
  return None
