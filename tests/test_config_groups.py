"""TransformerConfig's fields grouped by what they change (config format 3): the
architecture at the top level, ``rope`` (RopeConfig) and ``kernels`` (KernelConfig);
``--set`` paths, the JSON form, format 2 converted on read and by convert-config, old
flat names refused in one line naming the new path."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from rankjax._src import config
from rankjax._src.config import KernelConfig, RopeConfig, TrainConfig, TransformerConfig

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

# a model whose every group differs from its defaults
LM = TransformerConfig(num_layers=2, d_model=32, num_heads=2, d_ff=64, max_seq_len=16,
                       pos_embedding="rope",
                       rope=RopeConfig(base=500.0, scaling="yarn", factor=4.0,
                                       original_max_len=64, beta_fast=16.0, truncate=False,
                                       attention_factor=1.1),
                       kernels=KernelConfig(remat="dots", attention_impl="einsum",
                                            vocab_multiple=8, loss_chunk=32, scan_unroll=2,
                                            fused_projections=True,
                                            grad_reduce_dtype="compute"))
CFG = TrainConfig(model=LM, seq_len=16, batch_size=4, warmup_steps=1, total_steps=2)


def _format2(data: dict) -> dict:
  """A format 3 TrainConfig dict as rankjax wrote it in format 2: the model's
  ``rope`` and ``kernels`` objects flat (``rope_base``, ``remat``, ...), written
  independently of ``MOVED``."""
  model = dict(data["model"])
  rope, kernels = model.pop("rope"), model.pop("kernels")
  model.update({f"rope_{k}": v for k, v in rope.items()})
  model.update(kernels)
  return {**data, "format": 2, "model": model}


def test_the_groups_hold_their_fields_and_moved_names_each_once():
  top = {f.name for f in dataclasses.fields(TransformerConfig)}
  rope = {f.name for f in dataclasses.fields(RopeConfig)}
  kernels = {f.name for f in dataclasses.fields(KernelConfig)}
  assert rope == {"base", "scaling", "factor", "low_freq_factor", "high_freq_factor",
                  "original_max_len", "beta_fast", "beta_slow", "truncate", "attention_factor"}
  assert kernels == {"remat", "attention_impl", "attn_dropout_kernel", "vocab_multiple",
                     "loss_chunk", "scan_unroll", "fused_projections", "grad_reduce_dtype"}
  assert len(top) == 37 and {"rope", "kernels", "pos_embedding"} <= top   # 53 before
  assert set(TransformerConfig.MOVED) == {f"rope_{n}" for n in rope} | kernels
  assert not set(TransformerConfig.MOVED) & top
  assert sorted(TransformerConfig.MOVED.values()) == sorted(
      [f"rope.{n}" for n in rope] + [f"kernels.{n}" for n in kernels])
  assert TransformerConfig().rope == RopeConfig() and TransformerConfig().kernels == KernelConfig()
  assert LM.padded_vocab_size == 264                 # 257 rounded up to kernels.vocab_multiple
  hash(LM)                                           # frozen all the way down


@pytest.mark.parametrize("build,message", [
    (lambda: RopeConfig(base=0.0), "rope.base=0.0 must be a positive number"),
    (lambda: RopeConfig(scaling="ntk"), "rope.scaling='ntk' is not allowed; choose one of "
                                         "['none', 'linear', 'llama3', 'yarn']"),
    (lambda: RopeConfig(scaling="yarn", beta_slow=40.0),
     "rope.scaling='yarn' needs 0 < rope.beta_slow < rope.beta_fast; got 40.0, 32.0"),
    (lambda: RopeConfig(scaling="llama3", low_freq_factor=5.0),
     "rope.scaling='llama3' needs 0 < rope.low_freq_factor < rope.high_freq_factor; got "
     "5.0, 4.0"),
    (lambda: RopeConfig(original_max_len=0), "rope.original_max_len=0 must be a positive"),
    (lambda: KernelConfig(remat="some"), "kernels.remat='some' is not allowed"),
    (lambda: KernelConfig(loss_chunk=-1), "kernels.loss_chunk=-1 must be an integer >= 0"),
    (lambda: KernelConfig(vocab_multiple=0), "kernels.vocab_multiple=0 must be a positive"),
    (lambda: KernelConfig(scan_unroll=0), "kernels.scan_unroll=0 must be a positive"),
    (lambda: KernelConfig(attention_impl="flash"), "kernels.attention_impl='flash' is not"),
    (lambda: TransformerConfig(rope={"base": 1.0}),
     "rope={'base': 1.0} must be a RopeConfig"),
    (lambda: TransformerConfig(kernels=None), "kernels=None must be a KernelConfig"),
])
def test_sub_configs_refuse_bad_values_in_one_line_naming_the_path(build, message):
  with pytest.raises(ValueError) as e:
    build()
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_json_nests_the_groups_and_round_trips():
  data = config.to_dict(CFG)
  assert data["format"] == config.FORMAT == 3
  assert data["model"]["rope"]["base"] == 500.0 and data["model"]["kernels"]["remat"] == "dots"
  assert "rope_base" not in data["model"] and "remat" not in data["model"]
  assert config.from_json(TrainConfig, config.to_json(CFG)) == CFG
  assert config.diff(TrainConfig(), CFG)["model.rope.base"] == (10000.0, 500.0)


def test_set_reaches_the_groups_and_refuses_the_old_flat_names():
  got = config.override(TrainConfig(), ["model.rope.base=500.0", "model.kernels.remat=full",
                                        "model.kernels.fused_projections=true"])
  assert got.model.rope == RopeConfig(base=500.0)
  assert got.model.kernels == KernelConfig(remat="full", fused_projections=True)
  assert got.model == dataclasses.replace(TransformerConfig(), rope=got.model.rope,
                                          kernels=got.model.kernels)
  for old, new in [("model.rope_base=5", "model.rope.base"),
                   ("model.rope_scaling=yarn", "model.rope.scaling"),
                   ("model.remat=full", "model.kernels.remat"),
                   ("model.attention_impl=xla", "model.kernels.attention_impl")]:
    with pytest.raises(ValueError) as e:
      config.override(TrainConfig(), [old])
    assert str(e.value) == (f"--set {old.split('=')[0]}: now {new} (since config format 3)")
  with pytest.raises(ValueError, match=r"^--set: kernels\.remat='some' is not allowed"):
    config.override(TrainConfig(), ["model.kernels.remat=some"])
  with pytest.raises(ValueError, match=r"unknown config key 'model\.rope\.bas' in --set; "
                                       r"known keys: .*did you mean 'base'\?"):
    config.override(TrainConfig(), ["model.rope.bas=5"])
  with pytest.raises(ValueError, match=r"^TransformerConfig field 'rope_base' is 'rope\.base' "
                                       r"since config format 3"):
    config.from_dict(TransformerConfig, {"rope_base": 5.0})


def test_format_2_is_converted_on_read_and_equals_the_new_config(tmp_path):
  old = _format2(config.to_dict(CFG))
  assert config.from_dict(TrainConfig, old) == CFG
  path = tmp_path / "config.json"
  path.write_text(json.dumps(old))
  assert config.from_json(TrainConfig, path) == CFG
  # a run folder written in format 2: the resume check and the finished check read it
  from rankjax._src.train import checkpoint, run_reader
  assert checkpoint.check_workdir_config(tmp_path, CFG)
  with pytest.raises(ValueError, match=r"model\.kernels\.remat: 'dots' \(saved\) vs 'full'"):
    checkpoint.check_workdir_config(tmp_path, config.override(CFG, ["model.kernels.remat=full"]))
  (tmp_path / "checkpoints" / "2").mkdir(parents=True)
  assert run_reader.finished(str(tmp_path), CFG)
  # an unknown kind in format 2 is left for from_dict to refuse, as in format 3
  with pytest.raises(ValueError, match="model kind 'cnn' is not registered"):
    config.from_dict(TrainConfig, {**old, "model": {"kind": "cnn", "remat": "full"}})


def test_every_committed_format_2_config_reads_with_its_values_in_the_groups():
  """The results files keep the config they ran with in format 2 (settings.config):
  each reads, every flat value lands in its group, nothing is dropped."""
  paths = sorted((ROOT / "experiments").glob("*/results/*/*.json"))
  seen = 0
  for path in paths:
    doc = json.loads(path.read_text())
    stored = doc.get("settings") if isinstance(doc, dict) else None
    stored = stored.get("config") if isinstance(stored, dict) else None
    if not (isinstance(stored, dict) and stored.get("format") == 2):
      continue
    cfg = config.from_dict(TrainConfig, stored)
    flat = dict(stored["model"])
    for old, new in TransformerConfig.MOVED.items():
      if old in flat:
        group, name = new.split(".")
        assert getattr(getattr(cfg.model, group), name) == flat.pop(old), (path, old)
    flat.pop("kind")
    assert {k: getattr(cfg.model, k) for k in flat} == flat, path
    seen += 1
  assert seen >= 5


def test_convert_config_rewrites_format_2_and_keeps_the_original(tmp_path):
  old = json.loads(json.dumps(_format2(config.to_dict(CFG))))     # lists, as read back
  (tmp_path / "config.json").write_text(json.dumps(old))
  path, backup = config.convert_file(tmp_path, TrainConfig)
  assert backup == tmp_path / "config.json.format2" and json.loads(backup.read_text()) == old
  written = json.loads(path.read_text())
  assert written["format"] == 3 and written["model"]["rope"]["beta_fast"] == 16.0
  assert config.from_json(TrainConfig, path) == CFG
  with pytest.raises(ValueError, match="has config format 3, not 1 or 2: nothing to convert"):
    config.convert_file(path, TrainConfig)


def test_step_shape_sees_the_groups():
  """Runs differing in a kernel knob or a RoPE setting are different programs."""
  other = dataclasses.replace(CFG, model=dataclasses.replace(
      LM, kernels=dataclasses.replace(LM.kernels, remat="full")))
  assert config.step_shape(other) != config.step_shape(CFG)
  seed = dataclasses.replace(CFG, seed=3)                           # per-run: one program
  assert config.step_shape(seed) == config.step_shape(CFG)
  rope = dataclasses.replace(CFG, model=dataclasses.replace(LM, rope=RopeConfig(base=9.0)))
  assert config.step_shape(rope) != config.step_shape(CFG)


def test_rope_frequencies_read_the_sub_config():
  """``attention.rope_frequencies(d_head, RopeConfig)`` against the formulas in float64
  numpy: RoFormer Eq. 34's ``base^(-2i/d)``, linear interpolation's ``/ factor``, and the
  Llama 3.1 rule at its three bands."""
  from rankjax._src.models import attention
  d = 16
  theta = 500.0 ** (-np.arange(0, d, 2, dtype=np.float64) / d)
  np.testing.assert_allclose(attention.rope_frequencies(d, RopeConfig(base=500.0)), theta,
                             rtol=1e-6)
  np.testing.assert_allclose(
      attention.rope_frequencies(d, RopeConfig(base=500.0, scaling="linear", factor=4.0)),
      theta / 4.0, rtol=1e-6)
  cfg = RopeConfig(base=500.0, scaling="llama3", factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_len=64)
  wavelength = 2 * np.pi / theta
  smooth = (64 / wavelength - 1.0) / (4.0 - 1.0)
  want = np.where(wavelength > 64 / 1.0, theta / 8.0, np.where(
      wavelength < 64 / 4.0, theta, (1 - smooth) * theta / 8.0 + smooth * theta))
  assert (wavelength > 64).any() and (wavelength < 16).any() and (
      (wavelength >= 16) & (wavelength <= 64)).any()              # every band is exercised
  np.testing.assert_allclose(attention.rope_frequencies(d, cfg), want, rtol=1e-6)
