"""``rankjax measure mlp``: spread over seeds x inputs, sweeps, float64 that is float64."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from rankjax._src import cli
from rankjax._src.config import MLPConfig
from rankjax._src.measure import summary
from rankjax._src.measure.jacobians import mlp_jacobian_study


def test_defaults_are_several_seeds_and_inputs_and_shown_in_help(capsys):
  try:
    cli.main(["measure", "mlp", "--help"])
  except SystemExit:
    pass
  text = " ".join(capsys.readouterr().out.split())
  assert "independent weight draws (the spread's sample; default 4)" in text
  assert "per weight draw (default 4)" in text
  assert "--sweep FIELD=V1,V2,..." in text and "sd, sd of the seed means, min" in text
  # a dtype sweep compares precision (test_weight_draws checks the numbers)
  assert "drawn at float32 and cast to param_dtype, so at one ``--seed`` every dtype" in text


def test_spread_matches_numpy_over_the_samples(tmp_path):
  out = tmp_path / "r.json"
  args = ["--set", "depth=3", "--set", "width=8", "--seeds", "3", "--inputs", "2"]
  assert cli.main(["measure", "mlp", *args, "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  cfg = MLPConfig(depth=3, width=8)
  _, samples = mlp_jacobian_study(cfg, jax.random.key(0), num_inputs=2, num_seeds=3,
                                  return_samples=True)
  erank = np.asarray(samples["erank"], np.float64)            # (seeds, inputs, L)
  flat = erank.reshape(6, 3)
  np.testing.assert_allclose(result["erank"], flat.mean(0), rtol=1e-6)
  got = result["spread"]["erank"]
  np.testing.assert_allclose(got["sd"], flat.std(0, ddof=1), rtol=1e-6)
  np.testing.assert_allclose(got["sd_seed_means"], erank.mean(1).std(0, ddof=1), rtol=1e-6)
  np.testing.assert_allclose(got["min"], flat.min(0), rtol=1e-6)
  np.testing.assert_allclose(got["max"], flat.max(0), rtol=1e-6)
  assert np.all(np.asarray(got["sd"]) > 0)
  assert result["dtype"] == "float32" and result["path_mass_unit"] == "ln"
  assert (result["num_seeds"], result["num_inputs"]) == (3, 2)
  assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow   # ~6 s; the sweep itself is fast in test_alpha_sweep_is_one_compiled_program
def test_sweep_writes_one_table_and_one_figure(tmp_path):
  out = tmp_path / "sweep.json"
  assert cli.main(["measure", "mlp", "--set", "width=8", "--seeds", "2", "--inputs", "1",
                   "--sweep", "depth=2,3", "--sweep", "norm_position=pre,post",
                   "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["sweep"] == ["depth", "norm_position"]
  assert [(r["depth"], r["norm_position"]) for r in result["rows"]] == [
      (2, "pre"), (2, "post"), (3, "pre"), (3, "post")]
  for row, point in zip(result["rows"], result["points"]):
    assert row["erank_L_mean"] == point["erank"][-1] and len(point["erank"]) == row["depth"]
    assert row["erank_L_min"] <= row["erank_L_mean"] <= row["erank_L_max"]
    assert row["reconstruction_error_max"] == point["reconstruction_error"]
  rows = list(csv.DictReader(out.with_suffix(".csv").open()))
  assert len(rows) == 4 and float(rows[3]["erank_L_mean"]) == result["rows"][3]["erank_L_mean"]
  assert out.with_suffix(".md").read_text().count("\n") == 6      # header, rule, 4 rows
  assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


def test_sweep_columns_name_their_aggregate():
  """The study's reconstruction_error is the max over samples: its column says max,
  beside the mean / sd / min / max columns of the other quantities."""
  from rankjax._src.measure import summary
  spread = lambda v: {"sd": v, "min": v, "max": v, "sd_seed_means": v}
  result = {"erank": [0.5, 0.4], "stable_rank": [0.3, 0.2], "mean_order": 2.0,
            "stream_rms": [1.0, 1.5], "reconstruction_error": 3e-7, "dtype": "float32",
            "spread": {"erank": spread([0.1, 0.2]), "reconstruction_error": spread(3e-7)}}
  row = summary.sweep_row({"depth": 2}, result)
  assert list(row) == [
      "depth", "erank_L_mean", "erank_L_sd", "erank_L_min", "erank_L_max",
      "stable_rank_L_mean", "mean_order_mean", "stream_rms_L_mean",
      "reconstruction_error_max", "reconstruction_error_sd", "reconstruction_error_min",
      "dtype"]
  assert row["erank_L_mean"] == 0.4 and row["reconstruction_error_max"] == 3e-7


def test_bad_sweep_or_import_is_one_line(capsys, tmp_path):
  for argv, message in ((["--sweep", "depth"], "--sweep expects field=v1,v2"),
                        (["--sweep", "dept=2,3"], "unknown config key 'dept'"),
                        (["--import", "no_such_pieces"], "--import no_such_pieces: no module")):
    assert cli.main(["measure", "mlp", *argv, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err
  assert not (tmp_path / "x.json").exists()


@pytest.mark.slow   # a fresh Python process (x64 is global), ~6 s idle
def test_float64_is_computed_in_float64(tmp_path):
  """In a fresh process (x64 is global): the path-sum reconstruction error is at
  float64 round-off, not float32's ~1e-7, and the JSON says float64."""
  out = tmp_path / "r64.json"
  code = ("import sys; from rankjax._src import cli; sys.exit(cli.main(['measure', 'mlp', '--set', "
          "'depth=4', '--set', 'width=8', '--set', 'param_dtype=float64', '--seeds', '2', "
          f"'--inputs', '1', '--out', {str(out)!r}]))")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads(out.read_text())
  assert result["dtype"] == "float64"
  assert result["reconstruction_error"] < 1e-13, result["reconstruction_error"]


def test_alpha_sweep_is_one_compiled_program(tmp_path):
  """alpha is a traced argument of the study: three values, one study build (_study_fn)."""
  from rankjax._src.measure import jacobians
  before = jacobians._study_fn.cache_info()
  out = tmp_path / "alpha.json"
  assert cli.main(["measure", "mlp", "--set", "depth=3", "--set", "width=8", "--seeds", "2",
                   "--inputs", "1", "--sweep", "alpha=0.25,1.0,4.0", "--out", str(out)]) == 0
  after = jacobians._study_fn.cache_info()
  assert after.misses - before.misses <= 1 and after.hits - before.hits >= 2
  rows = json.loads(out.read_text())["rows"]
  assert [r["alpha"] for r in rows] == [0.25, 1.0, 4.0]
  assert len({r["erank_L_mean"] for r in rows}) == 3     # the values differ per point
