"""The runner convention of ``rankjax reproduce``: rows, summary.json, failures that fail."""

import json
import textwrap

import pytest

from experiments import runner
from rankjax import cli, reproduce


@pytest.mark.parametrize("paper, ours, status", [
    ("0.637 / 1.57", "0.637 / 1.58", "match"),      # 1.58 within 5% of 1.57
    ("0.637 / 1.57", "0.637 / 1.75", "mismatch"),
    ("17.8%", "15.4%", "mismatch"),                  # 13% off
    ("~0.11", "0.112", "match"),
    ("0.003", "0.0034", "match"),                     # within the paper's last digit
    ("< 1e-13", "3.1e-15", "match"),
    ("< 1e-13", "2e-12", "mismatch"),
    ("near 1 (figure)", "0.99", "qualitative"),
    ("0.5 / 0.6", "0.5", "qualitative"),              # not the same count
    ("0.000 / inf / 50.66", "0.000 / inf / 57.12", "mismatch"),
    ("0.000 / inf", "0.000 / inf", "match"),
])
def test_auto_status(paper, ours, status):
  assert runner.auto_status(paper, ours) == status


def _fake_study(tmp_path, monkeypatch, needs=None):
  pkg = tmp_path / "fakepkg"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "good.py").write_text(textwrap.dedent("""
      import pathlib
      def run(out_dir, scale):
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out_dir) / "ran").write_text(scale)
        return {"settings": {"seeds": 4}, "value": 0.5}
  """))
  (pkg / "bad.py").write_text("def run(out_dir, scale):\n  raise RuntimeError('boom')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  rows = lambda res: [runner.row("value", "0.5", f"{res['value']}"),
                      runner.row("trend", "grows", "grows", "qualitative", spread="sd 0.1")]
  return runner.Study(
      name="fake", title="Fake: paper vs ours", package="fakepkg",
      experiments={"good": runner.Experiment("good", rows, folder="g", needs=needs),
                   "bad": runner.Experiment("bad", rows),
                   "quick_only": runner.Experiment("good", rows, scales=("quick",),
                                                   why_missing="CPU only")},
      aliases={"fig1": "good"})


def test_run_study_writes_rows_and_names_failures(tmp_path, monkeypatch):
  study = _fake_study(tmp_path, monkeypatch)
  res = runner.run_study(study, tmp_path / "out", "paper")
  assert res["failed"] == ["bad"]
  rows = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert all(list(r) == list(runner.FIELDS) for r in rows)
  assert [(r["experiment"], r["status"]) for r in rows] == [
      ("good", "match"), ("good", "qualitative"), ("bad", "failed"), ("quick_only", "missing")]
  assert rows[0]["seeds"] == 4 and rows[0]["scale"] == "paper" and rows[1]["spread"] == "sd 0.1"
  assert "RuntimeError: boom" in rows[2]["note"] and rows[3]["note"] == "CPU only"
  md = (tmp_path / "out" / "summary.md").read_text()
  assert md.startswith("# Fake: paper vs ours (paper scale)")
  assert "| good | value | 0.5 | 0.5 | match | paper | 4 |  |  |" in md
  assert "Status counts: match 1, mismatch 0, qualitative 1, missing 1, failed 1" in md
  assert study.resolve("FIG1,good") == ["good"]
  with pytest.raises(ValueError, match="unknown experiment 'fig9'"):
    study.resolve("fig9")


def test_unprepared_data_stops_before_anything_runs(tmp_path, monkeypatch):
  needs = lambda scale: "cifar10 is not prepared; tfds build cifar10" if scale == "paper" else None
  study = _fake_study(tmp_path, monkeypatch, needs)
  with pytest.raises(runner.NotPrepared, match="fake --scale paper: cifar10 is not prepared"):
    runner.run_study(study, tmp_path / "out", "paper")
  assert not (tmp_path / "out").exists()
  with pytest.raises(ValueError, match="--scale 'huge' is not known"):
    runner.run_study(study, tmp_path / "out", "huge")


def test_reproduce_command_exits_nonzero_naming_the_failed(tmp_path, monkeypatch, capsys):
  study = _fake_study(tmp_path, monkeypatch)
  monkeypatch.setattr(reproduce, "studies", lambda: ("fake",))
  monkeypatch.setattr(reproduce, "study", lambda name: study)
  assert cli.main(["reproduce", "fake", "--out", str(tmp_path / "r"), "--only", "good"]) == 0
  assert cli.main(["reproduce", "fake", "--out", str(tmp_path / "r")]) == 1
  err = capsys.readouterr().err
  assert "FAILED: fake/bad" in err
  assert (tmp_path / "r" / "fake" / "report" / "report.html").is_file()


def test_studies_are_the_folders():
  assert reproduce.studies() == ("postnorm_collapse", "softmax_sensitivity", "transforming_rank")
  for name in reproduce.studies():
    st = reproduce.study(name)
    assert st.name == name and st.experiments and set(st.aliases.values()) <= set(st.experiments)


def test_studies_import_without_experiments_on_sys_path(tmp_path):
  """The checkout's experiments/ is found next to the rankjax package, not on sys.path
  (a clone run from anywhere): a fresh interpreter that sees only a link to rankjax."""
  import pathlib
  import subprocess
  import sys
  root = pathlib.Path(reproduce.__file__).resolve().parents[1]
  (tmp_path / "pp").mkdir()
  (tmp_path / "pp" / "rankjax").symlink_to(root / "rankjax")
  code = ("import sys; sys.path = [p for p in sys.path if p not in ('', %r)]\n"
          "import importlib.util; assert importlib.util.find_spec('experiments') is None\n"
          "from rankjax import reproduce\n"
          "print(reproduce.study('softmax_sensitivity').name, reproduce._runner().__name__)"
          % str(root))
  out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env={"PYTHONPATH": str(tmp_path / "pp"), "PATH": "/usr/bin"})
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["softmax_sensitivity", "experiments.runner"]
