"""The main job end to end at smoke size, interrupted and continued, and
``rankjax report`` on bad workdirs."""

import base64
import json
import os
import re
import shutil
import signal

import numpy as np
import pytest

from rankjax._src import cli, tour
from rankjax._src.train import loop
from rankjax._src.train.run_reader import load_run

# "diagnostics": the recorded series without a figure of their own (basic/batch_similarity_stream)
FIGURES = ("loss", "token_similarity", "grad_profile", "contraction", "attention", "jacobian",
           "diagnostics")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted smoke tour: (workdir, its stdout)."""
  import contextlib
  import io
  workdir = tmp_path_factory.mktemp("reference") / "tour"
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(["tour", "--smoke", "--workdir", str(workdir)]) == 0
  return workdir, out.getvalue()


def _summary(stdout: str) -> list[str]:
  return stdout[stdout.index("summary:"):stdout.index("numbers:")].splitlines()


@pytest.mark.slow
def test_tour_smoke_writes_report_and_report_rebuilds(reference):
  workdir, out = reference
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
  # tour_summary.json holds the numbers the printed sentences are made of
  doc = json.loads((workdir / tour.SUMMARY).read_text())
  assert doc["smoke"] and doc["provenance"]["jax"] and doc["seed"] == 0
  assert [f"  {s}" for s in tour.summary_paragraphs(doc)] == _summary(out)[1:]


def test_readme_block_renders_the_summary_sentences(tmp_path):
  from rankjax._src import report_story
  runs = {"lm_post": report_story.numbers_to_dict(report_story.RunNumbers(
      name="lm_post", model="transformer", placement="post", layers=3, updates=20, final_loss=3.25,
      steps=np.array([10, 20]), tsim=np.array([[0.5, 0.99, 0.9995], [0.5, 0.9991, 1.0]]),
      freq_loss=3.2499, grad_norm=np.array([1e-6, 1.0, 2.0])))}
  jac = {"studies": {"pre": {"erank": [1.0, 0.47]}, "post": {"erank": [1.0, 0.14]}},
         "configs": {"pre": {"depth": 48, "width": 64}}, "num_seeds": 4}
  doc = {"provenance": {"commit": "0123456789abc", "dirty": False, "device_kind": "cpu",
                        "cpu": "x", "jax": "0.10", "wall_s": 600.0, "date": "d"},
         "smoke": False, "seed": 0, "runs": runs, "jacobians": jac}
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "s.json").write_text(json.dumps(doc))
  text = "intro\n<!-- tour docs/s.json -->\nold numbers\n<!-- end tour -->\nrest\n"
  out = tour.render_readme(text, tmp_path)
  assert "old numbers" not in out and out.startswith("intro\n<!-- tour docs/s.json -->\n> ")
  assert "It collapsed at update 10: from then to the last diagnostics update (20) the " \
         "token similarity of layers 1-2 stayed at or above 0.95" in out
  assert "erank(dh_L/dh_0)/d is 0.470 for Pre-Norm, 0.140 for Post-Norm" in out
  assert "commit 0123456789, cpu (x), jax 0.10, 600.0 s, d." in out
  assert tour.render_readme(out, tmp_path) == out
  assert "(no docs/none.json yet)" in tour.render_readme(
      "<!-- tour docs/none.json -->\n<!-- end tour -->", tmp_path)


@pytest.mark.slow
def test_tour_interrupted_three_times_continues_to_the_same_numbers(reference, tmp_path,
                                                                     monkeypatch, capsys):
  """Ctrl-C in the Post-Norm run, SIGTERM in the Pre-Norm run, SIGTERM in the Jacobian
  phase; each time the same command again. The final losses, every diagnostic, the
  Jacobian study and the printed summary equal the uninterrupted tour's."""
  ref_dir, ref_out = reference
  workdir = tmp_path / "tour"
  argv = ["tour", "--smoke", "--workdir", str(workdir)]
  real_train, real_measure = loop.train, tour.measure_jacobians
  sigterm_handler = signal.getsignal(signal.SIGTERM)

  def train_sending(signum, run_name, at_step):
    def train(cfg, run_dir, **kw):
      def on_step(step):
        if run_dir.name == run_name and step == at_step:
          os.kill(os.getpid(), signum)
      return real_train(cfg, run_dir, on_step=on_step, **kw)
    return train

  monkeypatch.setattr(loop, "train", train_sending(signal.SIGINT, "lm_post", 5))
  assert cli.main(argv) == 130
  assert "stopped at update 5 of lm_post" in capsys.readouterr().err
  assert load_run(workdir / "lm_post").step == 5 and not (workdir / "lm_pre").exists()

  monkeypatch.setattr(loop, "train", train_sending(signal.SIGTERM, "lm_pre", 7))
  assert cli.main(argv) == 130
  assert "stopped at update 7 of lm_pre" in capsys.readouterr().err
  assert load_run(workdir / "lm_post").step == 12 and load_run(workdir / "lm_pre").step == 7

  def measure_interrupted(path, smoke=False):
    os.kill(os.getpid(), signal.SIGTERM)   # the tour's handler raises KeyboardInterrupt
    return real_measure(path, smoke)

  monkeypatch.setattr(loop, "train", real_train)
  monkeypatch.setattr(tour, "measure_jacobians", measure_interrupted)
  assert cli.main(argv) == 130
  assert "interrupted" in capsys.readouterr().err
  assert not (workdir / "jacobians.json").exists() and not (workdir / "report").exists()
  assert signal.getsignal(signal.SIGTERM) is sigterm_handler   # handlers restored

  monkeypatch.setattr(tour, "measure_jacobians", real_measure)
  assert cli.main(argv) == 0
  assert _summary(capsys.readouterr().out) == _summary(ref_out)
  for name in ("lm_post", "lm_pre"):
    run, ref = load_run(workdir / name), load_run(ref_dir / name)
    losses = {r["step"]: r["loss"] for r in run.history if "loss" in r and "kind" not in r}
    ref_losses = {r["step"]: r["loss"] for r in ref.history if "loss" in r and "kind" not in r}
    assert losses == ref_losses and sorted(losses) == list(range(1, 13)), name
    np.testing.assert_array_equal(run.diagnostic_steps, ref.diagnostic_steps)
    assert run.diagnostics.keys() == ref.diagnostics.keys()
    for key, value in ref.diagnostics.items():
      np.testing.assert_array_equal(run.diagnostics[key], value, err_msg=f"{name} {key}")
  assert (json.loads((workdir / "jacobians.json").read_text())
          == json.loads((ref_dir / "jacobians.json").read_text()))


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
  (half / "config.json").write_text('{"format": 2}')
  _one_line_error(capsys, ["report", str(half)], "half-written run")
  assert not (half / "report").exists() or not any((half / "report").iterdir())
