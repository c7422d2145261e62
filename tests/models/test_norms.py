"""Norm Jacobians against their closed forms (Transforming Rank, Eqs. 19-20 and Table 2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.models import norms

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


def _plain(v, op, eps):
  """rms / layer by the formula alone (autodiff differentiates it, no custom rule)."""
  if op == "layer":
    v = v - jnp.mean(v, axis=-1, keepdims=True)
  return v / jnp.sqrt(jnp.mean(v * v, axis=-1, keepdims=True) + eps)


@pytest.mark.parametrize("op", ["rms", "layer"])
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_rescale_rule_equals_autodiff_of_the_formula(op, eps, x64):
  """norms.rescale's custom JVP: forward, reverse and second order, with eps > 0 too."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=D) * 3.0 + 0.5)
  w = jnp.asarray(rng.normal(size=D))
  ours, plain = (lambda v: norms.normalize(v, op, eps)), (lambda v: _plain(v, op, eps))
  np.testing.assert_array_equal(ours(x), plain(x))            # the value is untouched
  hess = lambda f, v: jax.hessian(lambda u: jnp.sin(f(u) @ w))(v)  # a non-linear scalar of N(x)

  def derivatives(v):          # one compile for all six
    return [(t(ours)(v), t(plain)(v)) for t in (jax.jacfwd, jax.jacrev)] + [
        (hess(ours, v), hess(plain, v))]

  (fwd, fwd_plain), (rev, rev_plain), (h, h_plain) = jax.jit(derivatives)(x)
  np.testing.assert_allclose(fwd, fwd_plain, rtol=1e-12, atol=1e-13)
  np.testing.assert_allclose(rev, rev_plain, rtol=1e-12, atol=1e-13)
  np.testing.assert_allclose(h, h_plain, rtol=1e-10, atol=1e-12)


# layer's rule stays fast in test_rescale_rule_equals_autodiff_of_the_formula
@pytest.mark.slow   # a float64 LM's gradient twice (~5 s); the rule alone is fast above
@pytest.mark.parametrize("position,op", [("post", "rms"), ("pre", "layer")])
def test_lm_gradient_with_the_rule_equals_plain_autodiff(position, op, x64, monkeypatch):
  """The whole DecoderLM's float64 loss gradient is the same with norms.rescale's rule
  as with autodiff of the formula: the rule changes float32 rounding only."""
  from rankjax._src.config import TransformerConfig
  from rankjax._src.models.transformer import DecoderLM
  cfg = TransformerConfig(vocab_size=23, num_layers=3, d_model=16, num_heads=2, d_ff=24,
                          max_seq_len=8, norm_position=position, norm_op=op,
                          norm_eps=1e-5, compute_dtype="float64", param_dtype="float64")
  model = DecoderLM(cfg)
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, cfg.vocab_size)
  params = jax.jit(model.init)(jax.random.key(1), tokens)["params"]

  def grad():
    def loss(p):
      logp = jax.nn.log_softmax(model.apply({"params": p}, tokens))
      return -jnp.mean(jnp.take_along_axis(logp, jnp.roll(tokens, -1, 1)[..., None], -1))
    return jax.jit(jax.grad(loss))(params)   # traced anew: sees the patched normalize

  ours = grad()
  plain_normalize = lambda v, o, eps=0.0: _plain(v, o, eps) if o in ("rms", "layer") \
      else ORIGINAL_NORMALIZE(v, o, eps)
  monkeypatch.setattr(norms, "normalize", plain_normalize)
  plain = grad()
  leaves = jax.tree.leaves(ours)
  assert leaves and all(a.dtype == jnp.float64 for a in leaves)
  for a, b in zip(leaves, jax.tree.leaves(plain)):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


ORIGINAL_NORMALIZE = norms.normalize


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
  variables = jax.jit(module.init)(jax.random.key(0), x)
  np.testing.assert_array_equal(variables["params"]["scale"], np.ones(D))
  doubled = jax.tree.map(lambda s: 2 * s, variables)
  np.testing.assert_allclose(module.apply(doubled, x), 2 * norms.normalize(x, "rms"), rtol=1e-6)
  assert "params" not in norms.Norm("mean", gain=True).init(jax.random.key(0), x)


@pytest.mark.parametrize("op", ["rms", "detached_rms", "mean", "layer", "none"])
def test_jacobian_products_match_jacfwd(op, x64):
  """``jacobian_left(M) = J M`` and ``jacobian_right(M) = M J`` with a gain and eps, J
  of ``normalize(x, op, eps) * g`` by autodiff in float64."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=D) * 3.0 + 0.5)
  g = jnp.asarray(rng.uniform(0.5, 2.0, size=D))
  eps = 1e-3
  jac = jax.jacfwd(lambda v: norms.normalize(v, op, eps) * g)(x)
  m_left = jnp.asarray(rng.normal(size=(D, 5)))
  m_right = jnp.asarray(rng.normal(size=(5, D)))
  np.testing.assert_allclose(norms.jacobian_left(m_left, x, op, eps, g), jac @ m_left,
                             rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(norms.jacobian_right(m_right, x, op, eps, g), m_right @ jac,
                             rtol=1e-12, atol=1e-12)
  with pytest.raises(ValueError, match="unknown norm op"):
    norms.jacobian_left(m_left, x, "batch", eps)
