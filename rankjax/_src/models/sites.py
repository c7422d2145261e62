"""Sites: named tensors of a forward pass, read out and differentiated by one mechanism.

A *site* is a tensor the measurements read, such as the postnorm paper's X_k and Y_k
(its Eq. 1: the sublayer input and the residual sum before the R norm). A forward pass
names a site by calling a ``Recorder`` at it: ``value = record(name, value)``. The
recorder keeps the value and, when it holds perturbations, returns ``value + e``
instead. With ``e = 0`` nothing changes, and the derivative of anything with respect to
``e`` is its derivative with respect to the site, ``dL/dX_k`` included (the skip path
too: the perturbation is added where the residual path reads the tensor).

The same recorder is called by ``DecoderLM``'s layer (``models.transformer``: the
training diagnostics, ``rankjax analyze`` layer at a time) and by ``flax_capture`` at
the module calls of a user's plain flax model; the gradients come from one function,
``loss_gradients`` (or a VJP of the same zero perturbations, ``zero_perturbations``).
A name recorded several times in one pass (one call per layer) is stacked in call
order along a new leading axis, and its perturbation is indexed the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax
import jax
import jax.numpy as jnp

Array = jax.Array

# X_1, Y_1, X_2, Y_2 of one decoder layer (postnorm Eq. 1)
SUBLAYER_SITES = ("x1", "y1", "x2", "y2")


class Recorder:
  """``record(name, value)``: keeps ``value`` (plus ``perturbations[name][i]`` at the
  i-th call of ``name``, when perturbations are given) and returns what the forward
  pass continues with. ``stacked()``: every name's values, stacked over its calls."""

  def __init__(self, perturbations: Mapping[str, Array] | None = None):
    self.perturbations = perturbations
    self._values: dict[str, list[Array]] = {}

  def __call__(self, name: str, value: Array) -> Array:
    calls = self._values.setdefault(name, [])
    if self.perturbations is not None:
      value = value + self.perturbations[name][len(calls)]
    calls.append(value)
    return value

  def names(self) -> list[str]:
    return list(self._values)

  def stacked(self) -> dict[str, Array]:
    return {name: jnp.stack(values) for name, values in self._values.items()}


def zero_perturbations(sites_of: Callable[[], Any]) -> Any:
  """Zeros shaped like the sites ``sites_of()`` records (traced abstractly, no FLOPs)."""
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(sites_of))


@flax.struct.dataclass
class SiteGradients:
  """A pytree (returnable from ``jax.jit``)."""

  loss: Array
  output: Any                  # the forward pass's output
  sites: dict[str, Array]      # name -> value, stacked over calls
  site_grads: dict[str, Array]  # name -> dL/d(value), same shapes
  param_grads: Any             # dL/d(params) (None when params is None)


def loss_gradients(run: Callable[[Any, Any], tuple[Any, dict[str, Array]]],
                   loss_fn: Callable[[Any], Array], params: Any = None) -> SiteGradients:
  """The loss, its gradients with respect to the sites and to ``params``, in one
  backward pass. ``run(params, perturbations) -> (output, sites)`` runs the forward
  pass with a ``Recorder(perturbations)`` (perturbations None: record only);
  ``loss_fn(output) -> scalar``."""
  zeros = zero_perturbations(lambda: run(params, None)[1])

  def loss(p, perturbations):
    output, sites = run(p, perturbations)
    return loss_fn(output), (output, sites)

  (value, (output, sites)), (g_params, g_sites) = jax.value_and_grad(
      loss, argnums=(0, 1), has_aux=True)(params, zeros)
  return SiteGradients(value, output, sites, g_sites, g_params)
