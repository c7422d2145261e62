"""Norm Jacobians against their closed forms (Transforming Rank, Eqs. 19-20 and Table 2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax.models import norms

D = 12


def _closed_form(op, x):
  d = x.shape[0]
  eye = np.eye(d)
  ones = np.ones((d, d)) / d
  nx = np.linalg.norm(x)
  xh = x / nx
  if op == "rms":
    return np.sqrt(d) / nx * (eye - np.outer(xh, xh))
  if op == "detached_rms":
    return np.sqrt(d) / nx * eye
  if op == "mean":
    return eye - ones
  if op == "layer":
    xc = x - x.mean()
    xch = xc / np.linalg.norm(xc)
    return np.sqrt(d) / np.linalg.norm(xc) * (eye - np.outer(xch, xch)) @ (eye - ones)
  if op == "none":
    return eye
  raise AssertionError(op)


@pytest.mark.parametrize("op", ["rms", "detached_rms", "mean", "layer", "none"])
def test_norm_jacobian_matches_closed_form(op, x64):
  rng = np.random.default_rng(0)
  for _ in range(5):
    x = rng.normal(size=D) * rng.uniform(0.1, 10.0) + rng.normal()
    jac = jax.jacfwd(lambda v: norms.normalize(v, op))(jnp.asarray(x))
    assert jac.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(jac), _closed_form(op, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["rms", "detached_rms", "layer"])
def test_rescaling_ops_give_unit_rms(op):
  x = jax.random.normal(jax.random.key(0), (4, D)) * 7.0 + 1.0
  y = norms.normalize(x, op)
  np.testing.assert_allclose(np.sqrt(np.mean(np.square(y), -1)), 1.0, rtol=1e-5)


def test_epsilon_enters_the_rms():
  x = jnp.full((D,), 1e-3)
  y = norms.normalize(x, "rms", eps=1e-6)
  np.testing.assert_allclose(y, 1e-3 / np.sqrt(1e-6 + 1e-6), rtol=1e-5)


def test_mean_op_centres_without_rescaling():
  x = jnp.arange(D, dtype=jnp.float32)
  y = norms.normalize(x, "mean")
  np.testing.assert_allclose(y, x - x.mean(), rtol=1e-6)


def test_unknown_op_raises():
  with pytest.raises(ValueError, match="norm op 'batch'"):
    norms.normalize(jnp.ones(3), "batch")


def test_norm_module_gain_is_learned_and_starts_at_one():
  module = norms.Norm("rms", gain=True, eps=0.0)
  x = jax.random.normal(jax.random.key(1), (2, D))
  variables = module.init(jax.random.key(0), x)
  np.testing.assert_array_equal(variables["params"]["scale"], np.ones(D))
  doubled = jax.tree.map(lambda s: 2 * s, variables)
  np.testing.assert_allclose(module.apply(doubled, x), 2 * norms.normalize(x, "rms"), rtol=1e-6)
  assert "params" not in norms.Norm("mean", gain=True).init(jax.random.key(0), x)
