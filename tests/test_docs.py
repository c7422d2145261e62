"""README.md, BUILD.md and docs/*.md are run, not only read: every ``rankjax`` command
in their bash blocks parses (the CLI's own parser, nothing runs) and names files that
exist; every Python block runs; every relative link resolves."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from rankjax._src import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BUILD.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def blocks(page: pathlib.Path, language: str) -> list[str]:
  return [body for lang, body in _BLOCK.findall(page.read_text()) if lang == language]


def commands(page: pathlib.Path) -> list[list[str]]:
  """The ``rankjax`` invocations of a page's bash blocks, as argv (after ``rankjax``):
  chains split at ``&&``, comments and environment assignments dropped."""
  out = []
  for body in blocks(page, "bash"):
    for line in body.replace("\\\n", " ").splitlines():
      for part in line.split("&&"):
        words = shlex.split(part, comments=True)
        while words and re.match(r"^[A-Z_]+=", words[0]):
          words = words[1:]
        if words[:1] == ["rankjax"]:
          out.append(words[1:])
  return out


def test_the_pages_hold_what_this_test_reads():
  assert len(PAGES) >= 7
  assert sum(len(commands(p)) for p in PAGES) >= 12
  assert sum(len(blocks(p, "python")) for p in PAGES) >= 2


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_parses_and_names_files_that_exist(page):
  for argv in commands(page):
    try:
      cli.build_parser().parse_args(argv)
    except SystemExit as e:
      pytest.fail(f"{page.name}: rankjax {shlex.join(argv)} does not parse (exit {e.code})")
    for word in argv:
      value = word.split("=", 1)[-1]
      if re.match(r"^(experiments|examples|launch|docs)/\S+\.(json|py|md)$", value):
        assert (ROOT / value).is_file(), (page.name, value)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
  for target, _ in _LINK.findall(page.read_text()):
    if "://" in target:
      continue
    assert (page.parent / target).exists(), (page.name, target)


_HELP = re.compile(r"`help\(([^`]+)\)`")


def _run(code: str, where: pathlib.Path) -> dict:
  """Runs ``code`` in ``where``; returns its namespace."""
  import os
  here = os.getcwd()
  os.chdir(where)
  namespace = {"__name__": "__snippet__"}
  try:
    exec(compile(code, "<snippet>", "exec"), namespace)  # noqa: S102
  finally:
    os.chdir(here)
  return namespace


@pytest.mark.slow   # a 48-block Jacobian study at width 256 (about 15 s on 2 idle cores)
def test_the_readmes_library_snippet_runs(tmp_path):
  (code,) = blocks(ROOT / "README.md", "python")
  _run(code, tmp_path)


@pytest.mark.slow   # trains the smoke tour's Post-Norm run (about 20 s)
def test_the_python_blocks_of_the_docs_run(tmp_path):
  """Each Python block of docs/*.md, in a folder where ``runs/tour/lm_post`` is the
  smoke tour's Post-Norm run (what the reading example opens); what a page's prose
  tells to ``help(...)`` resolves after its blocks ran."""
  from rankjax._src.tour_runs import lm_configs
  from rankjax._src.train.loop import train
  train(lm_configs(smoke=True)["lm_post"], str(tmp_path / "runs" / "tour" / "lm_post"),
        progress_bar=False)
  ran, helped = 0, 0
  for page in sorted((ROOT / "docs").glob("*.md")):
    namespace = {}
    for code in blocks(page, "python"):
      namespace.update(_run(code, tmp_path))
      ran += 1
    for target in _HELP.findall(page.read_text()):
      assert eval(target, namespace) is not None, (page.name, target)  # noqa: S307
      helped += 1
  assert ran >= 1 and helped >= 1


def _docstring_examples() -> list[tuple[str, str]]:
  """(module file, code) of each ``::`` literal block in the module docstrings of
  rankjax/ that is code (a folder layout is not)."""
  import ast
  import textwrap
  out = []
  for path in sorted((ROOT / "rankjax").rglob("*.py")):
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    for intro, block in re.findall(r"([^\n]*)::\n\n((?:(?:  [^\n]*)?\n)+)", doc):
      if not intro.startswith("Layout"):
        out.append((str(path.relative_to(ROOT)), textwrap.dedent(block)))
  return out


def test_the_docstring_examples_compile_and_the_diagnostic_one_runs(monkeypatch):
  """Copied as they are, the module docstrings' examples parse (the diagnostic example
  had an unindented line: an IndentationError); the diagnostic example registers its
  diagnostic."""
  from rankjax._src.train import diagnostics
  examples = _docstring_examples()
  assert len(examples) >= 4
  for where, code in examples:
    compile(code, where, "exec")
  (code,) = [c for w, c in examples if w == "rankjax/_src/train/diagnostics.py"]
  monkeypatch.setattr(diagnostics, "_REGISTRY", {})
  exec(compile(code, "<diagnostics example>", "exec"), {})  # noqa: S102
  assert list(diagnostics._REGISTRY) == ["x1_rms"]


def test_the_pages_state_what_the_code_does():
  """Statements that were wrong when followed (issue 55): images were "one per
  diagnostics step" while image_every draws fewer; attention dropout was said to train
  on the explicit (B, H, T, T) probabilities; the smoke tour "runs in about a minute"
  (170 s on a loaded 2-core machine)."""
  from rankjax._src.config import TrainConfig
  from rankjax._src.models import attention
  training = (ROOT / "docs" / "training.md").read_text()
  assert "one image per diagnostics step" not in training
  assert f"`image_every` updates (default {TrainConfig().image_every}" in training
  configs = (ROOT / "experiments" / "configs" / "README.md").read_text()
  assert "trains on the explicit" not in configs
  assert "trains through `blocked_attention`" in configs and attention.blocked_attention
  readme = " ".join((ROOT / "README.md").read_text().split())
  assert "about a minute" not in readme
  assert "65 s of CPU time on a 2-core" in readme
