"""A pytest plugin: a test's own time limit moves faulthandler's watchdog with it.

pytest's faulthandler plugin arms one watchdog for every test, ``faulthandler_timeout``
(pyproject.toml), and exits the (xdist worker) process when it fires. A test that
declares a longer limit of its own, ``@pytest.mark.timeout(S)`` above that watchdog (the
committed results' reruns, tests/experiments/test_committed_results.py), would be killed
before its own limit. For such a test this re-arms the watchdog at ``S + MARGIN_S``, so
``python -m pytest -m committed`` by hand runs under the same limits as CI, with no
``-o faulthandler_timeout=...``: pytest-timeout ends the test at S with its stack, and
the watchdog (a C thread, it fires with the GIL held inside XLA or LAPACK) MARGIN_S
later. A test's limit never lowers the watchdog.
"""

import faulthandler
import sys

import pytest

MARGIN_S = 60.0


def own_timeout(item) -> float | None:
  """The seconds of ``item``'s ``timeout`` mark (pytest-timeout's), None without one."""
  mark = item.get_closest_marker("timeout")
  if mark is None:
    return None
  value = mark.args[0] if mark.args else mark.kwargs.get("timeout")
  return float(value) if value else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  # Runs inside pytest's faulthandler wrapper of pytest_runtest_protocol, after it armed
  # the ini's watchdog; dump_traceback_later replaces that timer, and the wrapper's
  # cancel_dump_traceback_later still ends it after the test's teardown.
  if not item.config.pluginmanager.has_plugin("faulthandler"):
    return
  ini = float(item.config.getini("faulthandler_timeout") or 0.0)
  own = own_timeout(item)
  if ini <= 0 or own is None or own + MARGIN_S <= ini:
    return
  try:
    from _pytest.faulthandler import fault_handler_stderr_fd_key
    stderr = item.config.stash[fault_handler_stderr_fd_key]
  except (ImportError, KeyError):
    stderr = sys.__stderr__.fileno()
  faulthandler.dump_traceback_later(
      own + MARGIN_S, file=stderr, exit=bool(item.config.getini("faulthandler_exit_on_timeout")))
