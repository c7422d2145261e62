"""EXPECTED.md's tables, rendered from the committed results files.

EXPECTED.md keeps the prose (protocol, open settings and what was chosen, discussion);
each table of results in it is a block the renderer owns:

    <!-- results quick/table3 -->
    (generated: the rows of experiments/<study>/results/quick/table3.json)
    <!-- end results -->

``<!-- results SCALE/counts -->`` renders the scale's counts by paper item (summary.json:
at the paper's setting, the proxies apart; ``rankjax.studies.register``).
``<!-- register -->`` renders the claims register: every item of the study's
``register`` (``rankjax.studies.PaperItem``) with the paper's words its rows quote,
its rows by kind and its status at each committed scale, or why no row tests it.
``<!-- figure SCALE/FILE.png -->`` shows a committed figure
(``results/SCALE/figures/FILE.png``, copied there by ``--record``). Options after the name: ``items=REGEX`` keeps the rows whose item matches (search),
``fields=a,b,c`` picks the columns (default :data:`FIELDS`). Under each table a line
gives the provenance (commit, device, date, wall time). A block whose results file is
missing renders as one line saying so.

  rankjax expected [--check] [STUDY or FOLDER ...]

writes every study's EXPECTED.md, and README.md's tour block (``<!-- tour
docs/tour_summary.json -->``, ``rankjax._src.tour.render_readme``) when no study is named
(``--check``: exits 1 naming the files that differ from what they render; the test
suite runs the same check).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
import sys
from typing import Sequence

from rankjax._src.studies import finder, items, results

COUNTS = "counts"   # <!-- results SCALE/counts -->: the scale's counts by paper item
FIGURES = "figures"   # results/<scale>/figures/: the committed figures
FIELDS = ("item", "quantity", "paper", "ours", "sd", "n", "interval", "band", "rule", "status")
_BLOCK = re.compile(r"(<!-- results (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- end results -->)",
                    re.S)
_REGISTER = re.compile(r"(<!-- register -->\n)(?P<body>.*?)(<!-- end register -->)", re.S)
_FIGURE = re.compile(r"(<!-- figure (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- end figure -->)",
                     re.S)


def path_of(study) -> pathlib.Path:
  """The study's EXPECTED.md (``study``: a Study, its folder, or a checkout study's name)."""
  return finder.folder_of(study) / "EXPECTED.md"


def _block(study: str, spec: str) -> str:
  parts = shlex.split(spec)
  if not parts or parts[0].count("/") != 1:
    raise ValueError(f"{study}/EXPECTED.md: results block {spec!r}: write "
                     "'<!-- results SCALE/EXPERIMENT [items=REGEX] [fields=a,b] -->'")
  scale, name = parts[0].split("/")
  opts = dict(p.split("=", 1) for p in parts[1:])
  unknown = set(opts) - {"items", "fields"}
  if unknown:
    raise ValueError(f"{study}/EXPECTED.md: results block {spec!r}: unknown option(s) "
                     f"{sorted(unknown)}")
  if name == COUNTS:
    return _counts_block(study, scale)
  path = results.committed_dir(study, scale) / f"{name}.json"
  if not path.is_file():
    return f"(no results file {results.shown(path, study)} yet)\n"
  doc = json.loads(path.read_text())
  rows = doc["rows"]
  if "items" in opts:
    rows = [r for r in rows if re.search(opts["items"], r["item"])]
  fields = opts["fields"].split(",") if "fields" in opts else FIELDS
  p = doc["provenance"]
  seeds = doc.get("seeds")
  lines = results.table(rows, fields)
  lines += ["", f"Rendered from `{results.shown(path, study)}`: commit "
            f"{(p.get('commit') or '?')[:10]}{' (dirty)' if p.get('dirty') else ''}, "
            f"{p.get('device_kind')} ({p.get('cpu')}), jax {p.get('jax')}, "
            f"seeds {seeds if seeds is not None else 'not recorded'}, "
            f"{p.get('wall_s')} s, {p.get('date')}."]
  return "\n".join(lines) + "\n"


def _counts_block(study: str, scale: str) -> str:
  path = results.committed_dir(study, scale) / "summary.json"
  if not path.is_file():
    return f"(no results file {results.shown(path, study)} yet)\n"
  rows = json.loads(path.read_text())
  return (f"{scale} scale, {len(rows)} rows: {results.counts_text(rows)} (rendered from "
          f"`{results.shown(path, study)}`).\n")


def committed_rows(study) -> dict[str, list[dict]]:
  """``{scale: rows}`` of every committed scale's summary.json (tiny has none)."""
  base = finder.folder_of(study) / "results"
  return {p.parent.name: json.loads(p.read_text())
          for p in sorted(base.glob("*/summary.json"))}


def _register_block(study) -> str:
  loaded = study if hasattr(study, "register") else finder.load(finder.folder_of(study))
  by_scale = {scale: items.item_table(rows) for scale, rows in committed_rows(study).items()}
  quotes: dict[str, list[str]] = {}
  for rows in committed_rows(study).values():
    for r in rows:
      q = r.get("quote")
      if q and r.get("where") and q not in quotes.setdefault(r["where"], []):
        quotes[r["where"]].append(q)
  scales = list(by_scale)
  lines = ["| paper item | what it states | the paper's words (as the rows quote them) | "
           + " | ".join(scales) + " |", "|---|---|---|" + "---|" * len(scales)]
  for e in loaded.register:
    cells = []
    for scale in scales:
      t = by_scale[scale].get(e.where)
      if t is None:
        cells.append("")
        continue
      kinds = ", ".join(f"{t[k]} {'exp' if k == 'experiment' else k}"
                        for k in ("experiment", "identity", "sensitivity") if t[k])
      cells.append(f"**{t['status']}** ({kinds})" + (f": {t['why']}" if t["why"] else ""))
    words = " / ".join(f"\"{q}\"" for q in quotes.get(e.where, []))
    if e.untested:
      words = (words + " " if words else "") + f"(no row: {e.untested})"
    lines.append("| " + " | ".join(results._cell(x) for x in (e.where, e.what, words))
                 + " | " + " | ".join(results._cell(c) for c in cells) + " |")
  problems = items.check_register(loaded.register, [r for rows in committed_rows(study).values()
                                                    for r in rows])
  if problems:
    lines += ["", "Register problems: " + "; ".join(problems) + "."]
  lines += ["", "Status per scale: the item's status from its experiment rows "
            "(rankjax.studies.register); in brackets its rows by kind (exp: experiment; "
            "only experiment rows count, identity and sensitivity rows are shown)."]
  return "\n".join(lines) + "\n"


def _figure_block(study, spec: str) -> str:
  parts = shlex.split(spec)
  if len(parts) != 1 or parts[0].count("/") != 1:
    raise ValueError(f"EXPECTED.md: figure block {spec!r}: write '<!-- figure SCALE/FILE.png -->'")
  scale, name = parts[0].split("/")
  path = results.committed_dir(study, scale) / FIGURES / name
  if not path.is_file():
    return f"(no committed figure {results.shown(path, study)} yet)\n"
  rel = path.relative_to(finder.folder_of(study))
  return f"![{name} ({scale} scale)]({rel.as_posix()})\n"


def render(study: str, text: str | None = None) -> str:
  """The study's EXPECTED.md with every results, register and figure block regenerated."""
  text = path_of(study).read_text() if text is None else text
  text = _BLOCK.sub(lambda m: m.group(1) + _block(study, m.group("spec")) + m.group(4), text)
  if _REGISTER.search(text):
    text = _REGISTER.sub(lambda m: m.group(1) + _register_block(study) + m.group(3), text)
  return _FIGURE.sub(lambda m: m.group(1) + _figure_block(study, m.group("spec"))
                     + m.group(4), text)


def write(study: str) -> bool:
  """Rewrites the study's EXPECTED.md; True when it changed."""
  path = path_of(study)
  if not path.is_file():
    return False
  old = path.read_text()
  new = render(study, old)
  if new != old:
    path.write_text(new)
  return new != old


def readme() -> tuple[pathlib.Path, str]:
  """README.md and what it renders to (its tour block from docs/tour_summary.json)."""
  from rankjax._src import tour
  root = finder.CHECKOUT_STUDIES.parent
  path = root / "README.md"
  return path, tour.render_readme(path.read_text(), root)


def studies() -> list[str]:
  """The checkout's studies that have an EXPECTED.md."""
  return sorted(n for n, f in finder.find().items() if (f / "EXPECTED.md").is_file())


def record(study, out_dir: str | pathlib.Path, scale: str, names: Sequence[str]) -> list[str]:
  """Copies the run's results files of ``names`` into the checkout's results folder,
  renders its summary and the study's EXPECTED.md; returns the recorded names."""
  src = pathlib.Path(out_dir) / "results" / scale
  dst = results.committed_dir(study, scale)
  dst.mkdir(parents=True, exist_ok=True)
  done = []
  for name in names:
    path = src / f"{name}.json"
    if path.is_file():
      (dst / path.name).write_text(path.read_text())
      done.append(name)
      _copy_figures(study, name, pathlib.Path(out_dir), dst / FIGURES)
  results.render_summary(study, dst, scale)
  write(study)
  return done


def _copy_figures(study, name: str, out_dir: pathlib.Path, dst: pathlib.Path) -> None:
  """The figures experiment ``name`` declares (``Experiment.figures``) from its run
  folder into the committed ``figures/`` folder."""
  exp = study.experiments[name]
  folder = out_dir / exp.folder if exp.folder else out_dir
  for fname in exp.figures:
    src = folder / fname
    if src.is_file():
      dst.mkdir(parents=True, exist_ok=True)
      (dst / pathlib.Path(fname).name).write_bytes(src.read_bytes())


def _arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("studies", nargs="*", help="names of the checkout's studies, or "
                      "study folders (default: every checkout study, and README.md)")
  parser.add_argument("--check", action="store_true",
                      help="exit 1 when a file differs from what it renders")


def _run(args: argparse.Namespace) -> int:
  stale = []
  for study in [pathlib.Path(s) if pathlib.Path(s).is_dir() else s
                for s in args.studies] or studies():
    if args.check:
      if render(study) != path_of(study).read_text():
        stale.append(results.shown(path_of(study), study))
    elif write(study):
      print(f"rewrote {results.shown(path_of(study), study)}")
  if not args.studies:
    path, text = readme()
    if text != path.read_text():
      if args.check:
        stale.append(path.name)
      else:
        path.write_text(text)
        print(f"rewrote {path.name}")
  if stale:
    print("not what the results files render (run rankjax expected): "
          + ", ".join(stale), file=sys.stderr)
    return 1
  return 0


def add_parser(sub) -> None:
  """``rankjax expected [--check] [STUDY ...]``."""
  p = sub.add_parser("expected", help="render EXPECTED.md's results tables (and README's "
                                      "tour block) from the committed results files")
  _arguments(p)
  p.set_defaults(func=_run)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description="render EXPECTED.md's results tables")
  _arguments(parser)
  return _run(parser.parse_args(argv))


if __name__ == "__main__":
  raise SystemExit(main())
