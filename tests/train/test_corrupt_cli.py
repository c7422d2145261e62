"""Every command on a run whose checkpoints are all corrupt: exit 3, one line on stderr,
the run untouched; what Orbax and TensorStore print goes to a log file (``cli_quiet``)."""

from __future__ import annotations

import hashlib
import logging
import random
import shutil
import subprocess
import sys
import threading

import pytest

from rankjax._src import cli_quiet
from rankjax._src.train.loop import train
from tests.train.conftest import ROOT, tiny_lm

METADATA = ("_METADATA", "_CHECKPOINT_METADATA", "_sharding", "process_0", "metrics")


@pytest.fixture(scope="module")
def reference(compile_cache, tmp_path_factory):
  """The tiny LM trained for 8 updates, checkpoints at 4 and 8."""
  workdir = tmp_path_factory.mktemp("corrupt_cli") / "run"
  assert train(tiny_lm(max_to_keep=2), workdir, progress_bar=False).step == 8
  return workdir


def corrupt(workdir, metadata: bool) -> None:
  """Truncates every array chunk of every step; ``metadata``: also overwrites the
  metadata and JSON files with random bytes."""
  rng = random.Random(0)
  for f in sorted((workdir / "checkpoints").rglob("*")):
    if not f.is_file():
      continue
    if f.parent.name == "d":
      f.write_bytes(f.read_bytes()[:20])
    elif metadata and (f.name in METADATA or f.suffix == ".json"):
      f.write_bytes(bytes(rng.randrange(256) for _ in range(64)))


def _hashes(workdir) -> dict[str, str]:
  return {str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file()
          else "dir" for p in workdir.rglob("*")}


COMMANDS = {
    "train": lambda wd, out: ["train", "--config", str(wd / "config.json"),
                              "--workdir", str(wd)],
    "report": lambda wd, out: ["report", str(wd)],
    "analyze": lambda wd, out: ["analyze", str(wd), "--out", str(out), "--dataset",
                                "shakespeare", "--tokens", "8"],
}


@pytest.mark.parametrize("metadata", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["data", "metadata"])
@pytest.mark.parametrize("command", [    # train in the default suite, the others slow
    c if c == "train" else pytest.param(c, marks=pytest.mark.slow) for c in COMMANDS])
def test_all_corrupt_run_is_one_line_and_exit_3(reference, tmp_path, worker_env, command,
                                                metadata):
  """Array chunks cut short (Orbax's abandoned reads print ~200 lines), and in the slow
  variant the metadata damaged too (Orbax cannot even list the steps)."""
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  corrupt(workdir, metadata)
  before = _hashes(workdir)
  proc = subprocess.run([sys.executable, "-m", "rankjax._src.cli",
                         *COMMANDS[command](workdir, tmp_path / "out")],
                        env=worker_env, capture_output=True, text=True, timeout=300, cwd=ROOT)
  err = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode == 3, proc.stderr[-3000:]
  assert len(err) == 1, proc.stderr[-3000:]
  assert err[0].startswith(f"rankjax {command}: ") and "corrupt" in err[0], err[0]
  assert _hashes(workdir) == before


def test_quiet_keeps_library_noise_in_a_log_file(tmp_path, monkeypatch, capsys):
  """absl records, unraisable exceptions and other threads' tracebacks go to the log
  file; the hooks are put back after a command without errors."""
  monkeypatch.setattr(cli_quiet, "log_path", lambda command: str(tmp_path / f"{command}.log"))
  monkeypatch.setattr(cli_quiet, "SETTLE_S", 0.01)
  hooks = sys.unraisablehook, sys.excepthook
  with cli_quiet.quiet("calm") as log:
    logging.getLogger("absl").warning("a library warning")
  assert (sys.unraisablehook, sys.excepthook) == hooks and log.errors == 0
  assert "a library warning" in (tmp_path / "calm.log").read_text()

  with cli_quiet.quiet("noisy") as log:
    logging.getLogger("absl").error("Failed to read Metadata file")
    sys.unraisablehook(type("U", (), dict(exc_type=RuntimeError, exc_value=RuntimeError("gc"),
                                          exc_traceback=None, err_msg=None, object="coro"))())
    t = threading.Thread(target=lambda: sys.excepthook(RuntimeError, RuntimeError(
        "Event loop is closed"), None))
    t.start()
    t.join()
  assert sys.excepthook is not hooks[1]     # kept for reads that report late
  sys.unraisablehook, sys.excepthook = hooks
  text = (tmp_path / "noisy.log").read_text()
  assert log.errors == 3 and "Metadata file" in text and "Event loop is closed" in text, text
  assert capsys.readouterr().err == ""
