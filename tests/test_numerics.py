"""The one mixed-precision rule (numerics.compute_copy) in both model families."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rankjax._src import numerics
from rankjax._src.config import MLPConfig, TransformerConfig
from rankjax._src.models import annotated, blocks
from rankjax._src.models.mlp import ResidualMLP
from rankjax._src.models.transformer import DecoderLM


def _dtypes(tree):
  return {jax.tree_util.keystr(p): x.dtype for p, x in
          jax.tree_util.tree_leaves_with_path(tree)}


def test_matrices_are_cast_and_norm_gains_and_biases_are_not():
  lm = TransformerConfig(vocab_size=11, num_layers=2, d_model=8, num_heads=2, d_ff=16,
                         max_seq_len=4, norm_position="pre", norm_op="layer")
  mlp = MLPConfig(width=8, depth=2, input_dim=5, num_classes=3, norm_position="peri",
                  norm_op="rms", norm_gain=True)
  tokens = jnp.zeros((1, 4), jnp.int32)
  for model, x in ((DecoderLM(lm), tokens), (ResidualMLP(mlp), jnp.zeros((1, 5)))):
    params = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
    # the kind is read from the logical axes the parameters were created with
    axes = annotated.logical_axes(
        jax.eval_shape(model.init_annotated, jax.random.key(0), x)["params"])
    cast = _dtypes(jax.eval_shape(lambda p: numerics.compute_copy(p, jnp.bfloat16, axes),
                                  params))
    kept = {k for k, d in cast.items() if d == jnp.float32}
    assert kept and all(k.endswith(("['scale']", "['bias']", "_scale']")) for k in kept), kept
    assert any(d == jnp.bfloat16 for d in cast.values())
  assert "['blocks']['p_scale']" in kept and "['w_in']" not in kept
  same = {"w": jnp.ones(2, jnp.float32)}
  assert numerics.compute_copy(same, jnp.float32, {"w": P("embed")})["w"] is same["w"]


def test_mlp_norms_compute_in_float32_and_keep_the_stream_dtype():
  """A bf16 stream through a float32 gain stays bf16 (before: promoted to float32 by
  the gain), and equals the float32 norm rounded once."""
  cfg = MLPConfig(width=16, depth=1, norm_position="pre", norm_op="rms", norm_gain=True)
  x = jax.random.normal(jax.random.key(1), (4, 16)) * 3.0
  gain = {"p_scale": jnp.linspace(0.5, 1.5, 16, dtype=jnp.float32)}
  y16 = blocks._norm(gain, "p", "rms", x.astype(jnp.bfloat16), cfg.norm_eps)
  assert y16.dtype == jnp.bfloat16
  ref = blocks._norm(gain, "p", "rms", x.astype(jnp.bfloat16).astype(jnp.float32),
                     cfg.norm_eps)
  np.testing.assert_array_equal(np.asarray(y16, np.float32),
                                np.asarray(ref.astype(jnp.bfloat16), np.float32))
