"""Diagnostics computed during training, registered by name.

A diagnostic is a pure, jit-able function of one ``DiagInputs`` that returns a flat
dict of arrays (fixed shapes, any rank). The loop compiles a second variant of the
training step that also runs the configured diagnostics (``TrainConfig.diagnostics``)
and uses it at update 1 and every ``diag_every`` updates; every other step is the
plain compiled step and pays nothing. Each returned array is stored, stacked by step,
in every checkpoint's ``diagnostics`` item and read back by ``rankjax.load_run`` as
``"<diagnostic>/<key>"`` series.

The library's diagnostics are the table ``BUILTIN`` (name -> module, function,
needs_capture), imported when a run names one. Adding your own (no library edit)::

  # my_pieces.py
  import jax.numpy as jnp
  from rankjax._src.train import diagnostics

  def x1_rms(d: diagnostics.DiagInputs) -> dict:
    x1 = d.activations["x1"]                        # (L, B, T, d)
    return {"x1_rms": jnp.sqrt(jnp.mean(x1 * x1, axis=(1, 2, 3)))}   # (L,)

  diagnostics.register("x1_rms", x1_rms, needs_capture=True)

then ``rankjax train --import my_pieces --set 'diagnostics=["basic","x1_rms"]' ...``
(``rankjax._src.plugins``; a tested example: ``examples/plugins/my_pieces.py``).
``register`` also works as a decorator, ``@diagnostics.register("x1_rms", needs_capture=True)``.
``needs_capture=True`` makes the step run
``Task.capture`` once (shared by all diagnostics) on the diagnostic examples: for the
LM, ``activations`` / ``activation_grads`` map x1, y1, x2, y2 to (L, B, T, d) arrays
(``models.transformer.intermediate_grads``, deterministic forward); for the MLP
classifier, ``activations`` has ``h0`` (B, d) and ``stream`` (L, B, d) and
``activation_grads`` is None.

Naming: X_k / Y_k (k = 1 attention, 2 FFN) of layer l are Transforming Rank Eq. 17's
branch input X = P(h) (after a Pre-Norm P norm; the stream itself under Post-Norm)
and residual sum Y = h + beta * branch(X) before any R norm (postnorm Eq. 1);
``rankjax.load_run``'s docstring has the same table.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rankjax._src.measure import gradients as gr
from rankjax._src.measure.similarity import token_similarity
from rankjax._src.errors import UserError

Array = jax.Array

# The library's diagnostics: name -> (module, function, needs_capture). Nothing
# registers itself when imported; ``resolve`` imports the module of a name a run uses.
BUILTIN: dict[str, tuple[str, str, bool]] = {
    "basic": ("rankjax._src.train.diagnostics", "basic", True),
    "postnorm": ("rankjax._src.train.diagnostics_postnorm", "postnorm", True),
    "postnorm_sublayer_norms": ("rankjax._src.train.diagnostics_postnorm", "sublayer_norms", True),
    "attention": ("rankjax._src.train.diagnostics_attention", "attention", False),
}


@dataclasses.dataclass(frozen=True)
class DiagInputs:
  """What a diagnostic sees, all inside the jitted diagnostics step.

  Attributes:
    kind: the model's kind ("transformer", "mlp" or a plug-in's).
    model: the linen module (call ``model.apply`` for extra forward passes).
    params: parameters before this update, as the training step's forward pass reads
      them (the compute copy: see ``master_params``).
    batch: the diagnostic examples (the first ``diag_examples`` of the last
      micro-batch), ``{"inputs", "targets"}``.
    grads: parameter gradients of the whole update, averaged over micro-batches,
      before clipping.
    loss: the update's mean training loss.
    step: the update number s (1-based), an int32 scalar.
    activations, activation_grads: ``Task.capture`` output when some configured
      diagnostic has ``needs_capture``, else None.
    stacked_roots: parameter subtrees with a leading layer axis.
    master_params: the float32 parameters (sharded as trained); ``params`` is the
      compute-dtype copy the training step's forward pass uses
      (``numerics.compute_copy``: the one mixed-precision rule), or these themselves
      under float32.
  """

  kind: str
  model: nn.Module
  params: Any
  batch: Mapping[str, Array]
  grads: Any
  loss: Array
  step: Array
  activations: Mapping[str, Array] | None = None
  activation_grads: Mapping[str, Array] | None = None
  stacked_roots: tuple[str, ...] = ()
  master_params: Any = None


DiagFn = Callable[[DiagInputs], Mapping[str, Array]]


@dataclasses.dataclass(frozen=True)
class Diagnostic:
  name: str
  fn: DiagFn
  needs_capture: bool = False


_REGISTRY: dict[str, Diagnostic] = {}


def register(name: str, fn: DiagFn | None = None, *, needs_capture: bool = False):
  """Registers ``fn(DiagInputs) -> {key: array}`` under ``name`` and returns it;
  without ``fn``, a decorator doing the same."""
  if not isinstance(name, str) or not name or "/" in name:
    raise UserError(f"diagnostic name {name!r} must be non-empty and contain no '/'")

  def deco(fn: DiagFn) -> DiagFn:
    if not callable(fn):
      raise UserError(f"diagnostic {name!r}: {fn!r} is not callable")
    _REGISTRY[name] = Diagnostic(name, fn, needs_capture)
    return fn

  return deco if fn is None else deco(fn)


def available() -> list[str]:
  return sorted(set(_REGISTRY) | set(BUILTIN))


def lookup(name: str) -> Diagnostic:
  """The diagnostic registered (or built in) as ``name``; ValueError when unknown."""
  if name not in _REGISTRY and name in BUILTIN:
    module, attr, needs_capture = BUILTIN[name]
    register(name, getattr(importlib.import_module(module), attr), needs_capture=needs_capture)
  if name not in _REGISTRY:
    raise UserError(f"unknown diagnostics [{name!r}]; registered: {available()} (your own: "
                     "rankjax._src.train.diagnostics.register, loaded with --import MODULE)")
  return _REGISTRY[name]


def resolve(names: Sequence[str]) -> tuple[Diagnostic, ...]:
  """The diagnostics for ``names``; ValueError naming unknown ones."""
  unknown = [n for n in names if n not in _REGISTRY and n not in BUILTIN]
  if unknown:
    raise UserError(f"unknown diagnostics {unknown}; registered: {available()} (your own: "
                     "rankjax._src.train.diagnostics.register, loaded with --import MODULE)")
  return tuple(lookup(n) for n in names)


def compute(diags: Sequence[Diagnostic], inputs: DiagInputs) -> dict[str, dict[str, Array]]:
  """{diagnostic name: {key: float32 array}} (nested: Orbax keys cannot hold '/')."""
  out = {}
  for d in diags:
    values = d.fn(inputs)
    for key in values:
      if not key or "/" in key or "." in key:
        raise UserError(f"diagnostic {d.name!r} returned key {key!r}; keys must be "
                         "non-empty and contain no '/' or '.'")
    out[d.name] = {k: jnp.asarray(v) for k, v in values.items()}
  return out


# ---------------------------------------------------------------------------
# helpers and the built-in diagnostic


def basic(d: DiagInputs) -> dict[str, Array]:
  """Per-layer parameter and gradient norms; per-layer token similarity.

  ``grad_norm`` / ``param_norm``: (L,) Frobenius norms of each layer's parameters
  (all stacked leaves of the layer together), the per-block gradient norms of the
  softmax-sensitivity paper (App D) and the postnorm paper (Sec 4.2).
  LM: ``tsim_<k>`` (L,) token similarity ``||mean_token X||^2 * n / ||X||_F^2`` (postnorm
  Def 2.1) of X_k / Y_k, averaged over examples, and ``act_grad_norm_<k>`` (L,)
  ``||dLoss/dX_k||_F`` summed in squares over the diagnostic examples.
  MLP: ``batch_similarity_stream`` (L,) the same statistic across the examples of the
  stream h_l (rows = examples).
  """
  out = {}
  g = gr.layer_sq_norms(d.grads, d.stacked_roots)
  if g is not None:
    out["grad_norm"] = jnp.sqrt(g)
    params = d.params if d.master_params is None else d.master_params
    out["param_norm"] = jnp.sqrt(gr.layer_sq_norms(params, d.stacked_roots))
  for k, x in (d.activations or {}).items():
    if x.ndim == 4:      # (L, B, T, d): tokens of each example
      out[f"tsim_{k}"] = jnp.mean(token_similarity(x), axis=-1)
    elif x.ndim == 3:    # (L, B, d): the examples of a batch
      out[f"batch_similarity_{k}"] = token_similarity(x)
  for k, g in (d.activation_grads or {}).items():
    out[f"act_grad_norm_{k}"] = jnp.sqrt(gr.sq_norm(g, tuple(range(1, g.ndim))))
  return out


class DiagnosticsHistory:
  """Host-side diagnostics of every diagnostics step of the run, stacked by step."""

  def __init__(self):
    self.steps: list[int] = []
    self.series: dict[str, dict[str, list[np.ndarray]]] = {}

  def append(self, step: int, values: Mapping[str, Mapping[str, Any]]) -> None:
    self.steps.append(int(step))
    for name, keys in values.items():
      for key, value in keys.items():
        self.series.setdefault(name, {}).setdefault(key, []).append(np.asarray(value))

  def __len__(self) -> int:
    return len(self.steps)

  def truncate(self, step: int) -> None:
    """Drops entries after ``step``."""
    keep = sum(1 for s in self.steps if s <= step)
    self.steps = self.steps[:keep]
    for keys in self.series.values():
      for key in keys:
        keys[key] = keys[key][:keep]

  def to_tree(self) -> dict[str, Any] | None:
    """``{"steps": (n,), name: {key: (n, ...)}}`` for the checkpoint; None when empty."""
    if not self.steps:
      return None
    tree: dict[str, Any] = {"steps": np.asarray(self.steps, np.int32)}
    for name, keys in self.series.items():
      tree[name] = {k: np.stack(v) for k, v in keys.items()}
    return tree

  @classmethod
  def from_tree(cls, tree: Mapping[str, Any] | None) -> "DiagnosticsHistory":
    h = cls()
    if not tree:
      return h
    h.steps = [int(s) for s in np.asarray(tree["steps"])]
    for name, keys in tree.items():
      if name == "steps":
        continue
      h.series[name] = {k: list(np.asarray(v)) for k, v in keys.items()}
    return h

  def flat(self) -> dict[str, np.ndarray]:
    """``{"<diagnostic>/<key>": (n, ...)}``."""
    return {f"{name}/{k}": np.stack(v) for name, keys in self.series.items()
            for k, v in keys.items() if v}
