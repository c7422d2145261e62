"""Every claim says what of the paper it tests, and the register lists every item.

Each declared claim carries the paper's words (``quote``), the item it tests (``where``)
and its ``kind``; each ``where`` is an item of the study's register
(``rankjax._src.studies.items``), and every registered item is tested by a committed row or
says why not. The paper's words are checked against the paper's text: a quote's
pieces between ellipses each occur in shared/papers/<study>.txt (whitespace and case
folded), where the checkout has the papers.
"""
from __future__ import annotations

import pathlib
import re

import pytest

from rankjax._src.studies import evidence, expected, finder, items

STUDIES = sorted(finder.find().items())
PAPERS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "papers"


def _fold(text: str) -> str:
  return re.sub(r"\s+", " ", text.replace("\u2019", "'").replace("\u2212", "-")).strip().lower()


def _claims(study):
  return {(name, item): c for name in study.experiments
          for item, c in study.claims(name).items()}


@pytest.mark.parametrize("name,folder", STUDIES, ids=[n for n, _ in STUDIES])
def test_every_claim_quotes_the_paper_and_names_its_item(name, folder):
  study = finder.load(folder)
  known = {e.where for e in study.register}
  bad = [f"{n}/{item}: " + ", ".join(
      why for why, fails in (("no quote", not c.quote), ("no where", not c.where),
                             (f"where {c.where!r} not registered", c.where not in known))
      if fails)
         for (n, item), c in _claims(study).items()
         if not c.quote or not c.where or c.where not in known]
  assert not bad, f"{len(bad)} claims: " + "; ".join(bad[:20])


@pytest.mark.parametrize("name,folder", STUDIES, ids=[n for n, _ in STUDIES])
def test_quotes_are_the_papers_words(name, folder):
  paper = PAPERS / f"{name}.txt"
  if not paper.is_file():
    pytest.skip(f"{paper} is not in this checkout")
  text = _fold(paper.read_text())
  study = finder.load(folder)
  bad = []
  for (n, item), c in _claims(study).items():
    for piece in re.split(r"\.\.\.|\u2026|\[[^\]]*\]", c.quote):
      piece = _fold(piece).strip(" .,;:\"'")
      if len(piece) >= 12 and piece not in text:
        bad.append(f"{n}/{item}: {piece[:60]!r}")
  assert not bad, f"{len(bad)} quotes not found in the paper: " + "; ".join(bad[:15])


@pytest.mark.parametrize("name,folder", STUDIES, ids=[n for n, _ in STUDIES])
def test_register_covers_the_committed_rows(name, folder):
  study = finder.load(folder)
  rows = [r for rs in expected.committed_rows(study).values() for r in rs]
  problems = items.check_register(study.register, rows)
  assert not problems, "; ".join(problems[:20])


@pytest.mark.parametrize("name,folder", STUDIES, ids=[n for n, _ in STUDIES])
def test_committed_rows_carry_the_declared_words(name, folder):
  """A committed row's where, kind and quote are its claim's (re-recorded or re-judged
  since the claim last changed)."""
  study = finder.load(folder)
  claims = _claims(study)
  stale = []
  for scale, rows in expected.committed_rows(study).items():
    for r in rows:
      c = claims.get((r["experiment"], r["item"]))
      if c is None or r["status"] in ("missing", "failed"):
        continue
      if (r.get("where"), r.get("kind"), r.get("quote")) != (c.where, c.kind, c.quote):
        stale.append(f"{scale}/{r['experiment']}/{r['item']}")
  assert not stale, (f"{len(stale)} rows not re-judged (rankjax rejudge): "
                     + "; ".join(stale[:10]))
  assert all(r.get("kind") in evidence.KINDS for rows in expected.committed_rows(study).values()
             for r in rows if r["status"] not in ("missing", "failed"))
