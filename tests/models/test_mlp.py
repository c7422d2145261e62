"""ResidualMLP: every placement x op x activation x M, placement semantics, the
beta*alpha^M symmetry (Transforming Rank App A.4), init statistics, skip spacing."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import MLP_ACTIVATIONS, NORM_OPS, NORM_POSITIONS, MLPConfig
from rankjax._src.models import blocks, norms
from rankjax._src.models.mlp import ResidualMLP

SMALL = dict(depth=3, width=8, expansion=2.0)


def _run(cfg, batch=3, key=0, capture=False):
  """Input, init and forward pass, in one compile."""
  model = ResidualMLP(cfg)

  def run(k):
    x = jax.random.normal(k, (batch, cfg.input_dim or cfg.width), jnp.dtype(cfg.param_dtype))
    variables = model.init(jax.random.key(key + 1), x)
    if capture:
      out, state = model.apply(variables, x, capture=True, mutable=["intermediates"])
      return x, variables, out, state["intermediates"]
    return x, variables, model.apply(variables, x)

  return jax.jit(run)(jax.random.key(key))


GRID = list(itertools.product(NORM_POSITIONS, NORM_OPS, MLP_ACTIVATIONS, (1, 2)))
# Every 43rd combination by default (7 of 300: every value of every axis appears, and
# mixed with the others); the whole grid runs under the slow marker.
SAMPLED = GRID[::43]
FULL = [pytest.param(*c, marks=pytest.mark.slow) for i, c in enumerate(GRID) if i % 43]


@pytest.mark.parametrize("position,op,activation,m", SAMPLED + FULL)
def test_every_combination_builds_and_is_finite(position, op, activation, m):
  cfg = MLPConfig(**SMALL, norm_position=position, norm_op=op, activation=activation,
                  branch_matrices=m, norm_gain=True, norm_eps=1e-6)
  _, _, out = _run(cfg)
  assert out.shape == (3, 8)
  assert bool(jnp.all(jnp.isfinite(out)))


def test_classifier_layers():
  cfg = MLPConfig(**SMALL, input_dim=20, num_classes=5)
  _, variables, out = _run(cfg)
  assert out.shape == (3, 5)
  assert variables["params"]["w_in"].shape == (20, 8)
  assert variables["params"]["w_out"].shape == (8, 5)


def test_post_renormalizes_every_block_output():
  cfg = MLPConfig(depth=5, width=16, norm_position="post", alpha=3.0)
  _, _, out, inter = _run(cfg, capture=True)
  stream = inter["stream"][0]  # (L, B, d)
  np.testing.assert_allclose(norms.rms(stream)[..., 0], 1.0, rtol=1e-5)
  np.testing.assert_allclose(norms.rms(out)[..., 0], 1.0, rtol=1e-5)


def test_pre_leaves_the_stream_unnormalized():
  cfg = MLPConfig(depth=6, width=32, norm_position="pre")
  _, _, _, inter = _run(cfg, capture=True)
  stream_rms = norms.rms(inter["stream"][0])[..., 0].mean(-1)  # (L,)
  # the Pre-Norm stream grows with depth (paper Sec 4, App B.3)
  assert bool(jnp.all(jnp.diff(stream_rms) > 0))
  assert float(stream_rms[-1]) > 1.5


def test_pre_block_equals_its_formula():
  cfg = MLPConfig(depth=1, width=8, expansion=4.0, norm_position="pre", beta=0.7)
  x, variables, out = _run(cfg)
  p = jax.tree.map(lambda a: a[0], variables["params"]["blocks"])
  z = norms.normalize(x, "rms")
  expected = x + 0.7 * (jax.nn.relu(z @ p["w_up"]) @ p["w_down"])
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_output_normalizes_the_branch_output():
  cfg = MLPConfig(depth=1, width=16, norm_position="output", beta=1.0)
  x, variables, out = _run(cfg)
  branch = out - x  # h + beta * B(f(h)) with beta = 1
  np.testing.assert_allclose(norms.rms(branch)[..., 0], 1.0, rtol=1e-5)


def test_skip_every_groups_blocks():
  """k=2, L=4: h2 = h0 + beta*F2(F1(h0)), h4 = h2 + beta*F4(F3(h2)), inner blocks plain."""
  cfg = MLPConfig(depth=4, width=8, norm_position="pre", skip_every=2, beta=0.5)
  x, variables, out, inter = _run(cfg, capture=True)
  ps = [jax.tree.map(lambda a, i=i: a[i], variables["params"]["blocks"]) for i in range(4)]
  f = lambda p, h: blocks.branch_out(p, h, cfg)
  h2 = x + 0.5 * f(ps[1], f(ps[0], x))
  h4 = h2 + 0.5 * f(ps[3], f(ps[2], h2))
  np.testing.assert_allclose(inter["stream"][0][1], h2, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out, h4, rtol=1e-5, atol=1e-6)
  # no skips at all: a plain deep MLP
  plain = dataclasses.replace(cfg, skip_every=0)
  _, _, out_plain = _run(plain)
  np.testing.assert_allclose(out_plain, f(ps[3], f(ps[2], f(ps[1], f(ps[0], x)))),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("position", ["pre", pytest.param("post", marks=pytest.mark.slow)])
def test_branch_scale_symmetry(position, x64):
  """Same beta*alpha^M, different (alpha, beta): same function at init (App A.4, Eq. 16)."""
  base = dict(depth=6, width=16, activation="relu", norm_position=position,
              param_dtype="float64")
  for m in (1, 2):
    a = MLPConfig(**base, branch_matrices=m, alpha=1.0, beta=0.5)
    lam = 1.7
    b = MLPConfig(**base, branch_matrices=m, alpha=lam, beta=0.5 / lam**m)
    x = jax.random.normal(jax.random.key(3), (4, 16), jnp.float64)

    def init_apply(v):         # both inits and forward passes in one compile
      # the same underlying standard-normal draws: N(0, alpha^2/fan_in) = alpha * N(0, 1/fan_in)
      va = ResidualMLP(a).init(jax.random.key(7), v)
      vb = ResidualMLP(b).init(jax.random.key(7), v)
      return va, vb, ResidualMLP(a).apply(va, v), ResidualMLP(b).apply(vb, v)

    va, vb, out_a, out_b = jax.jit(init_apply)(x)
    np.testing.assert_allclose(vb["params"]["blocks"]["w_up" if m == 2 else "w"],
                               lam * va["params"]["blocks"]["w_up" if m == 2 else "w"],
                               rtol=1e-14)
    assert out_a.dtype == jnp.float64
    np.testing.assert_allclose(out_a, out_b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("alpha,m", [(1.0, 2), (2.0, 2), (0.5, 1)])
def test_init_statistics(alpha, m):
  cfg = MLPConfig(depth=4, width=128, expansion=4.0, branch_matrices=m, alpha=alpha,
                  activation="swiglu")
  x = jnp.ones((1, 128))
  params = jax.jit(ResidualMLP(cfg).init)(jax.random.key(0), x)["params"]["blocks"]
  for name, (fan_in, _) in blocks.matrix_shapes(cfg).items():
    target = alpha**2 / fan_in
    var = float(jnp.var(params[name]))
    assert abs(var / target - 1) < 0.05, (name, var, target)
    assert abs(float(jnp.mean(params[name]))) < 3 * math.sqrt(target / params[name].size)


def test_blocks_are_independent_draws():
  cfg = MLPConfig(depth=3, width=16)
  params = jax.jit(ResidualMLP(cfg).init)(jax.random.key(0), jnp.ones((1, 16)))["params"]["blocks"]
  w = params["w_up"]
  assert not np.allclose(w[0], w[1])
