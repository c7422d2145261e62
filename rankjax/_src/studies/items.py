"""Counted by paper item: each figure, table or statement of the paper once.

A study's rows test the paper's items (a row's ``where``: "Table 3", "Fig 1",
"Thm 3.2"). The counts a study reports count each item once, by the status of its
``experiment`` rows at one scale; ``identity`` and ``sensitivity`` rows are shown beside
their item and never counted (``rankjax._src.studies.evidence.KINDS``).

An item's status, from its experiment rows (:func:`item_status`):

- the rows of each ``reading`` (where the text leaves a choice open) are combined:
  any ``failed`` or ``missing`` row gives that; otherwise the rows at the paper's setting
  decide (any ``mismatch`` -> mismatch, else any ``inconclusive`` -> inconclusive, else
  ``match``); with none at the paper's setting the reading is a ``proxy`` (counted
  apart, never a match), or ``qualitative`` / ``tiny`` when those are all there is;
- one reading, or readings that agree: that status; readings that disagree: ``open``
  ("match under X; mismatch under Y"), counted neither as a match nor as a mismatch.

The study's **register** (``Study.register``, a tuple of :class:`PaperItem`) lists every
figure, table and quantitative statement of the paper, with the reason where no row
tests it; every row's ``where`` must be a registered item (:func:`check_register`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

ITEM_STATUSES = ("match", "mismatch", "inconclusive", "open", "proxy", "qualitative", "tiny",
                 "missing", "failed", "not tested")
VERDICTS = ("match", "mismatch", "inconclusive", "open")   # at the paper's setting


@dataclasses.dataclass(frozen=True)
class PaperItem:
  """One figure, table or quantitative statement of the paper.

  where: how the paper names it ("Fig 3b", "Table 1", "Thm 3.2"); rows name it in their
    ``where``.
  what: what it states, in a line (the rows quote the paper's words).
  untested: why no row tests it (not testable here, needs an accelerator, needs a
    checkpoint); empty when rows test it.
  """
  where: str
  what: str
  untested: str = ""


def register(entries: Iterable[PaperItem]) -> tuple[PaperItem, ...]:
  """The entries as a tuple (an item registered twice is an error)."""
  out = tuple(entries)
  seen: set[str] = set()
  for e in out:
    if not e.where or not e.what:
      raise ValueError(f"register entry {e!r}: where and what are required")
    if e.where in seen:
      raise ValueError(f"register: {e.where!r} is registered twice")
    seen.add(e.where)
  return out


def _combine(rows: Sequence[dict]) -> str:
  statuses = [r["status"] for r in rows]
  for s in ("failed", "missing"):
    if s in statuses:
      return s
  judged = [s for s in statuses if s in ("match", "mismatch", "inconclusive")]
  if judged:
    return ("mismatch" if "mismatch" in judged else
            "inconclusive" if "inconclusive" in judged else "match")
  for s in ("proxy", "tiny", "qualitative"):
    if s in statuses:
      return s
  return statuses[0] if statuses else "not tested"


def experiment_rows(rows: Iterable[dict]) -> list[dict]:
  """The rows that count (kind ``experiment``; the runner's missing / failed rows too)."""
  return [r for r in rows if (r.get("kind") or "experiment") == "experiment"]


def item_status(rows: Sequence[dict]) -> tuple[str, str]:
  """``(status, why)`` of one paper item from its rows (all kinds; only experiment rows
  count). ``why`` names each reading's status when the item is ``open``."""
  rows = experiment_rows(rows)
  if not rows:
    return "not tested", "no experiment row"
  readings: dict[str, list[dict]] = {}
  for r in rows:
    readings.setdefault(r.get("reading") or "", []).append(r)
  by = {k: _combine(v) for k, v in readings.items()}
  if len(set(by.values())) == 1:
    return next(iter(by.values())), ""
  decided = {k: s for k, s in by.items() if s in ("match", "mismatch", "inconclusive")}
  if len(set(decided.values())) > 1 or (decided and len(decided) < len(by)):
    return "open", "; ".join(f"{s} under {k or 'the unnamed reading'}"
                             for k, s in sorted(by.items()))
  return _combine([{"status": s} for s in by.values()]), ""


def by_item(rows: Iterable[dict]) -> dict[str, list[dict]]:
  """Rows grouped by their ``where``, in first-seen order (runner rows, which have no
  ``where``, under their experiment's name)."""
  out: dict[str, list[dict]] = {}
  for r in rows:
    key = r.get("where") or f"({r.get('experiment')})"
    out.setdefault(key, []).append(r)
  return out


def item_table(rows: Iterable[dict]) -> dict[str, dict[str, Any]]:
  """``{where: {"status", "why", "experiment", "identity", "sensitivity"}}``: each item's
  status and its rows counted by kind."""
  out = {}
  for where, rs in by_item(rows).items():
    status, why = item_status(rs)
    kinds = {k: sum((r.get("kind") or "experiment") == k for r in rs)
             for k in ("experiment", "identity", "sensitivity")}
    out[where] = {"status": status, "why": why, **kinds}
  return out


def item_counts(rows: Iterable[dict]) -> dict[str, int]:
  """Paper items per status (statuses with no item left out, but the verdicts and
  ``proxy`` always shown)."""
  table = item_table(rows)
  n = {s: sum(v["status"] == s for v in table.values()) for s in ITEM_STATUSES}
  return {s: k for s, k in n.items() if k or s in (*VERDICTS, "proxy")}


def counts_text(rows: Sequence[dict]) -> str:
  """The counts in words, by paper item: the verdicts at the paper's setting, the
  proxies apart, the rest; and the rows beside them by kind (the line summary.md,
  EXPECTED.md and ``rankjax reproduce`` print)."""
  rows = list(rows)
  n = item_counts(rows)
  part = lambda keys: ", ".join(f"{s} {n[s]}" for s in keys if s in n)
  rest = part([s for s in n if s not in (*VERDICTS, "proxy")])
  kinds = {k: sum((r.get("kind") or "experiment") == k for r in rows)
           for k in ("experiment", "identity", "sensitivity")}
  return (f"{sum(n.values())} paper items: at the paper's setting {part(VERDICTS)}; proxy "
          f"{n['proxy']} (measured at another setting, counted apart, never a match)"
          + (f"; {rest}" if rest else "")
          + f" (from {kinds['experiment']} experiment rows; {kinds['identity']} identity "
          f"and {kinds['sensitivity']} sensitivity rows shown, not counted)")


def check_register(register: Sequence[PaperItem], rows: Iterable[dict]) -> list[str]:
  """What is wrong between a register and the rows: a row whose ``where`` is not
  registered; a registered item with no row and no reason; an item with rows that
  also says why none tests it."""
  known = {e.where: e for e in register}
  tested = {r.get("where") for r in rows if r.get("where")}
  out = [f"row where {w!r} is not in the register" for w in sorted(tested - set(known))]
  for e in register:
    if e.where in tested and e.untested:
      out.append(f"{e.where!r}: rows test it, yet the register says {e.untested!r}")
    if e.where not in tested and not e.untested:
      out.append(f"{e.where!r}: no row tests it and the register gives no reason")
  return out
