"""Claims as the papers state them: the new rules, counting by paper item, the
register, re-judging committed rows, and --check's rule for trained runs."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from rankjax._src.provenance import same_bits
from rankjax._src.studies import evidence, expected, items, rejudge, results, runner
from rankjax._src.studies.evidence import Abs, Bound, Claim, Draw


def _row(where, status, kind="experiment", reading="", experiment="e"):
  return {"where": where, "status": status, "kind": kind, "reading": reading,
          "experiment": experiment}


def test_draw_judges_the_papers_one_draw_against_single_draws_not_the_mean():
  rng = np.random.default_rng(0)
  draws = list(0.178 + 0.02 * rng.standard_normal(40))
  paper = 89 / 500                                  # one draw, 0.178
  as_mean = Claim("D.2 rate", "rate", paper, Abs(0.001)).judge(draws)
  as_draw = Claim("D.2 rate", "rate", paper, Draw(0.001)).judge(draws)
  assert as_draw["status"] == "match" and as_draw["rule"].startswith("draw:")
  lo, hi = np.percentile(draws, [2.5, 97.5])
  assert as_draw["interval"] == pytest.approx([lo, hi])
  assert as_mean["band"] == as_draw["band"] == pytest.approx(0.001)
  far = Claim("D.2 rate", "rate", 0.30, Draw(0.001)).judge(draws)
  assert far["status"] == "mismatch"
  few = Claim("D.2 rate", "rate", paper, Draw()).judge(draws[:3])
  assert few["status"] == "inconclusive" and "single draws" in few["note"]
  for r in (as_draw, far, few):
    assert evidence.recheck(r) == r["status"]


def test_a_family_of_k_points_is_judged_at_the_sidak_level():
  assert evidence.family_confidence(1) == 0.95
  assert evidence.family_confidence(10) == pytest.approx(0.95 ** 0.1)
  vals = [1.0, 1.1, 0.9, 1.05]
  one = Claim("x", "q", 1.0, Abs(0.2)).judge(vals)
  fam = Claim("x", "q", 1.0, Abs(0.2), family=10).judge(vals)
  w = lambda r: r["interval"][1] - r["interval"][0]
  assert fam["confidence"] == pytest.approx(0.95 ** 0.1) and w(fam) > w(one)
  sd = np.std(vals, ddof=1)
  half = stats.t.ppf(0.5 + 0.95 ** 0.1 / 2, 3) * sd / 2
  assert w(fam) == pytest.approx(2 * half)
  assert evidence.recheck(fam) == fam["status"]
  with pytest.raises(ValueError, match="family"):
    Claim("x", "q", 1.0, Abs(0.2), family=0)


def test_our_threshold_is_a_limit_and_never_the_papers_number():
  row = Claim("Fig 7 fit", "R^2", None, Bound(">=", limit=0.99)).judge([0.995, 0.996, 0.997, 0.996])
  assert row["paper"] is None and row["limit"] == 0.99
  assert row["rule"] == "ours >= limit (ours)" and row["status"] == "match"
  assert evidence.recheck(row) == "match"
  assert "our limit 0.99" in evidence.direction(row)
  with pytest.raises(ValueError, match="limit is ours"):
    Claim("x", "q", 0.5, Bound("<", limit=0.99))
  with pytest.raises(ValueError, match="needs the paper's number"):
    Claim("x", "q", None, Bound("<"))


def test_direction_words_an_interval_on_the_papers_value():
  row = lambda lo, hi, ours: {"paper": 0.0, "ours": ours, "interval": [lo, hi]}
  assert "is equal to the paper's 0" in evidence.direction(row(0.0, 0.0, 0.0))
  assert "on both sides of" in evidence.direction(row(-1.0, 1.0, 0.0))
  assert "at or above" in evidence.direction(row(0.0, 1.0, 0.5))
  assert "ours 0 is equal" in evidence.direction({"paper": 0.0, "ours": 0.0})


def test_claims_carry_where_quote_kind_reading_post_hoc_into_the_row():
  c = Claim("T3 e=0.6", "erank/d", 0.98, Abs(0.01), note="d=256", where="Table 3",
            quote="independent random walk", kind="sensitivity", reading="renormalized",
            post_hoc="declared after a review saw it reproduce")
  row = c.judge([0.979, 0.981, 0.98])
  assert (row["where"], row["kind"], row["reading"], row["quote"]) == (
      "Table 3", "sensitivity", "renormalized", "independent random walk")
  assert row["note"].startswith(evidence.POST_HOC + "declared after a review")
  with pytest.raises(ValueError, match="kind"):
    Claim("x", "q", 1.0, Abs(0.1), kind="headline")
  untested = c.judge(1.0, untested="the budget guarantees it")
  assert untested["note"].startswith(evidence.NOT_TESTED) and untested["where"] == "Table 3"


def test_an_item_counts_once_by_its_experiment_rows():
  rows = [_row("Fig 1", "match"), _row("Fig 1", "mismatch"),
          _row("Fig 1", "match", kind="identity"),
          _row("Table 3", "match"), _row("Table 3", "mismatch", kind="sensitivity"),
          _row("Fig 9", "proxy"), _row("Fig 9", "proxy"),
          _row("Eq 5", "match", kind="identity")]
  t = items.item_table(rows)
  assert t["Fig 1"]["status"] == "mismatch" and t["Table 3"]["status"] == "match"
  assert t["Fig 9"]["status"] == "proxy" and t["Eq 5"]["status"] == "not tested"
  assert (t["Fig 1"]["experiment"], t["Fig 1"]["identity"]) == (2, 1)
  n = items.item_counts(rows)
  assert (n["match"], n["mismatch"], n["proxy"], n["open"]) == (1, 1, 1, 0)
  text = items.counts_text(rows)
  assert text.startswith("4 paper items: at the paper's setting match 1, mismatch 1, "
                         "inconclusive 0, open 0; proxy 1")
  assert "2 identity and 1 sensitivity rows shown, not counted" in text


def test_readings_that_disagree_leave_the_item_open():
  agree = [_row("T3", "match", reading="geodesic"), _row("T3", "match", reading="renormalized")]
  assert items.item_status(agree) == ("match", "")
  differ = [_row("T3", "mismatch", reading="geodesic"),
            _row("T3", "match", reading="renormalized")]
  status, why = items.item_status(differ)
  assert status == "open" and why == "mismatch under geodesic; match under renormalized"
  assert items.item_counts(differ)["open"] == 1
  failed = [_row("T3", "failed", reading="a"), _row("T3", "match", reading="b")]
  assert items.item_status(failed)[0] == "open"


def test_the_register_names_every_item_and_every_row_names_a_registered_item():
  reg = items.register([items.PaperItem("Fig 1", "rank kept"),
                        items.PaperItem("Fig 17", "MP bulk", untested="needs a checkpoint")])
  assert items.check_register(reg, [_row("Fig 1", "match")]) == []
  assert items.check_register(reg, [_row("Fig 2", "match")]) == [
      "row where 'Fig 2' is not in the register",
      "'Fig 1': no row tests it and the register gives no reason"]
  assert "rows test it, yet" in items.check_register(reg, [_row("Fig 17", "match"),
                                                           _row("Fig 1", "match")])[0]
  with pytest.raises(ValueError, match="twice"):
    items.register([items.PaperItem("Fig 1", "a"), items.PaperItem("Fig 1", "b")])


def _study(tmp_path, claims_src: str, register_src: str = "()"):
  """A study package on disk (one experiment, module m) and its committed rows."""
  import importlib
  import sys
  pkg = tmp_path / "mystudy_items"
  (pkg / "results" / "quick").mkdir(parents=True, exist_ok=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "m.py").write_text(
      "from rankjax.studies import Claim, Abs, Bound, Draw, claims\n"      # the face
      f"CLAIMS = claims([{claims_src}])\nSCALES = {{'quick': {{}}}}\n"
      "def run(out_dir, scale='quick'):\n  return {}\n")
  (pkg / "reproduce.py").write_text(
      "from rankjax import studies as items\n"        # register_src's items.PaperItem
      "from rankjax.studies import Study, Experiment\n"
      "STUDY = Study('mystudy_items', 'T', {'m': Experiment('m', setting={'quick': 'paper'})},"
      f" register={register_src})\n")
  for name in [n for n in sys.modules if n.startswith("mystudy_items")]:
    del sys.modules[name]
  importlib.invalidate_caches()
  from rankjax._src.studies import finder
  return finder.load(pkg), pkg


def test_rejudge_applies_the_current_claims_to_the_committed_values(tmp_path):
  study, pkg = _study(tmp_path, "Claim('a', 'q', 1.0, Abs(0.05), note='old words')")
  old = runner._filled("m", evidence.as_proxy(
      Claim("a", "q", 1.0, Abs(0.05), note="old words").judge(
          [1.0, 1.2, 0.8], seeds=[0, 1, 2], note="measured at d=8"),
      "d=8 (paper: d=256)"), "quick")
  assert old["status"] == "proxy" and "inconclusive: the 95% interval" in old["note"]
  prov = {"commit": "abc", "dirty": False, "jax": "0", "backend": "cpu", "device_kind": "cpu"}
  (pkg / "results" / "quick" / "m.json").write_text(json.dumps(
      {"rows": [old], "provenance": prov, "seeds": [0, 1, 2]}))
  (pkg / "m.py").write_text((pkg / "m.py").read_text().replace(
      "Abs(0.05), note='old words')",
      "Abs(0.5), note='old words', where='Fig 1', quote='the rank', kind='experiment')"))
  study, _ = _study(tmp_path, "Claim('a', 'q', 1.0, Abs(0.5), note='old words', "
                    "where='Fig 1', quote='the rank')")
  assert rejudge.rejudge(study, "quick") == ["m"]
  doc = json.loads((pkg / "results" / "quick" / "m.json").read_text())
  row = doc["rows"][0]
  assert row["per_seed"] == old["per_seed"] and row["seeds"] == [0, 1, 2]
  assert (row["where"], row["quote"], row["band"]) == ("Fig 1", "the rank", 0.5)
  assert row["status"] == "proxy" and evidence.recheck(row) == "proxy"
  assert row["note"] == ("proxy: d=8 (paper: d=256); ours 1 [0.5032, 1.497] is on both "
                         "sides of the paper's 1; old words; measured at d=8")
  assert doc["rejudged"]["claims"].startswith("the experiment's CLAIMS")
  assert doc["provenance"] == prov
  assert (pkg / "results" / "quick" / "summary.json").is_file()
  study, _ = _study(tmp_path, "Claim('b', 'q', 1.0, Abs(0.5))")
  with pytest.raises(rejudge.MustRerun, match="'a' is no longer declared"):
    rejudge.rejudge(study, "quick")


def test_the_register_and_figures_render_in_expected_md(tmp_path):
  study, pkg = _study(tmp_path, "Claim('a', 'q', 1.0, Abs(0.5), where='Fig 1', "
                      "quote='the rank is kept')",
                      "items.register([items.PaperItem('Fig 1', 'rank kept'), "
                      "items.PaperItem('Fig 17', 'MP bulk', untested='needs a checkpoint')])")
  row = runner._filled("m", Claim("a", "q", 1.0, Abs(0.5), where="Fig 1",
                                  quote="the rank is kept").judge([1.0, 1.0, 1.01]), "quick")
  (pkg / "results" / "quick" / "summary.json").write_text(json.dumps([row]))
  (pkg / "results" / "quick" / "figures").mkdir()
  (pkg / "results" / "quick" / "figures" / "fig1.png").write_bytes(b"png")
  text = ("<!-- register -->\n<!-- end register -->\n<!-- figure quick/fig1.png -->\n"
          "<!-- end figure -->\n<!-- figure quick/nope.png -->\n<!-- end figure -->\n")
  out = expected.render(study, text)
  assert ("| Fig 1 | rank kept | \"the rank is kept\" | **match** (1 exp) |" in out)
  assert "| Fig 17 | MP bulk | (no row: needs a checkpoint) |  |" in out
  assert "![fig1.png (quick scale)](results/quick/figures/fig1.png)" in out
  assert "(no committed figure" in out and "nope.png" in out
  assert expected.render(study, out) == out


def test_check_of_a_trained_run_uses_bits_where_the_bits_are_decided_alike():
  prov = {"jax": "0.10.2", "jaxlib": "0.10.2", "flax": "0.12.8", "optax": "0.2.6",
          "numpy": "2.4.6", "backend": "cpu", "device_kind": "cpu",
          "device_count": 1, "xla_flags": "", "cpu_features": "abc"}
  assert same_bits(prov, dict(prov))[0]
  same, why = same_bits(prov, dict(prov, cpu_features="def"))
  assert not same and "cpu_features 'abc' -> 'def'" in why
  assert not same_bits({k: v for k, v in prov.items() if k != "cpu_features"}, prov)[0]
  row = lambda per: dict(Claim("a", "loss", 1.0, Abs(1.0)).judge(per), experiment="e")
  old, new = [row([1.0, 1.1, 1.2])], [row([1.0, 1.1, 1.2 * (1 + 5e-6)])]
  assert results.compare(new, old, trained=True, same_bits=True)   # 5e-6 relative: moved
  new_ok = [row([1.0, 1.1, 1.2 * (1 + 5e-7)])]
  assert results.compare(new_ok, old, trained=True, same_bits=True) == []
  assert results.compare(new, old, trained=True, same_bits=False) == []   # intervals overlap
  bits, rule = results.check_rule(True, {"provenance": prov}, {"provenance": prov})
  assert bits and "1e-06 relative" in rule
  bits, rule = results.check_rule(True, {"provenance": {}}, {"provenance": prov})
  assert not bits and "intervals must overlap" in rule
  assert results.check_rule(False, {}, {})[1].startswith("deterministic")
