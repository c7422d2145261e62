"""The diagnostics registry and the diagnostics step variant."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.train import diagnostics as diag_lib
from rankjax._src.train import state as state_lib
from rankjax._src.train.tasks import make_task
from tests.train.conftest import tiny_mlp


@pytest.fixture
def custom():
  @diag_lib.register("test_output_rms", needs_capture=True)
  def output_rms(d: diag_lib.DiagInputs):
    return {"stream_rms": jnp.sqrt(jnp.mean(jnp.square(d.activations["stream"]), axis=(1, 2))),
            "loss": d.loss, "step": d.step}

  yield "test_output_rms"
  diag_lib._REGISTRY.pop("test_output_rms")


def test_register_resolve_and_errors(custom):
  assert custom in diag_lib.available() and "basic" in diag_lib.available()
  assert [d.name for d in diag_lib.resolve(["basic", custom])] == ["basic", custom]
  with pytest.raises(ValueError, match=r"unknown diagnostics \['nope'\]; registered:"):
    diag_lib.resolve(["nope"])
  with pytest.raises(ValueError, match="contain no '/'"):
    diag_lib.register("a/b")
  bad = diag_lib.Diagnostic("bad", lambda d: {"a.b": jnp.zeros(())})
  with pytest.raises(ValueError, match="keys must be"):
    diag_lib.compute([bad], None)


def test_diagnostics_step_runs_registered_functions(custom):
  """MLP classifier: the custom and the basic diagnostic on the last micro-batch."""
  cfg = tiny_mlp(batch_size=8, grad_accum=2, diag_examples=3)
  task = make_task(cfg)
  params = jax.jit(task.init)(jax.random.PRNGKey(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 4, cfg.model.input_dim))
  batch = {"inputs": x, "targets": jnp.zeros((2, 4), jnp.int32)}
  grads = jax.tree.map(jnp.ones_like, params)
  state = state_lib.TrainState(params=params, opt_state=None, step=jnp.int32(6),
                               rng=jax.random.PRNGKey(0))
  diags = diag_lib.resolve([custom, "basic"])
  out = jax.jit(lambda s, b, g: state_lib.run_diagnostics(task, cfg, diags, s, b, g, 1.5))(
      state, batch, grads)
  assert out[custom]["step"] == 7 and out[custom]["loss"] == 1.5
  assert out[custom]["stream_rms"].shape == (cfg.model.depth,)
  stream = task.model.apply({"params": params}, x[-1, :3], capture=True,
                            mutable=["intermediates"])[1]["intermediates"]["stream"][0]
  np.testing.assert_allclose(out[custom]["stream_rms"],
                             np.sqrt(np.mean(np.square(stream), axis=(1, 2))), rtol=1e-5)
  basic = out["basic"]
  per_layer = np.sqrt(sum(np.prod(v.shape[1:]) for v in jax.tree.leaves(params["blocks"])))
  np.testing.assert_allclose(basic["grad_norm"], np.full(cfg.model.depth, per_layer), rtol=1e-6)
  assert basic["batch_similarity_stream"].shape == (cfg.model.depth,)
