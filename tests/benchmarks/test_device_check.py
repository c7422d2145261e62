"""experiments/benchmarks/device_check.py --smoke: every part runs and its numbers hold."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_device_check_smoke(tmp_path):
  out = tmp_path / "dc.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments/benchmarks/device_check.py"), "--smoke",
       "--json", str(out)], capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(out.read_text())
  assert "## Device check" in proc.stdout
  # CPU float32 dots are exact float32 at every precision.
  assert r["precision"]["err_highest"] < 1e-5
  assert not r["precision"]["default_is_tf32_or_bf16"]
  for a in r["attention"]:
    assert a["out_rel_diff"] < 1e-5 and a["grad_rel_diff"] < 1e-5
  assert [s["config"] for s in r["steps"]] == ["postnorm_48l_d512_c4.json", "gpt2_774m.json"]
  for s in r["steps"]:
    assert s["step_s"] > 0 and s["mfu_spec"] is None   # no spec peak for a CPU
  assert r["jacobian"]["reconstruction_error"] < 1e-4
  a = r["analyze"]
  assert a["forward_s"] > 0 and a["backward_s"] > 0 and np.isfinite(a["loss"])
  assert "**rankjax analyze**" in proc.stdout


def test_device_check_rejects_unknown_part():
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments/benchmarks/device_check.py"), "--smoke",
       "--only", "precision,warp"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "unknown part(s) ['warp']" in proc.stderr
