"""Matmul precision of the measurements: the lowered dots, and the emulated error."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import export

from rankjax._src.config import MLPConfig
from rankjax._src.measure import decoder_jacobians, jacobians, paths, representations
from rankjax._src.measure import precision as precision_lib
from rankjax._src.models import hf, transformer

CFG = MLPConfig(depth=3, width=8, expansion=2.0, norm_position="pre")


def _lowered(jitted, args, platform):
  if platform == "cpu":
    return jitted.lower(*args).as_text()
  return export.export(jitted, platforms=[platform])(*args).mlir_module()


@pytest.mark.parametrize("platform", ["cpu", "cuda", "tpu"])
def test_every_dot_of_the_study_is_highest_by_default(platform):
  fn = jacobians.make_study_fn(CFG, 1, 2)
  text = _lowered(fn.jitted, fn.args(jax.random.PRNGKey(0), 1.0, 1.0), platform)
  dots = precision_lib.lowered_dot_precisions(text)
  assert len(dots) >= 5 and set(dots) == {"HIGHEST"}, dots


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_a_named_precision_reaches_every_dot(platform):
  fn = jacobians.make_study_fn(CFG, 1, 2, precision="high")
  dots = precision_lib.lowered_dot_precisions(
      _lowered(fn.jitted, fn.args(jax.random.PRNGKey(0), 1.0, 1.0), platform))
  assert dots and set(dots) == {"HIGH"}, dots


def test_other_entry_points_lower_at_highest_for_cuda():
  # lowering needs only the arguments' shapes and dtypes (nothing is computed)
  blocks, h0 = jax.eval_shape(lambda k: jacobians.seed_samples(CFG, k, 4), jax.random.PRNGKey(0))
  h0_D = jax.ShapeDtypeStruct(h0.shape[1:], h0.dtype)
  bj = jax.eval_shape(lambda b, h: jacobians.block_jacobians(b, h, CFG), blocks, h0_D)
  gpt2 = hf.gpt2_config({"n_embd": 64, "n_head": 2, "n_layer": 2, "vocab_size": 50,
                         "n_positions": 8})
  params = jax.eval_shape(lambda k: transformer.DecoderLM(gpt2).init(
      k, jnp.zeros((1, 5), jnp.int32))["params"], jax.random.PRNGKey(0))
  h_LxTxD = jax.eval_shape(lambda p: decoder_jacobians.ffn_inputs(gpt2, p, jnp.arange(5)),
                           params)
  cases = [
      (jax.jit(lambda b: paths.path_sums(b, 0.5).unit), (bj.branch,)),
      (jax.jit(lambda b, h: jacobians.input_output_jacobians(
          jacobians.block_jacobians(b, h, CFG), CFG)), (blocks, h0_D)),
      (jax.jit(lambda l, h: decoder_jacobians.ffn_jacobians(gpt2, l, h)),
       (params["layers"], jax.ShapeDtypeStruct(h_LxTxD.shape[:1] + h_LxTxD.shape[2:],
                                               h_LxTxD.dtype))),
      (jax.jit(lambda p, t: decoder_jacobians.ffn_inputs(gpt2, p, t)),
       (params, jnp.arange(5))),
      (jax.jit(lambda b, x: representations.trace_representations(b, x, CFG, [1, 3])),
       (blocks, h0)),
  ]
  for jitted, args in cases:
    dots = precision_lib.lowered_dot_precisions(_lowered(jitted, args, "cuda"))
    assert dots and set(dots) == {"HIGHEST"}, (jitted, dots)


def test_precision_is_inherited_and_overridable():
  a = jnp.ones((4, 4))
  with precision_lib.matmul_precision("high"):
    inner = jax.jit(lambda x: paths.block_cosines(x[None].repeat(2, 0)))
    assert set(precision_lib.lowered_dot_precisions(inner.lower(a).as_text())) == {"HIGH"}
  outer = jax.jit(lambda x: paths.block_cosines(x[None].repeat(2, 0), precision="default"))
  assert set(precision_lib.lowered_dot_precisions(outer.lower(a).as_text())) == {"DEFAULT"}


def test_bad_precision_is_one_clear_error():
  with pytest.raises(ValueError, match="precision='fast'; choose one of"):
    jacobians.make_study_fn(CFG, 1, 1, precision="fast")
  with pytest.raises(ValueError, match="precision='tf32'"):
    paths.path_sums(jnp.ones((2, 3, 3)), precision="tf32")
  with pytest.raises(ValueError, match="algorithm 'x'"):
    precision_lib.emulate(jnp.dot, "x")


def test_round_mantissa_is_bfloat16_and_tf32_rounding():
  x = np.random.default_rng(0).normal(size=4096).astype(np.float32) * 1e3
  bf = np.asarray(precision_lib.round_mantissa(jnp.asarray(x), 7))
  np.testing.assert_array_equal(bf, x.astype(ml_dtypes.bfloat16).astype(np.float32))
  tf = np.asarray(precision_lib.round_mantissa(jnp.asarray(x), 10), np.float64)
  rel = np.abs(tf - x) / np.abs(x)
  assert rel.max() <= 2.0 ** -11 and rel.max() > 2.0 ** -13     # half an ulp of 10 bits
  bits = tf.astype(np.float32).view(np.uint32)
  assert np.all(bits & 0x1FFF == 0)


def test_emulated_dot_matches_rounded_operands_in_float64():
  rng = np.random.default_rng(1)
  a, b = (rng.normal(size=(64, 64)).astype(np.float32) for _ in range(2))
  exact = a.astype(np.float64) @ b.astype(np.float64)
  bf = lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float64)
  one_pass = precision_lib.emulate(jnp.matmul, "bf16")(a, b)
  np.testing.assert_allclose(one_pass, bf(a) @ bf(b), rtol=1e-5, atol=1e-5)
  lo = lambda x: bf((x - bf(x)).astype(np.float32))
  three = bf(a) @ bf(b) + bf(a) @ lo(b) + lo(a) @ bf(b)
  np.testing.assert_allclose(precision_lib.emulate(jnp.matmul, "bf16_3x")(a, b), three,
                             rtol=1e-5, atol=1e-5)
  errs = {n: precision_lib.relative_error(precision_lib.emulate(jnp.matmul, n)(a, b), exact)
          for n in ("f32", "bf16_3x", "tf32", "bf16")}
  assert errs["f32"] < 1e-6 < errs["bf16_3x"] < 1e-4 < errs["tf32"] < errs["bf16"] < 1e-2


def test_emulated_study_error_grows_with_coarser_dots(x64):
  cfg32 = MLPConfig(depth=8, width=32, expansion=4.0, norm_position="pre")
  cfg64 = MLPConfig(depth=8, width=32, expansion=4.0, norm_position="pre",
                    param_dtype="float64")
  blocks, h0 = jacobians.seed_samples(cfg32, jax.random.PRNGKey(3), 1)
  ts = lambda b, h: jacobians.input_output_jacobians(
      jacobians.block_jacobians(b, h, cfg32), cfg32)[-1]
  b64 = jax.tree.map(lambda x: x.astype(jnp.float64), blocks)
  exact = jax.jit(lambda b, h: jacobians.input_output_jacobians(
      jacobians.block_jacobians(b, h, cfg64), cfg64)[-1])(b64, h0[0].astype(jnp.float64))
  errs = {n: precision_lib.relative_error(jax.jit(precision_lib.emulate(ts, n))(blocks, h0[0]),
                                          exact)
          for n in ("f32", "bf16_3x", "tf32", "bf16")}
  assert errs["f32"] < 1e-5 and errs["f32"] < errs["bf16_3x"] < errs["tf32"] < errs["bf16"]
  assert errs["bf16"] > 1e-3, errs
