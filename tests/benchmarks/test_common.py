"""experiments/benchmarks: RESULTS.md sections keep their hand-written notes, and
profile_ops.py traces both loss gradients op by op."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments/benchmarks"))
import common  # noqa: E402


def test_write_section_replaces_the_table_and_keeps_the_notes(tmp_path):
  path = tmp_path / "RESULTS.md"
  path.write_text("# Benchmark results\n\n## A\n\nold table\n\n" + common.NOTES_MARK +
                  "\n\nnote one\n\n## B\n\nb table\n")
  common.write_section("## A", "## A\n\nnew table\n", path)
  text = path.read_text()
  assert "old table" not in text and "new table" in text
  assert text.index("new table") < text.index(common.NOTES_MARK) < text.index("note one") \
      < text.index("## B")
  assert text.count("note one") == 1 and "b table" in text
  common.write_section("## B", "## B\n\nb2\n", path)      # no mark: the whole section goes
  assert "b table" not in path.read_text() and path.read_text().endswith("b2\n")
  common.write_section("## C", "## C\n\nc\n", path)       # a new section is appended
  assert path.read_text().endswith("## C\n\nc\n") and "note one" in path.read_text()


@pytest.mark.slow
def test_profile_ops_reports_both_sides():
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  proc = subprocess.run(
      [sys.executable, "profile_ops.py", "--shape", "32,2,2,64,16,2", "--steps", "2",
       "--top", "3"], capture_output=True, text=True, env=env, timeout=600,
      cwd=ROOT / "experiments/benchmarks")
  assert proc.returncode == 0, proc.stderr[-3000:]
  for side in ("rj", "plain"):
    block = proc.stdout.split(f"== {side}: ")[1].split("== ")[0]
    assert float(block.split("wall per step ")[1].split(" ms")[0]) > 0
    kinds = {l.split()[0]: float(l.split()[-2]) for l in block.splitlines()
             if l.strip().endswith(" ms") and l.split()[0] in ("dot", "other")}
    assert kinds["dot"] > 0 and kinds["other"] > 0
    ops = block.split("costliest ops")[1].strip().splitlines()[1:]
    assert len(ops) == 3 and all(float(l.split()[0]) > 0 for l in ops)
    assert any("jit(" in l for l in ops)       # named by their jax source
  assert "layer-scan bookkeeping" in proc.stdout.split("== plain: ")[0]   # rankjax scans
