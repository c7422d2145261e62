"""The exact GELU's closed-form derivative (models/activations.py) against independent
computations: math.erf in float64, autodiff of jax.nn.gelu, and the second derivative's
closed form phi(z) (2 - z^2)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from rankjax.models import activations, blocks

Z = np.concatenate([np.linspace(-9.0, 9.0, 721), [0.0, -1e-3, 1e-3, 30.0, -30.0]])


def _phi(z):
  return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _cdf(z):
  return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_value_is_jax_gelu_bit_for_bit(dtype):
  z = jnp.asarray(Z, dtype)
  np.testing.assert_array_equal(activations.gelu(z), jax.nn.gelu(z, approximate=False))
  assert activations.gelu(z).dtype == dtype


def test_first_and_second_derivative_match_closed_forms(x64):
  z = jnp.asarray(Z)
  first = np.array([_cdf(v) + v * _phi(v) for v in Z])
  second = np.array([_phi(v) * (2.0 - v * v) for v in Z])
  for grad in (jax.vmap(jax.grad(activations.gelu)),
               lambda u: jax.jvp(activations.gelu, (u,), (jnp.ones_like(u),))[1],
               lambda u: blocks.derivative(activations.gelu, u)):
    np.testing.assert_allclose(np.asarray(grad(z)), first, rtol=1e-14, atol=1e-15)
  np.testing.assert_allclose(np.asarray(jax.vmap(jax.grad(jax.grad(activations.gelu)))(z)),
                             second, rtol=1e-12, atol=1e-15)
  jac = jax.jacfwd(activations.gelu)(z[:7])
  np.testing.assert_array_equal(jac, jax.jacrev(activations.gelu)(z[:7]))
  np.testing.assert_array_equal(jac, np.diag(np.diag(jac)))


def test_float32_derivative_as_accurate_as_autodiff_of_jax_gelu():
  """The rule's float32 rounding is no worse than autodiff of jax.nn.gelu's formula."""
  z = jnp.asarray(Z, jnp.float32)
  exact = np.array([_cdf(float(v)) + float(v) * _phi(float(v)) for v in np.asarray(z)])
  ours = np.asarray(jax.vmap(jax.grad(activations.gelu))(z), np.float64)
  theirs = np.asarray(jax.vmap(jax.grad(lambda u: jax.nn.gelu(u, approximate=False)))(z),
                      np.float64)
  assert np.abs(ours - exact).max() <= max(2e-7, 1.5 * np.abs(theirs - exact).max())


def test_backward_pass_keeps_one_array_the_size_of_the_input():
  """The reason for the rule (issue #14): autodiff of the erf formula keeps three
  (B, T, F) arrays for the backward pass; the closed form keeps gelu'(z) alone."""
  z = jnp.ones((4, 16), jnp.float32)
  ours = [aval.shape for aval, _ in saved_residuals(lambda u: activations.gelu(u).sum(), z)]
  theirs = [aval.shape for aval, _ in
            saved_residuals(lambda u: jax.nn.gelu(u, approximate=False).sum(), z)]
  assert ours == [(4, 16)]
  assert theirs.count((4, 16)) == 3
