"""Any residual network: a user's own flax model against a direct jax.jacobian (float64)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.measure import matrix_free, residual_networks as rn, spectra

L, D = 5, 12


class GatedBlock(nn.Module):
  """A user's block: Pre-LayerNorm gated MLP branch, h + branch(h)."""
  width: int
  hidden: int = 20

  def setup(self):
    self.norm = nn.LayerNorm(dtype=jnp.float64, param_dtype=jnp.float64)
    self.gate = nn.Dense(self.hidden, param_dtype=jnp.float64)
    self.up = nn.Dense(self.hidden, param_dtype=jnp.float64)
    self.down = nn.Dense(self.width, param_dtype=jnp.float64,
                         kernel_init=nn.initializers.normal(0.3))

  def branch(self, h):
    x = self.norm(h)
    return self.down(nn.gelu(self.gate(x)) * self.up(x))

  def __call__(self, h):
    return h + self.branch(h)


class UserModel(nn.Module):
  """Blocks as separate submodules (not stacked), as users usually write them."""
  @nn.compact
  def __call__(self, h):
    for i in range(L):
      h = GatedBlock(D, name=f"block_{i}")(h)
    return h


def _model_and_stacked(key):
  model = UserModel()
  h0 = jax.random.normal(key, (D,), jnp.float64)
  params = jax.jit(model.init)(jax.random.PRNGKey(1), h0)["params"]
  stacked = jax.tree.map(lambda *p: jnp.stack(p), *[params[f"block_{i}"] for i in range(L)])
  branch = lambda p, h: GatedBlock(D).apply({"params": p}, h, method=GatedBlock.branch)
  return model, params, stacked, branch, h0


@pytest.mark.slow   # the docstring recipe end to end (~7 s); the engine is fast below
def test_flax_recipe_matches_direct_jacobian(x64):
  model, params, stacked, branch, h0 = _model_and_stacked(jax.random.PRNGKey(0))

  @jax.jit   # one program: the references, the study and the estimate
  def compute(params, stacked, h0):
    ref = jax.jacobian(lambda h: model.apply({"params": params}, h))(h0)
    out = rn.network_study(stacked, h0, branch)
    # per-block: the prefix of the first l blocks
    sub = jax.jacobian(lambda h: _prefix(params, h, 2))(h0)
    # the matrix-free estimate from the same user functions (no stacking needed)
    est = matrix_free.function_rank_estimates(
        lambda x: model.apply({"params": params}, x), h0, jax.random.PRNGKey(2), num_probes=4,
        num_steps=D)
    return ref, out, sub, est

  ref, out, sub, est = compute(params, stacked, h0)
  np.testing.assert_allclose(out["input_output"][-1], ref, rtol=1e-12, atol=1e-13)
  assert float(out["reconstruction_error"]) < 1e-13
  np.testing.assert_allclose(out["erank"][-1] * D, spectra.effective_rank(ref), rtol=1e-12)
  np.testing.assert_allclose(np.exp(out["order_log_mass"]).sum() > 0, True)
  np.testing.assert_allclose(out["input_output"][1], sub, rtol=1e-12, atol=1e-13)
  np.testing.assert_allclose(est.spectral_sq, np.linalg.norm(ref, 2) ** 2, rtol=1e-10)


def _prefix(params, h, l):
  for i in range(l):
    h = GatedBlock(D).apply({"params": params[f"block_{i}"]}, h)
  return h


def test_general_split_post_norm_block_with_closed_form(x64):
  """Post-norm h = N(h + W h): K = J_N, B = J_N W (Eq. 18), from user closed forms and by
  jacfwd."""
  w = jax.random.normal(jax.random.PRNGKey(3), (L, D, D), jnp.float64) * 0.4
  norm = lambda x: (x - x.mean()) / jnp.sqrt(jnp.var(x) + 1e-5)
  out = jax.jit(lambda w, h: rn.network_study(
      w, h, branch=lambda p, h: p @ h, post=lambda p, y: norm(y),
      branch_jacobian=lambda p, h: p,
      post_jacobian=lambda p, y: jax.jacfwd(norm)(y)))(w, jnp.linspace(-1.0, 1.0, D))
  by_jacfwd = jax.jit(lambda w, h: rn.network_study(
      w, h, branch=lambda p, h: p @ h, post=lambda p, y: norm(y)))(w, jnp.linspace(-1.0, 1.0, D))

  def net(h):
    for l in range(L):
      h = norm(h + w[l] @ h)
    return h

  ref = jax.jit(jax.jacobian(net))(jnp.linspace(-1.0, 1.0, D))
  np.testing.assert_allclose(out["input_output"][-1], ref, rtol=1e-11, atol=1e-12)
  assert float(out["reconstruction_error"]) < 1e-12
  np.testing.assert_allclose(by_jacfwd["input_output"], out["input_output"], rtol=1e-11,
                             atol=1e-12)
  np.testing.assert_allclose(out["branch_to_skip"], np.linalg.norm(w, axis=(1, 2)) / np.sqrt(D),
                             rtol=1e-12)      # G_l = W_l, relative to the skip (Eq. 4)


def test_skip_as_a_function_and_errors(x64):
  a = jax.random.normal(jax.random.PRNGKey(4), (L, D, D), jnp.float64) * 0.3
  nj = rn.network_block_jacobians(a, jnp.ones(D), branch=lambda p, h: jnp.tanh(p @ h),
                                  skip=lambda p, h: 0.5 * h)
  np.testing.assert_allclose(nj.skip, 0.5 * np.broadcast_to(np.eye(D), (L, D, D)))
  with pytest.raises(TypeError, match="block"):    # the old split-by-hand keyword is gone
    rn.network_block_jacobians(a, jnp.ones(D), branch=lambda p, h: p @ h,
                               block=lambda p, h: h)
