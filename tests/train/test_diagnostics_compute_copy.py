"""The diagnostics step reads the training step's compute copy of the parameters
(``numerics.compute_copy``, the one mixed-precision rule): under bfloat16 the forward
pass and loss it measures are the training step's bit for bit, and within bfloat16's
rounding of float32's."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src import numerics
from rankjax._src.models.lm_head import head_cross_entropy
from rankjax._src.train import diagnostics as diag_lib, loop, sharding as shard_lib, tasks
from tests.train.conftest import tiny_lm

FAMILIES = {   # the Post-Norm paper's model (RMSNorm, SwiGLU, RoPE) and the GPT-2 one
    "llama": dict(norm_op="rms", ffn="swiglu", pos_embedding="rope"),
    "gpt2": dict(norm_op="layer", ffn="gelu", pos_embedding="learned", attn_bias=True,
                 norm_bias=True, tie_embeddings=True)}


def _dtypes(tree) -> dict[str, jnp.dtype]:
  return {jax.tree_util.keystr(k): x.dtype for k, x in jax.tree_util.tree_leaves_with_path(tree)}


def _diag_step(cfg):
  """One diagnostics step from the initial state on a fixed batch: the float32 initial
  parameters, the step's metrics, its diagnostics ("basic" and ``training_forward``:
  the training loss (``LMTask.loss``'s head and cross-entropy) of the model applied to
  the parameters the diagnostics read, as the diagnostics apply it, on their examples)
  and the dtypes of the parameters the diagnostics saw."""
  seen = {}

  def training_forward(d):       # the model on the parameters as the diagnostics read them
    seen.update(_dtypes(d.params))
    lm = d.model.cfg
    h, w = d.model.apply({"params": d.params}, d.batch["inputs"], return_hidden=True)
    return {"loss": head_cross_entropy(h.reshape(-1, h.shape[-1]), w,
                                       d.batch["targets"].reshape(-1), lm.vocab_size,
                                       lm.kernels.loss_chunk)}

  diags = diag_lib.resolve(("basic",)) + (diag_lib.Diagnostic("training_forward",
                                                              training_forward),)
  c = loop.build(cfg, diags=diags)
  toks = np.random.default_rng(0).integers(0, 257, (cfg.batch_size, cfg.seq_len + 1))
  batch = shard_lib.global_batch({"inputs": toks[:, :-1].astype(np.int32),
                                  "targets": toks[:, 1:].astype(np.int32)},
                                 cfg.grad_accum, c.batch_sharding)
  state = c.init()
  params = jax.device_get(state.params)
  _, metrics, out = c.diag_step(state, batch)       # donates state
  return params, jax.device_get(metrics), jax.device_get(out), seen


# one case in the default suite (about 5 s on 2 cores), the others slow; the GPT-2 one
# has learned positions, which the diagnostics' earlier rule (float32 embedding tables)
# added unrounded: its loss differed from the training step's (1e-4 relative here)
@pytest.mark.parametrize("family, placement", [
    ("gpt2", "post"), *[pytest.param(f, p, marks=pytest.mark.slow)
                        for f, p in (("gpt2", "pre"), ("llama", "pre"), ("llama", "post"))]])
def test_diagnostics_measure_the_training_forward_pass(family, placement):
  lm = dataclasses.replace(tiny_lm().model, norm_position=placement, dropout_rate=0.0,
                           max_seq_len=32, **FAMILIES[family])
  # the diagnostic examples are the whole (one) micro-batch: the training loss of the
  # update is the loss of exactly the examples the diagnostics read
  cfg = tiny_lm(model=lm, seq_len=32, batch_size=4, grad_accum=1, compute_dtype="bfloat16",
                diag_every=1, diag_examples=4)
  params, metrics, out, seen = _diag_step(cfg)

  # the parameters the diagnostics read are the training step's compute copy: matrices
  # and embedding tables bfloat16, norm gains and biases float32
  axes = tasks.make_task(cfg).param_axes()
  assert seen == _dtypes(numerics.compute_copy(params, jnp.bfloat16, axes))
  assert seen["['layers']['attn']['w_q']"] == seen["['embed']['embedding']"] == jnp.bfloat16
  assert any(d == jnp.float32 for k, d in seen.items() if "norm" in k)
  if family == "gpt2":
    assert seen["['pos_embed']"] == jnp.bfloat16
  # ... so the forward pass they measure is the training step's, bit for bit
  np.testing.assert_array_equal(out["training_forward"]["loss"], metrics["loss"])

  # independently: within bfloat16's rounding of the float32 step's (same parameters)
  params32, metrics32, out32, seen32 = _diag_step(dataclasses.replace(cfg,
                                                                      compute_dtype="float32"))
  jax.tree.map(np.testing.assert_array_equal, params32, params)
  assert set(seen32.values()) == {jnp.dtype(jnp.float32)}
  # (float32's two forward passes, the step's under grad and the diagnostics', may be
  # fused differently by XLA: equal to float32's rounding, not asserted bit for bit)
  np.testing.assert_allclose(out32["training_forward"]["loss"], metrics32["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics["loss"], metrics32["loss"], rtol=1e-2)
  for key, want in out32["basic"].items():
    tol = dict(rtol=0.0, atol=3e-2) if key.startswith("tsim") else dict(rtol=5e-2, atol=1e-6)
    np.testing.assert_allclose(out["basic"][key], want, err_msg=key, **tol)
