"""The fast dropout attention (``attn_dropout_mask="hash"``): the explicit formula with
the hash masks, the masks' law, the skipped key blocks, the config knob, and the model's
two paths (query blocks, einsum) drawing the same masks."""

import dataclasses
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import TransformerConfig
from rankjax._src.models import attention, dropout_mask
from rankjax._src.models.attention import prefix_average_matrix
from tests.conftest import with_kernels


def _explicit(q, k, v, scale, alpha, rate, key):
  """The formula with the whole (B, H, T, T) matrix: ``causal_probabilities`` minus
  alpha C_n, each entry kept where the hash of its indices says (the mask of the whole
  square, ``dropout_mask.keep`` over every row and column) and divided by 1 - rate."""
  b, t, h, dh = q.shape
  p = (attention.causal_probabilities(q, k, 1.0 / (scale * math.sqrt(dh)))
       - alpha * prefix_average_matrix(t, q.dtype))
  if rate:
    keep = dropout_mask.keep(dropout_mask.streams(key, b, h), jnp.arange(t), jnp.arange(t),
                             t, rate)
    p = jnp.where(keep, p / (1 - rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v)


CASES = [(13, 0.0, 0.2), (13, 0.6, 0.2), (13, 0.7, 0.0), (16, 0.0, 0.5), (3, 0.3, 0.1)]


def _check(dtype, t, alpha, rate, rtol, atol):
  q, k, v = (jax.random.normal(jax.random.key(i), (2, t, 3, 4), dtype) for i in range(3))
  key, scale = jax.random.key(5), 0.4
  fast = lambda q, k, v: attention.causal_dropout_attention(q, k, v, scale, alpha, rate, key, 4)
  explicit = lambda q, k, v: _explicit(q, k, v, scale, alpha, rate, key)
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))
  both = lambda f: jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(loss(f), (0, 1, 2))(q, k, v)))
  (of, gf), (oe, ge) = both(fast)(q, k, v), both(explicit)(q, k, v)
  np.testing.assert_allclose(of, oe, rtol=rtol, atol=atol)
  chex.assert_trees_all_close(gf, ge, rtol=10 * rtol, atol=10 * atol)


@pytest.mark.parametrize("t,alpha,rate", CASES)
def test_fast_path_is_the_explicit_formula_float32(t, alpha, rate):
  """Blocks of 4 rows; T = 13 and 3 are no multiple of the block (a short last block),
  with and without prefix removal and dropout: outputs and gradients."""
  _check(jnp.float32, t, alpha, rate, 1e-5, 1e-6)


@pytest.mark.parametrize("t,alpha,rate", CASES[:2])
def test_fast_path_is_the_explicit_formula_float64(x64, t, alpha, rate):
  _check(jnp.float64, t, alpha, rate, 1e-12, 1e-13)


def test_fast_path_forms_only_the_visible_key_blocks():
  """The logits of query block i (rows [4i, 4i + 4), the last one short) span keys
  [0, 4i + 4) only: the dot products' shapes, in the program jax traces."""
  t = 10
  q = jnp.zeros((1, t, 3, 5))
  jaxpr = jax.make_jaxpr(lambda q: attention.causal_dropout_attention(
      q, q, q, 0.5, 0.0, 0.1, jax.random.key(0), 4))(q)
  shapes = [tuple(e.outvars[0].aval.shape) for e in _equations(jaxpr.jaxpr)
            if e.primitive.name == "dot_general"]
  logits = sorted(s for s in shapes if 5 not in s)     # (B, H, rows, keys); P V has D = 5
  assert logits == [(1, 3, 2, 10), (1, 3, 4, 4), (1, 3, 4, 8)]


def _equations(jaxpr):
  """Every equation of ``jaxpr`` and of the jaxprs nested in it (checkpoint, pjit)."""
  for e in jaxpr.eqns:
    yield e
    for p in e.params.values():
      inner = getattr(p, "jaxpr", p)
      if hasattr(inner, "eqns"):
        yield from _equations(inner)


def test_hash_masks_keep_the_declared_share_and_differ_everywhere():
  """Over 2^20 entries the kept share is within 5 binomial standard deviations of the
  keep probability, which is within 2^-33 of 1 - rate; the masks of two keys, two
  batch rows, two heads, and two entries beside each other agree only as independent
  draws would (p^2 + (1 - p)^2, within 5 deviations); a block of rows and columns reads
  the same entries as the whole square."""
  rate, t, b, h = 0.1, 256, 2, 8
  p = dropout_mask.keep_probability(rate)
  assert abs(p - (1 - rate)) <= 2.0 ** -33
  rows = cols = jnp.arange(t)
  mask = jax.jit(lambda key: dropout_mask.keep(dropout_mask.streams(key, b, h), rows, cols,
                                               t, rate))
  m = mask(jax.random.key(0))
  n = m.size
  assert abs(float(m.mean()) - p) < 5 * math.sqrt(p * (1 - p) / n)
  agree = p * p + (1 - p) ** 2

  def independent(a, c):
    share = float(jnp.mean(a == c))
    assert abs(share - agree) < 5 * math.sqrt(agree * (1 - agree) / a.size), share
  independent(m, mask(jax.random.key(1)))          # keys
  independent(m[0], m[1])                           # batch rows
  independent(m[:, 0], m[:, 1])                     # heads
  independent(m[..., :-1], m[..., 1:])              # neighbouring keys
  independent(m[:, :, :-1], m[:, :, 1:])            # neighbouring queries
  independent(m[:, :, :128], m[:, :, 128:])        # query blocks of 128 rows
  words = dropout_mask.streams(jax.random.key(0), b, h)
  block = dropout_mask.keep(words, jnp.arange(100, 140), jnp.arange(37, 90), t, rate)
  assert bool(jnp.all(block == m[:, :, 100:140, 37:90]))


def test_hash_masks_refuse_a_sequence_their_counter_cannot_hold():
  with pytest.raises(ValueError, match="T <= 65536"):
    dropout_mask.keep(dropout_mask.streams(jax.random.key(0), 1, 1), jnp.arange(2),
                      jnp.arange(2), 65537, 0.1)


def test_fmix32_is_murmur3s_finalizer():
  """Against the finalizer written in Python integers (mod 2^32)."""
  def ref(x):
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)
  xs = [0, 1, 2, 12345, 0xDEADBEEF, 0xFFFFFFFF]
  got = dropout_mask.fmix32(jnp.array(xs, jnp.uint32))
  assert [int(g) for g in got] == [ref(x) for x in xs]


CFG = TransformerConfig(vocab_size=37, num_layers=2, d_model=16, num_heads=2, d_ff=24,
                        max_seq_len=12, attn_dropout_rate=0.3, attn_dropout_mask="hash",
                        prefix_avg_removal=0.4)


def test_model_query_block_and_einsum_paths_draw_the_same_hash_masks():
  """DecoderLM in training with hash masks: the query-block path (attention_impl auto)
  and the einsum path (the explicit probabilities, the same masks over the whole
  square) give the same logits and gradients from the same dropout key; threefry masks
  give other logits (the knob selects)."""
  from rankjax._src.models.transformer import DecoderLM
  tokens = jax.random.randint(jax.random.key(3), (2, 11), 0, 37)

  params = jax.jit(DecoderLM(CFG).init)(jax.random.key(0), tokens)

  def run(cfg, grad=True):
    f = lambda p: DecoderLM(cfg).apply(p, tokens, deterministic=False,
                                       rngs={"dropout": jax.random.key(9)})
    return jax.jit(lambda p: (f(p), jax.grad(lambda p: jnp.sum(jnp.sin(f(p))))(p)) if grad
                   else f(p))(params)
  fast, ref = run(CFG), run(with_kernels(CFG, attention_impl="einsum"))
  chex.assert_trees_all_close(fast, ref, rtol=2e-5, atol=2e-6)
  threefry = run(dataclasses.replace(CFG, attn_dropout_mask="threefry"), grad=False)
  assert float(jnp.max(jnp.abs(threefry - fast[0]))) > 1e-2


def test_attn_dropout_mask_is_a_validated_setting():
  assert TransformerConfig().attn_dropout_mask == "threefry"   # recorded runs keep their bits
  with pytest.raises(ValueError, match=r"attn_dropout_mask='philox'.*\['threefry', 'hash'\]"):
    TransformerConfig(attn_dropout_mask="philox")
  cfg = config_lib.override(config_lib.TrainConfig(), ["model.attn_dropout_mask=hash"])
  assert cfg.model.attn_dropout_mask == "hash"


def test_softmax_study_paper_scale_takes_the_hash_path_and_quick_keeps_threefry():
  """The paper step (not trained here: no committed number depends on its masks) selects
  the fast path; the quick scales, whose trained results are committed, keep threefry."""
  from experiments.softmax_sensitivity import prepost_training as pt
  paper = config_lib.override(
      config_lib.from_json(config_lib.TrainConfig, pt.CONFIGS["paper"]), pt.SCALE_SETS["paper"])
  assert (paper.model.attn_dropout_rate, paper.model.attn_dropout_mask) == (0.1, "hash")
  quick = config_lib.from_json(config_lib.TrainConfig, pt.CONFIGS["quick"])
  assert (quick.model.attn_dropout_rate, quick.model.attn_dropout_mask) == (0.1, "threefry")
  assert not re.search("attn_dropout_mask", " ".join(pt.SCALE_SETS.get("quick_deep", ())))
  import sys
  sys.path.insert(0, "experiments/benchmarks")
  try:
    import device_check
  finally:
    sys.path.pop(0)
  # the device check times the study's step as the study runs it (but its log cadence)
  assert set(device_check.SOFTMAX_SETS) == set(pt.SCALE_SETS["paper"]) - {"log_every=10"}


def test_cudnn_fused_dropout_takes_its_seed_at_compile_time():
  """Why cuDNN's fused dropout (a private jax API) is not taken (attention.py's
  docstring): lowered for CUDA from this CPU (cuDNN's version checks answered as for an
  H100), its forward and backward custom calls carry the seed as a constant of their
  backend config, and two dropout keys cannot reach it (the operands are q, k, v only).
  If a jax release makes the seed an operand, this fails and the route is worth
  reopening."""
  from unittest import mock
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_lib
  x = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16)

  def loss(q, k, v):
    out = cudnn_lib.dot_product_attention(q, k, v, scale=0.125, dropout_rate=0.1,
                                          mask_type=cudnn_lib.MaskType.CAUSAL)
    return jnp.sum(out.astype(jnp.float32))
  with mock.patch.object(cudnn_lib, "check_cudnn_version", return_value=91000), \
       mock.patch.object(cudnn_lib, "check_compute_capability", return_value=True):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(x, x, x).lower(
        lowering_platforms=("cuda",)).as_text()
  calls = re.findall(r"stablehlo.custom_call @(__cudnn\$\w+)\(([^)]*)\)", text)
  assert sorted(c for c, _ in calls) == ["__cudnn$fmhaSoftmaxDropout",
                                         "__cudnn$fmhaSoftmaxDropoutBackward"]
  assert len(calls[0][1].split(",")) == 3                  # q, k, v: no seed operand
  assert re.findall(r"\\22seed\\22: (\d+)", text) == ["42", "42"]
