"""A study imports only rankjax's public face: ``rankjax`` and its faces.

Public: ``rankjax`` and ``rankjax.<face>`` (``rankjax.FACES``: config, data, measure,
models, studies, train) and the names their ``__all__`` lists; never
``rankjax.<face>.<module>`` nor ``rankjax._src``. Inside a study, relative imports only
(no ``experiments.`` import: no study reads another's code), and no ``_private`` name
is imported or read from a rankjax module or another module. The plug-in example
(examples/plugins/) is held to the same rule.
"""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import rankjax
from rankjax._src.studies import finder

STUDIES = sorted(finder.find().items())
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _public(module: str, name: str | None = None) -> str | None:
  """Why ``from module import name`` (or ``import module``) is not public API, or None."""
  parts = module.split(".")
  if parts[0] != "rankjax":
    return None
  if len(parts) > 2 or (len(parts) == 2 and parts[1] not in rankjax.FACES):
    return f"{module} is not rankjax or one of its faces {list(rankjax.FACES)}"
  if name is None:
    return None
  target = importlib.import_module(module)
  if name not in getattr(target, "__all__", ()):
    return f"{module}.{name} is not in {module}.__all__"
  return None


def _violations(path: pathlib.Path) -> list[str]:
  tree = ast.parse(path.read_text(), str(path))
  bad, aliases = [], set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] == "experiments":
          bad.append(f"import {a.name}: another study's (or the checkout's) code")
        elif (why := _public(a.name)):
          bad.append(f"import {a.name}: {why}")
        aliases.add((a.asname or a.name).split(".")[0])
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ""
      if node.level == 0 and module.split(".")[0] == "experiments":
        bad.append(f"from {module}: another study's (or the checkout's) code")
        continue
      for a in node.names:
        if a.name.startswith("_") and not a.name.startswith("__"):
          bad.append(f"from {'.' * node.level}{module} import {a.name}: private")
        elif node.level == 0 and (why := _public(module, a.name)):
          bad.append(f"from {module} import {a.name}: {why}")
        aliases.add(a.asname or a.name)
  for node in ast.walk(tree):   # mod._private on an imported module or name
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in aliases and node.attr.startswith("_")
        and not node.attr.startswith("__")):
      bad.append(f"{node.value.id}.{node.attr} (line {node.lineno}): private")
  return [f"{path.name}: {b}" for b in bad]


@pytest.mark.parametrize("name,folder", STUDIES, ids=[n for n, _ in STUDIES])
def test_a_study_imports_only_the_public_api(name, folder):
  bad = [v for p in sorted(folder.rglob("*.py")) for v in _violations(p)]
  assert not bad, "\n".join(bad)


def test_the_rule_catches_what_it_forbids(tmp_path):
  """The checker itself fails on each kind of violation (a check that cannot fail is
  not one)."""
  src = tmp_path / "m.py"
  src.write_text("from rankjax._src.measure import engine\n"
                 "from rankjax.measure import _private\n"
                 "from rankjax.measure import effective_rank\n"
                 "from rankjax import measure\n"
                 "x = measure._hidden\n"
                 "from experiments.transforming_rank import common\n"
                 "import rankjax.train.checkpoint\n"
                 "from rankjax.measure import engine\n"
                 "from rankjax import effective_rank, studies\n"
                 "from rankjax.studies import Claim, measured\n"
                 "from . import common\n")
  found = _violations(src)
  assert [f.split(": ", 1)[1].split(":")[0] for f in found] == [
      "from rankjax._src.measure import engine", "from rankjax.measure import _private",
      "from experiments.transforming_rank", "import rankjax.train.checkpoint",
      "from rankjax.measure import engine", "from rankjax import effective_rank",
      "measure._hidden (line 5)"]


def test_the_plugin_example_imports_only_the_public_face():
  bad = [v for p in sorted((ROOT / "examples").rglob("*.py")) for v in _violations(p)]
  assert not bad, "\n".join(bad)


def test_every_public_name_has_a_docstring():
  """Each face's names are documented: a function or class has its own docstring (a
  constant is named in its face's docstring)."""
  missing = []
  for face in rankjax.FACES:
    module = importlib.import_module(f"rankjax.{face}")
    for name in module.__all__:
      obj = getattr(module, name)
      if callable(obj) and not (getattr(obj, "__doc__", None) or "").strip():
        missing.append(f"rankjax.{face}.{name}")
      elif not callable(obj) and name not in module.__doc__:
        missing.append(f"rankjax.{face}.{name} (not named in the face's docstring)")
  assert not missing, missing


def test_the_architecture_map_lists_each_face_as_it_is():
  """docs/architecture.md's "The public face" names each face's ``__all__``, no more."""
  text = (ROOT / "docs" / "architecture.md").read_text()
  for face in rankjax.FACES:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"- **`rankjax.{face}`**")]
    listed = line.split(": ", 1)[1].replace("`", "").split(", ")
    assert listed == list(importlib.import_module(f"rankjax.{face}").__all__), face
