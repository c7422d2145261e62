"""DecoderLM on the shared residual block: every placement and per-location operation,
the embed/final-norm rule, norm bias, remat policies, padded vocab and chunked loss,
the dropout PRNG implementation."""

import dataclasses
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import KernelConfig, TransformerConfig
from rankjax._src.models import norms
from rankjax._src.models.lm_head import head_cross_entropy, head_logits
from rankjax._src.models.transformer import (DecoderLM, first_layer_input, intermediate_grads,
                                        norm_names)
from rankjax._src.train import tasks
from tests.conftest import with_kernels

TINY = dict(vocab_size=37, num_layers=2, d_model=16, num_heads=2, d_ff=24, max_seq_len=12,
            norm_eps=0.0)


def _tokens(b=2, t=8, key=0, vocab=37):
  return jax.random.randint(jax.random.key(key), (b, t), 0, vocab)


def _setup(**kw):
  cfg = TransformerConfig(**{**TINY, **kw})
  tokens = _tokens()
  params = jax.jit(DecoderLM(cfg).init)(jax.random.key(0), tokens)["params"]
  return cfg, tokens, params


def _capture(cfg, p, tokens):
  return DecoderLM(cfg).apply({"params": p}, tokens, capture=True)[1]


def _init_and(fn, **kw):
  """(cfg, tokens, params, fn(cfg, params, tokens)), init and fn in one compile."""
  cfg = TransformerConfig(**{**TINY, **kw})
  tokens = _tokens()

  def run(key):
    params = DecoderLM(cfg).init(key, tokens)["params"]
    return params, fn(cfg, params, tokens)

  params, out = jax.jit(run)(jax.random.key(0))
  return cfg, tokens, params, out


def _unit_rms(x):
  np.testing.assert_allclose(norms.rms(x)[..., 0], 1.0, rtol=1e-4)


PLACEMENTS = list(itertools.product(("pre", "post", "output", "peri", "none"),
                                    ("rms", "layer", "mean", "detached_rms")))
# By default the two ops no other fast test runs (mean, detached_rms); the other
# placements' forward passes run in the fast tests below (pre: beta, post: Eq. 1,
# output, none: theirs, and test_transformer's peri), and
# test_every_placement_names_its_norm_params checks every combination's names fast.
# The whole grid runs under the slow marker.
FAST_PLACEMENTS = {("output", "mean"), ("peri", "detached_rms")}


def _check_norm_names(cfg, op, params):
  has_params = norms.has_gain(op)
  expected = set(norm_names(cfg).values()) if has_params else set()
  got = {k for k in params["layers"] if k.startswith("norm_")}
  assert got == expected
  top = {k for k in params if k.startswith("norm_")}
  want_top = {n for n, on in (("norm_embed", cfg.uses_embed_norm),
                              ("norm_final", cfg.uses_final_norm)) if on and has_params}
  assert top == want_top


@pytest.mark.parametrize("position,op", [
    c if c in FAST_PLACEMENTS else pytest.param(*c, marks=pytest.mark.slow)
    for c in PLACEMENTS])
def test_every_placement_builds_with_its_norms(position, op):
  cfg = TransformerConfig(**TINY, norm_position=position, norm_op=op)
  tokens = _tokens()
  model = DecoderLM(cfg)

  def init_apply(key):        # one compile for both
    variables = model.init(key, tokens)
    return variables["params"], model.apply(variables, tokens)

  params, logits = jax.jit(init_apply)(jax.random.key(0))
  chex.assert_tree_all_finite(logits)
  _check_norm_names(cfg, op, params)


def test_every_placement_names_its_norm_params():
  """Every placement x op: the norm parameters init creates (shapes only, no compile)."""
  tokens = _tokens()
  for position, op in PLACEMENTS:
    cfg = TransformerConfig(**TINY, norm_position=position, norm_op=op)
    params = jax.eval_shape(DecoderLM(cfg).init, jax.random.key(0), tokens)["params"]
    _check_norm_names(cfg, op, params)


def test_output_placement_normalizes_branch_outputs_only():
  cfg, tokens, params, acts = _init_and(_capture, norm_position="output")
  _unit_rms(acts["y1"] - acts["x1"])            # Y_1 = h + B(Attn(h)), X_1 = h
  _unit_rms(acts["y2"] - acts["x2"])
  np.testing.assert_array_equal(acts["x2"], acts["y1"])   # no P, no R: the stream is Y_1
  assert not np.allclose(norms.rms(acts["y2"])[..., 0], 1.0, rtol=1e-2)


def test_no_norms_at_all():
  cfg, tokens, params, acts = _init_and(_capture, norm_position="none")
  assert not any(k.startswith("norm_") for k in params) and not any(
      k.startswith("norm_") for k in params["layers"])
  emb = params["embed"]["embedding"][tokens]
  np.testing.assert_array_equal(acts["x1"][0], emb)
  np.testing.assert_array_equal(acts["x1"][1], acts["y2"][0])


def test_pre_and_post_norms_together_get_their_own_names():
  """P and R both set (p_norm override on post): the attention's R norm is
  norm_attn_res, the FFN's P norm norm_ffn_in; X_2 = P(R(Y_1))."""
  cfg, tokens, params, acts = _init_and(_capture, norm_position="post", p_norm="layer")
  names = set(norm_names(cfg).values())
  assert names == {"norm_attn_p", "norm_attn_r", "norm_ffn_p", "norm_ffn_r"}
  r = norms.normalize(acts["y1"], "rms")
  np.testing.assert_allclose(acts["x2"], norms.normalize(r, "layer"), rtol=1e-5, atol=1e-5)


def test_beta_scales_the_branch():
  cfg, tokens, params, (acts, full) = _init_and(lambda c, p, t: (_capture(c, p, t), _capture(
      dataclasses.replace(c, beta=1.0), p, t)), norm_position="pre", beta=0.25)
  # layer 1: same input, branch scaled by beta
  emb = first_layer_input(cfg, params, tokens)
  np.testing.assert_allclose(acts["y1"][0] - emb, 0.25 * (full["y1"][0] - emb),
                             rtol=1e-5, atol=1e-6)


def test_final_norm_rule_per_placement():
  post = TransformerConfig(**TINY, norm_position="post")
  assert post.uses_embed_norm and not post.uses_final_norm
  for position in ("pre", "peri", "output"):
    c = TransformerConfig(**TINY, norm_position=position)
    assert c.uses_final_norm and not c.uses_embed_norm
  none = TransformerConfig(**TINY, norm_position="none")
  assert not none.uses_final_norm and not none.uses_embed_norm
  forced = TransformerConfig(**TINY, norm_position="post", final_norm=True, embed_norm=False)
  assert forced.uses_final_norm and not forced.uses_embed_norm


def test_post_follows_eq1_every_sublayer_reads_a_norm_output():
  """postnorm Eq. 1: X_1^1 = RMS(Y_0^1) (the embeddings), X_2 = RMS(Y_1), and the
  head reads RMS(Y_2^L), the last layer's norm, with no second norm after it."""
  cfg, tokens, params, (acts, logits) = _init_and(lambda c, p, t: (_capture(c, p, t), DecoderLM(
      c).apply({"params": p}, t)), norm_position="post")
  _unit_rms(acts["x1"])
  _unit_rms(acts["x2"])
  h_last = norms.normalize(acts["y2"][-1], "rms") * params["layers"]["norm_ffn_r"]["scale"][-1]
  np.testing.assert_allclose(logits, h_last @ params["lm_head"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(first_layer_input(cfg, params, tokens), acts["x1"][0], rtol=1e-6)


def test_layer_norm_bias_matches_the_formula():
  """LN(x) = gamma * (x - mu) / sigma + beta (softmax paper Sec 2)."""
  cfg, tokens, params = _setup(norm_position="pre", norm_op="layer")   # bias by default
  assert set(params["norm_final"]) == {"scale", "bias"}
  assert set(params["layers"]["norm_attn_p"]) == {"scale", "bias"}
  shapes = lambda **kw: jax.eval_shape(DecoderLM(TransformerConfig(**{**TINY, **kw})).init,
                                       jax.random.key(0), tokens)["params"]["norm_final"]
  assert set(shapes(norm_position="pre", norm_op="layer", norm_bias=False)) == {"scale"}
  assert set(shapes(norm_position="pre", norm_op="rms")) == {"scale"}        # RMSNorm: none
  assert set(shapes(norm_position="pre", norm_op="rms", norm_bias=True)) == {"scale", "bias"}
  rng = np.random.default_rng(0)
  gamma, beta = rng.normal(size=16), rng.normal(size=16)
  p = dict(params, norm_final={"scale": jnp.asarray(gamma, jnp.float32),
                               "bias": jnp.asarray(beta, jnp.float32)})
  (h, w), acts = jax.jit(lambda q: (DecoderLM(cfg).apply(
      {"params": q}, tokens, return_hidden=True), _capture(cfg, q, tokens)))(p)
  y = np.asarray(acts["y2"][-1], np.float64)
  mu, sigma = y.mean(-1, keepdims=True), y.std(-1, keepdims=True)
  np.testing.assert_allclose(h, gamma * (y - mu) / sigma + beta, rtol=1e-4, atol=1e-5)


@pytest.mark.slow   # ~6 s per placement; remat itself runs fast in test_lm_golden
@pytest.mark.parametrize("position", ["pre", "post"])
def test_every_remat_policy_gives_the_same_gradients(position):
  cfg, tokens, params = _setup(norm_position=position, dropout_rate=0.1)
  rng = {"dropout": jax.random.key(3)}

  def grads(policy):
    model = DecoderLM(with_kernels(cfg, remat=policy))
    loss = lambda p: jnp.sum(model.apply({"params": p}, tokens, deterministic=False,
                                         rngs=rng) ** 2)
    return jax.jit(jax.grad(loss))(params)

  ref = grads("none")
  for policy in ("dots", "full"):
    chex.assert_trees_all_close(grads(policy), ref, rtol=2e-5, atol=2e-6)   # float32 rounding


# 2 of 3 layers: an unrolled pair and a remainder; 3: fully unrolled (slow)
@pytest.mark.slow   # ~4 s each: two compiled models per case
@pytest.mark.parametrize("unroll", [2, 3])
def test_layer_scan_unroll_keeps_outputs_gradients_and_params(unroll):
  cfg, tokens, params = _setup(norm_position="post", num_layers=3)
  model = DecoderLM(cfg)
  unrolled = DecoderLM(with_kernels(cfg, scan_unroll=unroll))
  chex.assert_trees_all_equal_shapes(
      jax.eval_shape(unrolled.init, jax.random.key(0), tokens)["params"],
      params)   # still stacked

  def value_and_grads(m):
    loss = lambda p: jnp.sum(m.apply({"params": p}, tokens) ** 2)
    return jax.jit(jax.value_and_grad(loss))(params)

  chex.assert_trees_all_close(value_and_grads(unrolled), value_and_grads(model),
                              rtol=2e-5, atol=2e-6)   # float32 rounding only


def test_remat_takes_a_policy_not_a_boolean():
  with pytest.raises(ValueError, match=r"^kernels\.remat=True is not allowed; choose one of "
                                       r"\['none', "
                                       r"'dots', 'full', 'auto'\]$"):
    TransformerConfig(kernels=KernelConfig(remat=True))
  with pytest.raises(ValueError, match="remat=False is not allowed"):
    config_lib.from_dict(TransformerConfig, {"kernels": {"remat": False}})


@pytest.mark.slow   # ~5 s: two tasks' gradients; the masked head (vocab 40 -> 33) is fast below
def test_padded_vocab_gives_the_unpadded_loss_and_gradients():
  cfg, tokens, params = _setup(norm_position="pre", tie_embeddings=True)
  padded = with_kernels(cfg, vocab_multiple=32)                   # 37 -> 64 rows
  assert padded.padded_vocab_size == 64
  extra = jax.random.normal(jax.random.key(9), (64 - 37, 16))     # pad rows: any values
  p_pad = dict(params, embed={"embedding": jnp.concatenate(
      [params["embed"]["embedding"], extra])})
  targets = _tokens(key=4)
  batch = {"inputs": tokens, "targets": targets}

  def task_loss(c, p):
    task = tasks.make_task(config_lib.TrainConfig(model=c, seq_len=8, batch_size=2,
                                                  warmup_steps=1, total_steps=2))
    return jax.jit(jax.value_and_grad(lambda q: task.loss(q, batch, None, True)[0]))(p)

  loss, g = task_loss(cfg, params)
  loss_pad, g_pad = task_loss(padded, p_pad)
  np.testing.assert_allclose(loss_pad, loss, rtol=1e-6)
  emb, emb_pad = g["embed"]["embedding"], g_pad["embed"]["embedding"]
  np.testing.assert_allclose(emb_pad[:37], emb, rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(emb_pad[37:], 0.0)
  logits = DecoderLM(padded).apply({"params": p_pad}, tokens)
  assert logits.shape == (2, 8, 37)
  # two programs (a 64- and a 37-column head): float32 rounding of O(1) logits, so an
  # absolute floor too (a logit near 0 has no meaningful relative error)
  np.testing.assert_allclose(logits, DecoderLM(cfg).apply({"params": params}, tokens),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk", [5, 16, 64])
def test_chunked_cross_entropy_equals_the_plain_one(chunk):
  h = jax.random.normal(jax.random.key(0), (16, 8))
  w = jax.random.normal(jax.random.key(1), (8, 40))
  y = jax.random.randint(jax.random.key(2), (16,), 0, 33)
  plain = lambda hh, ww: head_cross_entropy(hh, ww, y, 33)
  chunked = lambda hh, ww: head_cross_entropy(hh, ww, y, 33, chunk=chunk)

  def everything(hh, ww):     # one compile instead of one per op
    ref = -jnp.mean(jax.nn.log_softmax((hh @ ww)[:, :33])[jnp.arange(16), y])
    return (ref, plain(hh, ww), chunked(hh, ww), jax.grad(chunked, (0, 1))(hh, ww),
            jax.grad(plain, (0, 1))(hh, ww), head_logits(hh, ww, 33))

  ref, loss_plain, loss_chunked, g_chunked, g_plain, logits = jax.jit(everything)(h, w)
  np.testing.assert_allclose(loss_plain, ref, rtol=1e-6)
  np.testing.assert_allclose(loss_chunked, ref, rtol=1e-6)
  chex.assert_trees_all_close(g_chunked, g_plain, rtol=1e-5, atol=1e-7)
  assert float(jnp.max(logits[:, 33:])) == -np.inf


def _head_matmuls(jaxpr, v: int) -> int:
  """dot_generals in ``jaxpr`` (scan bodies included) that touch a (., v) array."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      shapes = [x.aval.shape for x in (*eqn.invars, *eqn.outvars)]
      count += any(len(sh) >= 2 and sh[-1] == v for sh in shapes)   # (s, ., v): per shard
    for param in eqn.params.values():
      for p in (param if isinstance(param, (list, tuple)) else [param]):
        inner = p if hasattr(p, "eqns") else getattr(p, "jaxpr", None)   # Jaxpr / Closed
        if inner is not None and hasattr(inner, "eqns"):
          count += _head_matmuls(inner, v)
  return count


def test_fused_chunked_loss_runs_the_head_three_times_and_in_bf16():
  """The chunked loss's value-and-grad has one logits matmul and the two gradient
  matmuls per chunk (autodiff through a rematerialized chunk had four); in bfloat16
  it stays within bf16 rounding of the float32 loss and gradients."""
  h = jax.random.normal(jax.random.key(0), (24, 8))
  w = jax.random.normal(jax.random.key(1), (8, 40)) * 0.3
  y = jax.random.randint(jax.random.key(2), (24,), 0, 33)
  f = lambda hh, ww: head_cross_entropy(hh, ww, y, 33, chunk=8)
  jaxpr = jax.make_jaxpr(jax.value_and_grad(f, (0, 1)))(h, w).jaxpr
  assert _head_matmuls(jaxpr, 40) == 3
  (l32, g32), (l16, g16) = jax.jit(lambda hh, ww: (
      jax.value_and_grad(f, (0, 1))(hh, ww),
      jax.value_and_grad(f, (0, 1))(hh.astype(jnp.bfloat16), ww.astype(jnp.bfloat16))))(h, w)
  assert g16[0].dtype == jnp.bfloat16 and g16[1].dtype == jnp.bfloat16
  np.testing.assert_allclose(l16, l32, rtol=2e-2)
  for a, b in zip(g16, g32):
    np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=0.05,
                               atol=0.05 * float(jnp.max(jnp.abs(b))))


def test_bad_head_shapes_raise():
  with pytest.raises(ValueError, match="expects h"):
    head_cross_entropy(jnp.ones((2, 3, 4)), jnp.ones((4, 5)), jnp.zeros((2, 3), jnp.int32))


def test_chunked_training_loss_matches_unchunked():
  cfg, tokens, params = _setup(norm_position="pre")
  batch = {"inputs": tokens, "targets": _tokens(key=4)}
  losses = []
  for chunk in (0, 6):
    task = tasks.make_task(config_lib.TrainConfig(
        model=with_kernels(cfg, loss_chunk=chunk), seq_len=8, batch_size=2,
        warmup_steps=1, total_steps=2))
    losses.append(jax.jit(lambda p, t=task: t.loss(p, batch, None, True)[0])(params))
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)


@pytest.mark.parametrize("impl", ["rbg", pytest.param("unsafe_rbg", marks=pytest.mark.slow)])
def test_dropout_prng_implementations(impl):
  rng = jax.random.PRNGKey(0)
  assert tasks.dropout_key(rng, "threefry") is rng
  key = tasks.dropout_key(rng, impl)
  assert str(jax.random.key_impl(key)) == impl
  cfg, tokens, params = _setup(norm_position="pre", dropout_rate=0.3, prng_impl=impl)
  task = tasks.make_task(config_lib.TrainConfig(model=cfg, seq_len=8, batch_size=2,
                                                warmup_steps=1, total_steps=2))
  batch = {"inputs": tokens, "targets": tokens}
  loss = jax.jit(lambda r: task.loss(params, batch, r)[0])   # one compile, two keys
  a = loss(jax.random.PRNGKey(1))
  b = loss(jax.random.PRNGKey(2))
  assert np.isfinite(a) and a != b


def test_intermediate_grads_with_output_placement_match_direct():
  """The perturbation gradients exist and match jax.grad for a placement the LM did
  not have before (output: X_k is the stream itself, also the skip)."""
  cfg, tokens, params = _setup(norm_position="output")
  targets = _tokens(key=5)
  ce = lambda lg: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(lg), targets[..., None], -1))
  value, g_params, grads, acts, direct = jax.jit(lambda p: (
      *intermediate_grads(DecoderLM(cfg), p, tokens, ce),
      jax.grad(lambda q: ce(DecoderLM(cfg).apply({"params": q}, tokens)))(p)))(params)
  chex.assert_trees_all_close(g_params, direct, rtol=1e-5, atol=1e-7)
  # the last layer's Y_2 reaches the logits through the final norm and the head only
  p = params

  def head(y):
    y = norms.normalize(y, "rms") * p["norm_final"]["scale"]
    return ce(y @ p["lm_head"])

  np.testing.assert_allclose(grads["y2"][-1], jax.jit(jax.grad(head))(acts["y2"][-1]),
                             rtol=1e-4, atol=1e-7)


def test_embed_norm_uses_the_r_operation():
  cfg, tokens, params, acts = _init_and(_capture, norm_position="post", norm_op="rms",
                                        r_norm="layer")
  assert cfg.embed_norm_op == "layer"
  emb = params["embed"]["embedding"][tokens]
  np.testing.assert_allclose(acts["x1"][0], norms.normalize(emb, "layer"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["xla", "einsum"])
def test_remat_dots_saves_the_attention_output(impl, monkeypatch):
  """Under remat="dots" the heads' output (L, B, T, H, d_head) is a saved residual, so
  the backward pass does not recompute a fused attention forward (a kernel is no dot:
  dots_with_no_batch_dims_saveable alone saved none of it)."""
  import contextlib
  import io

  from rankjax._src.models import transformer
  cfg = TransformerConfig(**{**TINY, "num_layers": 2},
                          kernels=KernelConfig(remat="dots", attention_impl=impl))
  tokens = _tokens()
  model = DecoderLM(cfg)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  params = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), params)
  heads_out = f"[2,{tokens.shape[0]},{tokens.shape[1]},{cfg.num_heads},{cfg.d_head}]"

  def saved():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      jax.ad_checkpoint.print_saved_residuals(
          lambda p: jnp.sum(DecoderLM(cfg).apply({"params": p}, tokens)), params)
    return buf.getvalue()

  assert heads_out in saved()
  monkeypatch.setitem(transformer.REMAT_POLICIES, "dots",
                      jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  assert heads_out not in saved()
