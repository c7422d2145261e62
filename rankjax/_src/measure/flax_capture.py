"""rankjax's diagnostics inside someone else's training loop: capture a plain flax
model's residual stream, its loss gradients and its attention, without editing it.

``capture(model, variables, inputs, sites, loss_fn)`` runs ``model.apply`` under
``flax.linen.intercept_methods``. Each *site* names module calls by a predicate
``select(module, method_name)`` and says whether to take the call's first input or its
output; every matching call (in call order: layer 0, 1, ...) is recorded by the
library's one site mechanism (``rankjax._src.models.sites``: the ``Recorder`` that
``DecoderLM``'s layers call) and, when ``loss_fn`` is given, gets a zero perturbation
added, whose gradient is the loss gradient with respect to that tensor (``dL/dX`` for
an input site; ``sites.loss_gradients``). Values come back
stacked along a leading layer axis: ``(L, B, T, d)`` for a residual stream.

Recipe for a nanodo-style Pre-LN decoder (``experiments/benchmarks/plain_flax.py``:
``Block`` = ``x + attn(LN(x))`` then ``+ mlp(LN(.))``; the model is not changed)::

  from rankjax import measure as fc          # the public face of this module's names
  sites = {
      "x1": fc.site(fc.module_named("Block"), "input"),        # X_1^l, stream into layer l
      "f1": fc.site(fc.nth_call_in_block("DenseGeneral", 1, block="Block"), "output"),  # attn out
      "y2": fc.site(fc.module_named("Block"), "output"),       # Y_2^l, stream out of layer l
      "qkv": fc.site(fc.nth_call_in_block("DenseGeneral", 0, block="Block"), "output"),  # qkv
  }
  loss = lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  out = fc.capture(model, {"params": params}, tokens, sites, loss)
  acts, grads = out.values, out.grads
  x1, y1 = acts["x1"], acts["x1"] + acts["f1"]           # Y_1 = X_1 + attention branch
  stats = fc.residual_statistics({"x1": x1, "y1": y1, "x2": y1, "y2": acts["y2"]},
                                 {"x1": grads["x1"], "y1": grads["f1"], "x2": grads["f1"],
                                  "y2": grads["y2"]})
  probs = fc.causal_probs(acts["qkv"][..., 0, :, :], acts["qkv"][..., 1, :, :])
  att = fc.layer_attention_statistics(probs, jax.random.key(0))   # attention_statistics here

Sites match by module class and call order inside each ``Block`` call, so the
blocks' submodules may have names of their own; a site matching calls in more than one
kind of module, or not once per block, raises naming the paths it found. Blocks run
unrolled (a Python loop): inside ``nn.scan`` a module is traced once, not per layer.

(``dL/dY_1 = dL/df_1`` because ``Y_1 = X_1 + f_1``; Pre-LN has no norm between
``Y_1`` and ``X_2``, so ``X_2 = Y_1``.) Here ``x_k`` is the *stream* entering
sublayer k, the postnorm paper's X_k (Post-Norm has no P norm): for a Pre-LN model
this is the tensor the residual path carries the gradient through. rankjax's own LM
capture names the branch input P(h) ``x_k`` instead (Transforming Rank Eq. 17), which
is the same tensor only without a P norm. ``stats`` then holds, per layer, the token
similarity of each tensor (postnorm Def 2.1), ``alpha_k = ||dL/dX_k|| / ||dL/dY_k||``
(Def 3.5), the RMSNorm factor ``sqrt(d)/||y||`` of ``Y_k`` and the contraction
``alpha_k sqrt(d)/||y||`` (Thm 3.6); ``att`` the attention certificate, normalized
entropy and p_max percentiles (softmax-sensitivity Sec 5), per layer. Everything is
jit-able: call it inside your own jitted step every N updates. Tested in
``tests/measure/test_flax_capture.py`` against independent block-by-block
computations.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from rankjax._src.measure import gradients as gr
from rankjax._src.measure import sensitivity as sens
from rankjax._src.measure.similarity import token_similarity
from rankjax._src.models import sites as sites_lib
from rankjax._src.models.attention import causal_probabilities

Array = jax.Array
Selector = Callable[[nn.Module, str], bool]


@dataclasses.dataclass(frozen=True)
class Site:
  select: Selector | NthCall
  where: str = "output"     # "input" (the call's first argument) or "output"


def site(select: Selector | NthCall, where: str = "output") -> Site:
  """The calls ``select`` matches (``module_named``, ``nth_call_in_block``), captured at
  their first input (``"input"``) or their output (``"output"``), one per layer."""
  if where not in ("input", "output"):
    raise ValueError(f"where={where!r}; choose 'input' or 'output'")
  return Site(select, where)


def module_named(class_name: str, method: str = "__call__") -> Selector:
  """Calls of ``method`` on modules whose class is named ``class_name``."""
  return lambda m, name: type(m).__name__ == class_name and name == method


@dataclasses.dataclass(frozen=True)
class NthCall:
  """Selects, in every call of a block, the ``index``-th call (0-based, in call order)
  of ``method`` on a module of class ``class_name`` made inside that call (at any
  depth). The block is the nearest enclosing module of class ``block``; with
  ``block=None``, the module that makes the call (its parent). Matched by module
  type and call position, never by flax's automatic names, so explicit submodule
  names (``nn.Dense(..., name="qkv")``) change nothing. ``capture`` raises, naming
  the module paths it found, when a ``block=None`` match has parents of more than one
  class (e.g. a block's first LayerNorm and the model's final LayerNorm) or when some
  call of the block made no such call (one value per block call, i.e. per layer)."""

  class_name: str
  index: int
  block: str | None = None
  method: str = "__call__"

  def __str__(self) -> str:
    block = "" if self.block is None else f", block={self.block!r}"
    return f"nth_call_in_block({self.class_name!r}, {self.index}{block})"


def nth_call_in_block(class_name: str, index: int, block: str | None = None,
                      method: str = "__call__") -> NthCall:
  """The ``index``-th call of a ``class_name`` module inside each call of ``block``
  (a class name; None: the calling module), see :class:`NthCall`."""
  if index < 0:
    raise ValueError(f"index={index}; the first call is index 0")
  return NthCall(class_name, index, block, method)


@flax.struct.dataclass
class Captured:
  """A pytree (returnable from ``jax.jit``)."""

  output: Any                       # the model's output
  values: dict[str, Array]          # site -> (calls, ...) stacked
  grads: dict[str, Array] | None    # site -> dL/d(value), same shapes (with loss_fn)
  loss: Array | None


class _Call:
  """A module method call in progress (or done) while the model runs."""

  def __init__(self, module: nn.Module):
    self.module = module
    self.path = "/".join(module.path) or type(module).__name__
    self.counts: dict[str, int] = {}      # NthCall site -> matching calls made inside


def _enclosing(stack: list[_Call], module: nn.Module, block: str | None) -> _Call | None:
  """The call in progress that ``module``'s call counts in (see NthCall)."""
  for call in reversed(stack):
    if (type(call.module).__name__ == block if block is not None
        else call.module.path != module.path):
      return call
  return None


def _listing(paths: list[str], most: int = 4) -> str:
  return ", ".join(paths[:most]) + (f", ... ({len(paths)} in all)" if len(paths) > most else "")


def _check_nth_calls(sites, calls: list[_Call], found: dict[str, list[tuple[_Call, str]]]):
  """Raises naming what was found when an NthCall site's matches are ambiguous or are
  not one per block call."""
  for name, s in sites.items():
    sel = s.select
    if not isinstance(sel, NthCall) or not found[name]:
      continue
    by_parent: dict[str, list[str]] = {}
    for block, path in found[name]:
      by_parent.setdefault(type(block.module).__name__, []).append(path)
    if len(by_parent) > 1:
      kinds = "; ".join(f"inside {k}: {_listing(v)}" for k, v in by_parent.items())
      raise ValueError(f"capture site {name!r}: {sel} is ambiguous, it matches "
                       f"{sel.class_name} calls in {len(by_parent)} kinds of module ({kinds});"
                       f" name the block, e.g. nth_call_in_block({sel.class_name!r}, "
                       f"{sel.index}, block={max(by_parent, key=lambda k: len(by_parent[k]))!r})")
    block = sel.block or next(iter(by_parent))
    blocks = [c for c in calls if type(c.module).__name__ == block]
    short = [c.path for c in blocks if c.counts.get(name, 0) <= sel.index]
    if short:
      raise ValueError(
          f"capture site {name!r}: {sel} captured {len(found[name])} calls "
          f"({_listing([p for _, p in found[name]])}) but {block} ran {len(blocks)} times; "
          f"{_listing(short)} made fewer than {sel.index + 1} {sel.class_name} calls")


def _run(model, variables, args, kwargs, sites, perturbations):
  record = sites_lib.Recorder(perturbations)    # one value per matching call, in order
  stack: list[_Call] = []                       # the calls in progress, outermost first
  calls: list[_Call] = []                       # every call, in call order
  found = {name: [] for name in sites}          # NthCall site -> [(block call, path)]

  def selected(module, method):
    out = []
    for name, s in sites.items():
      sel = s.select
      if not isinstance(sel, NthCall):
        if sel(module, method):
          out.append(name)
        continue
      if type(module).__name__ != sel.class_name or method != sel.method:
        continue
      block = _enclosing(stack, module, sel.block)
      if block is None:
        continue
      seen = block.counts.get(name, 0)
      block.counts[name] = seen + 1
      if seen == sel.index:
        found[name].append((block, "/".join(module.path)))
        out.append(name)
    return out

  def interceptor(next_fun, call_args, call_kwargs, context):
    matched = selected(context.module, context.method_name)
    call = _Call(context.module)
    calls.append(call)
    stack.append(call)
    try:
      if any(sites[n].where == "input" for n in matched):
        x = call_args[0]
        for name in matched:              # one input may feed several sites
          if sites[name].where == "input":
            x = record(name, x)
        call_args = (x, *call_args[1:])
      out = next_fun(*call_args, **call_kwargs)
    finally:
      stack.pop()
    for name in matched:
      if sites[name].where == "output":
        out = record(name, out)
    return out

  with nn.intercept_methods(interceptor):
    out = model.apply(variables, *args, **kwargs)
  missing = [n for n in sites if n not in record.names()]
  if missing:
    classes = list(dict.fromkeys(type(c.module).__name__ for c in calls))
    raise ValueError(f"capture sites {missing} matched no module call (modules called: "
                     f"{', '.join(classes)})")
  _check_nth_calls(sites, calls, found)
  return out, record.stacked()


def capture(model: nn.Module, variables: Mapping[str, Any], inputs: Any,
            sites: Mapping[str, Site], loss_fn: Callable[[Any], Array] | None = None,
            **apply_kwargs) -> Captured:
  """``model.apply(variables, inputs, **apply_kwargs)`` with the ``sites`` recorded
  (and, with ``loss_fn(output) -> scalar``, their loss gradients); see module doc."""
  run = lambda _, perturbations: _run(model, variables, (inputs,), apply_kwargs, sites,
                                      perturbations)
  if loss_fn is None:
    out, values = run(None, None)
    return Captured(out, values, None, None)
  g = sites_lib.loss_gradients(run, loss_fn)
  return Captured(g.output, g.sites, g.site_grads, g.loss)


def residual_statistics(acts: Mapping[str, Array],
                        grads: Mapping[str, Array] | None = None) -> dict[str, Array]:
  """Per-layer statistics of captured (L, B, T, d) tensors named x1, y1, x2, y2 (any
  subset): ``tsim_<k>`` (L,) token similarity, mean over examples (postnorm Def 2.1);
  with grads for x_k and y_k: ``alpha_k`` (L,) ``||dL/dX_k||_F / ||dL/dY_k||_F``
  (Def 3.5); with y_k: ``rms_factor_mean_k`` / ``_std_k`` (L,) of ``sqrt(d)/||y||``
  over tokens and, with alpha_k, ``contraction_k`` (Thm 3.6)."""
  out = {}
  for name, x in acts.items():
    out[f"tsim_{name}"] = jnp.mean(token_similarity(x), axis=-1)
  for k in ("1", "2"):
    y = acts.get(f"y{k}")
    if y is not None:
      out[f"rms_factor_mean_{k}"], out[f"rms_factor_std_{k}"] = gr.rms_factor_stats(y)
    if grads is not None and f"x{k}" in grads and f"y{k}" in grads:
      out[f"alpha_{k}"] = gr.sublayer_grad_contribution(grads[f"x{k}"], grads[f"y{k}"])
      if y is not None:
        out[f"contraction_{k}"] = gr.contraction(out[f"alpha_{k}"], out[f"rms_factor_mean_{k}"])
  return out


def causal_probs(q_LxBxTxHxK: Array, k_LxBxTxHxK: Array, scale: float | None = None) -> Array:
  """Causal softmax attention probabilities (L, B, H, T, T) from captured queries and
  keys: ``softmax(q k^T * scale)`` over keys ``j <= t`` (scale 1/sqrt(head dim) by
  default), the attention of the recipe's model recomputed from its projections by
  the library's one einsum attention (``models.attention.causal_probabilities``, the
  scale as its temperature ``tau = 1/(scale sqrt(head dim))``), in float32."""
  q_shape, k_shape = jnp.shape(q_LxBxTxHxK), jnp.shape(k_LxBxTxHxK)
  if len(q_shape) != 5 or q_shape != k_shape:
    hint = " (one layer? add the layer axis: q[None], k[None])" if len(q_shape) == 4 else ""
    raise ValueError(f"causal_probs takes queries and keys of one shape (layers, batch, "
                     f"tokens, heads, head_dim); got q {q_shape} and k {k_shape}{hint}")
  dh = q_LxBxTxHxK.shape[-1]
  tau = 1.0 if scale is None else 1.0 / (scale * math.sqrt(dh))
  return causal_probabilities(q_LxBxTxHxK.astype(jnp.float32),
                              k_LxBxTxHxK.astype(jnp.float32), tau)


def attention_statistics(probs_LxBxHxTxT: Array, key: Array, num_rows: int = 512,
                         min_query: int = 16, method: str = "greedy_prefix") -> dict[str, Array]:
  """Per layer: percentiles and mean of the attention certificate ``theta_cert``,
  ``p_max`` and the normalized entropy over sampled causal rows
  (``rankjax._src.measure.sensitivity.attention_statistics``, softmax-sensitivity Sec 5),
  as ``{"<stat>_<p5|...|mean>": (L,)}``. ``num_rows`` is capped at the rows
  available."""
  shape = jnp.shape(probs_LxBxHxTxT)
  if len(shape) != 5 or shape[-1] != shape[-2]:
    raise ValueError(f"attention_statistics takes probabilities of shape (layers, batch, "
                     f"heads, tokens, tokens), as causal_probs returns them; got {shape}")
  L, B, H, T, _ = shape
  n = min(num_rows, B * H * max(T - min_query, 0))
  if n < 1:
    raise ValueError(f"no attention rows with t >= {min_query} in a sequence of length {T}")

  def one(args):
    probs, k = args
    s = sens.attention_statistics(probs, k, num_rows=n, min_query=min_query, method=method)
    return {f"{stat}_{p}": v for stat in ("theta_cert", "p_max", "entropy_norm")
            for p, v in s[stat].items()}

  return jax.lax.map(one, (probs_LxBxHxTxT, jax.random.split(key, L)))
