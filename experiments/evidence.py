"""Rows as evidence: one quantity per row, judged by a rule declared before the run.

An experiment declares its claims at import time, before anything runs: each
:class:`Claim` names where the paper states it (``item``), the one quantity measured
(``quantity``), the paper's number (or the limit of a worded claim) and the
:class:`Rule` that judges it. After the run, ``claim.judge(values)`` turns the measured
value(s) into one row; the status is computed there from the numbers, never typed:

- :class:`Abs`, :class:`Rel`, :class:`OneMinus`: ``match`` iff ``|ours - paper| <=
  tolerance``, with ``tolerance`` the absolute band written into the row, so anyone can
  recheck it from the row alone. The band is the declared one (absolute near 0,
  relative elsewhere, relative on ``1 - x`` near 1) widened by the measured noise:
  ``max(band, noise * sd)`` (``noise`` = 2 sd by default; no widening with one value).
- :class:`Bound`: a worded claim written as a predicate, ``ours <op> paper`` ("alpha
  stays below 2.5": ``Bound("<")`` with paper 2.5; "Post-LN spikes more than Pre-LN":
  the difference, ``Bound(">")`` with paper 0). ``every_seed=True`` asks it of every
  seed's value, not of their mean. The row's ``tolerance`` is null.
- :class:`Qualitative`: what has no testable statement (a figure's look); the reason is
  the row's note.

A row's fields are :data:`FIELDS`; ``experiments.runner`` adds ``experiment`` and
``scale``. The statuses are :data:`STATUSES` (``missing`` and ``failed`` come from the
runner, never from a claim).
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Iterable, Sequence

# "tiny": a row of --scale tiny, measured but not judged against the paper
STATUSES = ("match", "mismatch", "qualitative", "tiny", "missing", "failed")
FIELDS = ("experiment", "item", "quantity", "paper", "ours", "sd", "n", "seeds", "per_seed",
          "tolerance", "rule", "status", "scale", "note")
NOISE_SDS = 2.0   # the default widening of a band by the measured noise: max(band, 2 sd)
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq}


@dataclasses.dataclass(frozen=True)
class Abs:
  """``|ours - paper| <= max(tol, noise sd)``: for numbers near 0."""
  tol: float
  noise: float = NOISE_SDS

  def band(self, paper: float) -> float:
    return self.tol

  def describe(self) -> str:
    return f"abs {self.tol:g}" + _noise_text(self.noise)


@dataclasses.dataclass(frozen=True)
class Rel:
  """``|ours - paper| <= max(rtol |paper|, noise sd)``: for numbers away from 0 and 1."""
  rtol: float
  noise: float = NOISE_SDS

  def band(self, paper: float) -> float:
    return self.rtol * abs(paper)

  def describe(self) -> str:
    return f"rel {self.rtol:g}" + _noise_text(self.noise)


@dataclasses.dataclass(frozen=True)
class OneMinus:
  """``|ours - paper| <= max(rtol |1 - paper|, noise sd)``: relative on ``1 - x``, for
  numbers near 1 (an erank/d of 0.980 is a rank loss of 0.020; 0.972 is 40% more)."""
  rtol: float
  noise: float = NOISE_SDS

  def band(self, paper: float) -> float:
    return self.rtol * abs(1.0 - paper)

  def describe(self) -> str:
    return f"rel {self.rtol:g} on 1-x" + _noise_text(self.noise)


@dataclasses.dataclass(frozen=True)
class Bound:
  """The predicate ``ours <op> paper`` (a worded claim); ``every_seed``: of each seed's
  value rather than of the mean."""
  op: str
  every_seed: bool = False

  def __post_init__(self):
    if self.op not in _OPS:
      raise ValueError(f"Bound op {self.op!r}; choose one of {list(_OPS)}")

  def describe(self) -> str:
    return f"ours {self.op} paper" + (" for every seed" if self.every_seed else "")


@dataclasses.dataclass(frozen=True)
class Qualitative:
  """No testable statement (a figure's look): the reason goes in the row's note."""
  reason: str

  def describe(self) -> str:
    return "qualitative"


Rule = Abs | Rel | OneMinus | Bound | Qualitative
_BANDS = (Abs, Rel, OneMinus)


def _noise_text(noise: float) -> str:
  return f" or {noise:g} sd" if noise else ""


def _number(x: Any) -> float:
  if isinstance(x, bool):
    return float(x)
  if hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
    x = x.item()
  if not isinstance(x, (int, float)):
    raise TypeError(f"a measured value must be a number, got {type(x).__name__} {x!r}")
  return float(x)


def spread(values: Any) -> tuple[float, float | None, int, list[float] | None]:
  """``(mean, sd, n, per_seed)`` of one value or a per-seed sequence (sd with ddof=1;
  None for one value; NaN values make the mean NaN)."""
  if isinstance(values, (list, tuple)) or (hasattr(values, "ndim") and values.ndim > 0):
    per = [_number(v) for v in list(values)]
  else:
    per = [_number(values)]
  if not per:
    raise ValueError("no measured values")
  n = len(per)
  mean = math.fsum(per) / n
  sd = (math.sqrt(math.fsum((v - mean) ** 2 for v in per) / (n - 1)) if n > 1 else None)
  return mean, sd, n, (per if n > 1 else None)


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of the paper and how it is judged, declared before the experiment runs.

  item: where the paper states it ("Table 3, eps=0.6, L=384").
  quantity: the one number measured ("erank(prod)/d").
  paper: the paper's number, the limit of a :class:`Bound`, or None (no number stated:
    only a :class:`Bound` or :class:`Qualitative` rule then).
  rule: how ``ours`` is judged against ``paper``.
  note: the paper's words, or what the protocol fixes (put into every row).
  """
  item: str
  quantity: str
  paper: float | None
  rule: Rule
  note: str = ""

  def __post_init__(self):
    if isinstance(self.rule, _BANDS + (Bound,)) and self.paper is None:
      raise ValueError(f"claim {self.item!r}: rule {self.rule.describe()!r} needs the "
                       "paper's number")
    if isinstance(self.rule, Qualitative) and not self.rule.reason:
      raise ValueError(f"claim {self.item!r}: a qualitative rule needs its reason")

  def judge(self, values: Any, *, seeds: Sequence[int] | None = None,
            note: str = "") -> dict[str, Any]:
    """The row for the measured ``values`` (one number, or one per seed in ``seeds``'
    order)."""
    mean, sd, n, per_seed = spread(values)
    if seeds is not None and len(seeds) != n:
      raise ValueError(f"claim {self.item!r}: {n} values for {len(seeds)} seeds")
    tolerance, status = None, "qualitative"
    if isinstance(self.rule, _BANDS):
      tolerance = max(self.rule.band(self.paper), self.rule.noise * (sd or 0.0))
      status = "match" if abs(mean - self.paper) <= tolerance else "mismatch"
    elif isinstance(self.rule, Bound):
      op = _OPS[self.rule.op]
      tested = (per_seed or [mean]) if self.rule.every_seed else [mean]
      status = "match" if all(op(v, self.paper) for v in tested) else "mismatch"
    if math.isnan(mean) and status == "match":
      status = "mismatch"
    notes = [x for x in (self.note, note,
                         self.rule.reason if isinstance(self.rule, Qualitative) else "") if x]
    return {"item": self.item, "quantity": self.quantity, "paper": self.paper,
            "ours": None if math.isnan(mean) else mean, "sd": sd, "n": n,
            "seeds": list(seeds) if seeds is not None else None, "per_seed": per_seed,
            "tolerance": tolerance, "rule": self.rule.describe(), "status": status,
            "note": "; ".join(notes)}


def claims(items: Iterable[Claim]) -> dict[str, Claim]:
  """The claims keyed by item (an item declared twice is an error)."""
  out: dict[str, Claim] = {}
  for c in items:
    if c.item in out:
      raise ValueError(f"claim {c.item!r} is declared twice")
    out[c.item] = c
  return out


def recheck(row: dict[str, Any]) -> str | None:
  """The status a row's own numbers give (None for rows no rule judges: qualitative,
  missing, failed), so a test can recompute every committed status."""
  rule = str(row.get("rule") or "")
  if row.get("status") in ("missing", "failed") or rule == "qualitative":
    return None
  ours, paper = row.get("ours"), row.get("paper")
  if ours is None or paper is None:
    return "mismatch"
  if row.get("tolerance") is not None:
    return "match" if abs(ours - paper) <= row["tolerance"] else "mismatch"
  op = rule.split()[1]
  tested = (row.get("per_seed") or [ours]) if rule.endswith("for every seed") else [ours]
  return "match" if all(_OPS[op](v, paper) for v in tested) else "mismatch"
