"""How the softmax-sensitivity study's rows are judged: one policy for every experiment.

EXPECTED.md, "How rows are judged": the rules are fixed before any run from the
paper's printed precision and the kind of quantity, never from our outcomes. Each
experiment module declares its claims (``CLAIMS``) with these constants; several
seeds are judged on their mean's 95% interval (``rankjax.studies.Claim``); worded
claims are ``Bound`` predicates on the measured values; identities are
``Bound("<", the paper's limit)``, or ``Bound(op, limit=...)`` where the limit is ours.
"""
from __future__ import annotations

from rankjax.studies import Abs, OneMinus, Rel

REL = Rel(0.05)            # a printed number away from 0 and 1: 5% relative
NEAR_ONE = OneMinus(0.25)  # a quantity bounded by 1 printed >= 0.9: 25% relative on 1 - x
FRACTION_FLOOR = 0.005     # near 0 (< 0.05): shares of samples, half a percentage point
P_MAX_FLOOR = 0.0005       # near 0: attention weights, half the paper's last digit (0.010)
COUNT_TOL = Abs(0.5)       # a count of seeds: half a unit
# (no minimum effect: a worded change such as "falls" is asked to be above 0; a size
# needs the paper's own number, tested by the rows of the endpoints it prints)


def fmt(xs) -> str:
  """Numbers in a row's note: four significant digits, comma-separated."""
  return ", ".join(f"{x:.4g}" for x in xs)
