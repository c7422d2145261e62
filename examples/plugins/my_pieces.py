"""A user's own diagnostic and model, trained by ``rankjax train`` without editing
the library (tested by ``tests/test_plugins.py``)::

  rankjax train --import examples/plugins/my_pieces.py \
      --config experiments/configs/mlp_classifier.json --workdir runs/plain \
      --set model.kind=plain_mlp --set dataset=digits --set model.input_dim=64 \
      --set model.num_classes=10 --set 'diagnostics=["logit_margin"]' --set diag_every=10

``--import`` takes a module name on the import path or a ``.py`` path
(``rankjax train --help``). The model kind ``plain_mlp`` is a non-residual ReLU MLP
classifier of ``model.depth`` hidden layers of ``model.width`` units, configured by
``PlainMLPConfig`` (``--set model.kind=plain_mlp`` starts from its defaults; its JSON
form is ``"model": {"kind": "plain_mlp", ...}``); the diagnostic
``logit_margin`` is the mean gap between the two largest logits on the diagnostic
examples. Both land in metrics, checkpoints, ``load_run`` and TensorBoard like the
library's own. The task declares its norm placement (``norm_position="none"``: the
model has no norm), which ``rankjax report`` names; a task that declares none is
reported as "norm placement not declared by the plug-in". The library's parameters
declare their logical axes where they are created
(``flax.linen.with_logical_partitioning(init, ("embed", "mlp"))``: sharding and mixed
precision read them); ``nn.Dense``'s do not, so the task opts into the fallback
(``unannotated_params="fallback"``).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from rankjax import config, train


@dataclasses.dataclass(frozen=True)
class PlainMLPConfig(config.ModelConfig):
  """``depth`` hidden layers of ``width`` units; ``input_dim`` and ``num_classes`` must
  match the data set."""

  depth: int = 2
  width: int = 64
  input_dim: int | None = None
  num_classes: int | None = None

  def __post_init__(self):
    config.check("depth", self.depth, "positive int")
    config.check("width", self.width, "positive int")
    config.check("input_dim", self.input_dim, "positive int", optional=True)
    config.check("num_classes", self.num_classes, "positive int", optional=True)


class PlainMLP(nn.Module):
  """``depth`` Dense+ReLU layers of ``width`` units, then a Dense classifier."""

  width: int
  depth: int
  num_classes: int

  @nn.compact
  def __call__(self, x):
    for _ in range(self.depth):
      x = nn.relu(nn.Dense(self.width)(x))
    return nn.Dense(self.num_classes)(x)


@dataclasses.dataclass(frozen=True)
class PlainMLPTask(train.ClassifierTask):
  """The library's classifier loss and accuracy on a model of one's own."""

  input_dim: int = 0

  def capture(self, params, batch):
    raise ValueError("plain_mlp has no residual stream to capture; use diagnostics "
                     "without needs_capture (e.g. logit_margin)")

  def data_requirements(self):
    return dict(num_classes=self.model.num_classes, input_dim=self.input_dim)


def plain_mlp_task(cfg):
  m = cfg.model
  if m.input_dim is None or m.num_classes is None:
    raise ValueError("model kind 'plain_mlp' needs model.input_dim and model.num_classes")
  model = PlainMLP(width=m.width, depth=m.depth, num_classes=m.num_classes)
  spec = {"inputs": ((m.input_dim,), jnp.float32), "targets": ((), jnp.int32)}
  # nn.Dense's parameters declare no logical axes: the task opts into the fallback
  # (a matrix sharded over fsdp along its largest divisible dimension, a bias replicated
  # and kept in its dtype); without it training refuses them in one line
  return PlainMLPTask("plain_mlp", "images", model, spec, 1, (), jnp.dtype(cfg.compute_dtype),
                      norm_position="none", unannotated_params="fallback",
                      input_dim=m.input_dim)


def logit_margin(d: train.DiagInputs) -> dict[str, jax.Array]:
  """Mean over the diagnostic examples of (largest - second largest logit)."""
  logits = d.model.apply({"params": d.params}, d.batch["inputs"])
  top2 = jax.lax.top_k(logits, 2)[0]
  return {"margin": jnp.mean(top2[:, 0] - top2[:, 1])}


config.register_model_config("plain_mlp", PlainMLPConfig)
train.register_task("plain_mlp", plain_mlp_task)
train.register_diagnostic("logit_margin", logit_margin)
