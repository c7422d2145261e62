"""Rows as evidence: claims judged by declared rules, results files, rendered tables."""

import json
import math

import pytest

from experiments import evidence, expected, results
from experiments.evidence import Abs, Bound, Claim, OneMinus, Qualitative, Rel


def test_band_rules_compute_the_tolerance_written_in_the_row():
  row = Claim("Fig 1", "erank/d", 0.5, Abs(0.01)).judge(0.505)
  assert (row["status"], row["tolerance"], row["n"], row["sd"]) == ("match", 0.01, 1, None)
  assert Claim("Fig 1", "erank/d", 0.5, Abs(0.01)).judge(0.52)["status"] == "mismatch"
  assert Claim("x", "q", 2.0, Rel(0.05)).judge(2.09)["tolerance"] == pytest.approx(0.1)
  # near 1 the band is relative on 1 - x: 0.972 is a rank loss 40% larger than 0.980
  near_one = Claim("Table 3", "erank/d", 0.980, OneMinus(0.25))
  assert near_one.judge(0.972)["status"] == "mismatch"
  assert near_one.judge(0.977)["status"] == "match"
  assert near_one.judge(0.977)["tolerance"] == pytest.approx(0.005)


def test_noise_widens_the_band_to_two_sd_of_the_seeds():
  values = [0.40, 0.50, 0.60]          # mean 0.5, sd 0.1 (ddof 1)
  row = Claim("x", "q", 0.62, Abs(0.01)).judge(values, seeds=[0, 1, 2])
  assert row["sd"] == pytest.approx(0.1) and row["n"] == 3
  assert row["tolerance"] == pytest.approx(0.2) and row["status"] == "match"
  assert row["per_seed"] == values and row["seeds"] == [0, 1, 2]
  no_noise = Claim("x", "q", 0.62, Abs(0.01, noise=0)).judge(values)
  assert no_noise["tolerance"] == 0.01 and no_noise["status"] == "mismatch"
  with pytest.raises(ValueError, match="3 values for 2 seeds"):
    Claim("x", "q", 0.5, Abs(0.1)).judge(values, seeds=[0, 1])


def test_bounds_are_predicates_on_the_mean_or_every_seed():
  below = Claim("alpha", "max alpha", 2.5, Bound("<"), note="stays below 2.5")
  row = below.judge([1.0, 3.0])
  assert row["status"] == "match" and row["tolerance"] is None   # mean 2.0
  assert row["note"] == "stays below 2.5" and row["rule"] == "ours < paper"
  every = Claim("alpha", "max alpha", 2.5, Bound("<", every_seed=True))
  assert every.judge([1.0, 3.0])["status"] == "mismatch"
  assert Claim("both", "seeds with a transition", 2, Bound(">=")).judge(1)["status"] == \
      "mismatch"


def test_nan_never_matches_and_qualitative_needs_a_reason():
  row = Claim("x", "q", 0.5, Abs(1.0)).judge(float("nan"))
  assert row["status"] == "mismatch" and row["ours"] is None
  assert Claim("x", "q", None, Qualitative("a figure's look")).judge(0.3)["status"] == \
      "qualitative"
  with pytest.raises(ValueError, match="needs its reason"):
    Claim("x", "q", None, Qualitative(""))
  with pytest.raises(ValueError, match="needs the paper's number"):
    Claim("x", "q", None, Abs(0.1))
  with pytest.raises(ValueError, match="declared twice"):
    evidence.claims([Claim("x", "q", 1.0, Abs(0.1)), Claim("x", "r", 1.0, Abs(0.1))])
  with pytest.raises(TypeError, match="must be a number"):
    Claim("x", "q", 1.0, Abs(0.1)).judge("0.5")


@pytest.mark.parametrize("claim, values", [
    (Claim("a", "q", 0.5, Abs(0.01)), [0.49, 0.52, 0.47]),
    (Claim("b", "q", 0.98, OneMinus(0.25)), 0.972),
    (Claim("c", "q", 2.5, Bound("<", every_seed=True)), [1.0, 2.6]),
    (Claim("d", "q", 0.0, Bound(">")), [0.1, -0.05]),
])
def test_recheck_recomputes_a_status_from_the_row_alone(claim, values):
  row = json.loads(json.dumps(claim.judge(values)))     # as committed
  assert evidence.recheck(row) == row["status"]


def _row(item, ours, tol=0.01, status="match", sd=None):
  return {"experiment": "e", "item": item, "ours": ours, "tolerance": tol, "status": status,
          "sd": sd}


def test_compare_names_what_moved():
  old = [_row("a", 0.50), _row("b", 0.50), _row("c", 1.0, None, "match", 0.1),
         _row("gone", 1.0)]
  new = [_row("a", 0.505), _row("b", 0.52), _row("c", 1.3, None, "match"),
         _row("fresh", 1.0)]
  moved = results.compare(new, old)
  assert any(line.startswith("e / b: ours 0.5 -> 0.52") for line in moved)
  assert any(line.startswith("e / c: ours 1 -> 1.3") for line in moved)   # beyond 2 sd
  assert "e / gone: committed row no longer produced" in moved
  assert "e / fresh: new row, not committed" in moved
  assert not any(line.startswith("e / a") for line in moved)
  flipped = results.compare([_row("a", 0.50, status="mismatch")], [_row("a", 0.50)])
  assert flipped == ["e / a: status match -> mismatch (ours 0.5 -> 0.5)"]


def test_expected_blocks_render_from_results_files(tmp_path, monkeypatch):
  monkeypatch.setattr(results, "ROOT", tmp_path)
  folder = tmp_path / "experiments" / "s" / "results" / "quick"
  folder.mkdir(parents=True)
  rows = [dict(Claim("Fig 1, L=4", "erank/d", 0.5, Abs(0.01)).judge(0.505),
               experiment="fig1", scale="quick"),
          dict(Claim("Fig 1, L=8", "erank/d", 0.4, Abs(0.01)).judge(0.2),
               experiment="fig1", scale="quick")]
  doc = {"rows": rows, "seeds": [0], "provenance": {"commit": "abc123", "dirty": False,
                                                     "device_kind": "cpu", "cpu": "x",
                                                     "jax": "0", "wall_s": 1.0, "date": "d"}}
  (folder / "fig1.json").write_text(json.dumps(doc))
  text = ("prose 1\n<!-- results quick/fig1 items=L=8 fields=item,ours,status -->\n"
          "stale\n<!-- end results -->\nprose 2\n<!-- results quick/fig9 -->\n"
          "<!-- end results -->\n")
  (tmp_path / "experiments" / "s" / "EXPECTED.md").write_text(text)
  out = expected.render("s")
  assert out.startswith("prose 1\n<!-- results quick/fig1 items=L=8 fields=item,ours,status"
                        " -->\n| item | ours | status |\n|---|---|---|\n"
                        "| Fig 1, L=8 | 0.2 | mismatch |\n")
  assert "commit abc123, cpu (x)" in out and "stale" not in out
  assert "(no results file experiments/s/results/quick/fig9.json yet)" in out
  assert expected.render("s", out) == out            # rendering is a fixed point
  assert expected.main(["s", "--check"]) == 1
  assert expected.write("s") and expected.main(["s", "--check"]) == 0
  with pytest.raises(ValueError, match="unknown option"):
    expected.render("s", "<!-- results quick/fig1 colour=red -->\n<!-- end results -->")


def test_the_committed_expected_files_are_what_their_results_render():
  """EXPECTED.md's results tables are rendered, never typed (python -m
  experiments.expected rewrites them)."""
  for study in expected.studies():
    assert expected.render(study) == expected.path_of(study).read_text(), study
  path, text = expected.readme()
  assert text == path.read_text(), "README's tour block is not what docs/ renders"


def test_every_committed_row_rechecks_and_is_one_number():
  """Each committed status follows from the row's own numbers; paper and ours are
  numbers (or null), never strings packing several quantities."""
  seen = 0
  for path in results.ROOT.glob("experiments/*/results/*/*.json"):
    if path.name == "summary.json":
      continue
    doc = json.loads(path.read_text())
    assert {"commit", "dirty", "jax", "backend", "device_kind"} <= set(doc["provenance"])
    for r in doc["rows"]:
      seen += 1
      assert list(r) == list(evidence.FIELDS), (path, r["item"])
      for k in ("paper", "ours", "sd", "tolerance"):
        assert r[k] is None or isinstance(r[k], (int, float)), (path, r["item"], k)
        assert r[k] is None or math.isfinite(r[k])
      if r["status"] in ("match", "mismatch"):
        assert evidence.recheck(r) == r["status"], (path, r["item"])
  assert seen > 0, "no committed results files"


def test_negative_zero_prints_as_zero_in_summary_md_and_the_report():
  """A paper value -0.000 (TR Fig 14) is stored as -0.0: printed "0", never "-0"."""
  from rankjax.report import rows_to_html
  row = {"experiment": "fig7", "item": "Fig 14", "paper": -0.0, "ours": -0.0,
         "per_seed": [-0.0, 0.25], "status": "match"}
  assert [results._cell(x) for x in (-0.0, 0.0, -1e-9, -0.5)] == ["0", "0", "-1e-09", "-0.5"]
  line = results.table([row], ("paper", "ours", "per_seed"))[-1]
  assert line == "| 0 | 0 | 0, 0.25 |"
  assert "-0<" not in rows_to_html([row]) and "<td>0</td>" in rows_to_html([row])
