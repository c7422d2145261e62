"""rankjax's diagnostics inside someone else's training loop: capture a plain flax
model's residual stream, its loss gradients and its attention, without editing it.

``capture(model, variables, inputs, sites, loss_fn)`` runs ``model.apply`` under
``flax.linen.intercept_methods``. Each *site* names module calls by a predicate
``select(module, method_name)`` and says whether to take the call's first input or its
output; every matching call (in call order: layer 0, 1, ...) is recorded and, when
``loss_fn`` is given, gets a zero perturbation added, whose gradient is the loss
gradient with respect to that tensor (``dL/dX`` for an input site). Values come back
stacked along a leading layer axis: ``(L, B, T, d)`` for a residual stream.

Recipe for a nanodo-style Pre-LN decoder (``experiments/benchmarks/plain_flax.py``:
``Block`` = ``x + attn(LN(x))`` then ``+ mlp(LN(.))``; the model is not changed)::

  from rankjax.measure import flax_capture as fc
  sites = {
      "x1": fc.site(fc.module_named("Block"), "input"),        # X_1^l, stream into layer l
      "f1": fc.site(fc.nth_call_in_block("DenseGeneral", 1), "output"),  # attention branch
      "y2": fc.site(fc.module_named("Block"), "output"),       # Y_2^l, stream out of layer l
      "qkv": fc.site(fc.nth_call_in_block("DenseGeneral", 0), "output"),  # (B, T, 3, H, dh)
  }
  loss = lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  out = fc.capture(model, {"params": params}, tokens, sites, loss)
  acts, grads = out.values, out.grads
  x1, y1 = acts["x1"], acts["x1"] + acts["f1"]           # Y_1 = X_1 + attention branch
  stats = fc.residual_statistics({"x1": x1, "y1": y1, "x2": y1, "y2": acts["y2"]},
                                 {"x1": grads["x1"], "y1": grads["f1"], "x2": grads["f1"],
                                  "y2": grads["y2"]})
  probs = fc.causal_probs(acts["qkv"][..., 0, :, :], acts["qkv"][..., 1, :, :])
  att = fc.attention_statistics(probs, jax.random.key(0))

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

from rankjax.measure import gradients as gr
from rankjax.measure import sensitivity as sens
from rankjax.measure.similarity import token_similarity
from rankjax.models.attention import causal_probabilities

Array = jax.Array
Selector = Callable[[nn.Module, str], bool]


@dataclasses.dataclass(frozen=True)
class Site:
  select: Selector
  where: str = "output"     # "input" (the call's first argument) or "output"


def site(select: Selector, where: str = "output") -> Site:
  if where not in ("input", "output"):
    raise ValueError(f"where={where!r}; choose 'input' or 'output'")
  return Site(select, where)


def module_named(class_name: str, method: str = "__call__") -> Selector:
  """Calls of ``method`` on modules whose class is named ``class_name``."""
  return lambda m, name: type(m).__name__ == class_name and name == method


def nth_call_in_block(class_name: str, index: int, method: str = "__call__") -> Selector:
  """The ``index``-th submodule of class ``class_name`` inside its parent (flax's
  automatic names ``DenseGeneral_0``, ``DenseGeneral_1``, ...)."""
  target = f"{class_name}_{index}"
  return lambda m, name: (type(m).__name__ == class_name and name == method
                          and m.name == target)


@flax.struct.dataclass
class Captured:
  """A pytree (returnable from ``jax.jit``)."""

  output: Any                       # the model's output
  values: dict[str, Array]          # site -> (calls, ...) stacked
  grads: dict[str, Array] | None    # site -> dL/d(value), same shapes (with loss_fn)
  loss: Array | None


def _run(model, variables, args, kwargs, sites, perturb):
  values = {name: [] for name in sites}

  def interceptor(next_fun, call_args, call_kwargs, context):
    matched = [n for n, s in sites.items() if s.select(context.module, context.method_name)]
    if not matched:
      return next_fun(*call_args, **call_kwargs)
    if any(sites[n].where == "input" for n in matched):
      x = call_args[0]
      for name in matched:              # one input may feed several sites
        if sites[name].where == "input":
          if perturb is not None:
            x = x + perturb[name][len(values[name])]
          values[name].append(x)
      call_args = (x, *call_args[1:])
    out = next_fun(*call_args, **call_kwargs)
    for name in matched:
      if sites[name].where == "output":
        if perturb is not None:
          out = out + perturb[name][len(values[name])]
        values[name].append(out)
    return out

  with nn.intercept_methods(interceptor):
    out = model.apply(variables, *args, **kwargs)
  missing = [n for n, v in values.items() if not v]
  if missing:
    raise ValueError(f"capture sites {missing} matched no module call")
  return out, {n: jnp.stack(v) for n, v in values.items()}


def capture(model: nn.Module, variables: Mapping[str, Any], inputs: Any,
            sites: Mapping[str, Site], loss_fn: Callable[[Any], Array] | None = None,
            **apply_kwargs) -> Captured:
  """``model.apply(variables, inputs, **apply_kwargs)`` with the ``sites`` recorded
  (and, with ``loss_fn(output) -> scalar``, their loss gradients); see module doc."""
  args = (inputs,)
  if loss_fn is None:
    out, values = _run(model, variables, args, apply_kwargs, sites, None)
    return Captured(out, values, None, None)
  shapes = jax.eval_shape(lambda: _run(model, variables, args, apply_kwargs, sites, None)[1])
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def loss_of(perturb):
    out, values = _run(model, variables, args, apply_kwargs, sites, perturb)
    return loss_fn(out), (out, values)

  (loss, (out, values)), grads = jax.value_and_grad(loss_of, has_aux=True)(zeros)
  return Captured(out, values, grads, loss)


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
  dh = q_LxBxTxHxK.shape[-1]
  tau = 1.0 if scale is None else 1.0 / (scale * math.sqrt(dh))
  return causal_probabilities(q_LxBxTxHxK.astype(jnp.float32),
                              k_LxBxTxHxK.astype(jnp.float32), tau)


def attention_statistics(probs_LxBxHxTxT: Array, key: Array, num_rows: int = 512,
                         min_query: int = 16, method: str = "greedy_prefix") -> dict[str, Array]:
  """Per layer: percentiles and mean of the attention certificate ``theta_cert``,
  ``p_max`` and the normalized entropy over sampled causal rows
  (``rankjax.measure.sensitivity.attention_statistics``, softmax-sensitivity Sec 5),
  as ``{"<stat>_<p5|...|mean>": (L,)}``. ``num_rows`` is capped at the rows
  available."""
  L, B, H, T, _ = probs_LxBxHxTxT.shape
  n = min(num_rows, B * H * max(T - min_query, 0))
  if n < 1:
    raise ValueError(f"no attention rows with t >= {min_query} in a sequence of length {T}")

  def one(args):
    probs, k = args
    s = sens.attention_statistics(probs, k, num_rows=n, min_query=min_query, method=method)
    return {f"{stat}_{p}": v for stat in ("theta_cert", "p_max", "entropy_norm")
            for p, v in s[stat].items()}

  return jax.lax.map(one, (probs_LxBxHxTxT, jax.random.split(key, L)))
