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
  assert r["failures"] == [] and "**Checks: all passed.**" in proc.stdout
  # CPU float32 dots are exact float32 at every precision.
  assert r["precision"]["err_highest"] < 1e-5
  assert not r["precision"]["default_is_tf32_or_bf16"]
  for a in r["attention"]:
    assert a["out_rel_diff"] < 1e-5 and a["grad_rel_diff"] < 1e-5
  assert [(s["config"], s["prng_impl"]) for s in r["steps"]] == [
      ("postnorm_48l_d512_c4.json", "threefry"), ("gpt2_774m.json", "threefry"),
      ("gpt2_774m.json", "unsafe_rbg")]        # 774M has dropout: again with unsafe_rbg
  for s in r["steps"]:
    assert s["step_s"] > 0 and np.isfinite(s["loss"])
    assert s["mfu_spec"] is None and s["mfu_full_attention"] is None   # no CPU spec peak
  assert r["jacobian"]["reconstruction_error"] < 1e-4
  a = r["analyze"]
  assert a["forward_s"] > 0 and a["backward_s"] > 0 and np.isfinite(a["loss"])
  assert "**rankjax analyze**" in proc.stdout


def test_device_check_rejects_unknown_part():
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments/benchmarks/device_check.py"), "--smoke",
       "--only", "precision,warp"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "unknown part(s) ['warp']" in proc.stderr


def _device_check():
  sys.path.insert(0, str(ROOT / "experiments" / "benchmarks"))
  try:
    import device_check
  finally:
    sys.path.pop(0)
  return device_check


def test_failed_checks_name_each_failure_and_pass_good_results():
  """The checks fixed in device_check.TOLERANCES fail by name on values outside their
  bands, and pass values inside them (a bf16 fused attention 1% off its reference
  passes, a float32 one does not)."""
  dc = _device_check()
  good = {"precision": {"err_highest": 3e-7},
          "attention": [{"shape": "a", "dtype": "bfloat16", "out_rel_diff": 1e-2,
                         "grad_rel_diff": 1e-2},
                        {"shape": "b", "dtype": "float32", "out_rel_diff": 1e-7,
                         "grad_rel_diff": 5e-5}],
          "steps": [{"config": "c.json", "loss": 10.4}],
          "jacobian": {"reconstruction_error": 2e-6}, "analyze": {"loss": 10.2}}
  assert dc.failed_checks(good) == []
  bad = {"precision": {"err_highest": 4e-4},                      # TF32 at 'highest'
         "attention": [{"shape": "b", "dtype": "float32", "out_rel_diff": 1e-2,
                        "grad_rel_diff": 1e-7}],
         "steps": [{"config": "c.json", "loss": float("nan")}],
         "jacobian": {"reconstruction_error": 0.5}, "analyze": {"loss": float("inf")}}
  failures = dc.failed_checks(bad)
  assert [f.split(":")[0] for f in failures] == [
      "precision", "attention b", "steps c.json", "jacobian", "analyze"], failures
  assert "4.0e-04 > 1e-05" in failures[0]
