"""Attention: the fused kernel against the explicit probabilities, RoPE against rotation
matrices, P - alpha*C_n without C_n, and the compiled step's buffers and dots."""

import dataclasses
import re
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from rankjax._src.config import KernelConfig, TransformerConfig
from rankjax._src.errors import UserError
from rankjax._src.models import attention, attention_kernels
from rankjax._src.models.attention import CausalSelfAttention, prefix_average_matrix
from tests.conftest import with_kernels

CFG = TransformerConfig(vocab_size=37, num_layers=2, d_model=16, num_heads=2, d_ff=24,
                        max_seq_len=12)


# by default one with RoPE and one with P - alpha C_n, both with a temperature
@pytest.mark.parametrize("tau,alpha,pos", [
    pytest.param(1.0, 0.0, "none", marks=pytest.mark.slow), (0.6, 0.0, "rope"),
    (1.3, 0.7, "none"), pytest.param(1.0, 1.0, "rope", marks=pytest.mark.slow)])
def test_fused_equals_einsum_outputs_and_gradients(tau, alpha, pos):
  cfg = dataclasses.replace(CFG, tau=tau, prefix_avg_removal=alpha, pos_embedding=pos)
  x = jax.random.normal(jax.random.key(0), (2, 9, 16))
  fused = CausalSelfAttention(with_kernels(cfg, attention_impl="xla"))
  ref = CausalSelfAttention(with_kernels(cfg, attention_impl="einsum"))
  params = jax.jit(fused.init)(jax.random.key(1), x)

  def value_and_grads(module):
    def loss(p, v):
      return jnp.sum(jnp.sin(module.apply(p, v)))
    return jax.jit(lambda p, v: (jax.value_and_grad(loss, argnums=(0, 1))(p, v),
                                 module.apply(p, v)))(params, x)   # one compile

  (lf, gf), out_f = value_and_grads(fused)
  (lr, gr), out_r = value_and_grads(ref)
  np.testing.assert_allclose(out_f, out_r, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lf, lr, rtol=1e-5)
  chex.assert_trees_all_close(gf, gr, rtol=1e-4, atol=1e-6)


def test_prefix_mean_is_c_n_times_v():
  v = jax.random.normal(jax.random.key(2), (2, 7, 3, 4))
  expected = jnp.einsum("qk,bkhd->bqhd", prefix_average_matrix(7), v)
  np.testing.assert_allclose(attention_kernels.prefix_mean(v), expected, rtol=1e-6, atol=1e-7)


def _rotation(m: int, dh: int, base: float) -> np.ndarray:
  """RoFormer Eq. 34: block-diagonal 2x2 rotations by m * base^(-2i/dh)."""
  r = np.zeros((dh, dh))
  for i in range(dh // 2):
    a = m * base ** (-2 * i / dh)
    r[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]
  return r


def test_rope_matches_explicit_rotation_matrices():
  t, heads, dh, base = 6, 2, 8, 100.0
  x = np.asarray(jax.random.normal(jax.random.key(3), (1, t, heads, dh)), np.float64)
  got = np.asarray(attention.rope(jnp.asarray(x, jnp.float32), base))
  want = np.stack([x[0, m] @ _rotation(m, dh, base).T for m in range(t)])[None]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_rope_scores_depend_on_relative_position_only():
  dh, t = 8, 12
  q = jax.random.normal(jax.random.key(4), (dh,))
  k = jax.random.normal(jax.random.key(5), (dh,))
  seq = lambda v: jnp.broadcast_to(v, (1, t, 1, dh))
  rq, rk = attention.rope(seq(q))[0, :, 0], attention.rope(seq(k))[0, :, 0]
  scores = rq @ rk.T                                  # (T, T): <R_m q, R_n k>
  for offset in (-3, 0, 2, 5):
    diag = jnp.diagonal(scores, offset=offset)
    np.testing.assert_allclose(diag, diag[0], rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(scores[0, 0] - scores[0, 3])) > 1e-3   # but it depends on m - n


def test_auto_is_xla_on_cpu_and_a_forced_choice_stands():
  assert attention.kernel_for(CFG, jnp.bfloat16, 12).name == "xla"
  cudnn = with_kernels(CFG, attention_impl="cudnn")
  assert attention.kernel_for(cudnn, jnp.bfloat16, 12).name == "cudnn"   # any backend
  with pytest.raises(UserError, match="attention_impl='cudnn' takes bfloat16, float16, not float32"):
    attention.kernel_for(cudnn, jnp.float32, 12)


# --- the compiled step under bf16 compute ------------------------------------------

BF16 = TransformerConfig(vocab_size=300, num_layers=2, d_model=64, num_heads=2, d_ff=96,
                         max_seq_len=128, norm_position="pre", tie_embeddings=True,
                         compute_dtype="bfloat16", kernels=KernelConfig(vocab_multiple=128))
B, T = 2, 128


def _step_text(cfg, platform="cpu", t=T):
  """StableHLO of the LM training loss and its gradient (the plain step's compute)."""
  from rankjax._src.train import tasks
  from rankjax._src.config import TrainConfig
  task = tasks.make_task(TrainConfig(model=cfg, seq_len=t, batch_size=B, warmup_steps=1,
                                     total_steps=2, compute_dtype=cfg.compute_dtype))
  batch = {k: jax.ShapeDtypeStruct((B, t), jnp.int32) for k in ("inputs", "targets")}
  step = jax.jit(jax.grad(lambda p, b: task.loss(p, b, None, deterministic=True)[0]))
  if platform == "cpu":
    return step.lower(jax.eval_shape(task.init, jax.random.key(0)), batch).as_text()
  # Lowering for CUDA on a machine without one: cuDNN's version and compute-capability
  # checks are answered as for an H100/H200 (cuDNN 9.10, sm_90); nothing runs.
  targets = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_lib
  with mock.patch.object(cudnn_lib, "check_cudnn_version", return_value=91000), \
       mock.patch.object(cudnn_lib, "check_compute_capability", return_value=True):
    params = jax.eval_shape(task.init, jax.random.key(0))
    exported = export.export(
        step, platforms=[platform],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(t) for t in targets])(
            params, batch)
  return exported.mlir_module()


def _dots(text):
  """(lhs type, rhs type, result type) of every dot_general in a StableHLO module."""
  pattern = r"stablehlo\.dot_general[^\n]*:\s*\((tensor<[^>]*>),\s*(tensor<[^>]*>)\)\s*->\s*(tensor<[^>]*>)"
  return re.findall(pattern, text)


def test_bf16_step_head_dots_are_bf16():
  dots = _dots(_step_text(BF16))
  vp = BF16.padded_vocab_size
  head = [d for d in dots if any(f"x{vp}x" in t or f"<{vp}x" in t for t in d)]
  assert len(head) >= 3, head        # forward logits, d/dh and d/dW of the head
  for lhs, rhs, _ in head:
    assert lhs.endswith("xbf16>") and rhs.endswith("xbf16>"), (lhs, rhs)


def test_cudnn_step_has_no_txt_buffer():
  cfg = with_kernels(BF16, attention_impl="cudnn")
  text = _step_text(cfg, platform="cuda")
  assert "__cudnn$fmhaSoftmax" in text and "__cudnn$fmhaSoftmaxBackward" in text
  txt = re.findall(rf"tensor<(?:\d+x)*{T}x{T}x[a-z0-9]+>", text)
  assert txt == [], txt
  # the einsum reference does build (B, H, T, T) scores: the check can see them
  ref = _step_text(with_kernels(BF16, attention_impl="einsum"))
  assert re.findall(rf"tensor<{B}x{BF16.num_heads}x{T}x{T}x", ref)


def test_causal_probabilities_against_numpy(x64):
  """The one einsum attention: softmax(q k^T / (sqrt(d_head) tau)) over keys j <= i."""
  rng = np.random.default_rng(0)
  b, t, h, dh, tau = 2, 5, 3, 4, 0.7
  q, k = rng.normal(size=(2, b, t, h, dh))
  got = np.asarray(attention.causal_probabilities(jnp.asarray(q), jnp.asarray(k), tau))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / (np.sqrt(dh) * tau)
  logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
  want = np.exp(logits - logits.max(-1, keepdims=True))
  want /= want.sum(-1, keepdims=True)
  assert got.dtype == np.float64 and got.shape == (b, h, t, t)
  np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
  assert np.all(got[..., np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] == 0.0)


def test_auto_is_splash_on_tpu_where_its_blocks_tile_the_sequence():
  with mock.patch.object(jax, "default_backend", return_value="tpu"):
    assert attention.kernel_for(CFG, jnp.bfloat16, 256).name == "splash"
    assert attention.kernel_for(CFG, jnp.bfloat16, 100).name == "xla"


@pytest.mark.slow
@pytest.mark.parametrize("tau,alpha,pos", [(0.6, 0.0, "rope"), (1.3, 0.7, "none")])
def test_splash_module_equals_einsum_outputs_and_gradients(tau, alpha, pos):
  """The attention module on the splash path (Pallas' interpreter on this CPU), with
  temperature, RoPE and P - alpha C_n, against the explicit probabilities."""
  cfg = dataclasses.replace(CFG, max_seq_len=128, tau=tau, prefix_avg_removal=alpha,
                            pos_embedding=pos)
  x = jax.random.normal(jax.random.key(0), (1, 128, 16))
  splash = CausalSelfAttention(with_kernels(cfg, attention_impl="splash"))
  ref = CausalSelfAttention(with_kernels(cfg, attention_impl="einsum"))
  params = jax.jit(splash.init)(jax.random.key(1), x)

  def grads(module):
    return jax.jit(jax.grad(lambda p, v: jnp.sum(jnp.sin(module.apply(p, v))),
                            argnums=(0, 1)))(params, x)

  np.testing.assert_allclose(splash.apply(params, x), ref.apply(params, x), rtol=1e-5,
                             atol=1e-6)
  chex.assert_trees_all_close(grads(splash), grads(ref), rtol=1e-4, atol=1e-6)


def test_splash_step_lowered_for_tpu_has_no_txt_buffer():
  """The whole LM loss gradient under bf16 compute, exported for a TPU from this CPU:
  the Mosaic splash kernels, no (T, T) tensor anywhere."""
  t = 256      # not 128: the kernel keeps its softmax statistics lane-padded, (B, H, T, 128)
  text = _step_text(dataclasses.replace(with_kernels(BF16, attention_impl="splash"),
                                       max_seq_len=t), platform="tpu", t=t)
  assert text.count("tpu_custom_call") >= 2     # forward and backward, in the layer scan
  # no float (T, T) scores or probabilities (the kernel's integer block masks are
  # constants, not activations)
  txt = re.findall(rf"tensor<(?:\d+x)*{t}x{t}x(?:f|bf)\d+>", text)
  assert txt == [], txt


def _explicit(q, k, v, scale, alpha, rate, key, n):
  """Blocked attention written with the whole (B, H, T, T) matrix: the probabilities of
  ``causal_probabilities``, minus alpha C_n, the masks of each query block drawn as
  ``blocked_attention`` documents (``bernoulli(fold_in(key, i))``), concatenated."""
  t = q.shape[1]
  tau = 1.0 / (scale * np.sqrt(q.shape[-1]))
  p = attention.causal_probabilities(q, k, tau) - alpha * prefix_average_matrix(t)
  if rate:
    shape = (q.shape[0], q.shape[2], n, t)
    keep = jnp.concatenate([jax.random.bernoulli(jax.random.fold_in(key, i), 1 - rate, shape)
                            for i in range(t // n)], axis=2)
    p = jnp.where(keep, p / (1 - rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("t,alpha,rate", [(12, 0.0, 0.0), (12, 0.7, 0.0), (12, 0.0, 0.3),
                                          (12, 0.6, 0.1), (7, 0.0, 0.2)])
def test_blocked_attention_is_the_explicit_formula_with_its_masks(t, alpha, rate):
  """Outputs and gradients of the query-block path equal the explicit (T, T) formula
  with the same dropout masks (blocks of 4 rows; 7 rows: one block of 7)."""
  q, k, v = (jax.random.normal(jax.random.key(i), (2, t, 3, 4)) for i in range(3))
  key, scale = jax.random.key(5), 0.4
  n = attention_kernels.query_block(t, 4)
  assert n == (4 if t == 12 else 1)

  def loss(f):
    return lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))
  blocked = lambda q, k, v: attention.blocked_attention(q, k, v, scale, alpha, rate, key, 4)
  explicit = lambda q, k, v: _explicit(q, k, v, scale, alpha, rate, key, n)
  np.testing.assert_allclose(blocked(q, k, v), explicit(q, k, v), rtol=1e-5, atol=1e-6)
  gb = jax.grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
  ge = jax.grad(loss(explicit), argnums=(0, 1, 2))(q, k, v)
  chex.assert_trees_all_close(gb, ge, rtol=1e-4, atol=1e-6)
  if rate:    # about the declared share of the kept weights is dropped
    drop = jnp.stack([jax.random.bernoulli(jax.random.fold_in(key, i), 1 - rate, (2, 3, n, t))
                      for i in range(t // n)])
    assert abs(1 - float(drop.mean()) - rate) < 0.1


def _shapes(text: str) -> list[tuple[int, ...]]:
  """Every float32 tensor shape in a StableHLO module's text."""
  return [tuple(int(x) for x in m.group(1).split("x")[:-1])
          for m in re.finditer(r"tensor<((?:\d+x)+)f32>", text)]


def test_softmax_paper_config_with_attention_dropout_has_no_t_by_t_buffer_on_gpu():
  """The softmax study's paper LM (attention dropout 0.1, App D.1), shrunk in width and
  depth but not in T, exported for CUDA: the training gradient's module holds no float32
  tensor with two trailing dimensions of T (the study's hash-mask path forms blocks of
  128 x at most T, the threefry path 128 x T); the same model on the einsum path does
  (the check can fail)."""
  import optax
  from rankjax._src.models.transformer import DecoderLM
  from rankjax._src import config as config_lib
  from experiments.softmax_sensitivity import prepost_training as pt
  paper = config_lib.override(
      config_lib.from_json(config_lib.TrainConfig, "experiments/configs/gpt2_774m.json"),
      pt.SCALE_SETS["paper"])                         # the study's (hash masks)
  t = 512
  cfg = dataclasses.replace(paper.model, vocab_size=64, num_layers=2, d_model=64, num_heads=2,
                            d_ff=128, max_seq_len=t, compute_dtype="bfloat16")
  assert (cfg.attn_dropout_rate, cfg.dropout_rate, cfg.kernels.attention_impl) == (0.1, 0.1,
                                                                                   "auto")
  assert cfg.attn_dropout_mask == "hash"
  tokens = jnp.zeros((2, t + 1), jnp.int32)

  def exported(c):
    model = DecoderLM(c)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens[:, :-1]))

    def loss(p, rng):
      logits = model.apply(p, tokens[:, :-1], deterministic=False, rngs={"dropout": rng})
      return optax.softmax_cross_entropy_with_integer_labels(
          logits.astype(jnp.float32), tokens[:, 1:]).mean()
    f = jax.jit(jax.grad(loss))
    return export.export(f, platforms=("cuda",))(params, jax.random.key(1)).mlir_module()

  square = lambda text: [s for s in _shapes(text) if len(s) >= 2 and s[-2:] == (t, t)]
  assert not square(exported(cfg))
  assert not square(exported(dataclasses.replace(cfg, attn_dropout_mask="threefry")))
  assert square(exported(with_kernels(cfg, attention_impl="einsum")))


@pytest.mark.parametrize("platform,impl,t", [("cuda", "cudnn", T), ("tpu", "splash", 256)])
def test_remat_dots_runs_the_fused_kernel_forward_once(platform, impl, t):
  """Under remat="dots" the fused kernel's residuals (its output and softmax statistics,
  named ATTENTION_RESIDUALS) are saved, so the backward pass runs no second forward: one
  forward kernel per layer scan, as without remat; remat="full" saves nothing and runs
  it twice (the count can tell them apart). Lowered for a GPU (cuDNN) and a TPU (splash)
  from this CPU."""
  def forwards(remat):
    cfg = dataclasses.replace(with_kernels(BF16, attention_impl=impl, remat=remat),
                              max_seq_len=t)
    text = _step_text(cfg, platform=platform, t=t)
    if platform == "cuda":
      return text.count("__cudnn$fmhaSoftmax") - text.count("__cudnn$fmhaSoftmaxBackward")
    return len(re.findall(r'kernel_name = "splash_mha_fwd_residuals"', text))
  assert forwards("none") == forwards("dots") == 1
  assert forwards("full") == 2


def test_named_residuals_change_no_value_or_gradient():
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 16, 2, 8)) for i in range(3))
  kernel = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=0.3)
  wrapped = attention_kernels.with_named_residuals(kernel)
  loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
  np.testing.assert_array_equal(wrapped(q, k, v), kernel(q, k, v))
  for a, b in zip(jax.grad(loss(wrapped), argnums=(0, 1, 2))(q, k, v),
                  jax.grad(loss(kernel), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_array_equal(a, b)


def _float64_attention(q, k, v=None):
  """Causal softmax(q k^T / sqrt(d)) (and times v) in float64 numpy from the same inputs."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  t = q.shape[1]
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return p if v is None else np.einsum("bhqk,bkhd->bqhd", p, np.asarray(v, np.float64))


def _entropy(p):
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def test_bf16_queries_and_keys_give_float32_logits_at_t1024():
  """From bf16 q and k at T = 1024 (peaked rows: mean p_max about 0.76), p_max and the
  row entropy of the einsum path, and the blocked path's output, against float64 from
  the same bf16 values. Logits rounded to bf16 put p_max off by 10% and the entropy by
  0.076 nats here; formed in float32, both agree to float32's rounding."""
  t, h, d = 1024, 2, 16
  kq, kk, kv = jax.random.split(jax.random.key(0), 3)
  q, k = ((3.0 * jax.random.normal(key, (1, t, h, d))).astype(jnp.bfloat16)
          for key in (kq, kk))
  ref = _float64_attention(q, k)
  p = np.asarray(jax.jit(attention.causal_probabilities)(q, k), np.float64)
  assert np.abs(p.max(-1) / ref.max(-1) - 1).max() < 1e-4
  assert np.abs(_entropy(p) - _entropy(ref)).max() < 1e-4
  # the blocked (dropout) path, rate 0: float32 values, so the output shows the logits
  v = jax.random.normal(kv, (1, t, h, d), jnp.float32)
  out = jax.jit(lambda q, k, v: attention.blocked_attention(q, k, v, 1.0 / np.sqrt(d)))(
      q, k, v)
  np.testing.assert_allclose(out, _float64_attention(q, k, v), atol=2e-5)
