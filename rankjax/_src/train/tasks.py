"""The one place that maps a model kind to its model, batch, loss and captures.

The loop, the step and the diagnostics never branch on the model kind; they call a
``Task``, built by the factory ``TASKS[cfg.model.kind]``. Two are the library's
(``register_task`` adds more):

  transformer: ``DecoderLM`` on text batches ``{"inputs", "targets"}`` of int32 (B, T);
       loss = mean next-token cross-entropy over all B*T tokens (sequences are packed,
       no padding), computed from the head's input by ``head_cross_entropy`` (compute
       dtype head, float32 log-sum-exp, pad columns masked, ``model.kernels.loss_chunk``) on
       the compute copy of the parameters (``numerics.compute_copy``, both tasks; the
       diagnostics step's forward passes read the same copy).
  mlp: ``ResidualMLP`` classifier on image batches ``{"inputs": (B, D) float32,
       "targets": (B,) int32}``; loss = mean cross-entropy, plus accuracy.

``stacked_roots`` names the parameter subtrees whose leaves carry a leading layer
axis (``nn.scan`` / the MLP's stacked blocks): sharding never splits that axis, weight
decay and per-layer diagnostics look past it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src import config as config_lib
from rankjax._src import numerics, partitioning
from rankjax._src.config import TrainConfig
from rankjax._src.measure.losses import cross_entropy
from rankjax._src.models import annotated
from rankjax._src.models.lm_head import head_cross_entropy
from rankjax._src.models.mlp import ResidualMLP
from rankjax._src.models.transformer import DecoderLM, intermediate_grads
from rankjax._src.errors import UserError

Array = jax.Array
Batch = Mapping[str, Array]
Params = Any


@dataclasses.dataclass(frozen=True)
class Task:
  """Model-kind-specific pieces of training; subclasses fill them in.

  Attributes:
    kind: the model's kind (``TrainConfig.model.kind``: "transformer", "mlp" or a
      plug-in's).
    data_kind: "text" or "images" (``rankjax._src.data.make_iterator`` kind).
    model: the linen module.
    example_spec: per-example shape and dtype of every batch entry.
    tokens_per_example: tokens an example contributes to throughput (T, or 1).
    stacked_roots: top-level parameter names whose leaves have a leading layer axis.
    lookup_tables: top-level parameter names read by lookup, not matmul (embeddings).
    compute_dtype: activations' dtype.
    dropout: whether the training forward pass needs a "dropout" rng.
    norm_position: where the model's residual blocks normalize, as the report names
      it ("pre", "post", "output", "peri", "none"; ``config.norm_position_of``).
      The library's tasks read it from the norms their model builds; a task of one's
      own declares it (None: not declared, and the report says so).
    unannotated_params: what a parameter created without logical axes gets
      (``param_axes``): "error" (the default: a one-line UserError naming it) or
      "fallback" (a plug-in's opt-in: a 1-D one is a vector like a norm gain, replicated
      and kept in its dtype; a larger one is sharded over ``fsdp`` along its largest
      dimension that ``fsdp`` divides, ``sharding.spec_for``, and cast like a matrix).
  """

  kind: str
  data_kind: str
  model: nn.Module
  example_spec: Mapping[str, tuple[tuple[int, ...], Any]]
  tokens_per_example: int
  stacked_roots: tuple[str, ...]
  compute_dtype: Any = jnp.float32
  dropout: bool = False
  lookup_tables: tuple[str, ...] = ()
  norm_position: str | None = None
  unannotated_params: str = "error"

  @property
  def throughput_unit(self) -> str:
    """What throughput counts: "images" (examples) for image data, else "tokens"
    (the metrics ``<unit>_per_s`` and ``<unit>_per_s_avg``)."""
    return "images" if self.data_kind == "images" else "tokens"

  def dummy_batch(self, batch_size: int) -> dict[str, Array]:
    return {k: jnp.zeros((batch_size, *shape), dtype)
            for k, (shape, dtype) in self.example_spec.items()}

  def init(self, rng: Array) -> Params:
    """Parameters from ``rng`` (call under ``jax.jit``/``eval_shape``): plain arrays."""
    return nn.unbox(self.model.init(rng, self.dummy_batch(1)["inputs"])["params"])

  def param_axes(self) -> Any:
    """The logical axes every parameter was created with (``rankjax._src.models.annotated``):
    a tree like ``init``'s of PartitionSpecs of logical names (``"layers"`` first under
    the layer stack), read from an abstract init. What sharding, mixed precision
    (``numerics.compute_copy``) and FLOP counting read; an unannotated parameter is an
    error unless ``unannotated_params="fallback"``."""
    cached = self.__dict__.get("_param_axes")
    if cached is None:
      init = getattr(self.model, "init_annotated", self.model.init)
      boxed = jax.eval_shape(lambda k: init(k, self.dummy_batch(1)["inputs"])["params"],
                             jax.random.key(0))
      cached = annotated.logical_axes(boxed, self.stacked_roots,
                                      fallback=self._fallback())
      object.__setattr__(self, "_param_axes", cached)
    return cached

  def with_model(self, model: Any) -> "Task":
    """This task around ``model``, a module with the same parameters (one run's model
    in a program of several: ``rankjax._src.train.runs``); the parameter axes carried over,
    not read again from an abstract init of ``model``."""
    out = dataclasses.replace(self, model=model)
    object.__setattr__(out, "_param_axes", self.param_axes())
    return out

  def _fallback(self) -> bool:
    if self.unannotated_params not in ("error", "fallback"):
      raise UserError(f"unannotated_params={self.unannotated_params!r}: "
                      "expected 'error' or 'fallback'")
    return self.unannotated_params == "fallback"

  def loss(self, params: Params, batch: Batch, rng: Array | None,
           deterministic: bool = False) -> tuple[Array, dict[str, Array]]:
    """(scalar loss, {metric: scalar}) of one micro-batch."""
    raise NotImplementedError

  def capture(self, params: Params, batch: Batch) -> tuple[dict[str, Array], dict[str, Array] | None]:
    """Deterministic forward (and backward) capture: (activations, their gradients)."""
    raise NotImplementedError

  def flops_per_example(self, causal: bool = True) -> float:
    """Model FLOPs of one forward+backward pass over one example: 6 per weight of a
    matmul per token (norm gains, biases and lookup tables are no matmuls), plus the
    attention products (``causal``: a causal attention's score and value products count
    at half, the work a causal kernel does; False counts them whole)."""
    raise NotImplementedError

  def matmul_params(self) -> int:
    """Weights that multiply an activation in a matmul (leaves annotated as norm gains or
    biases, ``numerics.is_norm_param``, and lookup tables excluded; see
    ``flops_per_example``)."""
    shapes = jax.eval_shape(self.init, jax.random.key(0))
    leaves = jax.tree_util.tree_leaves_with_path(shapes)
    return int(sum(np.prod(x.shape) for (path, x), axes in zip(
                       leaves, jax.tree.leaves(self.param_axes()))
                   if not numerics.is_norm_param(axes)
                   and getattr(path[0], "key", None) not in self.lookup_tables))

  def data_requirements(self) -> dict[str, Any]:
    """What the data must match (``rankjax._src.data.check_model_fits`` keywords)."""
    return {}


def dropout_key(rng: Array, impl: str) -> Array:
  """``rng`` as a key of the PRNG implementation ``impl`` (``TransformerConfig.prng_impl``).

  threefry (jax's default) passes ``rng`` through; rbg / unsafe_rbg keys are built
  from random bits drawn with ``rng`` (their key data is wider than threefry's).
  """
  if impl == "threefry":
    return rng
  shape = jax.random.key_data(jax.random.key(0, impl=impl)).shape
  return jax.random.wrap_key_data(jax.random.bits(rng, shape, jnp.uint32), impl=impl)


@dataclasses.dataclass(frozen=True)
class LMTask(Task):
  """Next-token prediction with ``DecoderLM``; captures X_k / Y_k and their grads."""

  def loss(self, params, batch, rng, deterministic=False):
    cfg = self.model.cfg
    rngs = ({"dropout": dropout_key(rng, cfg.prng_impl)}
            if (self.dropout and not deterministic) else None)
    # a tied table is read as one copy per batch shard by the lookup and the head: its
    # two gradients are added on the shard and reduced once (matmul.shard_copies)
    shards = partitioning.axis_size("batch") if cfg.tie_embeddings else 1
    if batch["inputs"].shape[0] % shards:
      shards = 1
    h, w = self.model.apply({"params": numerics.compute_copy(params, cfg.compute_dtype,
                                                             self.param_axes())},
                            batch["inputs"],
                            deterministic=deterministic or not self.dropout, rngs=rngs,
                            return_hidden=True, tied_shards=shards)
    targets = batch["targets"]
    loss = head_cross_entropy(h.reshape(-1, h.shape[-1]), w, targets.reshape(-1),
                              cfg.vocab_size, cfg.kernels.loss_chunk)
    return loss, {"loss": loss}

  def capture(self, params, batch):
    targets = batch["targets"]
    _, _, grads, acts = intermediate_grads(
        self.model, params, batch["inputs"], lambda logits: cross_entropy(logits, targets))
    return acts, grads

  def data_requirements(self) -> dict[str, Any]:
    return dict(vocab_size=self.model.cfg.vocab_size, max_seq_len=self.model.cfg.max_seq_len)

  def flops_per_example(self, causal: bool = True) -> float:
    cfg = self.model.cfg
    t = self.tokens_per_example
    # PaLM (App B): 6N per token for the matmuls (the LM head counts, the embedding
    # lookup does not: a tied table counts once, as the head) plus 12 L T d for
    # attention scores and values; a causal mask leaves half of those (MaxText's count).
    dense = self.matmul_params()
    if cfg.tie_embeddings:
      dense += cfg.padded_vocab_size * cfg.d_model
    attention = 12.0 * cfg.num_layers * t * cfg.d_model * (0.5 if causal else 1.0)
    return t * (6.0 * dense + attention)


@dataclasses.dataclass(frozen=True)
class ClassifierTask(Task):
  """Classification with ``ResidualMLP`` (input and output layers set)."""

  def _logits(self, params, x):
    if self.compute_dtype != jnp.float32:
      params = numerics.compute_copy(params, self.compute_dtype, self.param_axes())
      x = x.astype(self.compute_dtype)
    return self.model.apply({"params": params}, x).astype(jnp.float32)

  def loss(self, params, batch, rng, deterministic=False):
    del rng, deterministic
    logits = self._logits(params, batch["inputs"])
    loss = cross_entropy(logits, batch["targets"])
    accuracy = jnp.mean((jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32))
    return loss, {"loss": loss, "accuracy": accuracy}

  def capture(self, params, batch):
    _, state = self.model.apply({"params": params}, batch["inputs"], capture=True,
                                mutable=["intermediates"])
    inter = state["intermediates"]
    return {"h0": inter["h0"][0], "stream": inter["stream"][0]}, None

  def data_requirements(self) -> dict[str, Any]:
    return dict(num_classes=self.model.cfg.num_classes, input_dim=self.model.cfg.input_dim)

  def flops_per_example(self, causal: bool = True) -> float:
    del causal          # no attention
    return 6.0 * self.matmul_params()


def data_kwargs(cfg: TrainConfig, task: Task) -> dict[str, Any]:
  """Arguments of ``rankjax._src.data.make_iterator`` / ``dataset_info`` for this run."""
  text = task.data_kind == "text"
  return dict(dataset=cfg.dataset, data_dir=cfg.data_dir,
              seq_len=cfg.seq_len if text else None,
              tokenizer=cfg.tokenizer if text else None)


def model_requirements(task: Task) -> dict[str, Any]:
  """Keyword arguments of ``rankjax._src.data.check_model_fits`` for this model."""
  return task.data_requirements()


def _lm_task(cfg: TrainConfig) -> Task:
  dtype = jnp.dtype(cfg.compute_dtype)
  lm = dataclasses.replace(cfg.model, compute_dtype=cfg.compute_dtype)
  spec = {"inputs": ((cfg.seq_len,), jnp.int32), "targets": ((cfg.seq_len,), jnp.int32)}
  return LMTask("transformer", "text", DecoderLM(lm), spec, cfg.seq_len, ("layers",), dtype,
                dropout=bool(lm.dropout_rate or lm.attn_dropout_rate),
                lookup_tables=("embed", "pos_embed"),
                norm_position=config_lib.norm_position_of(lm.norm_ops))


def _mlp_task(cfg: TrainConfig) -> Task:
  mlp = cfg.model
  if mlp.input_dim is None or mlp.num_classes is None:
    raise UserError("model kind 'mlp' trains a classifier: set model.input_dim and "
                     f"model.num_classes (got input_dim={mlp.input_dim}, "
                     f"num_classes={mlp.num_classes})")
  spec = {"inputs": ((mlp.input_dim,), jnp.float32), "targets": ((), jnp.int32)}
  return ClassifierTask("mlp", "images", ResidualMLP(mlp), spec, 1, ("blocks",),
                        jnp.dtype(cfg.compute_dtype),
                        norm_position=config_lib.norm_position_of(mlp.norm_ops))


TaskFactory = Callable[[TrainConfig], Task]

# A model kind (``TrainConfig.model.kind``) -> the function building its task.
# ``register_task`` adds one beside the kind's config class
# (``rankjax._src.config.register_model_config``; a user's model:
# ``examples/plugins/my_pieces.py``, ``rankjax train --import``).
TASKS: dict[str, TaskFactory] = {"transformer": _lm_task, "mlp": _mlp_task}


def register_task(kind: str, factory: TaskFactory) -> TaskFactory:
  """Makes a config whose model is of ``kind`` train ``factory(cfg)`` (a ``Task``; its
  ``norm_position`` is the placement ``rankjax report`` names). The kind's config class
  is registered in the config layer: ``rankjax._src.config.register_model_config``."""
  if not isinstance(kind, str) or not kind:
    raise UserError(f"model kind {kind!r} must be a non-empty string")
  TASKS[kind] = factory
  return factory


def require_task(cfg: TrainConfig) -> TaskFactory:
  """The factory of ``cfg.model.kind``; one-line ValueError naming the registry if none."""
  factory = TASKS.get(cfg.model.kind)
  if factory is None:
    raise UserError(f"model kind {cfg.model.kind!r} has no task; choose one of "
                     f"{sorted(TASKS)} (or register your own: "
                     "rankjax._src.train.tasks.register_task, loaded with --import MODULE)")
  return factory


def make_task(cfg: TrainConfig) -> Task:
  """The task for ``cfg.model``'s kind; raises ValueError when the model cannot train."""
  return require_task(cfg)(cfg)


def is_stacked(path: tuple[Any, ...], roots: tuple[str, ...]) -> bool:
  """Whether a pytree path (``jax.tree_util`` keys) goes through a stacked root."""
  for key in path:
    name = getattr(key, "key", getattr(key, "name", None))
    if name in roots:
      return True
  return False


def count_params(params: Params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
