"""Train state, optimizer, learning-rate schedule, and the update step.

One update (``make_step``):

  1. the global batch arrives as (grad_accum, micro_batch, ...) arrays; gradients
     of the k micro-batches are summed in a ``lax.scan`` (float32, like the
     parameters) and divided by k, which equals the gradient of one k-times batch;
  2. ``grad_norm = optax.tree.norm(grads)`` (the global L2 norm; ``optax.global_norm``
     is deprecated) is recorded before clipping, then the
     gradients are clipped to ``clip_norm`` (same rule as
     ``optax.clip_by_global_norm``);
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

from rankjax.config import TrainConfig
from rankjax.train import diagnostics as diag_lib
from rankjax.train.tasks import Task, is_stacked

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
  """
  peak, end = cfg.learning_rate, cfg.learning_rate * cfg.min_lr_ratio
  warmup, total, cosine = cfg.warmup_steps, cfg.total_steps, cfg.lr_schedule == "cosine"

  def schedule(count):
    s = jnp.asarray(count, jnp.float32) + 1.0
    warm = peak * s / max(warmup, 1)
    if cosine:
      progress = jnp.clip((s - warmup) / max(total - warmup, 1), 0.0, 1.0)
      after = end + 0.5 * (peak - end) * (1.0 + jnp.cos(math.pi * progress))
    else:
      after = jnp.asarray(peak, jnp.float32)
    return jnp.where(s <= warmup, warm, after)

  return schedule


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
                     grad_shardings: Any = None) -> tuple[Any, dict[str, Array]]:
  """Mean gradient and mean metrics over the leading micro-batch axis of ``batch``."""
  k = jax.tree.leaves(batch)[0].shape[0]
  grad_fn = jax.grad(task.loss, has_aux=True)
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


def clip_by_norm(grads: Any, norm: Array, max_norm: float) -> Any:
  """``optax.clip_by_global_norm`` given the already computed global norm."""
  trigger = norm < max_norm
  return jax.tree.map(lambda g: jnp.where(trigger, g, (g / norm.astype(g.dtype)) * max_norm),
                      grads)


def make_step(task: Task, cfg: TrainConfig, tx: optax.GradientTransformation,
              diags: Sequence[diag_lib.Diagnostic] = (), grad_shardings: Any = None):
  """``step(state, batch) -> (state, metrics, diagnostics)``; pure, for ``jax.jit``.

  ``batch`` leaves are (grad_accum, micro_batch, ...). With ``diags`` the step also
  runs them (the diagnostics variant); otherwise the diagnostics output is ``{}``.
  """
  schedule = make_schedule(cfg)

  def step(state: TrainState, batch: Any):
    rng = jax.random.fold_in(state.rng, state.step)
    grads, aux = accumulate_grads(task, state.params, batch, rng, grad_shardings)
    grad_norm = optax.tree.norm(grads)
    clipped = clip_by_norm(grads, grad_norm, cfg.clip_norm) if cfg.clip_norm > 0 else grads
    updates, opt_state = tx.update(clipped, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {**aux, "grad_norm": grad_norm, "lr": schedule(state.step)}
    out = {}
    if diags:
      out = run_diagnostics(task, cfg, diags, state, batch, grads, metrics["loss"])
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    return new_state, metrics, out

  return step


def run_diagnostics(task: Task, cfg: TrainConfig, diags: Sequence[diag_lib.Diagnostic],
                    state: TrainState, batch: Any, grads: Any, loss: Array):
  """The diagnostics of one update on the last micro-batch's first examples."""
  n = cfg.diag_examples or None
  examples = jax.tree.map(lambda x: x[-1, :n], batch)
  acts = act_grads = None
  if any(d.needs_capture for d in diags):
    acts, act_grads = task.capture(state.params, examples)
  inputs = diag_lib.DiagInputs(
      kind=task.kind, model=task.model, params=state.params, batch=examples, grads=grads,
      loss=loss, step=state.step + 1, activations=acts, activation_grads=act_grads,
      stacked_roots=task.stacked_roots)
  return diag_lib.compute(diags, inputs)


def make_eval_step(task: Task):
  """``eval_step(params, batch) -> metrics`` on one (B, ...) batch, deterministic."""

  def eval_step(params, batch):
    return task.loss(params, batch, None, deterministic=True)[1]

  return eval_step
