"""CI hygiene (.ci/run, pyproject's pytest settings): every step of .ci/run fails CI when
it fails; a test whose worker crashed fails the run, with no rerun to turn it green; a
test's own timeout mark, not the ini's watchdog, bounds it (tests/watchdog.py)."""

import pathlib
import re
import shlex

import pytest

from tests import conftest, watchdog

pytest_plugins = ["pytester"]
ROOT = pathlib.Path(__file__).resolve().parents[1]
CI = ROOT / ".ci" / "run"


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
  monkeypatch.setenv("PYTHONPATH", str(ROOT))   # -p tests.watchdog in the child


def _commands(text: str) -> list[str]:
  return [line.strip() for line in text.splitlines()
          if line.strip() and not line.lstrip().startswith("#")]


def test_ci_runs_the_readme_test_command_one_step_a_line():
  """README's test command is in .ci/run, its install and its pytest each a line of their
  own; no command of .ci/run is chained with && (a failure left of && escapes set -e)."""
  script = CI.read_text()
  assert "set -euo pipefail" in script
  lines = _commands(script)
  assert not [line for line in lines
              if "&&" in line and not re.match(r"(if|elif|while) ", line)]
  blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
  (readme,) = [block for block in blocks if "pytest" in block]
  steps = [shlex.split(part) for part in readme.split("&&")]
  install = next(s for s in steps if s[:2] == ["pip", "install"])
  test = next(s for s in steps if "pytest" in s)
  words = [shlex.split(line) for line in lines if "pip install" in line or "pytest" in line]
  assert ["python", "-m", *install] in words, install
  assert any(w[w.index("python"):][:len(test)] == test for w in words if "python" in w), test


def test_a_crashed_worker_fails_the_run_though_a_second_try_passes(pytester):
  """Under the project's pytest settings a test whose xdist worker dies fails the run,
  named, even when it would pass if run again (no reruns); the other tests still run."""
  pytester.makepyfile(test_crash="""
import os, pathlib
MARK = pathlib.Path(__file__).with_name("crashed_once")

def test_crashes_its_worker_once():
  if not MARK.exists():
    MARK.write_text("x")
    os._exit(1)          # the xdist worker dies, as a hang ended by the watchdog would

def test_fine():
  pass
""")
  result = pytester.runpytest_subprocess(
      "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(pytester.path), "-n", "1",
      "-p", "no:cacheprovider", "test_crash.py")
  out = result.stdout.str()
  assert result.ret == pytest.ExitCode.TESTS_FAILED, out
  result.assert_outcomes(failed=1, passed=1)      # and no "rerun"
  assert "crashed while running 'test_crash.py::test_crashes_its_worker_once'" in out, out


_SLEEPER = """
import time, pytest

@pytest.mark.committed
@pytest.mark.timeout(6)
def test_own_limit():
  time.sleep(2.5)          # past the ini's watchdog (1 s), within its own limit (6 s)

def test_no_own_limit():
  time.sleep(2.5)
"""


def _run_sleeper(pytester, which: str):
  pytester.makepyfile(test_sleep=_SLEEPER)
  pytester.makeini("[pytest]\nmarkers =\n  committed: x\n")
  return pytester.runpytest_subprocess(
      "-p", "tests.watchdog", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=1",
      "-o", "faulthandler_exit_on_timeout=true", f"test_sleep.py::{which}")


def test_a_tests_own_timeout_mark_moves_the_watchdog_above_it(pytester):
  """A committed test with its own limit outlives the ini's faulthandler_timeout, as
  `python -m pytest -m committed` by hand must (no -o faulthandler_timeout there)."""
  assert conftest.pytest_runtest_setup is watchdog.pytest_runtest_setup
  result = _run_sleeper(pytester, "test_own_limit")
  result.assert_outcomes(passed=1)


def test_without_its_own_limit_the_watchdog_ends_a_test(pytester):
  """The control: the same sleep with no timeout mark is ended by the ini's watchdog."""
  result = _run_sleeper(pytester, "test_no_own_limit")
  assert result.ret != 0
  assert "Timeout" in result.stderr.str() + result.stdout.str()
