"""Rows as evidence: claims judged by declared rules, results files, rendered tables."""

import json
import math
import re

import numpy as np
import pytest

from rankjax._src.studies import evidence, expected, finder, results
from rankjax._src.studies.evidence import Abs, Bound, Claim, OneMinus, Qualitative, Rel


def test_band_rules_write_the_declared_band_into_the_row():
  row = Claim("Fig 1", "erank/d", 0.5, Abs(0.01)).judge(0.505)
  assert (row["status"], row["band"], row["n"], row["sd"], row["interval"]) == \
      ("match", 0.01, 1, None, None)
  assert Claim("Fig 1", "erank/d", 0.5, Abs(0.01)).judge(0.52)["status"] == "mismatch"
  assert Claim("x", "q", 2.0, Rel(0.05)).judge(2.09)["band"] == pytest.approx(0.1)
  # near 1 the band is relative on 1 - x: 0.972 is a rank loss 40% larger than 0.980
  near_one = Claim("Table 3", "erank/d", 0.980, OneMinus(0.25))
  assert near_one.judge(0.972)["status"] == "mismatch"
  assert near_one.judge(0.977)["status"] == "match"
  assert near_one.judge(0.977)["band"] == pytest.approx(0.005)


def test_the_t_interval_is_scipys_and_independent_of_the_band():
  values = [0.40, 0.50, 0.60]          # mean 0.5, sd 0.1 (ddof 1), t_{0.975, 2} = 4.3027
  lo, hi = evidence.t_interval(values)
  assert (lo, hi) == pytest.approx((0.5 - 4.302653 * 0.1 / 3 ** 0.5,
                                    0.5 + 4.302653 * 0.1 / 3 ** 0.5), rel=1e-6)
  row = Claim("x", "q", 0.5, Abs(0.01)).judge(values, seeds=[0, 1, 2])
  assert row["band"] == 0.01 and row["interval"] == pytest.approx([lo, hi])
  assert row["per_seed"] == values and row["seeds"] == [0, 1, 2]
  with pytest.raises(ValueError, match="3 values for 2 seeds"):
    Claim("x", "q", 0.5, Abs(0.1)).judge(values, seeds=[0, 1])


def test_noise_never_widens_the_band():
  """The issue's example: seeds +0.5 and -1.5 around a paper value of -0.5 used to
  "match" (2 sd = 2.83); their interval straddles the band, and a tight -0.40 is a
  mismatch however many seeds show it."""
  claim = Claim("x", "slope", -0.5, Abs(0.05))
  noisy = claim.judge([0.5, -1.5])
  assert noisy["status"] == "inconclusive" and noisy["band"] == 0.05
  assert "no number of seeds" not in noisy["note"] and "seeds at this spread" in noisy["note"]
  assert claim.judge([-0.40, -0.401, -0.399])["status"] == "mismatch"
  assert claim.judge([-0.50, -0.501, -0.499])["status"] == "match"


def test_inconclusive_says_how_many_seeds_would_decide():
  values = [0.46, 0.50, 0.54]   # mean 0.5, sd 0.04: half width 0.0994 with 3 seeds
  row = Claim("x", "q", 0.55, Abs(0.1)).judge(values)    # margin to the edge 0.45: 0.05
  assert row["status"] == "inconclusive"
  need = evidence.seeds_to_decide(0.05, 0.04, 3)
  assert evidence.half_width(0.04, need) < 0.05 <= evidence.half_width(0.04, need - 1)
  assert f"about {need} seeds" in row["note"]
  assert evidence.seeds_to_decide(0.0, 0.04, 3) is None
  # with that many seeds at the same mean and spread it is decided
  more = np.linspace(-1, 1, need)
  more = 0.5 + 0.04 * more / np.std(more, ddof=1)
  assert Claim("x", "q", 0.55, Abs(0.1)).judge(list(more))["status"] == "match"


def test_bounds_are_predicates_on_the_interval_or_every_seed():
  below = Claim("alpha", "max alpha", 2.5, Bound("<"), note="stays below 2.5")
  row = below.judge([1.0, 3.0])                 # mean 2.0, interval about [-4.4, 8.4]
  assert row["status"] == "inconclusive" and row["band"] is None
  assert row["note"].startswith("stays below 2.5") and row["rule"] == "ours < paper"
  assert below.judge([1.0, 1.1, 1.2])["status"] == "match"
  assert below.judge([3.0, 3.1, 3.2])["status"] == "mismatch"
  assert below.judge(2.4)["status"] == "match" and below.judge(2.5)["status"] == "mismatch"
  every = Claim("alpha", "max alpha", 2.5, Bound("<", every_seed=True))
  assert every.judge([1.0, 3.0])["status"] == "mismatch"
  assert every.judge([1.0, 2.0])["status"] == "match"
  assert Claim("both", "seeds with a transition", 2, Bound(">=")).judge(1)["status"] == \
      "mismatch"
  equal = Claim("rank", "rank", 9, Bound("=="))
  assert equal.judge([9, 9, 9])["status"] == "match"
  assert equal.judge([8, 10])["status"] == "inconclusive"
  assert equal.judge([7, 7])["status"] == "mismatch"


def test_a_proxy_shows_its_numbers_and_direction_and_is_never_a_match():
  row = Claim("Fig 3", "alpha max", 2.5, Abs(0.5)).judge([2.4, 2.5, 2.6])
  assert row["status"] == "match"
  proxy = evidence.as_proxy(row, "12 layers, d=64 (paper: 48, d=512)")
  assert proxy["status"] == "proxy" and proxy["ours"] == row["ours"]
  assert proxy["note"].startswith("proxy: 12 layers, d=64 (paper: 48, d=512); ours 2.5 [")
  assert "on both sides of the paper's 2.5" in proxy["note"]
  assert evidence.recheck(proxy) == "proxy"
  low = evidence.as_proxy(Claim("x", "q", 1.0, Rel(0.1)).judge(0.5), "toy")
  assert "ours 0.5 is below the paper's 1" in low["note"]
  qual = Claim("x", "q", None, Qualitative("a look")).judge(0.5)
  assert evidence.as_proxy(qual, "toy") == qual       # nothing judged, nothing to mark


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
    (Claim("a2", "q", 0.5, Abs(0.01)), [0.499, 0.5, 0.501]),
    (Claim("a3", "q", 0.5, Rel(0.1)), [0.6, 0.601, 0.599]),
    (Claim("b2", "q", 2.5, Bound("<")), [1.0, 3.0]),
    (Claim("b", "q", 0.98, OneMinus(0.25)), 0.972),
    (Claim("c", "q", 2.5, Bound("<", every_seed=True)), [1.0, 2.6]),
    (Claim("d", "q", 0.0, Bound(">")), [0.1, -0.05]),
])
def test_recheck_recomputes_a_status_from_the_row_alone(claim, values):
  row = json.loads(json.dumps(claim.judge(values)))     # as committed
  assert evidence.recheck(row) == row["status"]


def _row(item, ours, status="match", per_seed=None, interval=None):
  return {"experiment": "e", "item": item, "ours": ours, "band": 0.1, "status": status,
          "per_seed": per_seed, "interval": interval}


def test_compare_names_what_moved_by_its_own_tolerance_never_the_paper_band():
  old = [_row("a", 0.50), _row("b", 0.50), _row("c", 1.0, per_seed=[0.9, 1.1]),
         _row("gone", 1.0)]
  new = [_row("a", 0.500001), _row("b", 0.52), _row("c", 1.0, per_seed=[0.95, 1.05]),
         _row("fresh", 1.0)]
  moved = results.compare(new, old)
  assert any(line.startswith("e / b: ours 0.5 -> 0.52") for line in moved)   # 4%, in band
  assert any(line.startswith("e / c: ours 1 -> 1") for line in moved)        # a seed moved
  assert "e / gone: committed row no longer produced" in moved
  assert "e / fresh: new row, not committed" in moved
  assert not any(line.startswith("e / a") for line in moved)                # 2e-6 relative
  flipped = results.compare([_row("a", 0.50, status="mismatch")], [_row("a", 0.50)])
  assert flipped == ["e / a: status match -> mismatch (ours 0.5 -> 0.5)"]


def _committed(scale: str):
  """``(path, results file, its Experiment)`` of every committed results file at
  ``scale`` (a glob)."""
  from rankjax._src import reproduce
  for name, folder in sorted(finder.find().items()):
    for path in sorted(folder.glob(f"results/{scale}/*.json")):
      if path.name != "summary.json":
        doc = json.loads(path.read_text())
        yield path, doc, reproduce.study(name).experiments[doc["experiment"]]


def test_a_planted_five_percent_change_of_a_deterministic_number_fails_check():
  """Every committed row of a deterministic experiment, moved by 5% (inside most paper
  bands), is named by --check under the experiment's declared tolerances."""
  checked = 0
  for path, doc, exp in _committed("quick"):
    if exp.trained:
      continue
    rows = doc["rows"]
    planted = [dict(r, ours=r["ours"] * 1.05 if r["ours"] is not None else None,
                    per_seed=[v * 1.05 for v in r["per_seed"]] if r["per_seed"] else None)
               for r in rows]
    moved = results.compare(planted, rows, exp.recheck_rtol, False, exp.recheck_atol)
    for r in rows:
      if r["ours"] and 0.05 * abs(r["ours"]) > exp.recheck_atol:
        checked += 1
        assert any(f"/ {r['item']}:" in m for m in moved), (path.name, r["item"])
  assert checked > 200


def test_trained_experiments_recheck_at_the_distribution_level():
  old = [_row("t", 1.0, per_seed=[0.9, 1.0, 1.1], interval=[0.75, 1.25])]
  near = [_row("t", 1.05, per_seed=[0.95, 1.05, 1.15], interval=[0.8, 1.3])]
  far = [_row("t", 2.0, per_seed=[1.9, 2.0, 2.1], interval=[1.75, 2.25])]
  assert results.compare(near, old, trained=True) == []
  assert results.compare(near, old) != []                # deterministic: 5% is drift
  assert results.compare(far, old, trained=True) == [
      "e / t: interval 0.75, 1.25 -> 1.75, 2.25, no overlap"]


def test_expected_blocks_render_from_results_files(tmp_path):
  study = tmp_path / "experiments" / "s"      # a study folder (rendering needs only that)
  folder = study / "results" / "quick"
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
  (study / "EXPECTED.md").write_text(text)
  out = expected.render(study)
  assert out.startswith("prose 1\n<!-- results quick/fig1 items=L=8 fields=item,ours,status"
                        " -->\n| item | ours | status |\n|---|---|---|\n"
                        "| Fig 1, L=8 | 0.2 | mismatch |\n")
  assert "commit abc123, cpu (x)" in out and "stale" not in out
  assert "(no results file s/results/quick/fig9.json yet)" in out
  assert expected.render(study, out) == out            # rendering is a fixed point
  assert expected.main([str(study), "--check"]) == 1
  from rankjax._src import cli                  # the same through `rankjax expected`
  assert cli.main(["expected", str(study), "--check"]) == 1
  assert expected.write(study) and expected.main([str(study), "--check"]) == 0
  assert cli.main(["expected", str(study), "--check"]) == 0
  with pytest.raises(ValueError, match="unknown option"):
    expected.render(study, "<!-- results quick/fig1 colour=red -->\n<!-- end results -->")
  (folder / "summary.json").write_text(json.dumps(rows + [dict(rows[0], status="proxy")]))
  counted = expected.render(study, "<!-- results quick/counts -->\n<!-- end results -->")
  assert ("quick scale, 3 rows: 1 paper items: at the paper's setting match 0, mismatch 1, "
          "inconclusive 0, open 0; proxy 0 (measured at another setting") in counted
  assert "(from 3 experiment rows; 0 identity and 0 sensitivity rows shown" in counted


def test_the_committed_expected_files_are_what_their_results_render():
  """EXPECTED.md's results tables are rendered, never typed (python -m
  rankjax._src.studies.expected rewrites them)."""
  for study in expected.studies():
    assert expected.render(study) == expected.path_of(study).read_text(), study
  path, text = expected.readme()
  assert text == path.read_text(), "README's tour block is not what docs/ renders"


def test_every_committed_row_rechecks_and_is_one_number():
  """Each committed status follows from the row's own numbers; paper and ours are
  numbers (or null), never strings packing several quantities."""
  seen = 0
  for path in (p for f in finder.find().values() for p in f.glob("results/*/*.json")):
    if path.name == "summary.json":
      continue
    doc = json.loads(path.read_text())
    assert {"commit", "dirty", "jax", "backend", "device_kind"} <= set(doc["provenance"])
    for r in doc["rows"]:
      seen += 1
      assert list(r) == list(evidence.FIELDS), (path, r["item"])
      for k in ("paper", "ours", "sd", "band"):
        assert r[k] is None or isinstance(r[k], (int, float)), (path, r["item"], k)
        assert r[k] is None or math.isfinite(r[k])
      if r["status"] in ("match", "mismatch", "inconclusive", "proxy"):
        assert evidence.recheck(r) == r["status"], (path, r["item"])
        want = (evidence.draw_range(r["per_seed"]) if (r["rule"] or "").startswith("draw:")
                and r["per_seed"]
                else evidence.t_interval(r["per_seed"], r["confidence"] or evidence.CONFIDENCE))
        assert r["interval"] == want, (path, r["item"])
        assert "or 2 sd" not in (r["rule"] or ""), (path, r["item"])
  assert seen > 0, "no committed results files"


def test_negative_zero_prints_as_zero_in_summary_md_and_the_report():
  """A paper value -0.000 (TR Fig 14) is stored as -0.0: printed "0", never "-0"."""
  from rankjax._src.report import rows_to_html
  row = {"experiment": "fig7", "item": "Fig 14", "paper": -0.0, "ours": -0.0,
         "per_seed": [-0.0, 0.25], "status": "match"}
  assert [results._cell(x) for x in (-0.0, 0.0, -1e-9, -0.5)] == ["0", "0", "-1e-09", "-0.5"]
  line = results.table([row], ("paper", "ours", "per_seed"))[-1]
  assert line == "| 0 | 0 | 0, 0.25 |"
  assert "-0<" not in rows_to_html([row]) and "<td>0</td>" in rows_to_html([row])


def test_committed_rows_away_from_the_papers_setting_are_proxies():
  """A committed row is a proxy exactly when its experiment declares its scale another
  setting than the paper's and the row is not one of its scale-free items; its note
  names that setting."""
  from rankjax._src.studies import runner
  proxies = 0
  for path, doc, exp in _committed("*"):
    setting = exp.setting[doc["scale"]]
    for r in doc["rows"]:
      judged = r["rule"] not in (None, "qualitative")
      away = setting != runner.PAPER_SETTING and r["item"] not in exp.scale_free
      assert (r["status"] == "proxy") == (judged and away), (path, r["item"])
      if r["status"] == "proxy":
        proxies += 1
        assert r["note"].startswith(f"proxy: {setting}; "), (path, r["item"])
  assert proxies > 0


def _committed_rows_and_claims():
  """``(path, row, its experiment's claims)`` of every committed row, every scale."""
  from rankjax._src import reproduce
  for name, folder in sorted(finder.find().items()):
    study = reproduce.study(name)
    for path in sorted(folder.glob("results/*/*.json")):
      if path.name != "summary.json":
        doc = json.loads(path.read_text())
        claims = study.claims(doc["experiment"])
        for r in doc["rows"]:
          yield path, r, claims


def test_every_committed_row_was_judged_by_the_claim_declared_today():
  """A committed row carries its claim (item, quantity, paper, rule, band): each is the
  claim its experiment declares now, so no claim was changed after its result was
  recorded (changing one means recording the experiment again)."""
  seen = 0
  for path, r, claims in _committed_rows_and_claims():
    if r["status"] in ("missing", "failed"):
      continue
    c = claims.get(r["item"])
    assert c is not None, (path, r["item"])
    band = c.rule.band(c.paper) if hasattr(c.rule, "band") else None
    assert (r["quantity"], r["paper"], r["rule"], r["limit"], r["confidence"]) == (
        c.quantity, c.paper, c.rule.describe(), c.limit,
        None if isinstance(c.rule, (evidence.Draw, Qualitative)) else c.confidence), (
        path, r["item"])
    assert r["band"] == band or (band is not None and math.isclose(r["band"], band)), (
        path, r["item"])
    seen += 1
  assert seen > 700


def test_every_results_file_names_its_claims_commit_not_later_than_its_own():
  """``claims_commit`` (the last commit that changed the module declaring the claims) is
  the result's own commit or one of its ancestors: the claims were in the code that
  produced the numbers, never added after them."""
  import subprocess
  git = lambda *a: subprocess.run(["git", "-C", str(finder.CHECKOUT_STUDIES), *a],
                                  capture_output=True, text=True)
  checked = 0
  for folder in finder.find().values():
    for path in sorted(folder.glob("results/*/*.json")):
      if path.name == "summary.json":
        continue
      doc = json.loads(path.read_text())
      claims, own = doc.get("claims_commit"), doc["provenance"]["commit"]
      assert claims and own, (path, "no claims_commit or commit recorded")
      if git("cat-file", "-e", f"{claims}^{{commit}}").returncode or git(
          "cat-file", "-e", f"{own}^{{commit}}").returncode:
        pytest.skip("this checkout lacks the history (a shallow clone)")
      assert git("merge-base", "--is-ancestor", claims, own).returncode == 0, path
      checked += 1
  assert checked > 50


_TYPED = re.compile(r"(?<![\w.`/-])[-+]?\d+\.\d{2,}(?:e[-+]?\d+)?(?![\w.`/])")


def _prose(text: str) -> str:
  """EXPECTED.md without its rendered blocks, code spans and code blocks."""
  text = re.sub(r"<!-- results [^>]*-->\n.*?<!-- end results -->", "", text, flags=re.S)
  text = re.sub(r"<!-- (?:register|figure[^>]*) -->\n.*?<!-- end (?:register|figure) -->", "",
                text, flags=re.S)     # the register quotes the paper's printed numbers
  text = re.sub(r"```.*?```", "", text, flags=re.S)
  return re.sub(r"`[^`]*`", "", text)


def test_expected_prose_types_no_measured_number():
  """EXPECTED.md is rendered evidence: a number with two or more decimals outside the
  rendered blocks (and code) would be typed by hand, so it is not there; the readings
  that quote numbers live in docs/notes/ (dated history), the current ones in the
  rendered tables."""
  for study in expected.studies():
    typed = _TYPED.findall(_prose(expected.path_of(study).read_text()))
    assert not typed, (study, typed[:20])


def test_the_typed_number_rule_can_fail():
  assert _TYPED.findall(_prose("ours 0.994 vs 0.992; LR 8e-4; `0.123` 1.5\n"
                               "<!-- results quick/x -->\n0.555\n<!-- end results -->")) == [
      "0.994", "0.992"]


def _past(row: dict, inside: bool = False) -> list[float] | float:
  """The row's measured values shifted rigidly (spread kept) so that the mean's interval
  lies wholly past the band or predicate limit (``inside``: centred on the paper's
  value, for band rows)."""
  per = row["per_seed"] or [row["ours"]]
  mean = sum(per) / len(per)
  lo, hi = row["interval"] or (mean, mean)
  w = max(hi - mean, mean - lo, *(abs(v - mean) for v in per))   # every seed past too
  paper = row["paper"] if row["paper"] is not None else row["limit"]   # ours, where no paper's
  eps = 1e-3 * max(1.0, abs(paper), w)
  if row["band"] is not None:
    target = paper if inside else paper + row["band"] + w + eps
  else:
    op = row["rule"].split()[1]
    target = paper + (w + eps if op in ("<", "<=", "==") else -(w + eps))
  shifted = [v + target - mean for v in per]
  return shifted if row["per_seed"] else shifted[0]


def test_every_committed_claim_fails_on_a_planted_counterexample():
  """Each committed row with a rule (proxies included), its values moved past the band or
  limit, is a mismatch under the claim its experiment declares: no claim passes
  whatever is measured. Band rows whose spread fits the band also match when moved
  onto the paper's value, so the rule discriminates both ways."""
  failed = matched = 0
  for path, r, claims in _committed_rows_and_claims():
    if r["rule"] in (None, "qualitative") or r["ours"] is None:
      continue
    c = claims[r["item"]]
    assert c.judge(_past(r))["status"] == "mismatch", (path, r["item"])
    failed += 1
    if r["band"] is not None and (not r["interval"] or (
        r["interval"][1] - r["interval"][0]) / 2 < r["band"]):
      assert c.judge(_past(r, inside=True))["status"] == "match", (path, r["item"])
      matched += 1
  assert failed > 700 and matched > 300, (failed, matched)


def test_a_planted_counterexample_of_every_declared_claim_fails():
  """Every claim any study declares, given three seeds past its band or limit, is a
  mismatch (and three on the paper's value, a match), whether or not it was measured."""
  from rankjax._src import reproduce
  seen = 0
  for name in sorted(finder.find()):
    study = reproduce.study(name)
    for exp in study.experiments:
      for c in study.claims(exp).values():
        if isinstance(c.rule, Qualitative):
          continue
        band = c.rule.band(c.paper) if hasattr(c.rule, "band") else None
        ref = c.paper if c.paper is not None else c.limit
        s = 0.01 * (band or max(1e-3, 0.1 * abs(ref)))
        k = evidence.MIN_DRAWS if isinstance(c.rule, evidence.Draw) else 1   # draws: 3k
        per = [ref + d for d in (-s, 0.0, s) * k]
        row = {"paper": c.paper, "limit": c.limit, "band": band, "rule": c.rule.describe(),
               "per_seed": per, "ours": sum(per) / len(per),
               "interval": evidence.t_interval(per, c.confidence)}
        assert c.judge(_past(row))["status"] == "mismatch", (name, exp, c.item)
        if band is not None:
          assert c.judge(_past(row, inside=True))["status"] == "match", (name, exp, c.item)
        seen += 1
  assert seen > 300, seen


def test_an_untested_claim_is_inconclusive_without_a_value_never_a_match():
  claim = Claim("Sec 5", "lowest median certificate", 0.995, Bound(">=", every_seed=True))
  row = json.loads(json.dumps(claim.judge([0.9999, 1.0], untested="attention stayed uniform")))
  assert (row["status"], row["ours"], row["per_seed"]) == ("inconclusive", None, None)
  assert row["note"].startswith(evidence.NOT_TESTED + "attention stayed uniform")
  assert evidence.recheck(row) == "inconclusive"
  proxy = evidence.as_proxy(row, "toy")
  assert proxy["status"] == "proxy" and evidence.recheck(proxy) == "proxy"
  band = Claim("x", "q", 0.5, Abs(0.1)).judge(0.5, untested="budget")
  assert (band["status"], band["band"]) == ("inconclusive", 0.1)
  # a not-tested note on a row that has a value is judged by its numbers
  assert evidence.recheck(dict(band, ours=0.5)) == "match"
