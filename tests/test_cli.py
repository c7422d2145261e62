"""The rankjax command: help, version, measure mlp, bad input (one line, exit 2),
earlier results kept unless --overwrite."""

import json
import pathlib
import subprocess
import sys

import pytest

from rankjax._src import cli


def test_help_lists_subcommands(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for command in ("version", "tour", "report", "train", "convert-config", "measure",
                  "reproduce"):
    assert command in out


def test_version(capsys):
  assert cli.main(["version"]) == 0
  assert capsys.readouterr().out.startswith("rankjax 0.1.0 (jax ")


def test_console_script_entry_point():
  proc = subprocess.run([sys.executable, "-m", "rankjax", "version"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "rankjax" in proc.stdout


def test_measure_mlp_writes_json_and_figure(tmp_path):
  out = tmp_path / "r.json"
  assert cli.main(["measure", "mlp", "--set", "depth=4", "--set", "width=8",
                   "--set", "norm_position=post", "--seeds", "2", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert len(result["erank"]) == 4 and len(result["order_log_mass"]) == 5
  assert result["config"]["norm_position"] == "post"
  assert 0 < result["erank"][-1] <= 1
  png = out.with_suffix(".png").read_bytes()
  assert png.startswith(b"\x89PNG") and len(png) > 1000


@pytest.mark.parametrize("argv,message", [
    (["measure", "mlp", "--set", "depth=0", "--out", "x.json"], "depth=0 must be a positive"),
    (["measure", "mlp", "--set", "dept=3", "--out", "x.json"], "unknown config key 'dept'"),
    (["measure", "mlp", "--config", "missing.json", "--out", "x.json"], "does not exist"),
    (["measure", "mlp", "--out", "x.txt"], "must end in .json"),
    (["measure", "mlp", "--sweep", "depth=2,0", "--out", "x.json"],
     "--sweep: depth=0 must be a positive integer"),
    (["measure", "mlp", "--sweep", "dpth=1,2", "--out", "x.json"],
     "unknown config key 'dpth' in --sweep"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and message in err
  assert not (tmp_path / "x.json").exists()


def test_unknown_choice_is_rejected_by_argparse(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["analyze", "--dtype", "float16"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("rankjax analyze: error: argument --dtype: "
                                              "invalid choice")


def test_unknown_study_is_one_line(capsys):
  """Studies are found at run time (--studies adds more), so the name is checked then."""
  assert cli.main(["reproduce", "nonexistent_study"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "study 'nonexistent_study' is not known" in err[0]


@pytest.mark.parametrize("argv,message", [
    (["tour", "--workdir", "F"], "--workdir F is a file, not a directory"),
    (["reproduce", "transforming_rank", "--out", "F"], "--out F is a file, not a directory"),
    (["measure", "mlp", "--out", "F/x.json"], "--out F/x.json: F is a file, not a directory"),
    (["measure", "mlp", "--out", "D/x.json"], "--out D/x.json is a folder, not a file"),
    (["report", "D"], "report folder D/report is a file, not a directory"),
])
def test_output_path_that_is_a_file_is_one_line_before_any_work(argv, message, capsys,
                                                                tmp_path, monkeypatch):
  """Every command checks where it writes (rankjax._src.storage.check_output) first."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "F").write_text("keep me")
  (tmp_path / "D" / "x.json").mkdir(parents=True)
  (tmp_path / "D" / "config.json").write_text("{}")
  (tmp_path / "D" / "report").write_text("keep me")
  before = sorted(p.name for p in tmp_path.rglob("*"))
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.splitlines() == [f"rankjax {argv[0]}: error: {message}"]
  assert sorted(p.name for p in tmp_path.rglob("*")) == before
  assert (tmp_path / "F").read_text() == "keep me"


def test_unwritable_output_folder_is_one_line(capsys, tmp_path, monkeypatch):
  import os
  monkeypatch.chdir(tmp_path)
  (tmp_path / "ro").mkdir()
  real = os.access
  monkeypatch.setattr(os, "access", lambda p, mode: os.fspath(p) != "ro" and real(p, mode))
  assert cli.main(["measure", "mlp", "--out", "ro/new/x.json"]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      "rankjax measure: error: --out ro/new/x.json: ro is not writable"]
  assert not (tmp_path / "ro" / "new").exists()


FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"


@pytest.mark.parametrize("command, existing", [
    (["measure", "mlp", "--set", "depth=2", "--set", "width=8", "--seeds", "2",
      "--inputs", "1", "--no-paths", "--out", "r.json"], ["r.json"]),
    (["measure", "mlp", "--set", "width=8", "--seeds", "2", "--inputs", "1", "--no-paths",
      "--sweep", "depth=2,3", "--out", "s.json"], ["s.png", "s.csv"]),
    (["analyze", str(FIXTURES / "gpt2"), "--token-ids", "ids.txt", "--tokens", "8",
      "--sequences", "1", "--measures", "stream", "--out", "a"], ["a/analysis.json"]),
])
def test_earlier_results_are_refused_unless_overwrite(command, existing, capsys, tmp_path,
                                                      monkeypatch):
  """measure / analyze --out: an output already there is one line and exit 2, nothing
  changed; --overwrite replaces it (rankjax._src.storage.check_new_outputs)."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "ids.txt").write_text(" ".join(str(i) for i in range(3, 20)))
  for name in existing:
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text("earlier")
  before = sorted(str(p) for p in tmp_path.rglob("*"))
  assert cli.main(command) == 2
  more = f" (and {len(existing) - 1} more of its outputs)" if len(existing) > 1 else ""
  assert capsys.readouterr().err.strip().splitlines() == [
      f"rankjax {command[0]}: error: --out {command[-1]}: {existing[0]} exists{more}; "
      "add --overwrite to replace the earlier results"]
  assert sorted(str(p) for p in tmp_path.rglob("*")) == before
  assert all((tmp_path / name).read_text() == "earlier" for name in existing)
  assert cli.main(command + ["--overwrite"]) == 0
  assert all((tmp_path / name).read_bytes() != b"earlier" for name in existing)
