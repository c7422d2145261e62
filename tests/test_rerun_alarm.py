"""A crashed worker's test, rerun and passed, is named in a banner (tests/rerun_alarm.py)."""

import pathlib

import pytest

pytest_plugins = ["pytester"]
ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
  monkeypatch.setenv("PYTHONPATH", str(ROOT))   # -p tests.rerun_alarm in the child


def test_a_test_that_passes_only_on_its_rerun_is_named_loudly(pytester):
  pytester.makepyfile(test_crash="""
import os, pathlib
MARK = pathlib.Path(__file__).with_name("crashed_once")

def test_crashes_its_worker_once(request):
  # The worker tells the controller this test's rerun budget by a message that is
  # not awaited; a real hang dies after minutes, long after it arrived. This one dies
  # at once, so first wait for the controller's answer on the same connection (its
  # messages are handled in order): otherwise, on a loaded machine, the crash can be
  # handled before the budget arrives and the test is not rerun (a race in the test,
  # not in the alarm).
  assert request.config.failures_db.get_test_reruns(request.node.nodeid) == 1
  if not MARK.exists():
    MARK.write_text("x")
    os._exit(1)          # the xdist worker dies, as a hang ended by the watchdog would

def test_fine():
  pass
""")
  result = pytester.runpytest_subprocess(
      "-n", "2", "-p", "tests.rerun_alarm", "-p", "no:cacheprovider", "--reruns", "1",
      "--only-rerun", "only a crashed or hung worker is rerun", "-raR")
  out = result.stdout.str()
  assert result.parseoutcomes() == {"passed": 2, "rerun": 1}, out
  assert "TESTS RERUN AFTER A CRASHED OR HUNG WORKER" in out, out
  assert "RERUN test_crash.py::test_crashes_its_worker_once" in out, out
  assert "crashed" in out


def test_no_banner_without_reruns(pytester):
  pytester.makepyfile(test_ok="def test_ok():\n  pass\n")
  result = pytester.runpytest_subprocess("-p", "tests.rerun_alarm", "-p", "no:cacheprovider")
  result.assert_outcomes(passed=1)
  assert "CRASHED OR HUNG" not in result.stdout.str()
