"""Tests of rankjax._src.measure.gradients (Post-Norm collapse paper, Def 3.5, Thm 3.6, 3.8)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import TransformerConfig
from rankjax._src.measure import gradients as gr
from rankjax._src.measure.losses import cross_entropy, frequency_logits, frequency_loss
from rankjax._src.models.attention import CausalSelfAttention
from rankjax._src.models.norms import Norm
from rankjax._src.models.transformer import DecoderLM, FeedForward, intermediate_grads


def _cfg(**kw) -> TransformerConfig:
  # The Post-Norm LM with no embedding norm and a final norm after the last layer's
  # norm (explicit: Post-Norm's default now follows postnorm Eq. 1), which the direct
  # re-implementation below mirrors.
  base = dict(vocab_size=11, num_layers=2, d_model=8, num_heads=2, d_ff=16, max_seq_len=8,
              norm_position="post", init="paper_collapse", embed_norm=False, final_norm=True)
  base.update(kw)
  return TransformerConfig(**base)


# ---------------------------------------------------------------------------
# a direct re-implementation of DecoderLM's forward pass from its parameters, to take
# gradients with respect to X_k^l / Y_k^l by jax.grad (no Flax perturb involved)


def _layer(params, l):
  return jax.tree.map(lambda x: x[l], params["layers"])


def _norm(cfg, p, x):
  return Norm(cfg.norm_op, gain=True, eps=cfg.norm_eps).apply({"params": p}, x)


def _attn(cfg, p, x):
  return CausalSelfAttention(cfg).apply({"params": p}, x)


def _ffn(cfg, p, x):
  return FeedForward(cfg).apply({"params": p}, x)


def _head(cfg, params, h):
  h = _norm(cfg, params["norm_final"], h)
  return h @ params["lm_head"]


def _from(cfg, params, l: int, site: str, v):
  """Logits of the network continued from X_k^l / Y_k^l = v (Post-Norm, Eq. 1)."""
  p = _layer(params, l)
  if site == "x1":
    v = v + _attn(cfg, p["attn"], v)
    site = "y1"
  if site == "y1":
    v = _norm(cfg, p["norm_attn_r"], v)
    site = "x2"
  if site == "x2":
    v = v + _ffn(cfg, p["ffn"], v)
  h = _norm(cfg, p["norm_ffn_r"], v)
  for j in range(l + 1, cfg.num_layers):
    h = _from_block(cfg, params, j, h)
  return _head(cfg, params, h)


def _from_block(cfg, params, l, h):
  p = _layer(params, l)
  y1 = h + _attn(cfg, p["attn"], h)
  x2 = _norm(cfg, p["norm_attn_r"], y1)
  y2 = x2 + _ffn(cfg, p["ffn"], x2)
  return _norm(cfg, p["norm_ffn_r"], y2)


def _forward_sites(cfg, params, tokens):
  """{site: (L, B, T, d)} computed directly, and the pre-head hidden state."""
  h = params["embed"]["embedding"][tokens]
  sites = {k: [] for k in ("x1", "y1", "x2", "y2")}
  for l in range(cfg.num_layers):
    p = _layer(params, l)
    y1 = h + _attn(cfg, p["attn"], h)
    x2 = _norm(cfg, p["norm_attn_r"], y1)
    y2 = x2 + _ffn(cfg, p["ffn"], x2)
    for k, v in zip(("x1", "y1", "x2", "y2"), (h, y1, x2, y2)):
      sites[k].append(v)
    h = _norm(cfg, p["norm_ffn_r"], y2)
  return {k: jnp.stack(v) for k, v in sites.items()}, _norm(cfg, params["norm_final"], h)


def test_alpha_matches_direct_grad():
  cfg = _cfg()
  model = DecoderLM(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, cfg.vocab_size)
  targets = jax.random.randint(jax.random.PRNGKey(2), (3, 8), 0, cfg.vocab_size)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
  loss_fn = lambda logits: cross_entropy(logits, targets)

  @jax.jit   # one program for the library's gradients and the direct ones
  def compute(params):
    _, _, g_pert, acts = intermediate_grads(model, params, tokens, loss_fn)
    sites, _ = _forward_sites(cfg, params, tokens)
    direct = {k: jnp.stack([jax.grad(lambda v: loss_fn(_from(cfg, params, l, k, v)))(sites[k][l])
                            for l in range(cfg.num_layers)]) for k in sites}
    return g_pert, acts, sites, direct

  g_pert, acts, sites, direct = compute(params)
  for k in sites:
    np.testing.assert_allclose(acts[k], sites[k], rtol=1e-5, atol=1e-5)
  for k in ("x1", "y1", "x2", "y2"):
    np.testing.assert_allclose(g_pert[k], direct[k], rtol=1e-4, atol=1e-7)
  for kk in (1, 2):
    alpha = gr.sublayer_grad_contribution(g_pert[f"x{kk}"], g_pert[f"y{kk}"])
    want = np.array([np.linalg.norm(direct[f"x{kk}"][l]) / np.linalg.norm(direct[f"y{kk}"][l])
                     for l in range(cfg.num_layers)])
    assert alpha.shape == (cfg.num_layers,)
    np.testing.assert_allclose(alpha, want, rtol=1e-4)


@pytest.mark.slow   # a model's captures (~6 s); rms_factor and the bound are fast below
def test_rms_factor_contraction_and_theorem_3_6_bound():
  """Thm 3.6 / App D.1: ||dL/dX_k|| <= alpha_k sqrt(d)/||y_k|| ||dL/dX_{k+1}|| (exact
  collapse); the RMSNorm step alone: ||dL/dY_k||_F <= max_i sqrt(d)/||y_i|| ||dL/dX_{k+1}||_F
  holds for any input (the projection has norm 1), checked on a tiny model."""
  cfg = _cfg(norm_eps=0.0)
  model = DecoderLM(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 8), 0, cfg.vocab_size)
  params = jax.jit(model.init)(jax.random.PRNGKey(4), tokens)["params"]
  # unit gains so that the RMSNorm Jacobian is exactly sqrt(d)/||y|| (I - Proj)
  _, _, g, acts = intermediate_grads(model, params, tokens,
                                     lambda z: cross_entropy(z, tokens))
  f1 = gr.rms_factor(acts["y1"])                       # (L, B, T)
  assert f1.shape == (2, 2, 8)
  d = cfg.d_model
  np.testing.assert_allclose(f1, np.sqrt(d) / np.linalg.norm(acts["y1"], axis=-1), rtol=1e-6)
  lhs = np.sqrt(np.sum(np.square(g["y1"]), axis=(1, 2, 3)))
  rhs = np.max(f1, axis=(1, 2)) * np.sqrt(np.sum(np.square(g["x2"]), axis=(1, 2, 3)))
  assert np.all(lhs <= rhs * (1 + 1e-5))
  mean, std = gr.rms_factor_stats(acts["y1"])
  np.testing.assert_allclose(mean, np.mean(f1, axis=(1, 2)), rtol=1e-6)
  np.testing.assert_allclose(std, np.std(f1, axis=(1, 2)), rtol=1e-5)
  np.testing.assert_allclose(gr.contraction(2.0, mean), 2.0 * mean)
  # per-token eps form
  np.testing.assert_allclose(gr.rms_factor(acts["y1"], eps=1e-6),
                             1 / np.sqrt(np.mean(np.square(acts["y1"]), -1) + 1e-6), rtol=1e-5)


def test_layer_and_block_grad_norms():
  grads = {"layers": {"attn": {"w": jnp.ones((3, 2, 2))}, "ffn": {"w": 2 * jnp.ones((3, 4))}},
           "embed": {"embedding": jnp.ones((5, 2))}}
  np.testing.assert_allclose(gr.layer_grad_norms(grads), np.sqrt([4 + 16] * 3), rtol=1e-6)
  blocks = gr.block_grad_norms(grads)
  np.testing.assert_allclose(blocks["attn"], [2.0] * 3)
  np.testing.assert_allclose(blocks["ffn"], [4.0] * 3)
  np.testing.assert_allclose(blocks["embed"], np.sqrt(10.0), rtol=1e-6)
  with pytest.raises(ValueError):
    gr.layer_grad_norms({"embed": grads["embed"]})


def test_alpha_per_example_and_zero_denominator():
  dx = jnp.ones((2, 3, 4, 5))
  dy = 2 * jnp.ones((2, 3, 4, 5))
  np.testing.assert_allclose(gr.sublayer_grad_contribution(dx, dy), [0.5, 0.5])
  assert gr.sublayer_grad_contribution(dx, dy, per_example=True).shape == (2, 3)
  assert float(gr.sublayer_grad_contribution(dx[0], jnp.zeros((3, 4, 5)))) == 0.0


# ---------------------------------------------------------------------------
# detector and alarm on synthetic series


def _synthetic(transition: int | None, n: int = 60):
  steps = np.arange(n) * 10
  sim = np.full(n, 0.3) + 0.01 * np.sin(np.arange(n))
  loss = 5.0 * np.exp(-np.arange(n) / 8) + 2.0
  if transition is not None:
    i = transition
    sim[i:] = np.minimum(0.3 + 0.35 * np.arange(1, n - i + 1), 0.999)
    loss[i:] = 3.3
  return steps, sim, loss


def test_detector_finds_the_sharp_rise():
  steps, sim, loss = _synthetic(30)
  tr = gr.detect_transition(steps, sim, loss)
  # sim reaches 0.9 (sim_high) at the second point after the jump
  assert tr.found and tr.step == steps[31]
  assert tr.sim_rise >= 0.2 and tr.loss_rise > 0


@pytest.mark.parametrize("kind", ["none", "sim_only", "loss_only", "slow"])
def test_detector_quiet_without_a_joint_sharp_rise(kind):
  steps, sim, loss = _synthetic(None)
  if kind == "sim_only":
    sim[30:] = 0.99
  elif kind == "loss_only":
    loss[30:] = 4.0
  elif kind == "slow":   # similarity drifts to 0.95 over the whole run: no sharp rise
    sim = np.linspace(0.3, 0.95, len(sim))
    loss[30:] = 3.3
  assert not gr.detect_transition(steps, sim, loss).found


def test_alarm():
  loss = np.array([5.0, 3.0, 3.31, 3.31, 2.0])
  freq = np.full(5, 3.3)
  sim = np.array([0.99, 0.5, 0.99, 0.9, 0.99])
  np.testing.assert_array_equal(gr.collapse_alarm(loss, freq, sim), [False, False, True, False,
                                                                     False])
  assert bool(gr.collapse_alarm(jnp.float32(3.3), jnp.float32(3.3), jnp.float32(1.0)))


# ---------------------------------------------------------------------------
# Theorem 3.8 on a tiny model


def _collapsed_setup(cfg, targets):
  """Exactly collapsed inputs (one repeated token, no positions: Lemma E.1) and an LM
  head whose logits are log p_freq(targets) at every position."""
  model = DecoderLM(cfg)
  tokens = jnp.full((1, cfg.max_seq_len), 3, jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
  params = jax.tree.map(lambda x: x.astype(jnp.float64), params)
  _, xh = _forward_sites(cfg, params, tokens)
  x = xh[0, 0]                                             # the common row x^H
  logp = frequency_logits(targets[0], cfg.vocab_size)
  w = jnp.outer(x / jnp.dot(x, x), logp)                   # x^T W = log p_freq
  params = dict(params, lm_head=w)
  return model, tokens, params


@pytest.mark.slow   # a float64 LM (~8 s); Thm 3.8's bound is fast in test_theorem_3_8_lower_bound
def test_theorem_3_8_zero_grads_at_frequency_output(x64):
  cfg = _cfg(vocab_size=5, param_dtype="float64", compute_dtype="float64", norm_eps=0.0)
  targets = jnp.array([[0, 1, 2, 3, 4, 0, 0, 2]])
  model, tokens, params = _collapsed_setup(cfg, targets)
  sites, _ = _forward_sites(cfg, params, tokens)
  from rankjax._src.measure.similarity import token_similarity
  np.testing.assert_allclose(token_similarity(sites["x1"]), 1.0, atol=1e-12)

  def loss(p):
    return cross_entropy(model.apply({"params": p}, tokens), targets)

  # DecoderLM returns float32 logits, so "zero" means float32 round-off here
  value, grads = jax.value_and_grad(loss)(params)
  np.testing.assert_allclose(value, frequency_loss(targets), rtol=1e-6)
  blocks = gr.block_grad_norms(grads)
  for name in ("attn", "ffn", "norm_attn_r", "norm_ffn_r"):
    assert np.max(blocks[name]) < 1e-5, (name, blocks[name])
  assert float(blocks["lm_head"]) < 1e-5
  # control: a head that is not at the frequency output gets non-zero gradients
  # (a rescaled head would not do: its column-sum gradient is parallel to x^H, which
  # the final RMSNorm's Jacobian projects out)
  noise = 0.1 * jax.random.normal(jax.random.PRNGKey(9), params["lm_head"].shape, jnp.float64)
  params2 = dict(params, lm_head=params["lm_head"] + noise)
  blocks2 = gr.block_grad_norms(jax.grad(loss)(params2))
  assert float(blocks2["lm_head"]) > 1e-2
  assert np.max(blocks2["ffn"]) > 1e3 * np.max(blocks["ffn"])


def test_theorem_3_8_lower_bound(x64):
  cfg = _cfg(vocab_size=7, param_dtype="float64", compute_dtype="float64")
  model = DecoderLM(cfg)
  key = jax.random.PRNGKey(5)
  n = cfg.max_seq_len

  @jax.jit      # one compilation for the four trials (eager float64 ops cost seconds)
  def loss_and_bound(xh, w, targets):
    eps = gr.collapse_distance(xh)
    return cross_entropy(xh @ w, targets), gr.collapsed_loss_lower_bound(targets, w, eps)

  @jax.jit      # the draws of a trial, one compile for the four
  def draw(key, scale):
    k1, k2, k3, key = jax.random.split(key, 4)
    targets = jax.random.randint(k1, (n,), 0, cfg.vocab_size)
    x = jax.random.normal(k2, (cfg.d_model,), jnp.float64)
    noise = scale * jax.random.normal(k3, (n, cfg.d_model), jnp.float64)
    xh = x[None, :] + noise
    w = jax.random.normal(key, (cfg.d_model, cfg.vocab_size), jnp.float64)
    return key, xh, w, targets

  for trial in range(4):
    key, xh, w, targets = draw(key, 10.0 ** -trial)
    ce, bound = loss_and_bound(xh, w, targets)
    assert float(ce) >= float(bound) - 1e-12

  @jax.jit      # on the tiny model at init: its pre-head state and head, one compile
  def at_init(key):
    tokens = jax.random.randint(key, (1, n), 0, cfg.vocab_size)
    params = model.init(jax.random.PRNGKey(6), tokens)["params"]
    _, xh = _forward_sites(cfg, params, tokens)
    eps = gr.collapse_distance(xh[0])
    ce = cross_entropy(model.apply({"params": params}, tokens), tokens)
    return ce, gr.collapsed_loss_lower_bound(tokens[0], params["lm_head"], eps)

  ce, bound = at_init(key)
  assert float(ce) >= float(bound)


def test_contraction_bound_holds_off_collapse_with_gains_where_the_token_mean_fails():
  """App D.1's row argument with a learned gain: for RMSNorm X = g * y sqrt(d)/||y||
  (row-wise) and any upstream gradient G, ||dL/dY||_F <= max|g| max_i sqrt(d)/||y_i||
  ||G||_F. Rows of very different norms and a gain above 1 make the token-mean factor
  without gain too small, so it is not a bound."""
  rng = np.random.default_rng(0)
  n, d = 16, 8
  y = rng.standard_normal((1, 1, n, d)) * np.r_[np.full(n - 1, 10.0), 0.2][None, None, :, None]
  gain = 1 + rng.uniform(0, 2, (1, d))
  upstream = rng.standard_normal((n, d))

  def norm_out(v):
    return jnp.sum(upstream * gain[0] * v / jnp.sqrt(jnp.mean(v * v, -1, keepdims=True)))

  with jax.enable_x64(True):
    dy = np.asarray(jax.grad(norm_out)(jnp.asarray(y[0, 0])))
  ratio = np.linalg.norm(dy) / np.linalg.norm(upstream)       # what c must bound (alpha = 1)
  bound = float(gr.contraction_bound(1.0, y, gain)[0])
  want = np.max(np.abs(gain)) * np.max(np.sqrt(d) / np.linalg.norm(y[0, 0], axis=-1))
  np.testing.assert_allclose(bound, want, rtol=1e-5)
  assert ratio <= bound * (1 + 1e-6)
  mean, _ = gr.rms_factor_stats(y)
  assert float(gr.contraction(1.0, mean)[0]) < ratio          # the token mean is no bound
  np.testing.assert_allclose(gr.rms_factor_max(y), [np.sqrt(d) / np.linalg.norm(y, axis=-1).min()],
                             rtol=1e-5)


def test_rms_factor_takes_a_traced_eps():
  y = jax.random.normal(jax.random.PRNGKey(3), (2, 4, 8))
  got = jax.jit(gr.rms_factor)(y, jnp.float32(1e-2))
  want = 1.0 / np.sqrt(np.mean(np.square(np.asarray(y, np.float64)), -1) + 1e-2)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(gr.rms_factor(jnp.zeros((3, 4)))), 0.0)
