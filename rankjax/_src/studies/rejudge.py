"""Re-judge committed results by the claims as now declared, without rerunning.

A claim's declaration (its ``where``, ``quote``, ``kind``, reading, rule, band) can
change while what was measured does not: the committed rows keep every measured value
(``ours``, ``per_seed``, ``seeds``). ``rejudge`` applies the experiment's current
``CLAIMS`` to those values and rewrites the results file, its summary and EXPECTED.md:

  rankjax rejudge STUDY --scale paper [--only fig1,table3]

Nothing is measured again: the rows' values, settings, seeds, figure data and
provenance stay as recorded, and the file gains ``"rejudged": {commit, date, claims}``
saying when and by which declarations it was judged again. A committed row whose claim
is no longer declared stops it with one line: that experiment must be rerun
(``rankjax reproduce --record``). A claim declared since (a new measurement) gets no
row from a re-judge: rerun the experiment for it (a claim may be measured at some
scales only, so its absence is not an error here).
The note of a row keeps what the measurement said; the claim's own note, the proxy
setting and the verdict's explanation are written anew.
"""
from __future__ import annotations

import argparse
import datetime
import json
from typing import Any, Sequence

from rankjax._src.studies import evidence, expected, finder, results, runner


class MustRerun(ValueError):
  """The committed rows do not carry what the current claims need."""


def _split_note(row: dict[str, Any]) -> tuple[str | None, str, str]:
  """``(proxy setting or None, untested reason, the measurement's own note)`` of a
  committed row's note (the parts ``Claim.judge`` and ``as_proxy`` add removed)."""
  note = row.get("note") or ""
  setting = None
  if row.get("status") == "proxy" and note.startswith(evidence.PROXY):
    body = note[len(evidence.PROXY):]
    for marker in ("; ours ", "; no finite value measured"):
      if marker in body:
        setting, rest = body.split(marker, 1)
        rest = rest.split("; ", 1)[1] if "; " in rest else ""
        note = rest
        break
    else:
      raise MustRerun(f"{row['item']!r}: cannot read the proxy note {note[:80]!r}")
  untested = ""
  if note.startswith(evidence.NOT_TESTED) and row.get("ours") is None:
    untested, note = note[len(evidence.NOT_TESTED):], ""
  parts, skip = [], False
  for p in note.split("; "):
    if p.startswith("inconclusive: ") and ("interval of" in p or "single draws" in p):
      skip = "interval of" in p        # its second half, "about N seeds ...", follows
      continue
    if skip or not p or p.startswith(evidence.POST_HOC):
      skip = False
      continue
    parts.append(p)
  return setting, untested, "; ".join(parts)


def rejudge_row(row: dict[str, Any], claim: evidence.Claim, name: str, scale: str
                ) -> dict[str, Any]:
  """One committed row judged again by ``claim`` (the same values, seeds and note)."""
  setting, untested, note = _split_note(row)
  for known in (claim.note, claim.rule.reason if isinstance(claim.rule, evidence.Qualitative)
                else ""):
    if known:
      note = "; ".join(p for p in note.split("; ") if p and p not in known.split("; "))
  values = row.get("per_seed") or [row.get("ours")]
  values = [float("nan") if v is None else v for v in values]
  new = claim.judge(values if len(values) > 1 else values[0], seeds=row.get("seeds"),
                    note=note, untested=untested)
  if setting is not None:
    new = evidence.as_proxy(new, setting)
  return runner._filled(name, new, scale)


def rejudge(study, scale: str, only: Sequence[str] | None = None) -> list[str]:
  """Re-judges the committed results of ``study`` at ``scale`` (every experiment, or
  ``only``); returns the names rewritten. Raises :class:`MustRerun` naming what needs a
  rerun (nothing is written then)."""
  folder = results.committed_dir(study, scale)
  names = study.resolve(only) if only else list(study.experiments)
  from rankjax._src.provenance import provenance
  now = provenance()
  docs = {}
  for name in names:
    path = folder / f"{name}.json"
    if not path.is_file():
      continue
    doc = json.loads(path.read_text())
    claims = study.claims(name)
    rows, seen = [], set()
    for row in doc["rows"]:
      if row.get("status") in ("missing", "failed"):
        rows.append(row)
        continue
      claim = claims.get(row["item"])
      if claim is None:
        raise MustRerun(f"{study.name}/{name}: committed row {row['item']!r} is no longer "
                        "declared: rerun it (rankjax reproduce --record)")
      seen.add(row["item"])
      rows.append(rejudge_row(row, claim, name, scale))
    doc["rows"] = rows
    doc["rejudged"] = {"commit": now["commit"], "dirty": now["dirty"],
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                           timespec="seconds"),
                       "claims": "the experiment's CLAIMS at that commit; values as measured"}
    docs[name] = (path, doc)
  for name, (path, doc) in docs.items():
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
  if docs:
    results.render_summary(study, folder, scale)
    expected.write(study)
  return list(docs)


def _arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("study")
  parser.add_argument("--scale", required=True)
  parser.add_argument("--only", default=None, help="comma-separated experiments")


def _run(args: argparse.Namespace) -> int:
  study = finder.load(finder.folder_of(args.study))
  try:
    done = rejudge(study, args.scale, args.only.split(",") if args.only else None)
  except MustRerun as e:
    print(f"rejudge: {e}")
    return 2
  print(f"rejudged {args.study} ({args.scale}): {', '.join(done) or 'nothing'}")
  return 0


def add_parser(sub) -> None:
  """``rankjax rejudge STUDY --scale SCALE [--only a,b]``."""
  p = sub.add_parser("rejudge", help="judge committed results again by the claims as now "
                                     "declared (nothing is measured again)")
  _arguments(p)
  p.set_defaults(func=_run)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  _arguments(parser)
  return _run(parser.parse_args(argv))


if __name__ == "__main__":
  raise SystemExit(main())
