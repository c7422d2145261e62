"""A pytest plugin: a test that passed only on its automatic rerun is reported loudly.

The suite reruns a test once when its xdist worker crashed or hung (pyproject.toml:
``--reruns 1 --only-rerun ...``; a hang is ended by faulthandler's watchdog). A green
run must not hide that: a crash or a hang is a bug to find (as the LAPACK deadlock
was). At the end of the run this prints a banner naming every rerun test and the first
lines of its first attempt's report; the full report of each attempt is in the
"rerun test summary info" section (``-rR``).
"""

import itertools

import pytest

BANNER = "TESTS RERUN AFTER A CRASHED OR HUNG WORKER (a bug to find, not noise)"


def reruns(terminalreporter) -> dict[str, list]:
  """nodeid -> the reports of its attempts that were rerun (outcome 'rerun')."""
  out: dict[str, list] = {}
  for report in itertools.chain.from_iterable(terminalreporter.stats.values()):
    if getattr(report, "outcome", None) == "rerun":
      out.setdefault(report.nodeid, []).append(report)
  return out


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
  found = reruns(terminalreporter)
  if not found:
    return
  tr = terminalreporter
  tr.write_sep("!", BANNER, red=True, bold=True)
  for nodeid, reports in found.items():
    tr.write_line(f"RERUN {nodeid}", red=True, bold=True)
    text = str(reports[0].longrepr or "").strip().splitlines()
    for line in text[:12]:
      tr.write_line(f"    {line}")
  tr.write_sep("!", f"{len(found)} test(s) rerun after a crashed or hung worker", red=True,
               bold=True)
