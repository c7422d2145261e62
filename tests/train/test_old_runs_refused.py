"""Runs written by earlier code are refused in one line, never read under other names:
a config.json of config format 1 (``rankjax convert-config`` rewrites it) and a
checkpoint whose parameter names are not the model's."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from rankjax._src import cli
from rankjax._src import config as config_lib
from rankjax._src.models import transformer
from rankjax._src.train import checkpoint as ckpt_lib
from tests.train.conftest import tiny_lm, tiny_mlp


def _format1(data: dict) -> dict:
  """A format 2 TrainConfig dict as rankjax wrote it before config format 2."""
  data = dict(data)
  data.pop("format")
  model = dict(data.pop("model"))
  kind = model.pop("kind")
  return {"model": {"transformer": "lm", "mlp": "mlp"}[kind],
          {"transformer": "lm", "mlp": "mlp"}[kind]: model, **data}


def test_check_param_names_refuses_other_names_in_one_line():
  params = {"layers": {"norm_ffn_r": {"scale": 1}, "attn": {"w": 2}}}
  ckpt_lib.check_param_names("here", params, {"layers": {"attn": {"w": 0},
                                                         "norm_ffn_r": {"scale": 0}}})
  old = {"layers": {"norm_out": {"scale": 1}, "attn": {"w": 2}}}
  with pytest.raises(ValueError) as e:
    ckpt_lib.check_param_names("checkpoint step 4 in d", old, params)
  assert str(e.value) == (
      "checkpoint step 4 in d holds parameters named otherwise than this config's model "
      "(saved only: layers/norm_out/scale; model only: layers/norm_ffn_r/scale): written by "
      "other model code, and parameters are never renamed on restore")


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
  from rankjax._src.train import loop
  cfg = tiny_mlp(total_steps=4, async_checkpointing=False)
  workdir = tmp_path_factory.mktemp("mlp") / "run"
  loop.train(cfg, workdir, progress_bar=False)
  return cfg, workdir


def test_a_format_1_run_is_refused_in_one_line_until_converted(mlp_run, tmp_path, capsys):
  from rankjax._src.train.run_reader import load_run
  cfg, written = mlp_run
  workdir = tmp_path / "run"
  shutil.copytree(written, workdir)
  path = workdir / "config.json"
  path.write_text(json.dumps(_format1(config_lib.to_dict(cfg)), indent=2) + "\n")
  with pytest.raises(config_lib.FormatError, match=f"^config {path} written by rankjax "
                                                   "before config format 2 "):
    load_run(workdir)
  given = tmp_path / "given.json"
  cfg.to_json(given)
  capsys.readouterr()
  assert cli.main(["train", "--config", str(given), "--workdir", str(workdir)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "before config format 2" in err[0] and "convert-config" in err[0]

  assert cli.main(["convert-config", str(workdir)]) == 0
  assert "rewritten in config format 3" in capsys.readouterr().out
  assert (workdir / "config.json.format1").is_file()
  run = load_run(workdir)
  assert run.config == cfg and run.step == 4
  assert cli.main(["train", "--config", str(given), "--workdir", str(workdir)]) == 0


def test_a_checkpoint_of_other_parameter_names_is_refused_by_load_run(mlp_run, tmp_path):
  from rankjax._src.train.run_reader import load_run
  cfg, written = mlp_run
  workdir = tmp_path / "run"
  shutil.copytree(written, workdir)
  other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, norm_gain=True))
  config_lib.to_json(other, workdir / "config.json")     # a model with norm gains
  with pytest.raises(ValueError) as e:
    load_run(workdir)
  assert "holds parameters named otherwise than this config's model (saved only: none; " \
      "model only: " in str(e.value) and "\n" not in str(e.value)


def _old_norm_names(cfg):
  """The LM's norm names before the (sublayer, location) names."""
  p, b, r = cfg.norm_ops
  names = {}
  for sub, op, loc in (("attn", p, "p"), ("attn", b, "b"), ("ffn", p, "p"), ("ffn", b, "b")):
    if op != "none":
      names[(sub, loc)] = f"norm_{sub}_{'in' if loc == 'p' else 'out'}"
  if r != "none":
    names[("attn", "r")] = "norm_attn_res" if p != "none" else "norm_ffn_in"
    names[("ffn", "r")] = "norm_out"
  return names


@pytest.mark.slow   # a tiny LM training written under the old names (~10 s)
def test_a_run_with_old_parameter_names_is_refused_on_resume(compile_cache, tmp_path,
                                                             monkeypatch, capsys):
  from rankjax._src.train import loop
  cfg = tiny_lm(diag_every=0, eval_every=0, total_steps=8, checkpoint_every=4, max_to_keep=2,
                stop_at=4)
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, norm_position="post"))
  old = tmp_path / "old"
  monkeypatch.setattr(transformer, "norm_names", _old_norm_names)
  loop._build_cached.cache_clear()
  loop.train(cfg, old, progress_bar=False)
  monkeypatch.undo()
  loop._build_cached.cache_clear()
  resumed = dataclasses.replace(cfg, stop_at=0)
  given = tmp_path / "given.json"
  resumed.to_json(given)
  capsys.readouterr()
  assert cli.main(["train", "--config", str(given), "--workdir", str(old)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "checkpoint step 4 in" in err[0]
  assert "saved only: layers/norm_ffn_in/scale, layers/norm_out/scale" in err[0]
  assert (old / "checkpoints" / "4").is_dir()              # nothing moved


@pytest.mark.slow   # a tiny LM trained, then resumed (~10 s)
def test_a_format_2_run_folder_loads_and_resumes(compile_cache, tmp_path, capsys):
  """A run written in config format 2 (the model's RoPE settings and kernel knobs flat in
  its config.json) is read converted: load_run gives the format 3 config, and the same
  run given in format 3 resumes it to the end."""
  from rankjax._src.train import loop
  from rankjax._src.train.run_reader import load_run
  lm = dataclasses.replace(tiny_lm().model, pos_embedding="rope",
                           rope=config_lib.RopeConfig(base=500.0),
                           kernels=config_lib.KernelConfig(loss_chunk=16, remat="dots"))
  cfg = tiny_lm(model=lm, diag_every=0, eval_every=0, total_steps=8, checkpoint_every=4,
                stop_at=4)
  workdir = tmp_path / "run"
  loop.train(cfg, workdir, progress_bar=False)
  data = json.loads((workdir / "config.json").read_text())
  model = data["model"]
  model.update({f"rope_{k}": v for k, v in model.pop("rope").items()})
  model.update(model.pop("kernels"))
  (workdir / "config.json").write_text(json.dumps({**data, "format": 2}, indent=2))
  run = load_run(workdir)
  assert run.config == cfg and run.step == 4
  given = tmp_path / "given.json"
  dataclasses.replace(cfg, stop_at=0).to_json(given)
  capsys.readouterr()
  assert cli.main(["train", "--config", str(given), "--workdir", str(workdir)]) == 0
  assert load_run(workdir).step == 8
