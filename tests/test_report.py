"""The report of ``rankjax reproduce`` output: paper-vs-measured tables and figures."""

import base64
import json
import pathlib
import re

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from rankjax._src import cli, plotting, reproduce  # noqa: E402
from rankjax._src.report import rows_to_html  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]

ROWS = [
    {"experiment": "fig1", "item": "erank at L=48 <ok>", "quantity": "erank/d", "paper": 0.41,
     "ours": 0.3912345, "sd": 0.01, "n": 3, "seeds": [0, 1, 2], "per_seed": [0.38, 0.39, 0.4],
     "interval": [0.3652, 0.4148], "band": 0.05, "rule": "abs 0.05", "status": "match",
     "scale": "quick",
     "note": ""},
    {"experiment": "fig2", "item": "slope", "quantity": "slope", "paper": 0.5, "ours": 0.2,
     "sd": None, "n": 1, "seeds": None, "per_seed": None, "interval": None,
     "band": 0.025, "rule": "rel 0.05", "status": "mismatch", "scale": "quick", "note": "a|b"},
]


def _png(path):
  path.parent.mkdir(parents=True, exist_ok=True)
  fig, ax = plt.subplots()
  ax.plot([0, 1], [1, 0])
  fig.savefig(path)
  plt.close(fig)


def test_rows_render_as_one_escaped_table_with_status_counts():
  page = rows_to_html(ROWS)
  assert page.count("<table>") == 1 and page.count("<tr") == 3
  assert ("<th>experiment</th><th>item</th><th>where</th><th>kind</th><th>quantity</th>"
          "<th>paper</th><th>ours</th><th>sd</th><th>n</th><th>interval</th><th>band</th>"
          "<th>limit</th><th>rule</th><th>status</th>") in page
  assert "paper items: at the paper&#x27;s setting" in page
  assert "<td>0.3652, 0.4148</td>" in page
  assert "<td>erank at L=48 &lt;ok&gt;</td>" in page and "<td>a|b</td>" in page
  assert "<td>0.3912</td>" in page                  # floats to 4 significant digits
  assert "status: match 1, mismatch 1" in page


def test_report_of_reproduce_output_embeds_tables_and_every_figure(tmp_path, capsys):
  for study in ("study_a", "study_b"):
    (tmp_path / study).mkdir()
    (tmp_path / study / "summary.json").write_text(json.dumps(ROWS))
    _png(tmp_path / study / "fig1.png")
    _png(tmp_path / study / "fig3" / "orders.png")
  assert cli.main(["report", str(tmp_path)]) == 0
  page = (tmp_path / "report" / "report.html").read_text()
  assert page.count("<table>") == 2 and "<h2>study_b (quick scale)</h2>" in page
  for alt in ("fig1.png", "fig3/orders.png"):
    assert page.count(f"alt='{alt}'") == 2
  embedded = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
  assert len(embedded) == 4
  assert all(base64.b64decode(e).startswith(b"\x89PNG") for e in embedded)
  # one study folder alone; the first report's own folder is not re-embedded
  assert cli.main(["report", str(tmp_path / "study_a")]) == 0
  single = (tmp_path / "study_a" / "report" / "report.html").read_text()
  assert single.count("<table>") == 1 and single.count("<figure>") == 2
  assert cli.main(["report", str(tmp_path / "study_a")]) == 0
  assert (tmp_path / "study_a" / "report" / "report.html").read_text().count("<figure>") == 2


def test_study_figures_are_captioned_by_what_they_show_not_by_file_name(tmp_path):
  """plotting.save_figure keeps the figure's titles and axis labels in the PNG; the
  report captions the figure with them, and opens with each study's statuses."""
  (tmp_path / "study_a").mkdir()
  (tmp_path / "study_a" / "summary.json").write_text(json.dumps(ROWS))
  fig, axes = plt.subplots(1, 2)
  fig.suptitle("Fig 4: placement")
  axes[0].plot([1, 2], [0.5, 0.4])
  axes[0].set(title="effective rank", xlabel="depth l", ylabel="erank / d")
  axes[1].plot([0, 1], [1, 0])
  axes[1].set(xlabel="path order k")
  plotting.save_figure(fig, tmp_path / "study_a" / "fig4.png")
  plt.close(fig)
  assert plotting.png_description(tmp_path / "study_a" / "fig4.png") == (
      "Fig 4: placement; effective rank: erank / d against depth l; path order k")
  assert cli.main(["report", str(tmp_path)]) == 0
  page = (tmp_path / "report" / "report.html").read_text()
  assert ("<figcaption>study_a: Fig 4: placement; effective rank: erank / d against depth l; "
          "path order k</figcaption>") in page
  assert "study_a (quick scale): 2 paper items, 1 match, 1 mismatch; mismatch: fig2." in page


def test_near_constant_series_are_drawn_without_offset_axes(tmp_path):
  """A series constant to 1e-9 was labelled "1e-9+4.23603e-2" (matplotlib's offset);
  every figure rankjax saves (save_figure, the run report's, TensorBoard's images)
  labels the values themselves, on both axes, and leaves a log axis alone."""
  from rankjax._src.train import tensorboard
  fig, axes = plt.subplots(1, 2)
  axes[0].plot([1000, 1000.001], [0.0423603, 0.0423603 + 1e-9])
  axes[1].plot([1, 2], [1e-3, 1e3])
  axes[1].set_yscale("log")
  plotting.save_figure(fig, tmp_path / "flat.png")
  fig.canvas.draw()
  y, x = axes[0].yaxis.get_major_formatter(), axes[0].xaxis.get_major_formatter()
  assert y.get_offset() == "" and x.get_offset() == ""
  assert all(t.get_text() for t in axes[0].get_yticklabels())
  plt.close(fig)
  drawn = {}
  real = tensorboard.plotting.plain_ticks

  def spy(fig):
    real(fig)
    fig.canvas.draw()
    drawn["offsets"] = [ax.yaxis.get_major_formatter().get_offset() for ax in fig.axes]

  import unittest.mock
  with unittest.mock.patch.object(tensorboard.plotting, "plain_ticks", spy):
    image = tensorboard.render_profiles(
        "flat", [("x", np.arange(3), 0.0423603 + np.array([0, 1e-9, 0]))])
  assert drawn["offsets"] == [""] and image.ndim == 3


def test_every_study_script_saves_its_figures_with_their_description():
  """The report's captions come from save_figure; a bare savefig would leave a figure
  captioned by its file name."""
  studies = [p.parent for p in sorted((ROOT / "experiments").glob("*/reproduce.py"))]
  assert len(studies) >= 3
  bare = [str(p.relative_to(ROOT)) for study in studies for p in sorted(study.glob("*.py"))
          if ".savefig(" in p.read_text()]
  assert bare == []


@pytest.mark.slow
def test_reproduce_writes_summary_and_report(tmp_path, capsys):
  reproduce.run("transforming_rank", tmp_path, only=["table1"])
  out = tmp_path / "transforming_rank"
  summary = (out / "summary.md").read_text()
  assert "| table1 |" in summary
  rows = json.loads((out / "summary.json").read_text())
  assert {r["experiment"] for r in rows} == {"table1"}
  # the measured stable ranks carry their 10 seeds; the quadrature constants none
  assert all(r["seeds"] in (None, list(range(10))) for r in rows)
  assert any(r["seeds"] == list(range(10)) for r in rows)
  page = (out / "report" / "report.html").read_text()
  assert "<td>table1</td>" in page and "alt='table1_coherence.png'" in page
  assert f"report: {out / 'report' / 'report.html'}" in capsys.readouterr().out


def test_reproduce_all_only_goes_to_the_studies_that_have_the_name():
  plan = reproduce._split_all(["fig3", "theorem_check,Table1", "certificates_large_l"])
  assert plan == {"postnorm_collapse": ["fig3"], "softmax_sensitivity": ["theorem_check", "certificates_large_L"],
                  "transforming_rank": ["fig3", "table1"]}
  with pytest.raises(ValueError, match=r"--only \['fig99'\]: no study has such an experiment"):
    reproduce._split_all(["fig3", "fig99"])
