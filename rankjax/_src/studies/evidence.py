"""Rows as evidence: one quantity per row, judged by a rule declared before the run.

An experiment declares its claims at import time, before anything runs: each
:class:`Claim` names where the paper states it (``item``), the one quantity measured
(``quantity``), the paper's number (or the limit of a worded claim) and the
:class:`Rule` that judges it. After the run, ``claim.judge(values)`` turns the measured
value(s) into one row; the status is computed there from the numbers, never typed.

The band is the declared one and is never widened by our own spread. With several
values (one per seed) a row is judged on the two-sided 95% Student-t interval of their
mean (``interval``, :func:`t_interval`); with one value, on the value itself:

- :class:`Abs`, :class:`Rel`, :class:`OneMinus`: ``band`` is the absolute half-width
  written into the row (absolute near 0, relative elsewhere, relative on ``1 - x`` near
  1). ``match`` when the interval lies inside ``[paper - band, paper + band]``,
  ``mismatch`` when it lies wholly outside, ``inconclusive`` otherwise (the note says
  about how many seeds at the measured spread would decide it). One value: ``match``
  iff ``|ours - paper| <= band``.
- :class:`Bound`: a worded claim written as a predicate, ``ours <op> paper`` ("alpha
  stays below 2.5": ``Bound("<")`` with paper 2.5; "Post-LN spikes more than Pre-LN":
  the difference, ``Bound(">")`` with paper 0). ``match`` when the whole interval
  satisfies it, ``mismatch`` when none of it does, ``inconclusive`` otherwise;
  ``every_seed=True`` asks it of every seed's value instead (match iff all do). The
  row's ``band`` is null.
- :class:`Qualitative`: what has no testable statement (a figure's look); the reason is
  the row's note.

A row measured away from the paper's setting (another model, data or training budget
than the one the paper measured the claim on) is a ``proxy`` (:func:`as_proxy`): its
numbers and the side of the paper's value they fall on are shown, it is counted apart,
and it is never a match. Mathematics, and measurements at the paper's own sizes, are
judged as above wherever they run.

A claim the measurement did not test (what the claim asserts is implied by a theorem at
the values measured, or guaranteed by the budget) is reported through
``measured(..., untested=reason)``: status ``inconclusive``, no value, the note opening
with :data:`NOT_TESTED` and the reason; never a match.

Every claim says what of the paper it tests: ``where`` (the paper item: section, figure,
table, equation; the key the counts group by), ``quote`` (the paper's own words,
verbatim, ellipses allowed) and ``kind``, one of :data:`KINDS`: ``experiment`` (a
measurement that could have come out otherwise), ``identity`` (a closed form, a value
true by construction, a duplicate of another row) or ``sensitivity`` (another reading or
setting of a claim that has its own headline row). Only experiment rows are counted
(``rankjax._src.studies.items``); the others are shown beside their item. Where the paper's
text leaves a choice open, each reasonable reading is an experiment row of its own
``reading``; the item is ``open`` when the readings' verdicts differ. ``post_hoc``:
why a reading or band was chosen after its outcome was seen (said in the row).

Statistics that fit the claim:

- :class:`Draw`: a statement about one draw (the paper's single sample): the paper's
  value against the spread of single draws (inside the 2.5-97.5% range of the seeds'
  values, widened by the band: the printed number's rounding), never a mean's interval.
- ``family=K``: a claim over K points ("every depth", "on one curve") judges each of its
  K rows at the Sidak level ``0.95 ** (1 / K)`` (the row's ``confidence``), so the claim
  as a whole is judged at 95%.
- :class:`Bound` with ``limit``: a worded claim whose threshold is ours (the paper
  prints no number): ``paper`` stays empty, the row's ``limit`` holds our threshold and
  its rule says so.

A row's fields are :data:`FIELDS`; ``rankjax._src.studies.runner`` adds ``experiment`` and
``scale``. The statuses are :data:`STATUSES` (``missing`` and ``failed`` come from the
runner, never from a claim). :func:`recheck` recomputes a status from the row alone.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Iterable, Sequence

from scipy import stats

# "tiny": a row of --scale tiny, measured but not judged against the paper
STATUSES = ("match", "mismatch", "inconclusive", "proxy", "qualitative", "tiny", "missing",
            "failed")
JUDGED = ("match", "mismatch", "inconclusive")   # the statuses a rule gives
FIELDS = ("experiment", "item", "where", "kind", "reading", "quantity", "paper", "ours", "sd",
          "n", "seeds", "per_seed", "interval", "confidence", "band", "limit", "rule",
          "status", "scale", "note", "quote")
KINDS = ("experiment", "identity", "sensitivity")   # Claim.kind; only experiments count
CONFIDENCE = 0.95   # two-sided level of the mean's t-interval (a family's: Sidak per row)
MAX_SEEDS = 10_000  # "more than this many seeds" ends the search for a deciding count
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq}


@dataclasses.dataclass(frozen=True)
class Abs:
  """Band ``tol``: for numbers near 0."""
  tol: float

  def band(self, paper: float) -> float:
    return self.tol

  def describe(self) -> str:
    return f"abs {self.tol:g}"


@dataclasses.dataclass(frozen=True)
class Rel:
  """Band ``rtol |paper|``: for numbers away from 0 and 1."""
  rtol: float

  def band(self, paper: float) -> float:
    return self.rtol * abs(paper)

  def describe(self) -> str:
    return f"rel {self.rtol:g}"


@dataclasses.dataclass(frozen=True)
class OneMinus:
  """Band ``rtol |1 - paper|``: relative on ``1 - x``, for numbers near 1 (an erank/d of
  0.980 is a rank loss of 0.020; 0.972 is 40% more)."""
  rtol: float

  def band(self, paper: float) -> float:
    return self.rtol * abs(1.0 - paper)

  def describe(self) -> str:
    return f"rel {self.rtol:g} on 1-x"


@dataclasses.dataclass(frozen=True)
class Bound:
  """The predicate ``ours <op> paper`` (a worded claim); ``every_seed``: of each seed's
  value rather than of the mean's interval. ``limit``: the threshold is ours, not a
  number the paper prints (``ours <op> limit``; the claim's ``paper`` is then None)."""
  op: str
  every_seed: bool = False
  limit: float | None = None

  def __post_init__(self):
    if self.op not in _OPS:
      raise ValueError(f"Bound op {self.op!r}; choose one of {list(_OPS)}")

  def describe(self) -> str:
    return (f"ours {self.op} " + ("paper" if self.limit is None else "limit (ours)")
            + (" for every seed" if self.every_seed else ""))


@dataclasses.dataclass(frozen=True)
class Draw:
  """A statement about one draw: match when the paper's value, widened by ``tol`` (the
  printed number's rounding), meets the central ``coverage`` range of the single draws
  (the seeds' values, at least :data:`MIN_DRAWS`); mismatch otherwise."""
  tol: float = 0.0
  coverage: float = 0.95

  def band(self, paper: float) -> float:
    return self.tol

  def describe(self) -> str:
    lo, hi = 50 * (1 - self.coverage), 50 * (1 + self.coverage)
    return f"draw: paper +- {self.tol:g} within the {lo:g}-{hi:g}% range of single draws"


@dataclasses.dataclass(frozen=True)
class Qualitative:
  """No testable statement (a figure's look): the reason goes in the row's note."""
  reason: str

  def describe(self) -> str:
    return "qualitative"


MIN_DRAWS = 10   # a Draw rule needs at least this many single draws to place the paper's

Rule = Abs | Rel | OneMinus | Bound | Draw | Qualitative
_BANDS = (Abs, Rel, OneMinus)


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


def _floats(per_seed: Sequence[float | None]) -> list[float]:
  """Per-seed values as read back from JSON (a NaN was written as null)."""
  return [math.nan if v is None else float(v) for v in per_seed]


def half_width(sd: float, n: int, confidence: float = CONFIDENCE) -> float:
  """Half the two-sided ``confidence`` t-interval of a mean of ``n`` values."""
  return float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)


def t_interval(per_seed: Sequence[float] | None, confidence: float = CONFIDENCE
               ) -> list[float] | None:
  """``[lo, hi]``: the two-sided ``confidence`` (95%) t-interval of the mean of
  ``per_seed`` (None for fewer than two values or a NaN among them)."""
  if not per_seed or len(per_seed) < 2:
    return None
  mean, sd, n, _ = spread(_floats(per_seed))
  if math.isnan(mean):
    return None
  h = half_width(sd, n, confidence)
  return [mean - h, mean + h]


def family_confidence(k: int) -> float:
  """The per-row level at which K rows of one claim keep the claim at
  :data:`CONFIDENCE` (Sidak: ``0.95 ** (1 / K)``)."""
  if k < 1:
    raise ValueError(f"a claim's family has at least one point, not {k}")
  return CONFIDENCE ** (1.0 / k)


def draw_range(per_seed: Sequence[float], coverage: float = 0.95) -> list[float]:
  """The central ``coverage`` range of single draws (linear-interpolated percentiles)."""
  import numpy as np
  v = np.asarray(_floats(per_seed), float)
  q = 50 * (1 - coverage)
  return [float(np.percentile(v, q)), float(np.percentile(v, 100 - q))]


def seeds_to_decide(margin: float, sd: float, n: int, confidence: float = CONFIDENCE
                    ) -> int | None:
  """The fewest seeds (more than ``n``) whose interval at the measured ``sd`` would be
  narrower than ``margin`` (the distance from the mean to the nearest band edge or
  predicate limit); None when none up to :data:`MAX_SEEDS` would (or margin is 0)."""
  if margin <= 0 or sd <= 0:
    return None
  lo, hi = n + 1, MAX_SEEDS
  if half_width(sd, hi, confidence) >= margin:
    return None
  while lo < hi:                       # half_width falls with n: bisect
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if half_width(sd, mid, confidence) < margin else (mid + 1, hi)
  return lo


def _holds(op: str, lo: float, hi: float, paper: float) -> tuple[bool, bool]:
  """(every point of [lo, hi] satisfies ``x op paper``, none does)."""
  f = _OPS[op]
  if op == "==":
    return lo == hi == paper, not lo <= paper <= hi
  return f(lo, paper) and f(hi, paper), not f(lo, paper) and not f(hi, paper)


def verdict(paper: float, ours: float | None, per_seed: Sequence[float] | None,
            band: float | None, op: str | None = None, every_seed: bool = False,
            confidence: float = CONFIDENCE, draw: float | None = None
            ) -> tuple[str, list[float] | None, str]:
  """``(status, interval, note)`` of a band row (``band``), a predicate row (``op``,
  against ``paper`` or our limit) or a one-draw row (``draw``: the coverage of the
  single draws' range; the interval returned is that range); the one judging rule
  (:func:`Claim.judge` and :func:`recheck` both call it). ``confidence``: the
  t-interval's level (a family's Sidak level, :func:`family_confidence`)."""
  if ours is None or (isinstance(ours, float) and math.isnan(ours)):
    return "mismatch", None, ""
  if draw is not None:
    values = _floats(per_seed or [ours])
    if len(values) < MIN_DRAWS:
      return "inconclusive", None, (
          f"inconclusive: {len(values)} single draws cannot place the paper's one draw "
          f"(at least {MIN_DRAWS})")
    lo, hi = draw_range(values, draw)
    meets = lo <= paper + (band or 0.0) and paper - (band or 0.0) <= hi
    return "match" if meets else "mismatch", [lo, hi], ""
  if op is not None and every_seed:
    tested = _floats(per_seed or [ours])
    status = "match" if all(_OPS[op](v, paper) for v in tested) else "mismatch"
    return status, t_interval(per_seed, confidence), ""
  interval = t_interval(per_seed, confidence)
  lo, hi = interval if interval else (ours, ours)
  if op is not None:
    inside, outside = _holds(op, lo, hi, paper)
    edges = [paper]
  else:
    inside = paper - band <= lo and hi <= paper + band
    outside = hi < paper - band or lo > paper + band
    edges = [paper - band, paper + band]
  if inside:
    return "match", interval, ""
  if outside:
    return "mismatch", interval, ""
  _, sd, n, _ = spread(_floats(per_seed))
  margin = min(abs(ours - e) for e in edges)
  need = seeds_to_decide(margin, sd, n, confidence)
  return "inconclusive", interval, (
      f"inconclusive: the {100 * confidence:.4g}% interval of {n} seeds straddles "
      + ("the limit" if op is not None else "a band edge") + "; "
      + (f"about {need} seeds at this spread would decide it" if need
         else "no number of seeds at this spread would decide it"))


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of the paper and how it is judged, declared before the experiment runs.

  item: the row's key, unique in its experiment ("Table 3: eps=0.6, L=384").
  quantity: the one number measured ("erank(prod)/d").
  paper: a number the paper prints (or computes in its text), the limit of a
    :class:`Bound` it states, or None (no number: a :class:`Qualitative` rule, or a
    ``Bound(limit=...)`` of ours).
  rule: how ``ours`` is judged against ``paper``.
  note: what the protocol fixes, and how a reading follows from the text (every row).
  where: the paper item it tests (section, figure, table, equation); the counts group
    rows by it (``rankjax._src.studies.items``) and the study's register lists it.
  quote: the paper's words that state the claim, verbatim (ellipses allowed).
  kind: one of :data:`KINDS` (only ``experiment`` rows are counted).
  reading: where the text leaves a choice open, the reading this row takes (each
    reasonable reading an experiment row; the item is ``open`` when they disagree).
  post_hoc: why this reading or band was chosen after its outcome was seen (said in
    the row's note; empty when it was declared before).
  family: the number of rows of one claim over K points (Sidak per row).
  """
  item: str
  quantity: str
  paper: float | None
  rule: Rule
  note: str = ""
  where: str = ""
  quote: str = ""
  kind: str = "experiment"
  reading: str = ""
  post_hoc: str = ""
  family: int = 1

  def __post_init__(self):
    needs_paper = isinstance(self.rule, _BANDS + (Draw,)) or (
        isinstance(self.rule, Bound) and self.rule.limit is None)
    if needs_paper and self.paper is None:
      raise ValueError(f"claim {self.item!r}: rule {self.rule.describe()!r} needs the "
                       "paper's number")
    if isinstance(self.rule, Bound) and self.rule.limit is not None and self.paper is not None:
      raise ValueError(f"claim {self.item!r}: a Bound with our limit has no paper number "
                       "(the paper prints none; the limit is ours)")
    if isinstance(self.rule, Qualitative) and not self.rule.reason:
      raise ValueError(f"claim {self.item!r}: a qualitative rule needs its reason")
    if self.kind not in KINDS:
      raise ValueError(f"claim {self.item!r}: kind {self.kind!r}; choose one of {list(KINDS)}")
    if self.family < 1:
      raise ValueError(f"claim {self.item!r}: family {self.family} (at least 1)")

  @property
  def confidence(self) -> float:
    return family_confidence(self.family)

  @property
  def limit(self) -> float | None:
    return self.rule.limit if isinstance(self.rule, Bound) else None

  def _base(self) -> dict[str, Any]:
    return {"item": self.item, "where": self.where, "kind": self.kind,
            "reading": self.reading, "quantity": self.quantity, "paper": self.paper,
            "limit": self.limit, "quote": self.quote,
            "confidence": None if isinstance(self.rule, (Draw, Qualitative)) else self.confidence,
            "band": self.rule.band(self.paper) if isinstance(self.rule, _BANDS + (Draw,)) else None,
            "rule": self.rule.describe()}

  def _notes(self, *more: str) -> str:
    post = f"{POST_HOC}{self.post_hoc}" if self.post_hoc else ""
    return "; ".join(x for x in (post, self.note, *more) if x)

  def judge(self, values: Any, *, seeds: Sequence[int] | None = None,
            note: str = "", untested: str = "") -> dict[str, Any]:
    """The row for the measured ``values`` (one number, or one per seed in ``seeds``'
    order); with ``untested`` (why the measurement did not test the claim) an
    ``inconclusive`` row without a value, whatever ``values`` is."""
    if untested and not isinstance(self.rule, Qualitative):
      return {**self._base(), "ours": None, "sd": None, "n": None,
              "seeds": list(seeds) if seeds else None, "per_seed": None, "interval": None,
              "status": "inconclusive", "note": NOT_TESTED + untested + (
                  "; " + self._notes(note) if self._notes(note) else "")}
    mean, sd, n, per_seed = spread(values)
    if seeds is not None and len(seeds) != n:
      raise ValueError(f"claim {self.item!r}: {n} values for {len(seeds)} seeds")
    ours = None if math.isnan(mean) else mean
    row = self._base()
    interval, status, why = t_interval(per_seed, self.confidence), "qualitative", ""
    if isinstance(self.rule, _BANDS):
      status, interval, why = verdict(self.paper, ours, per_seed, row["band"],
                                      confidence=self.confidence)
    elif isinstance(self.rule, Draw):
      status, interval, why = verdict(self.paper, ours, per_seed, row["band"],
                                      draw=self.rule.coverage)
    elif isinstance(self.rule, Bound):
      target = self.paper if self.rule.limit is None else self.rule.limit
      status, interval, why = verdict(target, ours, per_seed, None, self.rule.op,
                                      self.rule.every_seed, self.confidence)
    reason = self.rule.reason if isinstance(self.rule, Qualitative) else ""
    return {**row, "ours": ours, "sd": sd, "n": n,
            "seeds": list(seeds) if seeds is not None else None, "per_seed": per_seed,
            "interval": interval, "status": status, "note": self._notes(note, reason, why)}


def measured(item: str, values: Any, *, seeds: Sequence[int] | None = None,
             note: str = "", untested: str = "") -> dict[str, Any]:
  """What an experiment's ``run`` reports for the claim ``item``: the measured value(s)
  (one number, or one per seed in ``seeds``' order) and a note (settings, not verdicts).
  The runner judges it by the declared claim (:meth:`Claim.judge`). ``untested``: why
  this measurement cannot test the claim (then the row is ``inconclusive``, valueless)."""
  return {"item": item, "values": values,
          "seeds": list(seeds) if seeds is not None else None, "note": note,
          "untested": untested}


def direction(row: dict[str, Any]) -> str:
  """Which side of the paper's value (or our limit) the row's numbers fall on, in words."""
  ref = row.get("paper") if row.get("paper") is not None else row.get("limit")
  whose = "the paper's" if row.get("paper") is not None else "our limit"
  ours, iv = row.get("ours"), row.get("interval")
  if ours is None or ref is None:
    return "no finite value measured"
  lo, hi = iv if iv else (ours, ours)
  if lo == hi == ref:
    side = "equal to"
  elif lo > ref:
    side = "above"
  elif hi < ref:
    side = "below"
  elif lo == ref or hi == ref:
    side = "at or above" if lo == ref else "at or below"
  else:
    side = "on both sides of"
  span = f" [{_g(lo)}, {_g(hi)}]" if iv and lo != hi else ""
  return f"ours {_g(ours)}{span} is {side} {whose} {_g(ref)}"


def _g(x: float) -> str:
  return f"{x:.4g}"


PROXY = "proxy: "   # how a proxy row's note begins
NOT_TESTED = "not tested: "   # how an untested row's note begins (Claim.judge(untested=))
POST_HOC = "chosen after the outcome: "   # Claim.post_hoc, said in the row


def as_proxy(row: dict[str, Any], setting: str) -> dict[str, Any]:
  """``row`` (judged) as a proxy measured at ``setting`` (ours against the paper's):
  status ``proxy``, the note opening with the setting and the direction."""
  if row["status"] not in JUDGED:
    return row
  note = f"{PROXY}{setting}; {direction(row)}"
  return {**row, "status": "proxy",
          "note": "; ".join(x for x in (note, row.get("note") or "") if x)}


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
  if row.get("status") == "proxy":
    return "proxy" if str(row.get("note") or "").startswith(PROXY) else "mismatch"
  target = row.get("paper") if row.get("paper") is not None else row.get("limit")
  if target is None:
    return "mismatch"
  if str(row.get("note") or "").startswith(NOT_TESTED) and row.get("ours") is None:
    return "inconclusive"
  confidence = row.get("confidence") or CONFIDENCE
  if rule.startswith("draw:"):
    coverage = float(rule.split("within the ")[1].split("-")[0])
    return verdict(target, row.get("ours"), row.get("per_seed"), row.get("band"),
                   draw=1 - coverage / 50)[0]
  if row.get("band") is not None:
    return verdict(target, row.get("ours"), row.get("per_seed"), row["band"],
                   confidence=confidence)[0]
  return verdict(target, row.get("ours"), row.get("per_seed"), None,
                 rule.split()[1], rule.endswith("for every seed"), confidence)[0]
