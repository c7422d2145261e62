"""Results files: what each experiment reports, per seed, with its provenance.

Every run of an experiment writes ``<out>/results/<scale>/<experiment>.json``:

    {"study", "experiment", "scale", "provenance": {commit, dirty, versions, backend,
     device_kind, device_count, cpu, xla_flags, python, date, wall_s},
     "claims_commit": the last commit that changed the module declaring its claims,
     "settings": the full config it ran with, "seeds": [...], "rows": [...],
     "data": what its figures need (null when larger than DATA_LIMIT bytes)}

``rankjax reproduce STUDY --record`` copies them into the checkout
(``<study folder>/results/<scale>/``), where they are committed; ``summary.json``
and ``summary.md`` beside them are rendered from them (:func:`render_summary`), and
EXPECTED.md's tables from them too (``rankjax._src.studies.expected``). ``--check`` reruns and
compares with the committed numbers (:func:`compare`).
"""
from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Sequence

from rankjax._src.studies import evidence, finder, items
from rankjax._src.provenance import last_commit, provenance

DATA_LIMIT = 256 * 1024   # bytes of figure data a committed results file may hold


def _seeds(result: dict[str, Any], rows: Sequence[dict]) -> list[int] | None:
  settings = result.get("settings") if isinstance(result.get("settings"), dict) else {}
  seeds = settings.get("seeds", result.get("seeds"))
  if isinstance(seeds, (list, tuple)):
    return list(seeds)
  listed = sorted({s for r in rows for s in (r.get("seeds") or [])})
  return listed or None


def write_result(out_dir: str | pathlib.Path, study: str, name: str, scale: str,
                 result: dict[str, Any], rows: list[dict], wall_s: float,
                 claims_file: str | pathlib.Path | None = None) -> pathlib.Path:
  """``out_dir/results/<scale>/<name>.json`` for one experiment's run; ``claims_commit``:
  the last commit that changed ``claims_file`` (the module declaring its claims), which
  is never later than the result's own commit."""
  data = _finite(to_jsonable({k: v for k, v in result.items()
                              if k not in ("measured", "settings")}))
  text = json.dumps(data)
  doc = {"study": study, "experiment": name, "scale": scale,
         "provenance": provenance(wall_s),
         "claims_commit": last_commit(claims_file) if claims_file else None,
         "settings": to_jsonable(result.get("settings")),
         "seeds": _seeds(result, rows), "rows": rows,
         "data": data if len(text) <= DATA_LIMIT else None}
  if doc["data"] is None:
    doc["data_omitted"] = f"{len(text)} bytes > {DATA_LIMIT}; the run's own JSON has it"
  path = pathlib.Path(out_dir) / "results" / scale / f"{name}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
  return path


def to_jsonable(x: Any) -> Any:
  """Dicts, lists, numpy / jax arrays and scalars as plain JSON values (NaN -> null)."""
  if isinstance(x, dict):
    return {str(k): to_jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_jsonable(v) for v in x]
  if hasattr(x, "tolist") and hasattr(x, "dtype"):   # numpy / jax arrays and scalars
    return to_jsonable(x.tolist())
  if isinstance(x, float):
    return None if math.isnan(x) else x
  return x


def _finite(x: Any) -> Any:
  """JSON values with +-inf as null (the results files are strict JSON)."""
  if isinstance(x, dict):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_finite(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def committed_dir(study, scale: str) -> pathlib.Path:
  """``<study folder>/results/<scale>``: where a study's results are committed
  (``study``: a Study, its folder, or a checkout study's name)."""
  return finder.folder_of(study) / "results" / scale


def shown(path: pathlib.Path, study) -> str:
  """``path`` as shown in rendered files: from the folder its package is imported from
  (``experiments/<study>/results/...`` for the checkout's studies)."""
  return str(path.relative_to(finder.import_name(finder.folder_of(study))[1]))


def load(folder: str | pathlib.Path) -> dict[str, dict[str, Any]]:
  """The results files of a folder, by experiment name."""
  folder = pathlib.Path(folder)
  return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))
          if p.name != "summary.json"}


def summary_rows(study, results: dict[str, dict]) -> list[dict]:
  """Every row of the results files, in the study's experiment order."""
  order = list(study.experiments)
  names = sorted(results, key=lambda n: (order.index(n) if n in order else len(order), n))
  return [r for n in names for r in results[n]["rows"]]


def _cell(x: Any) -> str:
  if x is None:
    return ""
  if isinstance(x, float):
    return f"{x + 0.0:.4g}"            # + 0.0: -0.0 prints as 0
  if isinstance(x, list):
    return ", ".join(_cell(v) for v in x)
  return str(x).replace("|", "\\|").replace("\n", " ")


def table(rows: Sequence[dict], fields: Sequence[str] = evidence.FIELDS) -> list[str]:
  """Markdown table lines of ``rows`` (floats to 4 significant digits)."""
  lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
  lines += ["| " + " | ".join(_cell(r.get(k)) for k in fields) + " |" for r in rows]
  return lines


def counts(rows: Sequence[dict]) -> dict[str, int]:
  """Rows per status (``tiny`` only when a row has it: only --scale tiny makes them);
  the study's counts are by paper item (:func:`counts_text`)."""
  n = {s: sum(r["status"] == s for r in rows) for s in evidence.STATUSES}
  return {s: k for s, k in n.items() if k or s != "tiny"}


counts_text = items.counts_text   # by paper item, experiment rows only


SUMMARY_FIELDS = tuple(f for f in evidence.FIELDS if f != "quote")   # the register quotes


def summary_markdown(study, rows: list[dict], scale: str,
                     provenance_by: dict[str, dict] | None = None) -> str:
  """``summary.md``: the status counts, the rows as one table, each experiment's
  provenance (commit, device, wall time)."""
  lines = [f"# {study.title} ({scale} scale)", ""]
  if study.notes.get(scale):
    lines += [study.notes[scale], ""]
  lines += ["Counts by paper item: " + counts_text(rows) + ". Each row's status is "
            "computed from its numbers: the 95% t-interval of the seeds' mean (a "
            "family's Sidak level: the row's confidence; one value: the value) inside "
            "[paper - band, paper + band] is a match, wholly outside a mismatch, else "
            "inconclusive; a predicate row likewise; a one-draw row by the range of single "
            "draws. An item's status comes from its experiment rows "
            "(rankjax.studies.register); machine-readable: summary.json (quotes included).",
            ""]
  lines += table(rows, SUMMARY_FIELDS)
  if provenance_by:
    lines += ["", "| experiment | commit | dirty | device | wall (s) | date |",
              "|---|---|---|---|---|---|"]
    for name, p in provenance_by.items():
      lines.append(f"| {name} | {(p.get('commit') or '')[:10]} | {p.get('dirty')} | "
                   f"{p.get('device_kind')} ({p.get('cpu')}) | {p.get('wall_s')} | "
                   f"{p.get('date')} |")
  return "\n".join(lines) + "\n"


def render_summary(study, folder: str | pathlib.Path, scale: str) -> list[dict]:
  """Writes ``summary.json`` and ``summary.md`` of ``folder`` from its results files."""
  folder = pathlib.Path(folder)
  results = load(folder)
  rows = summary_rows(study, results)
  (folder / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
  prov = {n: results[n]["provenance"] for n in study.experiments if n in results}
  (folder / "summary.md").write_text(summary_markdown(study, rows, scale, prov))
  return rows


def input_mismatch(name: str, new: dict[str, Any], old: dict[str, Any]) -> str | None:
  """Why a rerun of ``name`` is not comparable with its committed result: it read another
  data set (``data["dataset"]``, the set an experiment resolved, e.g. 'auto' -> 'digits'
  where fashion_mnist is not installed). None when both read the same inputs."""
  ran, committed = (r.get("data", {}).get("dataset") if isinstance(r.get("data"), dict)
                    else None for r in (new, old))
  if ran == committed:
    return None
  return (f"{name}: committed results read the data set {committed!r}, this rerun read "
          f"{ran!r}: not comparable (make {committed!r} available and rerun)")


RECHECK_RTOL = 1e-4   # --check: a deterministic number's relative drift from its record
BITS_RTOL = 1e-6      # --check of a trained run where its bits are decided the same way


def _drifted(a: float | None, b: float | None, rtol: float, atol: float = 0.0) -> bool:
  if a is None or b is None:
    return (a is None) != (b is None)
  return abs(b - a) > rtol * max(abs(a), abs(b)) + atol


def _overlap(a: list[float] | None, b: list[float] | None) -> bool:
  return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


def compare(new: Sequence[dict], old: Sequence[dict], rtol: float = RECHECK_RTOL,
            trained: bool = False, atol: float = 0.0, same_bits: bool = False) -> list[str]:
  """What moved between a rerun's rows and the committed rows of the same experiment,
  judged by a reproducibility tolerance of its own (never the paper band): a status
  that changed; for a deterministic experiment, a mean or per-seed value that moved by
  more than ``rtol`` relative (plus ``atol``, for rows that are rounding residuals);
  for a ``trained`` one: where the rerun's bits are decided as the record's were
  (``same_bits``: ``rankjax._src.provenance.same_bits``) every per-seed value within
  :data:`BITS_RTOL` relative, elsewhere (rounding moves its runs) a rerun whose 95%
  interval of the mean does not overlap the committed one (rows of one value: ``rtol``
  as above); a row that appeared or vanished. Empty when nothing moved."""
  key = lambda r: (r["experiment"], r["item"])
  before, after = {key(r): r for r in old}, {key(r): r for r in new}
  out = []
  for k in before.keys() - after.keys():
    out.append(f"{k[0]} / {k[1]}: committed row no longer produced")
  for k in after.keys() - before.keys():
    out.append(f"{k[0]} / {k[1]}: new row, not committed")
  for k in sorted(before.keys() & after.keys()):
    a, b = before[k], after[k]
    if a["status"] != b["status"]:
      out.append(f"{k[0]} / {k[1]}: status {a['status']} -> {b['status']} "
                 f"(ours {_cell(a['ours'])} -> {_cell(b['ours'])})")
      continue
    tol = rtol
    if trained and same_bits:
      tol = BITS_RTOL
    elif trained and a.get("interval") and b.get("interval"):
      if not _overlap(a["interval"], b["interval"]):
        out.append(f"{k[0]} / {k[1]}: interval {_cell(a['interval'])} -> "
                   f"{_cell(b['interval'])}, no overlap")
      continue
    pairs = [(a["ours"], b["ours"])]
    if not trained or same_bits:
      pairs += list(zip(a.get("per_seed") or [], b.get("per_seed") or []))
    if len(a.get("per_seed") or []) != len(b.get("per_seed") or []) or any(
        _drifted(x, y, tol, 0.0 if trained and same_bits else atol) for x, y in pairs):
      out.append(f"{k[0]} / {k[1]}: ours {_cell(a['ours'])} -> {_cell(b['ours'])}, "
                 f"moved more than {tol:g} relative"
                 + (f" + {atol:g}" if atol and not (trained and same_bits) else "")
                 + " (mean or a seed)")
  return out


def check_rule(trained: bool, committed: dict, rerun: dict, rtol: float = RECHECK_RTOL
               ) -> tuple[bool, str]:
  """``(same_bits, the rule --check applies, in a line)`` for one experiment's rerun
  against its committed results file."""
  from rankjax._src.provenance import same_bits
  if not trained:
    return False, f"deterministic: every number within {rtol:g} relative"
  same, why = same_bits(committed.get("provenance") or {}, rerun.get("provenance") or {})
  if same:
    return True, f"trained, bits decided alike ({why}): every seed within {BITS_RTOL:g} relative"
  return False, f"trained, bits may differ ({why}): the seeds' 95% intervals must overlap"
