"""Extension points without library edits: ``--import``, a user's diagnostic and
task (``examples/plugins/my_pieces.py``), the explicit diagnostics table,
``TrainConfig.from_json`` / ``to_json``, field lists derived from field metadata."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from rankjax._src import config as config_lib
from rankjax._src import plugins
from rankjax._src.config import MLPConfig, TrainConfig, TransformerConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugins" / "my_pieces.py"


@pytest.fixture(autouse=True)
def _plugin_registrations_end_with_the_test():
  """The example plug-in registers a model kind, a task and a diagnostic when imported;
  each test here imports it afresh and leaves the registries as it found them (tests
  elsewhere in the same process list the kinds: tests/test_config.py)."""
  from rankjax._src.train import diagnostics, tasks
  registries = (config_lib.MODEL_CONFIGS, tasks.TASKS, diagnostics._REGISTRY)
  saved = [dict(r) for r in registries]
  yield
  for registry, before in zip(registries, saved):
    registry.clear()
    registry.update(before)
  module = sys.modules.get(EXAMPLE.stem)
  if module is not None and getattr(module, "__file__", None) == str(EXAMPLE.resolve()):
    del sys.modules[EXAMPLE.stem]


def test_config_json_classmethods_round_trip(tmp_path):
  cfg = TrainConfig(model=MLPConfig(depth=3, input_dim=64, num_classes=10),
                    optimizer="adam", weight_decay=0.0, warmup_steps=0)
  path = tmp_path / "c.json"
  text = cfg.to_json(path)
  assert TrainConfig.from_json(path) == cfg == TrainConfig.from_json(text)
  assert config_lib.from_json(TrainConfig, path) == cfg           # the function still works
  assert MLPConfig.from_json(MLPConfig(depth=5).to_json()).depth == 5
  assert TransformerConfig.from_json(TransformerConfig().to_json()) == TransformerConfig()


def test_run_control_field_lists_come_from_field_metadata():
  """The lists the loop and the checkpointer use are the fields marked in TrainConfig
  (they equal the hand-written lists they replaced)."""
  from rankjax._src.train import checkpoint, loop
  assert set(loop._NOT_BUILT) == {
      "log_every", "checkpoint_every", "max_to_keep", "async_checkpointing", "eval_every",
      "eval_batches", "eval_split", "dataset", "data_dir", "tokenizer", "compilation_cache_dir",
      "image_every", "checkpoint_minutes", "stop_at", "stop_on_collapse"}
  assert checkpoint.RESUMABLE_FIELDS == {
      "log_every", "checkpoint_every", "max_to_keep", "async_checkpointing", "mesh_data",
      "mesh_fsdp", "zero1", "eval_every", "eval_batches", "eval_split", "compilation_cache_dir",
      "image_every", "checkpoint_minutes", "stop_at", "stop_on_collapse"}
  assert config_lib.fields_with(MLPConfig, "resumable", True) == ()


def test_builtin_diagnostics_are_a_table_not_import_side_effects():
  """A fresh process: importing the diagnostics module registers nothing; naming a
  built-in diagnostic imports its module from the table."""
  code = ("from rankjax._src.train import diagnostics as d; import sys; "
          "assert not d._REGISTRY, d._REGISTRY; "
          "assert 'rankjax._src.train.diagnostics_attention' not in sys.modules; "
          "r = d.resolve(['basic', 'attention']); "
          "assert [x.needs_capture for x in r] == [True, False]; "
          "assert 'rankjax._src.train.diagnostics_attention' in sys.modules; print('ok')")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120, cwd=ROOT)
  assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_import_errors_are_one_line(tmp_path):
  with pytest.raises(ValueError, match="no module named 'no_such_pieces' on the import path"):
    plugins.import_module("no_such_pieces")
  with pytest.raises(ValueError, match="no such file"):
    plugins.import_module(str(tmp_path / "missing.py"))


def test_a_model_kind_without_a_task_names_the_registry(tmp_path, monkeypatch):
  """A registered model config of any kind builds; training it (or reading its run)
  needs a task registered for the kind."""
  import dataclasses
  from rankjax._src.config import ModelConfig
  from rankjax._src.train import loop, tasks

  @dataclasses.dataclass(frozen=True)
  class NopeConfig(ModelConfig):
    width: int = 4

  monkeypatch.setitem(config_lib.MODEL_CONFIGS, "nope", NopeConfig)
  cfg = TrainConfig(model=NopeConfig())
  message = (r"model kind 'nope' has no task; choose one of \[.*'mlp'.*'transformer'.*"
             "register_task")
  with pytest.raises(ValueError, match=message):
    tasks.make_task(cfg)
  with pytest.raises(ValueError, match=message):
    loop.train(cfg, tmp_path / "run", progress_bar=False)
  assert not (tmp_path / "run").exists()                 # refused before anything is written
  with pytest.raises(ValueError, match="model='mlp' must be a model config"):
    TrainConfig(model="mlp")


def _source(module: str) -> pathlib.Path:
  """The file of ``module``: ``a/b.py``, or a package's ``a/b/__init__.py``."""
  path = ROOT / module.replace(".", "/")
  return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _rankjax_imports(module: str) -> set[str]:
  """The rankjax modules ``module``'s source imports (anywhere in it, lazy ones too)."""
  import ast
  tree = ast.parse(_source(module).read_text())
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name.startswith("rankjax")}
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rankjax"):
      for a in node.names:   # `from rankjax._src.train import loop` imports a module
        sub = f"{node.module}.{a.name}"
        out.add(sub if _source(sub).exists() else node.module)
  return out


def test_config_imports_nothing_above_it():
  """rankjax._src.config (a package) imports, transitively, only its own modules and the
  leaves rankjax._src.storage (etils) and rankjax._src.errors: no model, task or training module
  (they import config; no cycle)."""
  seen, todo = set(), ["rankjax._src.config"]
  while todo:
    for m in _rankjax_imports(todo.pop()) - seen:
      seen.add(m)
      todo.append(m)
  own = {f"rankjax._src.config.{p.stem}" for p in (ROOT / "rankjax" / "_src" / "config").glob("*.py")
         if p.stem != "__init__"}
  assert seen == own | {"rankjax._src.storage", "rankjax._src.errors"}, seen


@pytest.mark.slow
def test_train_imports_a_user_task_and_diagnostic(tmp_path):
  """``rankjax train --import examples/plugins/my_pieces.py``: the user's model trains,
  its diagnostic is in the checkpoint (load_run) and in TensorBoard."""
  pytest.importorskip("sklearn")
  from rankjax._src.train import tensorboard as tb
  from rankjax._src.train.run_reader import load_run
  workdir = tmp_path / "run"
  config = ROOT / "experiments" / "configs" / "mlp_classifier.json"
  argv = ["train", "--import", str(EXAMPLE), "--config", str(config), "--workdir",
          str(workdir), "--set", "model.kind=plain_mlp", "--set", "dataset=digits",
          "--set", "model.input_dim=64", "--set", "model.num_classes=10",
          "--set", "model.depth=2", "--set", "model.width=16",
          "--set", "total_steps=4", "--set", "batch_size=32", "--set", "diag_every=2",
          "--set", "diag_examples=8", "--set", 'diagnostics=["logit_margin"]',
          "--set", "checkpoint_every=4", "--set", "eval_every=4", "--set", "log_every=1"]
  code = f"import sys; from rankjax._src import cli; sys.exit(cli.main({argv!r}))"
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "plain_mlp on digits" in proc.stdout
  saved = json.loads((workdir / "config.json").read_text())["model"]
  assert saved == {"kind": "plain_mlp", "depth": 2, "width": 16, "input_dim": 64,
                   "num_classes": 10}
  with pytest.raises(ValueError, match="model kind 'plain_mlp' is not registered"):
    load_run(workdir)                       # the model's module is not imported here
  plugins.import_module(str(EXAMPLE))
  run = load_run(workdir)
  assert run.config.model.kind == "plain_mlp"
  assert list(run.diagnostic_steps) == [1, 2, 4]
  assert run.diagnostics["logit_margin/margin"].shape == (3,)
  assert [r["step"] for r in run.eval_history] == [4]
  assert [r["step"] for r in run.train_history] == [1, 2, 3, 4]
  assert "Dense_0" in run.params
  scalars = tb.read_scalars(str(workdir / "tensorboard"))
  assert [s for s, _ in scalars["diagnostics/logit_margin/margin"]] == [1, 2, 4]
  json.loads((workdir / "config.json").read_text())


def test_report_imports_the_module_of_a_plugin_model(tmp_path, capsys):
  """``rankjax report --import MODULE WORKDIR``: a run of a user's model is reported."""
  from rankjax._src import cli
  from rankjax._src.train.loop import train
  plugins.import_module(str(EXAMPLE))
  cfg = config_lib.override(
      TrainConfig.from_json(ROOT / "experiments" / "configs" / "mlp_classifier.json"),
      ["model.kind=plain_mlp", "model.input_dim=64", "model.num_classes=10", "model.depth=1",
       "model.width=8", "total_steps=2", "batch_size=8",
       "diag_every=0", "checkpoint_every=2", "eval_every=0", "log_every=1"])
  workdir = tmp_path / "run"
  train(cfg, workdir, progress_bar=False)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r.get("compile_step") for r in rows] == [1.0, None]    # update 1 compiled
  assert all("images_per_s" in r and not any(k.startswith("tokens") for k in r) for r in rows)
  assert "images_per_s_avg" in rows[1] and "images_per_s_avg" not in rows[0]
  assert cli.main(["report", "--import", str(EXAMPLE), str(workdir)]) == 0
  page = (workdir / "report" / "report.html").read_text()
  assert "run (no norm, 1 block)" in page and "Pre-Norm" not in page   # as declared
  assert " images/s</td>" in page and "tokens/s" not in page
  assert cli.main(["report", "--import", "no_such_pieces", str(workdir)]) == 2
  assert "--import no_such_pieces: no module named" in capsys.readouterr().err
