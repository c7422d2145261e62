"""The Transforming Rank study at ``--scale tiny``: every experiment has a tiny entry and
the whole study runs end to end (the paper scale's code path at CPU sizes)."""
import importlib
import json

import pytest

from rankjax._src import reproduce as cli
from rankjax.studies import run_study
from experiments.transforming_rank import common, reproduce

STUDY = cli.study("transforming_rank")   # loaded by rankjax._src.studies.finder (package set)


def _module(name):
  return importlib.import_module(
      f"experiments.transforming_rank.{reproduce.EXPERIMENTS[name]}")


@pytest.mark.parametrize("name", sorted(reproduce.EXPERIMENTS))
def test_every_scale_has_the_paper_settings(name):
  scales = _module(name).SCALES
  # quick, paper, tiny; fig6 also quick_seeds3 (issue 53: three networks per cell)
  extra = {reproduce.SEEDS3} if name == "fig6" else set()
  assert set(scales) == set(common.SCALE_NAMES) | extra
  assert all(set(scales[s]) == set(scales["paper"]) for s in scales)
  assert "tiny" in STUDY.scales_of(name)


@pytest.mark.slow   # ~3.5 min on 2 cores (~5 min loaded): every experiment at tiny scale
def test_the_study_runs_at_tiny_scale(tmp_path):
  res = run_study(STUDY, tmp_path, "tiny")
  assert res["failed"] == []
  by_name = {}
  for row in res["rows"]:
    by_name.setdefault(row["experiment"], []).append(row)
  assert set(by_name) == set(reproduce.EXPERIMENTS)
  assert all(r["status"] == "tiny" and r["scale"] == "tiny" for r in res["rows"])
  assert res["results"]["fig6"]["dataset"] == "digits"   # the offline set, never CIFAR-10
  assert json.loads((tmp_path / "summary.json").read_text()) == res["rows"]
  assert (tmp_path / "summary.md").read_text().count("| tiny |") >= len(res["rows"])
  for name, rows in by_name.items():
    doc = json.loads((tmp_path / "results" / "tiny" / f"{name}.json").read_text())
    assert doc["scale"] == "tiny" and doc["settings"]["scale"] == "tiny"
    assert doc["rows"] == rows
    assert (tmp_path / f"{reproduce.EXPERIMENTS[name]}.png").is_file()
