"""Checkpoints written with the LM's earlier norm names restore under the new ones."""

from __future__ import annotations

import collections
import dataclasses
import shutil

import jax
import numpy as np
import pytest

from rankjax.config import TransformerConfig
from rankjax.models import transformer
from rankjax.train import checkpoint as ckpt_lib
from tests.train.conftest import losses, tiny_lm

_Adam = collections.namedtuple("_Adam", "count mu nu")


def _old_norm_names(cfg):
  """The names before the (sublayer, location) rename (the code this replaced)."""
  p, b, r = cfg.norm_ops
  names = {}
  for sub, op, loc in (("attn", p, "p"), ("attn", b, "b"), ("ffn", p, "p"), ("ffn", b, "b")):
    if op != "none":
      names[(sub, loc)] = f"norm_{sub}_{'in' if loc == 'p' else 'out'}"
  if r != "none":
    names[("attn", "r")] = "norm_attn_res" if p != "none" else "norm_ffn_in"
    names[("ffn", "r")] = "norm_out"
  return names


@pytest.mark.parametrize("position, p_norm", [("post", None), ("pre", None), ("peri", None),
                                              ("output", None), ("post", "layer")])
def test_legacy_renames_map_each_old_name_to_its_sublayer_and_location(position, p_norm):
  cfg = TransformerConfig(norm_position=position, p_norm=p_norm)
  old, new = _old_norm_names(cfg), transformer.norm_names(cfg)
  assert transformer.legacy_norm_renames(cfg) == {old[k]: new[k] for k in old}
  assert set(new.values()).isdisjoint(old.values())        # the rename is one way


def test_rename_keys_reaches_params_and_optimizer_state_and_finds_old_names():
  state = {"params": {"layers": {"norm_out": {"scale": 1}, "attn": {"w": 2}}},
           "opt": (_Adam(0, {"layers": {"norm_out": {"scale": 3}}}, [{"norm_out": 4}]),)}
  renamed = ckpt_lib.rename_keys(state, {"norm_out": "norm_ffn_r"})
  assert renamed["params"]["layers"] == {"norm_ffn_r": {"scale": 1}, "attn": {"w": 2}}
  assert renamed["opt"][0].mu == {"layers": {"norm_ffn_r": {"scale": 3}}}
  assert renamed["opt"][0].nu == [{"norm_ffn_r": 4}] and type(renamed["opt"][0]) is _Adam
  assert ckpt_lib.saved_renames(state, {"norm_out": "norm_ffn_r", "norm_x": "y"}) == \
      {"norm_out": "norm_ffn_r"}
  assert ckpt_lib.saved_renames(renamed, {"norm_out": "norm_ffn_r"}) == {}


@pytest.mark.slow   # two tiny LM trainings (~20 s); the rename pieces are tested above
def test_run_written_with_old_names_resumes_exactly_and_loads(compile_cache, tmp_path,
                                                              monkeypatch):
  import orbax.checkpoint as ocp
  from rankjax.train import loop
  from rankjax.train.run_reader import load_run
  cfg = tiny_lm(diag_every=0, eval_every=0, total_steps=8, checkpoint_every=4, max_to_keep=2)
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, norm_position="post"))
  full = tmp_path / "full"
  loop.train(cfg, full, progress_bar=False)

  old = tmp_path / "old"                 # the same run, written by the earlier code
  monkeypatch.setattr(transformer, "norm_names", _old_norm_names)
  loop._build_cached.cache_clear()
  loop.train(cfg, old, progress_bar=False)
  shutil.rmtree(old / "checkpoints" / "8")           # it stopped after step 4
  manager = ocp.CheckpointManager(str(old / "checkpoints"), item_handlers=ckpt_lib.handlers())
  held = ckpt_lib._keys(manager.item_metadata(4)["state"].tree)
  manager.close()
  assert {"norm_ffn_in", "norm_out"} <= held and "norm_ffn_r" not in held

  monkeypatch.undo()
  loop._build_cached.cache_clear()
  run = load_run(old)
  assert {"norm_attn_r", "norm_ffn_r"} <= set(run.params["layers"])
  assert "norm_out" not in run.params["layers"]
  np.testing.assert_array_equal(run.params["layers"]["norm_ffn_r"]["scale"],
                                load_run(full, step=4).params["layers"]["norm_ffn_r"]["scale"])
  # resumed by the current code, it continues the old run's trajectory bit for bit
  loop.train(cfg, old, progress_bar=False)
  assert losses(old) == losses(full)
  assert jax.tree.structure(load_run(old).params) == jax.tree.structure(load_run(full).params)
