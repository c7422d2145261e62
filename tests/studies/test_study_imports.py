"""A study imports only rankjax's public API and ``rankjax.studies``.

Public: the names and modules listed in ``__all__`` of ``rankjax`` and of its
sub-packages; a public module's names that do not start with ``_``. Inside a study,
relative imports only (no ``experiments.`` import: no study reads another's code), and
no ``_private`` name is imported or read from a rankjax module or another module.
"""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from rankjax.studies import finder

STUDIES = sorted(finder.find().items())


def _public(module: str, name: str | None = None) -> str | None:
  """Why ``from module import name`` (or ``import module``) is not public API, or None."""
  parts = module.split(".")
  if parts[0] != "rankjax":
    return None
  if parts[:2] == ["rankjax", "studies"]:
    return None if name is None or not name.startswith("_") else f"{module}.{name} is private"
  for i in range(1, len(parts)):
    parent = importlib.import_module(".".join(parts[:i]))
    if parts[i] not in getattr(parent, "__all__", ()):
      return f"{'.'.join(parts[:i + 1])} is not in {parent.__name__}.__all__"
  if name is None:
    return None
  target = importlib.import_module(module)
  if name.startswith("_"):
    return f"{module}.{name} is private"
  if hasattr(target, "__path__") and name not in getattr(target, "__all__", ()):
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
  src.write_text("from rankjax.measure import engine\n"          # not in __all__
                 "from rankjax.measure.spectra import _private\n"
                 "from rankjax.measure import spectra\n"
                 "x = spectra._hidden\n"
                 "from experiments.transforming_rank import common\n"
                 "import rankjax.train.checkpoint\n"
                 "from rankjax import effective_rank, plotting\n"
                 "from rankjax.studies import Claim, measured\n"
                 "from . import common\n")
  found = _violations(src)
  assert [f.split(": ", 1)[1].split(":")[0] for f in found] == [
      "from rankjax.measure import engine", "from rankjax.measure.spectra import _private",
      "from experiments.transforming_rank", "import rankjax.train.checkpoint",
      "spectra._hidden (line 4)"]
