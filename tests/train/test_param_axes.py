"""Parameters declare their logical axes where they are created
(``rankjax._src.models.annotated``): the shardings they give equal the name table they
replaced, an unannotated parameter is refused in one line, and a plug-in's opt-in
fallback shards it by its largest dimension."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from rankjax._src import config as config_lib
from rankjax._src import numerics
from rankjax._src.config import TrainConfig
from rankjax._src.errors import UserError
from rankjax._src.train import sharding as shard_lib
from rankjax._src.train import tasks
from rankjax._src.train.state import make_init, make_optimizer
from tests.train.conftest import ROOT, tiny_lm, tiny_mlp

# The name table the annotations replaced (rankjax._src.train.sharding.PARAM_RULES at 0e90c80),
# kept here as the reference the annotations must reproduce.
OLD_RULES = {
    "embedding": ("vocab", "embed"), "pos_embed": ("length", "embed"),
    "lm_head": ("embed", "vocab"),
    "w_q": ("embed", "heads"), "w_k": ("embed", "heads"), "w_v": ("embed", "heads"),
    "w_o": ("heads", "embed"),
    "b_q": ("heads",), "b_k": ("heads",), "b_v": ("heads",), "b_o": ("embed",),
    "w_1": ("embed", "mlp"), "w_3": ("embed", "mlp"), "w_2": ("mlp", "embed"),
    "b_1": ("mlp",), "b_3": ("mlp",), "b_2": ("embed",),
    "scale": ("norm",), "bias": ("norm",),
    "w_in": ("input", "embed"), "w_out": ("embed", "classes"),
    "w_up": ("embed", "mlp"), "w_gate": ("embed", "mlp"), "w_down": ("mlp", "embed"),
    "w": ("embed", "mlp"), "p_scale": ("norm",), "b_scale": ("norm",), "r_scale": ("norm",),
}
MESHES = ({"data": 2, "fsdp": 4}, {"data": 1, "fsdp": 8}, {"data": 4, "fsdp": 2},
          {"data": 3, "fsdp": 5})


def _old_spec(path, shape, mesh, roots):
  """The old name-based ``param_spec`` (rule by leaf name, else the largest dimension)."""
  keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
  name = next((k for k in reversed(keys) if isinstance(k, str)), None)
  stacked = any(k in roots for k in keys)
  rule = OLD_RULES.get(name)
  lead = ("layers",) if stacked and len(shape) >= 1 else ()
  if rule is None or len(lead) + len(rule) != len(shape):
    return shard_lib.spec_for(shape, mesh["fsdp"], stacked)
  spec = [("fsdp" if a == "embed" and mesh["fsdp"] > 1 and n % mesh["fsdp"] == 0 else None)
          for n, a in zip(shape, (*lead, *rule))]
  return P(*spec) if any(spec) else P()


def _old_state_specs(abstract, mesh, roots, zero1):
  def leaf(path, x):
    names = [getattr(k, "name", None) for k in path]
    spec = _old_spec(path, tuple(x.shape), mesh, roots)
    if zero1 and "opt_state" in names:
      spec = shard_lib.zero1_spec(spec, tuple(x.shape), mesh["data"], mesh["fsdp"],
                                  any(getattr(k, "key", None) in roots for k in path))
    if "rng" in names[:1] or "step" in names[:1]:
      spec = P()
    return spec
  return jax.tree_util.tree_map_with_path(leaf, abstract)


def _paper_configs():
  out = [tiny_lm(), tiny_mlp(),
         tiny_lm(model=dataclasses.replace(tiny_lm().model, attn_bias=True, ffn_bias=True,
                                           ffn="swiglu", pos_embedding="learned",
                                           tie_embeddings=False, norm_bias=True))]
  for name in ("gpt2_774m", "lm_tiny_shakespeare", "postnorm_48l_d512_c4", "mlp_classifier",
               "mlp_classifier_fashion_mnist"):
    cfg = config_lib.from_json(TrainConfig, ROOT / "experiments" / "configs" / f"{name}.json")
    if cfg.model.kind == "mlp" and cfg.model.input_dim is None:
      cfg = dataclasses.replace(cfg, model=dataclasses.replace(
          cfg.model, input_dim=64, num_classes=10))
    out.append(cfg)
  return out


def test_annotations_give_the_old_name_table_specs_for_every_paper_config():
  for cfg in _paper_configs():
    task = tasks.make_task(cfg)
    tx = make_optimizer(cfg, task.stacked_roots)
    abstract = jax.eval_shape(make_init(task, tx, 0))
    axes = task.param_axes()
    assert jax.tree.structure(axes) == jax.tree.structure(abstract.params)
    for mesh in MESHES:
      for zero1 in (False, True):
        new = shard_lib.state_specs(abstract, mesh, axes, zero1)
        old = _old_state_specs(abstract, mesh, task.stacked_roots, zero1)
        assert new == old, (cfg.model.kind, mesh, zero1)
    # the kind: norm gains and biases exactly the leaves the old name rule picked
    for (path, _), a in zip(jax.tree_util.tree_leaves_with_path(abstract.params),
                            jax.tree.leaves(axes)):
      name = path[-1].key
      assert numerics.is_norm_param(a) == (name in ("scale", "bias") or name.endswith("_scale"))


class _Toy(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param("w", nn.with_logical_partitioning(nn.initializers.ones, ("embed", "mlp")),
                   (x.shape[-1], 8))
    return nn.Dense(3, name="head")(x @ w)


def _toy_task(**kw):
  return tasks.ClassifierTask("toy", "images", _Toy(), {"inputs": ((4,), jnp.float32),
                                                        "targets": ((), jnp.int32)},
                              1, (), **kw)


def test_an_unannotated_parameter_is_refused_in_one_line():
  with pytest.raises(UserError, match=r"^parameter head/bias declares no logical axes: "
                     r"[^\n]*unannotated_params='fallback'\)$"):
    _toy_task().param_axes()
  with pytest.raises(UserError, match="unannotated_params='maybe'"):
    _toy_task(unannotated_params="maybe").param_axes()


def test_the_plugin_fallback_shards_by_the_largest_dimension():
  task = _toy_task(unannotated_params="fallback")
  axes = task.param_axes()
  assert axes == {"w": P("embed", "mlp"), "head": {"kernel": P("unannotated", "unannotated"),
                                                   "bias": P("norm")}}
  params = jax.eval_shape(task.init, jax.random.key(0))
  specs = shard_lib.state_specs(params, {"data": 1, "fsdp": 4}, axes)
  assert specs == {"w": P("fsdp", None), "head": {"kernel": P("fsdp", None), "bias": P()}}
  # kind: the matrix is cast and counted, the 1-D bias kept and not counted
  copy = jax.eval_shape(lambda p: numerics.compute_copy(p, jnp.bfloat16, axes), params)
  assert (copy["head"]["kernel"].dtype, copy["head"]["bias"].dtype) == (jnp.bfloat16, jnp.float32)
  assert task.matmul_params() == 4 * 8 + 8 * 3


def test_models_return_plain_arrays_and_annotate_the_stack():
  task = tasks.make_task(tiny_lm())
  params = jax.eval_shape(task.init, jax.random.key(0))
  assert not any(isinstance(x, nn.meta.AxisMetadata) for x in jax.tree.leaves(
      params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata)))
  assert task.param_axes()["layers"]["attn"]["w_q"] == P("layers", "embed", "heads")
