"""The attention kernel registry: the selector's choice for every (setting, need), its
refusals, the declarations against what the kernels compute (float64 numpy), grouped
K/V passed natively against copied, and the prefix removal's two forms against C_n."""

import dataclasses
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from rankjax._src.errors import UserError
from rankjax._src.models import attention_kernels as ak

BF16, F32, F64 = jnp.bfloat16, jnp.float32, jnp.float64


def _need(dtype=BF16, t=256, d_head=64, **kw):
  return ak.Need(dtype, t, d_head, **kw)


def _pick(impl="auto", mask="threefry", kernel="auto", dropout=False, **need):
  return ak.select(ak.Settings(impl, kernel),
                   _need(dropout=mask if dropout else None, **need)).name


# (settings, need) -> the kernel, written out from the rules (config docs of
# attention_impl, attn_dropout_mask, attn_dropout_kernel), not from the selector
CHOICES = [
    # auto, no dropout: the backend's fused kernel where it applies, else xla
    (dict(backend="cpu"), "xla"),
    (dict(backend="gpu"), "cudnn"),
    (dict(backend="gpu", dtype=F32), "xla"),             # cuDNN: 16-bit only
    (dict(backend="gpu", d_head=12), "xla"),             # cuDNN: d_head % 8
    (dict(backend="gpu", d_head=256), "xla"),            # cuDNN: d_head <= 128
    (dict(backend="tpu"), "splash"),
    (dict(backend="tpu", t=100), "xla"),                 # splash: T % 128
    (dict(backend="gpu", prefix=True), "cudnn"),         # the output form of P - alpha C_n
    # auto: the probabilities (capture) and float64 only on the einsum path
    (dict(backend="gpu", capture=True), "einsum"),
    (dict(backend="tpu", dtype=F64), "einsum"),
    (dict(backend="gpu", dtype=F64, dropout=True), "einsum"),
    (dict(backend="cpu", capture=True, mask="hash", dropout=True), "einsum"),
    # einsum wins every time
    *[(dict(impl="einsum", backend=b, **n), "einsum") for b in ("cpu", "gpu", "tpu")
      for n in ({}, {"dropout": True}, {"dropout": True, "mask": "hash"}, {"capture": True})],
    # explicit fused kernels, any backend (a step may be lowered for another platform)
    (dict(impl="xla", backend="gpu"), "xla"),
    (dict(impl="cudnn", backend="cpu"), "cudnn"),
    (dict(impl="splash", backend="gpu"), "splash"),
    (dict(impl="xla", backend="cpu", prefix=True, dtype=F32), "xla"),
    # dropout in training: attn_dropout_mask and attn_dropout_kernel choose, not attention_impl
    *[(dict(impl=i, backend="gpu", dropout=True), "blocks") for i in ("auto", "xla", "cudnn", "splash")],
    (dict(backend="cpu", dropout=True, mask="hash"), "hash_blocks"),
    (dict(backend="gpu", dropout=True, mask="hash"), "flash"),
    (dict(impl="xla", backend="gpu", dropout=True, mask="hash"), "flash"),
    (dict(backend="gpu", dropout=True, mask="hash", dtype=F32), "hash_blocks"),
    (dict(backend="gpu", dropout=True, mask="hash", prefix=True), "hash_blocks"),
    (dict(backend="gpu", dropout=True, mask="hash", d_head=48), "hash_blocks"),
    (dict(backend="gpu", dropout=True, mask="hash", t=70000), "hash_blocks"),
    (dict(backend="gpu", dropout=True, mask="hash", kernel="blocks"), "hash_blocks"),
    (dict(backend="cpu", dropout=True, mask="hash", kernel="pallas", dtype=F32), "flash"),
    (dict(backend="cpu", dropout=True, mask="hash", kernel="pallas", prefix=True), "hash_blocks"),
    (dict(backend="gpu", dropout=True, mask="threefry", kernel="pallas"), "blocks"),
]


@pytest.mark.parametrize("case,want", CHOICES)
def test_selector_choice(case, want):
  case = dict(case)
  settings = {k: case.pop(k) for k in ("impl", "mask", "kernel") if k in case}
  assert _pick(**settings, **case) == want


def test_declarations_decide_the_refusals():
  flash, blocks = ak.KERNELS["flash"], ak.KERNELS["blocks"]
  assert flash.refusal(_need(dropout="hash")) is None
  assert flash.refusal(_need(dropout="threefry")) == "has no attention dropout with threefry masks"
  assert flash.refusal(_need(dropout="hash", prefix=True)).startswith("has no prefix removal")
  assert blocks.refusal(_need(dropout="threefry", prefix=True, dtype=F64)) is None
  assert ak.KERNELS["xla"].refusal(_need(dropout="hash")).startswith("has no attention dropout")


def test_auto_follows_the_default_backend():
  with mock.patch.object(jax, "default_backend", return_value="gpu"):
    assert _pick() == "cudnn"
  assert _pick(dtype=F32) == "xla"   # this CPU


REFUSED = [
    (dict(impl="cudnn", dtype=F64), "attention_impl='cudnn' computes no float64 softmax"),
    (dict(impl="xla", dtype=F64), "attention_impl='xla' computes no float64 softmax"),
    (dict(impl="xla", dtype=F64, dropout=True), "attention_impl='xla' computes no float64"),
    (dict(impl="cudnn", dtype=F32), "attention_impl='cudnn' takes bfloat16, float16, not float32"),
    (dict(impl="cudnn", d_head=12), "attention_impl='cudnn' needs d_head a multiple of 8 up to 128, not 12"),
    (dict(impl="splash", t=100), "attention_impl='splash' needs a sequence length that is a multiple of 128, not 100"),
    (dict(impl="flash_attention"), "attention_impl 'flash_attention'; choose auto, einsum, xla, cudnn, splash"),
]


@pytest.mark.parametrize("case,message", REFUSED)
def test_selector_refuses_an_explicit_kernel_that_cannot_serve_the_call(case, message):
  with pytest.raises(UserError) as info:
    _pick(backend="gpu", **case)
  text = str(info.value)
  assert text.startswith(message) and "\n" not in text, text


def test_capture_takes_einsum_whatever_kernel_the_config_names():
  """A measurement's capture (the diagnostics in a run with an explicit fused kernel)
  gets the probabilities from einsum; the output is the fused kernel's function."""
  for impl in ("xla", "splash", "cudnn"):
    assert _pick(impl=impl, capture=True) == "einsum"
  from rankjax._src.config import KernelConfig, TransformerConfig
  from rankjax._src.models.attention import CausalSelfAttention
  cfg = TransformerConfig(vocab_size=37, num_layers=1, d_model=16, num_heads=2, d_ff=24,
                          max_seq_len=8, kernels=KernelConfig(attention_impl="xla"))
  x = jax.random.normal(jax.random.key(1), (1, 8, 16))
  module = CausalSelfAttention(cfg)
  params = module.init(jax.random.key(0), x)
  plain = module.apply(params, x)
  captured, state = module.apply(params, x, capture_probs=True, mutable=["intermediates"])
  probs = state["intermediates"]["attn_probs"][0]
  assert probs.shape == (1, 2, 8, 8)
  np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(captured, plain, rtol=1e-5, atol=1e-6)


# --- what the kernels compute ---------------------------------------------------------

def _numpy_attention(q, k, v, tau, alpha):
  """(P - alpha C_n) V in float64 numpy, K/V heads repeated, C_n by its definition."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  g = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
  t, dh = q.shape[1], q.shape[-1]
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / (np.sqrt(dh) * tau)
  logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  c = np.array([[1.0 / (i + 1) if j <= i else 0.0 for j in range(t)] for i in range(t)])
  return np.einsum("bhqk,bkhd->bqhd", p - alpha * c, v)


def _qkv(dtype, kv=3, t=10, heads=6, dh=8):
  keys = jax.random.split(jax.random.key(4), 3)
  return [jax.random.normal(key, (2, t, h, dh), dtype)
          for key, h in zip(keys, (heads, kv, kv))]


@pytest.mark.parametrize("name", ["einsum", "xla", "blocks", "hash_blocks"])
def test_every_kernel_is_the_formula_and_float64_where_it_declares_it(x64, name):
  """Each kernel runnable on this CPU, through ``attend`` with grouped K/V (3 kv heads
  for 6 query heads) and P - alpha C_n, at rate 0: float64 numpy's formula, to float64's
  rounding where the kernel declares float64, and visibly not where it does not (xla's
  softmax is float32)."""
  kernel = ak.KERNELS[name]
  q, k, v = _qkv(F64)
  request = ak.Request(tau=0.7, alpha=0.6)
  got = np.asarray(ak.attend(kernel, q, k, v, request))
  err = np.abs(got - _numpy_attention(q, k, v, 0.7, 0.6)).max()
  if kernel.float64:
    assert got.dtype == np.float64 and err < 1e-13, err
  else:
    assert 1e-12 < err < 1e-5, err


def test_only_the_probability_kernel_sows_and_drops_both_masks():
  q, k, v = _qkv(F32, kv=6, heads=6)
  sown = []
  ak.attend(ak.KERNELS["einsum"], q, k, v, ak.Request(sow=sown.append))
  assert len(sown) == 1 and sown[0].shape == (2, 6, 10, 10)
  assert [n for n, kern in ak.KERNELS.items() if kern.probabilities] == ["einsum"]
  for mask in ("threefry", "hash"):
    req = ak.Request(dropout_rate=0.5, dropout_mask=mask, rng=jax.random.key(1))
    assert not np.allclose(ak.attend(ak.KERNELS["einsum"], q, k, v, req),
                           ak.attend(ak.KERNELS["einsum"], q, k, v, ak.Request()))


@pytest.mark.parametrize("name", ["xla", "einsum"])
def test_grouped_kv_natively_equals_repeated(x64, name):
  """Grouped K/V (2 kv heads, 6 query heads) as the kernel takes them equal K/V
  repeated to every head: outputs and gradients in float64 (xla takes them grouped,
  einsum gets them repeated by ``kv_for``)."""
  kernel = ak.KERNELS[name]
  q, k, v = _qkv(F64, kv=2)
  rep = lambda a: jnp.repeat(a, 3, axis=2)
  request = ak.Request(tau=1.3, alpha=0.4)
  grouped = lambda q, k, v: ak.attend(kernel, q, k, v, request)
  repeated = lambda q, k, v: ak.attend(kernel, q, rep(k), rep(v), request)
  assert ak.kv_for(kernel, 6, k, v)[0].shape[2] == (2 if kernel.grouped_kv else 6)
  np.testing.assert_allclose(grouped(q, k, v), repeated(q, k, v), rtol=1e-12, atol=1e-12)
  loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
  for a, b in zip(jax.grad(loss(grouped), argnums=(0, 1, 2))(q, k, v),
                  jax.grad(loss(repeated), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_cudnn_takes_grouped_kv_lowered_for_cuda():
  """cuDNN's fused attention lowered for CUDA from this CPU gets K and V with their 2 kv
  heads (no (B, T, 4, D) copy of them anywhere), with P - alpha C_n on the output."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_lib
  q = jax.ShapeDtypeStruct((2, 128, 4, 64), BF16)
  kv = jax.ShapeDtypeStruct((2, 128, 2, 64), BF16)
  f = jax.jit(lambda q, k, v: ak.attend(ak.KERNELS["cudnn"], q, k, v, ak.Request(alpha=0.5)))
  with mock.patch.object(cudnn_lib, "check_cudnn_version", return_value=91000), \
       mock.patch.object(cudnn_lib, "check_compute_capability", return_value=True):
    text = export.export(f, platforms=["cuda"], disabled_checks=[
        export.DisabledSafetyCheck.custom_call("__cudnn$fmhaSoftmax")])(q, kv, kv).mlir_module()
  # the kernel's operands are the function's arguments q, k, v as given: no copy between
  assert re.search(r"custom_call @__cudnn\$fmhaSoftmax\(%arg0, %arg1, %arg2\)", text)
  assert re.search(r"%arg1: tensor<2x128x2x64xbf16>", text)


# --- the prefix removal (postnorm Cor 3.3) --------------------------------------------

def test_prefix_removal_on_the_output_equals_it_on_the_probabilities(x64):
  """``remove_prefix_mean(P V, V, alpha) = (P - alpha C_n) V`` with ``remove_prefix``'s
  P - alpha C_n, both against C_n written entry by entry (float64); grouped V (2 kv
  heads for 4 query heads) as V repeated."""
  rng = np.random.default_rng(0)
  b, t, h, kv, d, alpha = 2, 9, 4, 2, 5, 0.8
  p = rng.random((b, h, t, t))
  v = rng.normal(size=(b, t, kv, d))
  v_h = np.repeat(v, h // kv, axis=2)
  c = np.array([[1.0 / (i + 1) if j <= i else 0.0 for j in range(t)] for i in range(t)])
  corrected_p = np.asarray(ak.remove_prefix(jnp.asarray(p), alpha, jnp.arange(t)))
  np.testing.assert_allclose(corrected_p, p - alpha * c, rtol=1e-15, atol=1e-15)
  want = np.einsum("bhqk,bkhd->bqhd", p - alpha * c, v_h)
  pv = jnp.asarray(np.einsum("bhqk,bkhd->bqhd", p, v_h))
  for vals in (v, v_h):
    got = np.asarray(ak.remove_prefix_mean(pv, jnp.asarray(vals), alpha))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
  # rows 3..6 only, first 7 keys: the block form of the dropout paths
  rows = jnp.arange(3, 7)
  block = np.asarray(ak.remove_prefix(jnp.asarray(p[..., 3:7, :7]), alpha, rows))
  np.testing.assert_allclose(block, p[..., 3:7, :7] - alpha * c[3:7, :7], rtol=1e-15)


def test_prefix_rows_are_prefix_average_matrix():
  from rankjax._src.models.attention import prefix_average_matrix
  for dtype in (F32, BF16):
    np.testing.assert_array_equal(ak.prefix_rows(jnp.arange(11), 11, dtype),
                                  prefix_average_matrix(11, dtype))


def test_request_and_kernel_records_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    ak.Request().alpha = 1.0
  with pytest.raises(dataclasses.FrozenInstanceError):
    ak.KERNELS["xla"].grouped_kv = False
