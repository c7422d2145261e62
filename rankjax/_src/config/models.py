"""The model configs a run carries (``TrainConfig.model``) and the registry of kinds.

A model config is a frozen dataclass subclassing ``ModelConfig``, registered under its
kind: ``transformer`` (``TransformerConfig``, the decoder LM) and ``mlp``
(``MLPConfig``, the residual MLP) are the library's; a plug-in registers its own
(``register_model_config(kind, cls)``) beside its task
(``rankjax._src.train.tasks.register_task(kind, factory)``). The JSON form is tagged with
the kind: ``{"kind": "transformer", "d_model": 512, ...}`` (``rankjax._src.config.io``).

Fields marked ``run_field(per_run=True)`` (MLP alpha, beta; transformer beta, tau,
init_scale) change no shape and are read only arithmetically (alpha and init_scale
only at init): runs differing
in them train as one program (``rankjax._src.train.runs``, ``--sweep model.beta=...``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import ClassVar, Literal, Sequence

from rankjax._src.config.fields import run_field
from rankjax._src.config.io import Tagged
from rankjax._src.config.validation import check, literal_choices
from rankjax._src.errors import UserError

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
AttnDropoutMask = Literal["threefry", "hash"]
AttnDropoutKernel = Literal["auto", "pallas", "blocks"]
GradReduceDType = Literal["float32", "compute"]
MLPActivation = Literal["relu", "gelu", "silu", "abs", "tanh", "swiglu"]
BranchMatrices = Literal[1, 2]

NORM_POSITIONS = typing.get_args(NormPosition)
NORM_OPS = typing.get_args(NormOp)
MLP_ACTIVATIONS = typing.get_args(MLPActivation)

# Where the shorthand ``norm_position`` puts ``norm_op`` inside a residual block
# R(h + beta * B(f(P(h)))) (Transforming Rank, Eq. 17): P, B and/or R.
NORM_LOCATIONS = {"pre": ("P",), "post": ("R",), "output": ("B",), "peri": ("P", "B"),
                  "none": ()}

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


# kind -> the config class of that kind of model (``register_model_config``)
MODEL_CONFIGS: dict[str, type[ModelConfig]] = {}


class ModelConfig(Tagged):
  """The base of every model config: ``cfg.kind`` is the kind it is registered under,
  the tag of its JSON form."""

  @classmethod
  def kind_of_class(cls) -> str:
    for kind, c in MODEL_CONFIGS.items():
      if c is cls:
        return kind
    raise UserError(f"{cls.__name__} is not a registered model config "
                     "(rankjax._src.config.register_model_config)")

  @classmethod
  def kinds(cls) -> list[str]:
    return sorted(MODEL_CONFIGS)

  @classmethod
  def of_kind(cls, kind: object) -> type[ModelConfig]:
    """The config class of ``kind``; a one-line ValueError naming the registry if none."""
    if isinstance(kind, str) and kind in MODEL_CONFIGS:
      return MODEL_CONFIGS[kind]
    raise UserError(f"model kind {kind!r} is not registered; choose one of "
                     f"{sorted(MODEL_CONFIGS)} (or register your own: "
                     "rankjax._src.config.register_model_config, loaded with --import MODULE)")


def register_model_config(kind: str, cls: type[ModelConfig]) -> type[ModelConfig]:
  """Makes ``kind`` a model kind configured by ``cls`` (a frozen dataclass subclassing
  ``ModelConfig`` whose every field has a default: ``--set model.kind=KIND`` starts from
  them; no field named ``kind``). A kind has one class and a class one kind."""
  if not isinstance(kind, str) or not kind:
    raise UserError(f"model kind {kind!r} must be a non-empty string")
  if not (isinstance(cls, type) and issubclass(cls, ModelConfig)
          and dataclasses.is_dataclass(cls)):
    raise UserError(f"{cls!r} must be a dataclass subclassing rankjax._src.config.ModelConfig")
  if "kind" in {f.name for f in dataclasses.fields(cls)}:
    raise UserError(f"{cls.__name__} has a field named 'kind': that key tags the JSON form")
  taken = [k for k, c in MODEL_CONFIGS.items() if c is cls and k != kind]
  if taken:
    raise UserError(f"{cls.__name__} is registered as model kind {taken[0]!r} already")
  try:
    cls()
  except (TypeError, ValueError) as e:
    raise UserError(f"{cls.__name__}() must build with its defaults ({e})") from None
  MODEL_CONFIGS[kind] = cls
  return cls


@dataclasses.dataclass(frozen=True)
class MLPConfig(ModelConfig):
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
  alpha: float = run_field(1.0, per_run=True)     # init only
  beta: float = run_field(1.0, per_run=True)      # blocks.residual_sublayer
  skip_every: int = 1
  input_dim: int | None = None
  num_classes: int | None = None
  param_dtype: DType = "float32"

  def __post_init__(self):
    literal_choices(self)
    check("depth", self.depth, "positive int")
    check("width", self.width, "positive int")
    check("expansion", self.expansion, "positive")
    check("norm_eps", self.norm_eps, "non-negative")
    check("alpha", self.alpha, "non-negative")
    check("beta", self.beta, "non-negative")
    check("skip_every", self.skip_every, "non-negative int", note="0: no skips")
    check("input_dim", self.input_dim, "positive int", optional=True)
    check("num_classes", self.num_classes, "positive int", optional=True)
    if self.hidden_width < 1:
      raise UserError(f"expansion={self.expansion!r} gives a hidden width below 1")

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
class RopeConfig:
  """Rotary position embedding settings of a ``TransformerConfig`` (``cfg.rope``), read
  only when ``pos_embedding="rope"`` (RoFormer, Su et al. 2021, Eq. 34;
  ``attention.rope`` and ``attention.rope_frequencies``). The defaults are plain RoPE.

  Attributes:
    base: the frequencies' base, ``theta_i = base^(-2i/d_head)`` (Hugging Face's
      ``rope_theta``).
    scaling: the frequencies' scaling: none; linear (position interpolation: every
      frequency divided by ``factor``); llama3 (Llama 3.1: wavelengths above
      ``original_max_len / low_freq_factor`` divided by ``factor``, below
      ``original_max_len / high_freq_factor`` kept, interpolated between); yarn (YaRN,
      Peng et al. 2023: a linear ramp between interpolated and kept frequencies over
      the dimensions rotating between ``beta_fast`` and ``beta_slow`` times in
      ``original_max_len``, floored/ceiled with ``truncate``).
    factor, low_freq_factor, high_freq_factor, original_max_len, beta_fast, beta_slow,
      truncate: the scalings' parameters (transformers' ``rope_scaling`` keys).
    attention_factor: multiplies q and k after the rotation (transformers'
      ``attention_scaling``; YaRN's ``0.1 ln(factor) + 1``), 1 otherwise.
  """

  base: float = 10000.0
  scaling: RopeScaling = "none"
  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_len: int = 8192
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  truncate: bool = True
  attention_factor: float = 1.0

  def __post_init__(self):
    literal_choices(self, prefix="rope.")
    check("rope.base", self.base, "positive")
    check("rope.factor", self.factor, "positive")
    check("rope.original_max_len", self.original_max_len, "positive int")
    check("rope.attention_factor", self.attention_factor, "positive")
    check("rope.truncate", self.truncate, "bool")
    if self.scaling == "yarn" and not 0 < self.beta_slow < self.beta_fast:
      raise UserError("rope.scaling='yarn' needs 0 < rope.beta_slow < rope.beta_fast; got "
                       f"{self.beta_slow}, {self.beta_fast}")
    if self.scaling == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
      raise UserError("rope.scaling='llama3' needs 0 < rope.low_freq_factor < "
                       f"rope.high_freq_factor; got {self.low_freq_factor}, "
                       f"{self.high_freq_factor}")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """How a ``TransformerConfig`` is computed, never what (``cfg.kernels``): each knob
  leaves the function the same, up to float rounding (tested where rounding differs);
  the papers' architecture is the top-level fields.

  Attributes:
    remat: rematerialization of each layer in the backward pass: none, dots (save
      the matmul outputs and the attention heads' output, recompute the rest) or full
      (save only the layer input), or auto: at build, the cheapest of none, dots,
      full whose estimated peak fits in 85% of a device's memory
      (``rankjax._src.train.memory``; dots where the device reports no limit, as on CPU).
      The recomputation is the forward's own.
    attention_impl: the attention kernel (``rankjax._src.models.attention``): auto (cuDNN
      flash attention on GPU when it applies, Pallas splash attention on TPU when the
      sequence length is a multiple of 128, XLA otherwise), xla, cudnn (GPU only),
      splash (``rankjax._src.models.splash_attention``; interpreted off TPU), or einsum
      (the explicit probability matrix; always used for captured probabilities, and
      for float64 under auto: an explicit fused kernel refuses float64 in one line;
      ``rankjax._src.models.attention_kernels``). Attention-probability dropout in training
      takes a query-block path instead (``attn_dropout_mask``), or with hash masks on
      a GPU the fused Pallas kernel of ``rankjax._src.models.flash_dropout``
      (``attn_dropout_kernel``).
    attn_dropout_kernel: the kernel of hash-mask dropout in training (no prefix
      removal): auto (the fused Pallas flash kernel ``rankjax._src.models.flash_dropout`` on
      a GPU backend when it takes the dtype (16-bit), d_head and T; the query blocks of
      ``causal_dropout_attention`` otherwise), pallas (the flash kernel wherever it
      takes the shapes, float32 too; interpreted off GPU: the tests), or blocks (never
      the flash kernel). The same masks and function either way.
    vocab_multiple: the embedding table and LM head get ``padded_vocab_size`` rows,
      ``vocab_size`` rounded up to this multiple (128: whole tiles for the head's
      matmul); the pad logits are masked to -inf, so losses and outputs are those of
      the unpadded model (the pad rows get no gradient but weight decay). It changes the
      parameters' shapes: a checkpoint resumes with its own.
    loss_chunk: the training loss computes the LM head and its float32
      log-sum-exp over chunks of this many tokens (a fused loss whose chunks form
      their gradients in the forward pass: ``models.lm_head``), never holding all
      B*T*V float32 logits; 0: one chunk.
    scan_unroll: layers per iteration of the layer scan (the parameters stay stacked
      either way; ``num_layers`` unrolls it fully, which lets XLA fuse across layers
      and slice the stacked weights statically, at the cost of compile time).
    fused_projections: Q, K, V as one matmul and SwiGLU's W1, W3 as one, the weights
      concatenated along their output axis where the layer uses them and the product
      split (``attention.projections``); the parameters keep their names and shapes.
      The same function up to float rounding (tested); off by default so recorded
      results keep their bits, on in the paper configs (fewer, wider matmuls).
    grad_reduce_dtype: under a 16-bit compute dtype, "float32" forms each weight's
      (and the embedding's) gradient in float32, so FSDP reduces it across devices in
      float32 and rounds the sum once (``models.matmul``); "compute": jax's own rule,
      bf16 partial sums (half the bytes). Float32 compute is the same either way.
  """

  remat: RematPolicy = "none"
  attention_impl: AttentionImpl = "auto"
  attn_dropout_kernel: AttnDropoutKernel = "auto"
  vocab_multiple: int = 1
  loss_chunk: int = 0
  scan_unroll: int = 1
  fused_projections: bool = False
  grad_reduce_dtype: GradReduceDType = "float32"

  def __post_init__(self):
    literal_choices(self, prefix="kernels.")
    check("kernels.vocab_multiple", self.vocab_multiple, "positive int")
    check("kernels.loss_chunk", self.loss_chunk, "non-negative int")
    check("kernels.scan_unroll", self.scan_unroll, "positive int")
    check("kernels.fused_projections", self.fused_projections, "bool")


# Config format 2's flat TransformerConfig fields and where format 3 keeps them
# (``TransformerConfig.MOVED``: rankjax._src.config.io converts format 2 on read).
_MOVED = {**{f"rope_{f.name}": f"rope.{f.name}" for f in dataclasses.fields(RopeConfig)},
          **{f.name: f"kernels.{f.name}" for f in dataclasses.fields(KernelConfig)}}


@dataclasses.dataclass(frozen=True)
class TransformerConfig(ModelConfig):
  """Decoder-only LM of the Post-Norm collapse and softmax-sensitivity papers.

  Each layer is two residual sublayers of the shared block (Transforming Rank Eq. 17),
  attention then FFN: ``h -> R(h + beta * B(f(P(h))))`` (``rankjax._src.models.blocks``).

  The fields are grouped by what they change: the top-level ones are the architecture
  (the papers' and Hugging Face's), ``rope`` the rotary positions' settings
  (``RopeConfig``) and ``kernels`` the knobs that change no result but by float rounding
  (``KernelConfig``). Config format 2 had them flat (``rope_base``, ``remat``, ...):
  ``MOVED`` maps each old name to its path, and ``rankjax._src.config.io`` converts.

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
      every head, Su et al. 2021 Eq. 34, set by ``rope``; Llama-2) or none (causal
      attention alone). It stays here, not in ``rope``: it chooses the parameters (a
      learned table or none) and the function, of which RoPE is one of three.
    rope: the RoPE settings (``RopeConfig``: base, scaling and its parameters), read
      only when ``pos_embedding="rope"``.
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
    prng_impl: the PRNG implementation of the dropout keys: threefry (jax's
      default), rbg or unsafe_rbg (cheaper on accelerators for dropout-heavy runs).
    attn_dropout_mask: the masks of attention-probability dropout in training:
      threefry (``jax.random.bernoulli`` per query block over every key:
      ``attention.blocked_attention``, the bits of every recorded run) or hash (a
      counter-based uint32 hash of the key, batch, head, query and key indices,
      ``rankjax._src.models.dropout_mask``, with the hidden key blocks skipped:
      ``attention.causal_dropout_attention``; other masks of the same law, faster).
    kernels: how the model is computed, never what (``KernelConfig``: remat, the
      attention kernels, vocabulary padding, the loss's chunks, the layer scan's unroll,
      fused projections, the gradients' reduction dtype).
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
  beta: float = run_field(1.0, per_run=True)      # blocks.residual_sublayer
  tau: float = run_field(1.0, per_run=True)       # the attention logits' scale
  pos_embedding: PosEmbedding = "none"
  rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
  init: LMInit = "paper_collapse"
  init_scale: float = run_field(1.0, per_run=True)   # init only (attention.matrix_init)
  init_scale_to: InitScaleTo = "all"
  embed_std: float | None = None
  tie_embeddings: bool = False
  prefix_avg_removal: float = 0.0
  dropout_rate: float = 0.0
  attn_dropout_rate: float = 0.0
  compute_dtype: DType = "float32"
  param_dtype: DType = "float32"
  prng_impl: PRNGImpl = "threefry"
  attn_dropout_mask: AttnDropoutMask = "threefry"
  kernels: KernelConfig = dataclasses.field(default_factory=KernelConfig)

  MOVED: ClassVar[dict[str, str]] = _MOVED

  def __post_init__(self):
    literal_choices(self)
    check("vocab_size", self.vocab_size, "positive int")
    check("num_layers", self.num_layers, "positive int")
    check("d_model", self.d_model, "positive int")
    check("num_heads", self.num_heads, "positive int")
    check("d_ff", self.d_ff, "positive int")
    check("max_seq_len", self.max_seq_len, "positive int")
    if self.d_model % self.num_heads:
      raise UserError(
          f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    check("num_kv_heads", self.num_kv_heads, "positive int", optional=True)
    if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
      raise UserError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")
    for name in ("attn_bias", "attn_out_bias", "ffn_bias", "tie_embeddings"):
      check(name, getattr(self, name), "bool")
    check("norm_eps", self.norm_eps, "non-negative")
    check("norm_bias", self.norm_bias, "bool", optional=True,
          note="null: LayerNorm has a bias, RMSNorm none")
    for name in ("embed_norm", "final_norm"):
      check(name, getattr(self, name), "bool", optional=True, note="null: the placement's rule")
    check("beta", self.beta, "non-negative")
    check("tau", self.tau, "positive")
    for name, sub in (("rope", RopeConfig), ("kernels", KernelConfig)):
      if not isinstance(getattr(self, name), sub):
        raise UserError(f"{name}={getattr(self, name)!r} must be a {sub.__name__}")
    if self.pos_embedding == "rope" and self.d_head % 2:
      raise UserError(f"pos_embedding='rope' needs an even d_head; got {self.d_head}")
    check("init_scale", self.init_scale, "positive")
    check("embed_std", self.embed_std, "positive", optional=True)
    check("prefix_avg_removal", self.prefix_avg_removal, "non-negative")
    check("dropout_rate", self.dropout_rate, "rate")
    check("attn_dropout_rate", self.attn_dropout_rate, "rate")

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
    """Rows of the embedding table and columns of the LM head (``kernels.vocab_multiple``)."""
    m = self.kernels.vocab_multiple
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


register_model_config("transformer", TransformerConfig)
register_model_config("mlp", MLPConfig)
