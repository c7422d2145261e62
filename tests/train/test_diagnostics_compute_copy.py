"""The diagnostics step reads a compute-dtype copy of the parameters (half the bytes to
gather under bfloat16) and gives the diagnostics of float32 parameters bit for bit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax.train import loop, sharding as shard_lib, state as state_lib
from tests.train.conftest import tiny_lm

FAMILIES = {   # the Post-Norm paper's model (RMSNorm, SwiGLU, RoPE) and the GPT-2 one
    "llama": dict(norm_op="rms", ffn="swiglu", pos_embedding="rope"),
    "gpt2": dict(norm_op="layer", ffn="gelu", pos_embedding="learned", attn_bias=True,
                 norm_bias=True, tie_embeddings=True)}


def _diagnostics(cfg):
  c = loop.build(cfg)
  toks = np.random.default_rng(0).integers(0, 257, (cfg.batch_size, cfg.seq_len + 1))
  batch = shard_lib.global_batch({"inputs": toks[:, :-1].astype(np.int32),
                                  "targets": toks[:, 1:].astype(np.int32)},
                                 cfg.grad_accum, c.batch_sharding)
  return jax.device_get(c.diag_step(c.init(), batch)[2])


# one case in the default suite (about 12 s each on 2 cores), the others slow
@pytest.mark.parametrize("family, placement", [
    ("llama", "post"), *[pytest.param(f, p, marks=pytest.mark.slow)
                         for f, p in (("llama", "pre"), ("gpt2", "pre"), ("gpt2", "post"))]])
def test_bf16_copy_gives_the_diagnostics_of_float32_parameters(family, placement,
                                                               monkeypatch):
  lm = dataclasses.replace(tiny_lm().model, norm_position=placement, dropout_rate=0.0,
                           max_seq_len=32, **FAMILIES[family])
  cfg = tiny_lm(model=lm, seq_len=32, compute_dtype="bfloat16", diag_every=1, diag_examples=4,
                diagnostics=("basic", "postnorm", "attention"))
  copy = jax.eval_shape(lambda: state_lib.compute_copy(loop.build(cfg).init().params,
                                                      "bfloat16"))
  dtypes = {jax.tree_util.keystr(k): x.dtype for k, x in jax.tree_util.tree_leaves_with_path(copy)}
  assert dtypes["['layers']['attn']['w_q']"] == jnp.bfloat16
  assert all(d == jnp.float32 for k, d in dtypes.items() if "norm" in k or "embed" in k)
  got = _diagnostics(cfg)
  monkeypatch.setattr(state_lib, "compute_copy", lambda params, dtype: params)
  loop._build_cached.cache_clear()
  want = _diagnostics(cfg)
  for name in want:
    for key in want[name]:
      np.testing.assert_array_equal(got[name][key], want[name][key], err_msg=f"{name}/{key}")
