"""The Transforming Rank experiment scripts parse their settings and run end to end."""
import importlib
import json

import pytest

from experiments.transforming_rank import reproduce


@pytest.mark.parametrize("name", sorted(reproduce.EXPERIMENTS))
def test_every_experiment_has_quick_and_paper_settings(name):
  module = importlib.import_module(f"experiments.transforming_rank.{reproduce.EXPERIMENTS[name]}")
  assert callable(module.run)
  assert set(module.SCALES) == {"quick", "paper"}
  assert set(module.SCALES["quick"]) == set(module.SCALES["paper"])


def test_resolve_aliases():
  assert reproduce.resolve("fig10,table4") == ["fig4", "fig5"]
  assert reproduce.resolve(["fig14"]) == ["fig7"]
  assert reproduce.resolve("fig8c,table5,appc") == ["fig12", "fig6", "appc"]
  with pytest.raises(ValueError, match="unknown experiment"):
    reproduce.resolve("fig99")


def test_small_experiment_and_summary(tmp_path):
  from experiments.transforming_rank import table3_projections
  res = table3_projections.run(str(tmp_path), width=16, depths=(4, 8), seeds=1, eps=(0.1,))
  assert (tmp_path / "table3_projections.png").is_file()
  saved = json.loads((tmp_path / "table3_projections.json").read_text())
  assert 0.5 < saved["table"]["0.1"][0] <= 1.0 and res["summary"]
  out = reproduce.run_all(str(tmp_path / "all"), "quick", only="table1")
  assert out["failed"] == [] and "error" not in out["results"]["table1"]
  text = (tmp_path / "all" / "summary.md").read_text()
  assert "| table1 | Table 1 relu" in text
  rows = json.loads((tmp_path / "all" / "summary.json").read_text())
  status = {r["item"].split(":")[0]: r["status"] for r in rows if "c / 1/c" in r["item"]}
  assert status["Table 1 relu"] == "match" and status["Table 1 tanh"] == "mismatch"  # EXPECTED.md
  # EXPECTED.md's Table 1 numbers (d=256, n=1024, 3 seeds), to their stated digits
  table = out["results"]["table1"]["table"]
  for act, (c, st) in {"abs": (0.637, 1.56), "relu": (0.318, 3.11), "gelu": (0.187, 5.21),
                       "silu": (0.120, 7.99), "tanh": (0.0, 57.12)}.items():
    assert table[act]["coherence"] == pytest.approx(c, abs=5e-4)
    assert table[act]["measured_stable_rank"] == pytest.approx(st, abs=0.006)
  n_dep = out["results"]["table1"]["n_dependence"]
  assert [round(n_dep["tanh"][n]["mean"], 1) for n in ("512", "1024")] == [49.5, 57.1]
