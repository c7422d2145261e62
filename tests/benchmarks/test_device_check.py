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
       "--json", str(out), "--out", str(tmp_path / "dc")], capture_output=True, text=True,
      env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(out.read_text())
  assert "## Device check" in proc.stdout
  assert r["failures"] == [] and "**Checks: all passed.**" in proc.stdout
  # CPU float32 dots are exact float32 at every precision.
  assert r["precision"]["err_highest"] < 1e-5
  assert not r["precision"]["default_is_tf32_or_bf16"]
  for a in r["attention"]:
    assert a["out_rel_diff"] < 1e-5 and a["grad_rel_diff"] < 1e-5
  assert [(s["config"], s["prng_impl"], s["attn_dropout"]) for s in r["steps"]] == [
      ("postnorm_48l_d512_c4.json", "threefry", 0.0), ("gpt2_774m.json", "threefry", 0.0),
      ("gpt2_774m.json", "threefry", 0.1),     # the softmax study's step
      ("gpt2_774m.json", "unsafe_rbg", 0.0)]   # 774M has dropout: again with unsafe_rbg
  for s in r["steps"]:
    assert s["step_s"] > 0 and np.isfinite(s["loss"])
    assert s["mfu_spec"] is None and s["mfu_full_attention"] is None   # no CPU spec peak
    assert 0 < s["peak_memory_gib"] < 1          # the step's own compiled peak
  # written where the caller said: the results and a 3-step trace per config
  assert json.loads((tmp_path / "dc" / "device_check.json").read_text())["steps"]
  for tag in ("postnorm_48l_d512_c4", "gpt2_774m", "gpt2_774m_softmax"):
    assert list((tmp_path / "dc" / "traces" / tag).rglob("*.xplane.pb")), tag
  # the softmax study's step as the study runs it (hash masks); on a CPU the query blocks
  assert "attention dropout 0.1 (softmax study; query blocks (hash))" in proc.stdout
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


def test_device_check_runs_each_part_in_its_own_process(tmp_path, monkeypatch):
  """Outside --smoke each part is a child process whose JSON the parent merges (so its
  peak device memory is its own); the targets are 50% and 55%."""
  dc = _device_check()
  calls = []
  monkeypatch.setattr(dc, "run_in_own_process",
                      lambda part, tmp, out: calls.append(part) or {"n": 1, "err_highest": 0.0,
                                                                    "err_default": 0.0,
                                                                    "err_high": 0.0,
                                                                    "tflops_default": 1.0,
                                                                    "tflops_high": 1.0,
                                                                    "tflops_highest": 1.0,
                                                                    "default_is_tf32_or_bf16": False})
  r = dc.main(["--only", "precision", "--no-write", "--out", str(tmp_path / "o")])
  assert calls == ["precision"] and r["failures"] == []
  assert (tmp_path / "o" / "device_check.json").exists()
  assert dc.MFU_TARGET == {"postnorm_48l_d512_c4.json": 0.50, "gpt2_774m.json": 0.55}
  monkeypatch.undo()
  child = dc.run_in_own_process("precision", tmp_path, None, smoke=True)   # a real child
  assert child["n"] == 256 and child["err_highest"] < 1e-5
