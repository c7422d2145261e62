"""Train state, optimizer, learning-rate schedule, and the update step.

One update (``make_step``):

  1. the global batch arrives as (grad_accum, micro_batch, ...) arrays; gradients
     of the k micro-batches are summed in a ``lax.scan`` (float32, like the
     parameters) and divided by k, which equals the gradient of one k-times batch;
  2. ``grad_norm = optax.tree.norm(grads)`` (the global L2 norm; ``optax.global_norm``
     is deprecated) is recorded before clipping, then ``optax.clip_by_global_norm``
     clips the gradients to ``clip_norm`` (its norm is the same computation, which
     XLA computes once);
  3. AdamW (or Adam) with linear warmup then cosine decay updates the parameters.

Dropout keys are ``fold_in(fold_in(state.rng, state.step), micro_batch_index)``, so
they depend only on the seed and the step: a resumed run draws the same ones.
Step numbering: update s (1-based) sees parameters after s-1 updates, reports the
loss of those parameters, and leaves ``state.step == s``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rankjax._src import numerics, partitioning
from rankjax._src.measure.losses import frequency_loss
from rankjax._src.config import TrainConfig
from rankjax._src.train import diagnostics as diag_lib
from rankjax._src.train.sharding import ACTIVATION_RULES, gather_lookup_tables
from rankjax._src.train.tasks import Task, is_stacked

Array = jax.Array
Schedule = Callable[[Array], Array]


@flax.struct.dataclass
class TrainState:
  """params, optimizer state, updates done so far (int32), base PRNG key (uint32[2])."""

  params: Any
  opt_state: Any
  step: Array
  rng: Array


def make_schedule(cfg: TrainConfig) -> Schedule:
  """Learning rate of the update after ``count`` updates (count = 0, 1, ...).

  Update s = count + 1 uses ``peak * s / warmup_steps`` during warmup (s <= warmup),
  then cosine decay from the peak to ``min_lr_ratio * peak`` at ``total_steps``
  (or the constant peak for ``lr_schedule="constant"``).

  Hand-written because optax's schedules are not the same bits:
  ``optax.warmup_cosine_decay_schedule(0, peak, warmup, total, end)(s)`` is the same
  function of s but rounds differently in float32. Its warmup is
  ``polynomial_schedule``'s ``(0 - peak) * (1 - s / warmup) + peak`` (ours
  ``peak * s / warmup``: update 1 of a 2000-step warmup at peak 6e-4 is 3.0001402e-07
  there, 3.0000004e-07 here), its decay ``peak * ((1 - a) * 0.5 * (1 + cos(pi t / T))
  + a)`` with ``a = end / peak`` (ours ``end + 0.5 * (peak - end) * (1 + cos(pi t /
  T))``), and ``join_schedules`` switches at ``s < warmup``, so update ``warmup``
  takes the decay's first value. The two differ by at most 2.5 float32 ulps of the
  peak (1.5e-10 at 6e-4; ``tests/train/test_state.py``) on 19-93% of the updates;
  switching would change the learning rate, hence the trajectory, of every run
  already on disk.
  """
  peak, end = cfg.learning_rate, cfg.learning_rate * cfg.min_lr_ratio
  warmup, total, cosine = cfg.warmup_steps, cfg.total_steps, cfg.lr_schedule == "cosine"

  def schedule(count):
    s = jnp.asarray(count, jnp.float32) + 1.0
    warm = peak * s / _at_least_one(warmup)
    if cosine:
      progress = jnp.clip((s - warmup) / _at_least_one(total - warmup), 0.0, 1.0)
      after = end + 0.5 * (peak - end) * (1.0 + jnp.cos(math.pi * progress))
    else:
      after = jnp.asarray(peak, jnp.float32)
    return jnp.where(s <= warmup, warm, after)

  return schedule


def _at_least_one(n):
  """``max(n, 1)`` of a Python int, or of a per-run array (``rankjax._src.train.runs``: the
  hyperparameters of several runs of one program are arrays)."""
  return max(n, 1) if isinstance(n, int) else jnp.maximum(n, 1)


def decay_mask(params: Any, stacked_roots: Sequence[str]) -> Any:
  """True for matrices: two or more dims not counting a stacked layer axis."""

  def leaf(path, x):
    return x.ndim - int(is_stacked(path, tuple(stacked_roots))) >= 2

  return jax.tree_util.tree_map_with_path(leaf, params)


def make_optimizer(cfg: TrainConfig, stacked_roots: Sequence[str]) -> optax.GradientTransformation:
  """AdamW with weight decay on matrices, or plain Adam (clipping is in the step)."""
  schedule = make_schedule(cfg)
  if cfg.optimizer == "adam":
    return optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  return optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                     weight_decay=cfg.weight_decay,
                     mask=lambda p: decay_mask(p, stacked_roots))


def make_init(task: Task, tx: optax.GradientTransformation, seed: int) -> Callable[[], TrainState]:
  """A function building the initial state; jit it with out_shardings (sharded init)."""

  def init() -> TrainState:
    key = jax.random.PRNGKey(seed)
    params = task.init(jax.random.fold_in(key, 0))
    return TrainState(params=params, opt_state=tx.init(params),
                      step=jnp.zeros((), jnp.int32), rng=jax.random.fold_in(key, 1))

  return init


def accumulate_grads(task: Task, params: Any, batch: Any, rng: Array,
                     grad_shardings: Any = None, mesh: Mesh | None = None,
                     ) -> tuple[Any, dict[str, Array]]:
  """Mean gradient and mean metrics over the leading micro-batch axis of ``batch``.

  With a mesh whose ``data`` axis has G > 1 devices and k > 1 micro-batches, each
  micro-batch is split into G equal groups (one per data shard) and the gradients
  are accumulated per group (``jax.vmap`` with ``spmd_axis_name="data"``, a (G, ...)
  accumulator sharded over ``data``): nothing is reduced over ``data`` inside the
  scan, and the one reduction is the sum over groups after it. Equal groups make
  the mean over groups the micro-batch mean. Dropout keys are then
  ``fold_in(fold_in(rng, i), g)`` per group g, so with dropout the masks (not their
  distribution) depend on ``mesh_data``.
  """
  k = jax.tree.leaves(batch)[0].shape[0]

  def loss(p, micro, key):
    # cast first, on the shards (pinned there: else GSPMD gathers the float32 table and
    # casts the replica), then gather the lookup tables in the compute dtype
    copy = numerics.compute_copy(p, task.compute_dtype, task.param_axes())
    if grad_shardings is not None:
      copy = jax.lax.with_sharding_constraint(copy, grad_shardings)
    return task.loss(gather_lookup_tables(copy, mesh), micro, key)

  grad_fn = jax.grad(loss, has_aux=True)
  groups = mesh.shape["data"] if mesh is not None and k > 1 else 1
  if groups > 1:
    return _accumulate_grouped(grad_fn, params, batch, rng, grad_shardings, mesh, k, groups)
  with partitioning.activation_sharding(mesh, ACTIVATION_RULES):
    if k == 1:
      return grad_fn(params, jax.tree.map(lambda x: x[0], batch), jax.random.fold_in(rng, 0))

    def body(acc, xs):
      micro, i = xs
      g, aux = grad_fn(params, micro, jax.random.fold_in(rng, i))
      acc = jax.tree.map(jnp.add, acc, g)
      if grad_shardings is not None:
        acc = jax.lax.with_sharding_constraint(acc, grad_shardings)
      return acc, aux

    zeros = jax.tree.map(jnp.zeros_like, params)
    total, aux = jax.lax.scan(body, zeros, (batch, jnp.arange(k)))
  return jax.tree.map(lambda g: g / k, total), jax.tree.map(jnp.mean, aux)


def _accumulate_grouped(grad_fn, params, batch, rng, grad_shardings, mesh, k, groups):
  """``accumulate_grads`` with one accumulator per data shard (see there)."""
  grouped = jax.tree.map(
      lambda x: x.reshape(k, groups, x.shape[1] // groups, *x.shape[2:]), batch)
  grouped = jax.lax.with_sharding_constraint(
      grouped, NamedSharding(mesh, P(None, "data", "fsdp")))
  group_grad = jax.vmap(grad_fn, in_axes=(None, 0, 0), spmd_axis_name="data")
  inner_rules = {**ACTIVATION_RULES, "batch": ("fsdp",)}   # "data" is the vmapped axis
  if grad_shardings is None:
    grad_shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  acc_shardings = jax.tree.map(lambda s: NamedSharding(mesh, P("data", *s.spec)),
                               grad_shardings)

  def body(acc, xs):
    micro, i = xs
    keys = jax.vmap(lambda g: jax.random.fold_in(jax.random.fold_in(rng, i), g))(
        jnp.arange(groups))
    with partitioning.activation_sharding(mesh, inner_rules):
      g, aux = group_grad(params, micro, keys)
    acc = jax.lax.with_sharding_constraint(jax.tree.map(jnp.add, acc, g), acc_shardings)
    return acc, aux

  zeros = jax.lax.with_sharding_constraint(
      jax.tree.map(lambda p: jnp.zeros((groups, *p.shape), p.dtype), params), acc_shardings)
  total, aux = jax.lax.scan(body, zeros, (grouped, jnp.arange(k)))
  grads = jax.tree.map(lambda g: g.sum(0) / (k * groups), total)
  grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
  return grads, jax.tree.map(jnp.mean, aux)


def make_clip(clip_norm: float) -> Callable[[Any], Any]:
  """Gradients clipped to global norm ``clip_norm`` (``optax.clip_by_global_norm``,
  stateless); 0: unchanged."""
  if not clip_norm:
    return lambda grads: grads
  clip = optax.clip_by_global_norm(clip_norm)
  return lambda grads: clip.update(grads, optax.EmptyState())[0]


def make_step(task: Task, cfg: TrainConfig, tx: optax.GradientTransformation,
              diags: Sequence[diag_lib.Diagnostic] = (), grad_shardings: Any = None,
              mesh: Mesh | None = None):
  """``step(state, batch) -> (state, metrics, diagnostics)``; pure, for ``jax.jit``.

  ``batch`` leaves are (grad_accum, micro_batch, ...). With ``diags`` the step also
  runs them (the diagnostics variant); otherwise the diagnostics output is ``{}``.
  With ``mesh`` the activations are constrained by ``ACTIVATION_RULES``
  (``rankjax._src.partitioning``) and gradients accumulated per data shard.
  """
  schedule = make_schedule(cfg)
  clip = make_clip(cfg.clip_norm)

  def step(state: TrainState, batch: Any):
    rng = jax.random.fold_in(state.rng, state.step)
    grads, aux = accumulate_grads(task, state.params, batch, rng, grad_shardings, mesh)
    grad_norm = optax.tree.norm(grads)
    clipped = clip(grads)
    updates, opt_state = tx.update(clipped, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {**aux, "grad_norm": grad_norm, "lr": schedule(state.step),
               **(label_frequencies(batch["targets"], cfg.model.vocab_size)
                  if cfg.label_frequency else {})}
    out = {}
    if diags:
      out = run_diagnostics(task, cfg, diags, state, batch, grads, metrics["loss"], mesh,
                            grad_shardings)
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    return new_state, metrics, out

  return step


def label_frequencies(targets: Array, vocab_size: int) -> dict[str, Array]:
  """Frequency loss (postnorm Def 3.7) of one update's labels ``(grad_accum, micro, T)``:
  pooled over every sequence (a ``(V,)`` histogram) and the mean of each sequence's own
  (sorted per sequence: no ``(B, V)`` histogram), Sec 4.3's two references."""
  seqs = targets.reshape(-1, targets.shape[-1])
  return {"label_freq_aggregate": frequency_loss(seqs, "aggregate", vocab_size=vocab_size),
          "label_freq_per_sequence": frequency_loss(seqs, "per_sequence")}


def run_diagnostics(task: Task, cfg: TrainConfig, diags: Sequence[diag_lib.Diagnostic],
                    state: TrainState, batch: Any, grads: Any, loss: Array,
                    mesh: Mesh | None = None, param_shardings: Any = None):
  """The diagnostics of one update on the last micro-batch's first examples.

  Under ``mesh`` they run in the activation-sharding context: the examples are split
  over the batch axes when their count divides them, and replicated otherwise (a few
  examples: each device computes them all); the capture and the diagnostics read a replicated
  copy of the parameters in the compute dtype by the training step's own rule
  (``numerics.compute_copy``: the forward passes are bit for bit the training step's;
  cast on the shards ``param_shardings`` before one all-gather; the diagnostics step
  holds it besides the shards), so no activation is split along d_model and nothing
  activation-sized is all-reduced."""
  n = cfg.diag_examples or None
  with partitioning.activation_sharding(mesh, ACTIVATION_RULES, replicate_indivisible=True):
    examples = jax.tree.map(
        lambda x: partitioning.constrain(x[-1, :n], ("batch",) + (None,) * (x.ndim - 2)),
        batch)
    copy = numerics.compute_copy(state.params, cfg.compute_dtype, task.param_axes())
    cast = any(c is not p for c, p in zip(jax.tree.leaves(copy), jax.tree.leaves(state.params)))
    if param_shardings is not None and cast:                      # cast on the shards
      copy = jax.lax.with_sharding_constraint(copy, param_shardings)
    params = _replicated(copy, mesh)
    acts = act_grads = None
    if any(d.needs_capture for d in diags):
      acts, act_grads = task.capture(params, examples)
    inputs = diag_lib.DiagInputs(
        kind=task.kind, model=task.model, params=params, batch=examples, grads=grads,
        loss=loss, step=state.step + 1, activations=acts, activation_grads=act_grads,
        stacked_roots=task.stacked_roots, master_params=state.params)
    return diag_lib.compute(diags, inputs)


def _replicated(params: Any, mesh: Mesh | None) -> Any:
  if mesh is None or mesh.size == 1:
    return params
  return jax.lax.with_sharding_constraint(params, NamedSharding(mesh, P()))


def make_eval_step(task: Task, mesh: Mesh | None = None):
  """``eval_step(params, batch) -> metrics`` on one (B, ...) batch, deterministic."""

  def eval_step(params, batch):
    with partitioning.activation_sharding(mesh, ACTIVATION_RULES):
      return task.loss(params, batch, None, deterministic=True)[1]

  return eval_step
