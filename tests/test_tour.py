"""The main job end to end at smoke size, and ``rankjax report`` on bad workdirs."""

import base64
import re
import shutil

import pytest

from rankjax import cli

FIGURES = ("loss", "token_similarity", "grad_profile", "contraction", "attention", "jacobian")


@pytest.mark.slow
def test_tour_smoke_writes_report_and_report_rebuilds(tmp_path, capsys):
  workdir = tmp_path / "tour"
  assert cli.main(["tour", "--smoke", "--workdir", str(workdir)]) == 0
  out = capsys.readouterr().out
  assert "summary:" in out and "report:" in out
  page = (workdir / "report" / "report.html").read_text()
  for name in FIGURES:
    png = (workdir / "report" / f"{name}.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000, name
    assert f"alt='{name}.png'" in page, name
  embedded = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
  assert len(embedded) == len(FIGURES)
  assert all(base64.b64decode(e).startswith(b"\x89PNG") for e in embedded)
  assert "http" not in page  # self-contained: nothing fetched to view it

  # the report is rebuilt from what is saved, never touching the checkpoints
  ckpts = sorted(p.name for p in (workdir / "lm_post" / "checkpoints").iterdir())
  shutil.rmtree(workdir / "report")
  assert cli.main(["report", str(workdir)]) == 0
  assert (workdir / "report" / "report.html").is_file()
  assert sorted(p.name for p in (workdir / "lm_post" / "checkpoints").iterdir()) == ckpts
  # and for a single run
  assert cli.main(["report", str(workdir / "lm_pre")]) == 0
  assert (workdir / "lm_pre" / "report" / "loss.png").is_file()


def _one_line_error(capsys, argv, message):
  assert cli.main(argv) != 0
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and message in err, err


def test_report_on_missing_empty_and_half_written_workdirs(tmp_path, capsys):
  _one_line_error(capsys, ["report", str(tmp_path / "nope")], "does not exist")
  (tmp_path / "empty").mkdir()
  _one_line_error(capsys, ["report", str(tmp_path / "empty")], "holds no rankjax run")
  half = tmp_path / "half"
  half.mkdir()
  (half / "config.json").write_text('{"model": "lm"}')
  _one_line_error(capsys, ["report", str(half)], "half-written run")
  assert not (half / "report").exists() or not any((half / "report").iterdir())
