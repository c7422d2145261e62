"""The closed-form derivatives of models/activations.py (exact GELU, SiLU) against
independent computations: math.erf / math.exp in float64, autodiff of jax.nn's
formulas, and the second derivatives' closed forms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from rankjax._src.models import activations, blocks

Z = np.concatenate([np.linspace(-9.0, 9.0, 721), [0.0, -1e-3, 1e-3, 30.0, -30.0]])


def _phi(z):
  return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _cdf(z):
  return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _sigmoid(z):
  return 1.0 / (1.0 + math.exp(-z))


# name: (ours, jax.nn's formula, first derivative, second derivative), float64 closed forms
CASES = {
    "gelu": (activations.gelu, lambda z: jax.nn.gelu(z, approximate=False),
             lambda z: _cdf(z) + z * _phi(z),                       # Phi + z phi
             lambda z: _phi(z) * (2.0 - z * z)),                    # phi (2 - z^2)
    "silu": (activations.silu, jax.nn.silu,
             lambda z: _sigmoid(z) * (1.0 + z * (1.0 - _sigmoid(z))),  # s (1 + z (1 - s))
             lambda z: _sigmoid(z) * (1.0 - _sigmoid(z)) * (2.0 + z * (1.0 - 2.0 * _sigmoid(z)))),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_value_is_jax_nn_bit_for_bit(name, dtype):
  ours, theirs, _, _ = CASES[name]
  z = jnp.asarray(Z, dtype)
  np.testing.assert_array_equal(ours(z), theirs(z))
  assert ours(z).dtype == dtype


@pytest.mark.parametrize("name", sorted(CASES))
def test_first_and_second_derivative_match_closed_forms(name, x64):
  ours, _, d1, d2 = CASES[name]
  z = jnp.asarray(Z)
  first = np.array([d1(v) for v in Z])
  second = np.array([d2(v) for v in Z])
  for grad in (jax.vmap(jax.grad(ours)),
               lambda u: jax.jvp(ours, (u,), (jnp.ones_like(u),))[1],
               lambda u: blocks.derivative(ours, u)):
    np.testing.assert_allclose(np.asarray(grad(z)), first, rtol=1e-14, atol=1e-15)
  np.testing.assert_allclose(np.asarray(jax.vmap(jax.grad(jax.grad(ours)))(z)),
                             second, rtol=1e-12, atol=1e-15)
  jac = jax.jacfwd(ours)(z[:7])
  # forward and reverse apply the one rule in two programs: equal up to rounding
  np.testing.assert_allclose(jac, jax.jacrev(ours)(z[:7]), rtol=1e-15, atol=0)
  np.testing.assert_array_equal(jac, np.diag(np.diag(jac)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_derivative_as_accurate_as_autodiff_of_jax_nn(name):
  """The rule's float32 rounding is no worse than autodiff of jax.nn's formula."""
  ours, theirs, d1, _ = CASES[name]
  z = jnp.asarray(Z, jnp.float32)
  exact = np.array([d1(float(v)) for v in np.asarray(z)])
  err = lambda fn: np.abs(np.asarray(jax.vmap(jax.grad(fn))(z), np.float64) - exact).max()
  assert err(ours) <= max(2.5e-7, 1.5 * err(theirs))


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_pass_keeps_one_array_the_size_of_the_input(name):
  """The reason for the rules: autodiff of the formulas keeps three arrays
  of the input's size for the backward pass; the rules keep one."""
  ours, theirs, _, _ = CASES[name]
  z = jnp.ones((4, 16), jnp.float32)
  kept = lambda fn: [aval.shape for aval, _ in saved_residuals(lambda u: fn(u).sum(), z)]
  assert kept(ours) == [(4, 16)]
  assert kept(theirs).count((4, 16)) == 3
