"""Config validation (one test per rule), JSON round trips, --set overrides, the model
kinds and the JSON format."""

import dataclasses
import json

import pytest

from rankjax._src import config
from rankjax._src.config import KernelConfig, MLPConfig, TrainConfig, TransformerConfig

MLP_BAD = [
    ("depth", 0), ("depth", -3), ("depth", 2.5),
    ("width", 0),
    ("expansion", 0.0), ("expansion", -1.0),
    ("branch_matrices", 3),
    ("activation", "sigmoid"),
    ("norm_position", "middle"),
    ("norm_op", "batch"),
    ("p_norm", "batch"), ("b_norm", "l2"), ("r_norm", "group"),
    ("norm_eps", -1e-6),
    ("alpha", -1.0),
    ("beta", -0.5),
    ("skip_every", -1),
    ("input_dim", 0),
    ("num_classes", 0),
    ("param_dtype", "int8"),
]

LM_BAD = [
    ("vocab_size", 0), ("num_layers", 0), ("d_model", -1), ("num_heads", 0),
    ("d_ff", 0), ("max_seq_len", 0),
    ("norm_position", "middle"), ("norm_op", "batch"), ("p_norm", "l2"), ("norm_eps", -1.0),
    ("ffn", "relu"), ("tau", 0.0), ("tau", -1.0), ("pos_embedding", "alibi"),
    ("init", "xavier"), ("init_scale", 0.0), ("embed_std", -0.1),
    ("prefix_avg_removal", -0.5), ("dropout_rate", 1.0), ("dropout_rate", -0.1),
    ("attn_dropout_rate", 1.5), ("compute_dtype", "float16"),
    ("embed_norm", "yes"), ("norm_bias", 1), ("beta", -1.0),
    ("attn_dropout_mask", "philox"),
]


@pytest.mark.parametrize("field,value", MLP_BAD)
def test_bad_mlp_field_names_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    MLPConfig(**{field: value})


@pytest.mark.parametrize("field,value", LM_BAD)
def test_bad_transformer_field_names_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    TransformerConfig(**{field: value})


def test_choice_errors_list_allowed_values():
  with pytest.raises(ValueError, match=r"\['pre', 'post', 'output', 'peri', 'none'\]"):
    MLPConfig(norm_position="middle")
  with pytest.raises(ValueError, match="relu"):
    MLPConfig(activation="sigmoid")


def _literal_fields(cls):
  """(field, allowed values, optional) of every Literal-typed field, from the hints."""
  import types
  import typing
  out = []
  for name, hint in typing.get_type_hints(cls).items():
    args = typing.get_args(hint)
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    optional = union and type(None) in args
    if optional:
      hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is typing.Literal:
      out.append((name, typing.get_args(hint), optional))
  return out


@pytest.mark.parametrize("cls", [MLPConfig, TransformerConfig, TrainConfig])
def test_every_string_choice_is_a_literal_checked_from_its_annotation(cls):
  """Each typed choice accepts exactly its Literal's values (and null when optional):
  a value outside them, or true for the choice 1, is one ValueError listing them."""
  fields = _literal_fields(cls)
  names = {n for n, _, _ in fields}
  expected = {MLPConfig: {"branch_matrices", "activation", "norm_position", "norm_op",
                          "p_norm", "b_norm", "r_norm", "param_dtype"},
              TrainConfig: {"optimizer", "lr_schedule", "compute_dtype"}}.get(cls)
  if expected is not None:
    assert names == expected
  base = {TrainConfig: dict(optimizer="adam", weight_decay=0.0)}.get(cls, {})
  for name, allowed, optional in fields:
    for value in allowed + ((None,) if optional else ()):
      if cls is TrainConfig and name == "optimizer" and value == "adamw":
        cls(**{name: value})                        # adamw with its default weight decay
      else:
        assert getattr(cls(**{**base, name: value}), name) == value
    bad = True if 1 in allowed else "no_such_choice"
    with pytest.raises(ValueError, match=rf"^{name}={bad!r} is not allowed; choose one of") as e:
      cls(**{**base, name: bad})
    assert str(allowed[0]) in str(e.value) and "\n" not in str(e.value)


def test_train_config_choices_from_json_and_set():
  cfg = config.override(TrainConfig(), ["optimizer=adam", "weight_decay=0", "lr_schedule=constant",
                                        "compute_dtype=bfloat16", "model.kind=mlp",
                                        "model.activation=swiglu"])
  assert (cfg.optimizer, cfg.lr_schedule, cfg.compute_dtype) == ("adam", "constant", "bfloat16")
  assert config.from_json(TrainConfig, config.to_json(cfg)) == cfg
  with pytest.raises(ValueError, match=r"lr_schedule='linear' is not allowed; choose one of "
                                       r"\['cosine', 'constant'\]"):
    config.override(cfg, ["lr_schedule=linear"])


def test_heads_must_divide_d_model():
  with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=4"):
    TransformerConfig(d_model=10, num_heads=4)


def test_train_config_rules():
  with pytest.raises(ValueError, match="batch_size"):
    TrainConfig(batch_size=10, grad_accum=3)
  with pytest.raises(ValueError, match="learning_rate"):
    TrainConfig(learning_rate=0.0)
  with pytest.raises(ValueError, match="model='lm' must be a model config"):
    TrainConfig(model="lm")       # which kinds train: tasks.require_task (test_plugins)


def test_norm_position_shorthand_and_overrides():
  assert MLPConfig(norm_position="pre").norm_ops == ("rms", "none", "none")
  assert MLPConfig(norm_position="post").norm_ops == ("none", "none", "rms")
  assert MLPConfig(norm_position="output", norm_op="layer").norm_ops == ("none", "layer", "none")
  assert MLPConfig(norm_position="peri").norm_ops == ("rms", "rms", "none")
  assert MLPConfig(norm_position="none").norm_ops == ("none", "none", "none")
  # the paper's ablations: Pre-RMSNorm with a detached-rescale or mean R, or a LayerNorm B
  assert MLPConfig(norm_position="pre", r_norm="detached_rms").norm_ops == (
      "rms", "none", "detached_rms")
  assert MLPConfig(norm_position="pre", b_norm="layer").norm_ops == ("rms", "layer", "none")


def test_hidden_width():
  assert MLPConfig(width=64, expansion=4).hidden_width == 256
  assert MLPConfig(width=64, branch_matrices=1).hidden_width == 64


@pytest.mark.parametrize("cfg", [
    MLPConfig(depth=7, p_norm="mean", input_dim=10, num_classes=3),
    TransformerConfig(num_layers=2, norm_position="pre", ffn="gelu", init="gpt2"),
    TrainConfig(model=MLPConfig(depth=3), batch_size=8, grad_accum=2),
])
def test_json_round_trip(cfg, tmp_path):
  path = tmp_path / "cfg.json"
  config.to_json(cfg, path)
  assert config.from_json(type(cfg), path) == cfg
  assert config.from_json(type(cfg), config.to_json(cfg)) == cfg


def test_json_unknown_field_and_bad_file(tmp_path):
  with pytest.raises(ValueError, match=r"unknown MLPConfig field\(s\) \['dept'\]"):
    config.from_json(MLPConfig, '{"dept": 3}')
  with pytest.raises(ValueError, match="does not exist"):
    config.from_json(MLPConfig, tmp_path / "missing.json")
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(ValueError, match="not valid JSON"):
    config.from_json(MLPConfig, bad)


def test_override_parses_values_and_nested_keys():
  cfg = config.override(TrainConfig(), ["model.num_layers=4", "learning_rate=1e-3",
                                        "model.norm_position=pre", "model.p_norm=null"])
  assert cfg.model.num_layers == 4 and cfg.learning_rate == 1e-3
  assert cfg.model.norm_position == "pre" and cfg.model.p_norm is None
  with pytest.raises(ValueError, match="unknown config key 'lm.depth'"):
    config.override(TrainConfig(), ["lm.depth=3"])
  with pytest.raises(ValueError, match="key=value"):
    config.override(TrainConfig(), ["depth"])
  with pytest.raises(ValueError, match="depth"):
    config.override(MLPConfig(), ["depth=0"])


def test_list_field_takes_a_comma_list_or_json_and_says_both_when_it_refuses():
  for value in ("basic,postnorm", " basic , postnorm ", '["basic", "postnorm"]'):
    cfg = config.override(TrainConfig(), [f"diagnostics={value}"])
    assert cfg.diagnostics == ("basic", "postnorm")
  assert config.override(TrainConfig(), ["diagnostics=basic"]).diagnostics == ("basic",)
  with pytest.raises(ValueError) as e:
    config.override(TrainConfig(), ["diagnostics=[1]"])
  assert str(e.value) == ("--set: diagnostics=[1] must be a list of diagnostic names (a list "
                          "is written --set diagnostics=a,b or --set "
                          "'diagnostics=[\"a\", \"b\"]')")


def test_diff_names_differing_fields():
  a = TrainConfig(learning_rate=6e-4, model=TransformerConfig(num_layers=48))
  b = dataclasses.replace(a, learning_rate=1e-3, model=dataclasses.replace(a.model, num_layers=4))
  assert config.diff(a, b) == {"learning_rate": (6e-4, 1e-3), "model.num_layers": (48, 4)}
  mlp = dataclasses.replace(a, model=MLPConfig())
  assert config.diff(a, mlp) == {"model.kind": ("transformer", "mlp")}   # other fields


def test_configs_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    MLPConfig().depth = 3


def test_gpt2_fields_are_checked_and_default_off():
  from rankjax._src.config import TransformerConfig
  cfg = TransformerConfig()
  assert (cfg.attn_out_bias, cfg.ffn_bias) == (False, False)      # old configs unchanged
  assert TransformerConfig(ffn="gelu_tanh", ffn_bias=True, attn_out_bias=True).ffn == "gelu_tanh"
  for field, value, match in [("attn_out_bias", "yes", "must be true or false"),
                              ("ffn_bias", 1, "must be true or false"),
                              ("ffn", "relu", "not allowed")]:
    with pytest.raises(ValueError, match=match):
      TransformerConfig(**{field: value})


def test_check_is_the_one_rule_helper():
  config.check("depth", 3, "positive int")
  config.check("input_dim", None, "positive int", optional=True)
  for value, rule, message in [
      (0, "positive int", "depth=0 must be a positive integer"),
      (True, "positive int", "depth=True must be a positive integer"),
      (-1.0, "non-negative", "depth=-1.0 must be a non-negative number"),
      (1.0, "rate", "depth=1.0 must be a number in [0, 1)"),
      (1, "bool", "depth=1 must be true or false"),
      ("x", "int", "depth='x' must be an integer")]:
    with pytest.raises(ValueError) as e:
      config.check("depth", value, rule)
    assert str(e.value) == message
  with pytest.raises(ValueError) as e:
    config.check("skip_every", -1, "non-negative int", optional=True, note="0: no skips")
  assert str(e.value) == "skip_every=-1 must be an integer >= 0 or null (0: no skips)"


def test_model_json_is_tagged_with_its_kind_and_written_with_the_format():
  data = config.to_dict(TrainConfig(model=MLPConfig(depth=3)))
  assert data["format"] == config.FORMAT == 3
  assert data["model"]["kind"] == "mlp" and data["model"]["depth"] == 3
  assert "lm" not in data and "mlp" not in data
  assert config.from_dict(TrainConfig, data).model == MLPConfig(depth=3)
  assert MLPConfig.from_json(MLPConfig(depth=3).to_json()) == MLPConfig(depth=3)
  with pytest.raises(ValueError, match="MLPConfig reads model kind 'mlp', not 'transformer'"):
    config.from_json(MLPConfig, TransformerConfig().to_json())
  assert TrainConfig().model == TransformerConfig() and TrainConfig().model.kind == "transformer"
  untagged = {**data, "model": {"depth": 3}}
  with pytest.raises(ValueError, match=r"^model=\{'depth': 3\} must be an object with a "
                                       r"\"kind\" \(one of \['mlp', 'transformer'\]\)"):
    config.from_dict(TrainConfig, untagged)
  with pytest.raises(ValueError, match=r"unknown MLPConfig field\(s\) \['d_model'\] "
                                       r"\(model kind 'mlp'\)"):
    config.from_dict(TrainConfig, {**data, "model": {"kind": "mlp", "d_model": 8}})
  with pytest.raises(ValueError, match="model kind 'cnn' is not registered; choose one of "
                                       r"\['mlp', 'transformer'\]"):
    config.from_dict(TrainConfig, {**data, "model": {"kind": "cnn"}})


def test_set_addresses_model_fields_and_switches_kind_to_its_defaults():
  cfg = config.override(TrainConfig(), ["model.d_model=1024", "model.num_heads=8"])
  assert (cfg.model.d_model, cfg.model.num_heads) == (1024, 8)
  mlp = config.override(cfg, ["model.kind=mlp", "model.depth=3", "optimizer=adam",
                              "weight_decay=0"])
  assert mlp.model == MLPConfig(depth=3)                  # the kind's defaults, then depth
  assert config.override(mlp, ["model.kind=mlp"]) == mlp  # the same kind: nothing changes
  for sets, message in [
      (["model.kind=mlp", "model.d_model=8"],
       "--set model.d_model: model kind 'mlp' has no field 'd_model'; its fields: "),
      (["model.kind=cnn"], "--set model.kind: model kind 'cnn' is not registered"),
      (["model=mlp"], "--set: model='mlp' must be an object with a \"kind\" (one of "
                      "['mlp', 'transformer']) and that kind's fields; --set model.kind=mlp "
                      "switches kind")]:
    with pytest.raises(ValueError) as e:
      config.override(TrainConfig(), sets)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_plugin_registers_its_model_config():
  @dataclasses.dataclass(frozen=True)
  class TinyConfig(config.ModelConfig):
    width: int = 4

  try:
    config.register_model_config("tiny_test_kind", TinyConfig)
    cfg = config.override(TrainConfig(), ["model.kind=tiny_test_kind", "model.width=8"])
    assert cfg.model == TinyConfig(width=8) and cfg.model.kind == "tiny_test_kind"
    assert config.from_json(TrainConfig, config.to_json(cfg)) == cfg
    with pytest.raises(ValueError, match="registered as model kind 'tiny_test_kind' already"):
      config.register_model_config("other_kind", TinyConfig)
  finally:
    config.MODEL_CONFIGS.pop("tiny_test_kind", None)
  with pytest.raises(ValueError, match="must be a dataclass subclassing"):
    config.register_model_config("x", dict)

  @dataclasses.dataclass(frozen=True)
  class NoDefaults(config.ModelConfig):
    width: int

  with pytest.raises(ValueError, match=r"NoDefaults\(\) must build with its defaults"):
    config.register_model_config("x", NoDefaults)

  @dataclasses.dataclass(frozen=True)
  class Kind(config.ModelConfig):
    kind: str = "x"

  with pytest.raises(ValueError, match="Kind has a field named 'kind'"):
    config.register_model_config("x", Kind)
  assert "x" not in config.MODEL_CONFIGS


FORMAT1 = {"model": "lm", "lm": {"num_layers": 2, "remat": True},
           "mlp": {"depth": 3}, "learning_rate": 1e-3}


def test_format_1_json_is_refused_in_one_line_naming_the_format(tmp_path):
  path = tmp_path / "config.json"
  path.write_text(json.dumps(FORMAT1))
  with pytest.raises(config.FormatError) as e:
    config.from_json(TrainConfig, path)
  assert str(e.value) == (
      f"config {path} written by rankjax before config format 2 (a \"model\" name beside "
      "\"lm\" / \"mlp\" objects): convert it with rankjax convert-config (its config.json "
      "or its run folder)")
  with pytest.raises(config.FormatError, match="^config has config format 4; this rankjax "
                                               "reads format 3: use the rankjax that wrote it"):
    config.from_json(TrainConfig, json.dumps({"format": 4}))
  with pytest.raises(config.FormatError, match="before config format 2"):
    config.from_dict(TrainConfig, {"lm": {}})             # no "model" name, the old objects


def test_convert_file_rewrites_format_1_and_keeps_the_original(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(FORMAT1))
  path, backup = config.convert_file(tmp_path, TrainConfig)      # a run folder
  assert path == tmp_path / "config.json" and backup == tmp_path / "config.json.format1"
  assert json.loads(backup.read_text()) == FORMAT1
  cfg = config.from_json(TrainConfig, path)
  assert cfg == TrainConfig(model=TransformerConfig(num_layers=2,
                                                    kernels=KernelConfig(remat="full")),
                            learning_rate=1e-3)
  with pytest.raises(ValueError, match="has config format 3, not 1 or 2: nothing to convert"):
    config.convert_file(path, TrainConfig)
  plugin = tmp_path / "plugin.json"
  plugin.write_text(json.dumps({"model": "plain_mlp", "mlp": {"depth": 2}}))
  with pytest.raises(ValueError, match="model 'plain_mlp' is a plug-in's"):
    config.convert_file(plugin, TrainConfig)
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"model": "mlp", "mlp": {"depth": 0}}))
  with pytest.raises(ValueError, match=r"converted is not a valid config \(depth=0 must be"):
    config.convert_file(bad, TrainConfig)
  assert not (tmp_path / "bad.json.format1").exists()
