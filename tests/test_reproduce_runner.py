"""The runner convention of ``rankjax reproduce``: rows, summary.json, failures that fail."""

import dataclasses
import json
import sys
import textwrap

import pytest

from rankjax._src.studies import evidence, finder, runner
from rankjax._src import cli, reproduce


PAPER = {"quick": runner.PAPER_SETTING, "paper": runner.PAPER_SETTING}

_CLAIMS = """
from rankjax.studies import Abs, Claim, Qualitative, claims, measured
CLAIMS = claims([Claim("Fig 1: value", "v", 0.5, Abs(0.01)),
                 Claim("Fig 1: look", "v", None, Qualitative("a figure's look"))])
"""


def _fake_study(tmp_path, monkeypatch, needs=None, value=0.5, dataset=None):
  """A study package ``fake`` under ``tmp_path/studies`` in the one form (each module:
  CLAIMS, SCALES, run returning measured values), loaded by ``finder.load``."""
  pkg = tmp_path / "studies" / "fake"
  pkg.mkdir(parents=True, exist_ok=True)
  (pkg / "__init__.py").write_text("")
  good = _CLAIMS + textwrap.dedent(f"""
      import pathlib
      def run(out_dir, scale):
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out_dir) / "ran").write_text(scale)
        v = [{value}, {value} + 0.0002]
        out = {{"settings": {{"seeds": [0, 1]}}, "value": v,
               "measured": [measured("Fig 1: value", v, seeds=[0, 1]),
                            measured("Fig 1: look", v[0])]}}
        return out if {dataset!r} is None else {{**out, "dataset": {dataset!r}}}
  """)
  (pkg / "good.py").write_text(good + 'SCALES = {"quick": {}, "paper": {}, "tiny": {}}\n')
  (pkg / "quick_only.py").write_text(good + 'SCALES = {"quick": {}}\n')
  (pkg / "bad.py").write_text(_CLAIMS + "SCALES = {'quick': {}, 'paper': {}}\n"
                              "def run(out_dir, scale):\n  raise RuntimeError('boom')\n")
  (pkg / "reproduce.py").write_text(textwrap.dedent("""
      from rankjax.studies import PAPER_SETTING, Experiment, Study
      PAPER = {"quick": PAPER_SETTING, "paper": PAPER_SETTING}
      STUDY = Study(
          name="fake", title="Fake: paper vs ours",
          experiments={"good": Experiment("good", folder="g", setting=PAPER),
                       "bad": Experiment("bad", setting=PAPER),
                       "quick_only": Experiment("quick_only", why_missing="CPU only",
                                                setting=PAPER)},
          aliases={"fig1": "good"})
  """))
  monkeypatch.setattr(sys, "path", list(sys.path))      # finder.load's entry goes after
  for name in [m for m in sys.modules if m == "fake" or m.startswith("fake.")]:
    del sys.modules[name]
  study = finder.load(pkg)
  if needs is not None:
    study = dataclasses.replace(study, experiments={
        n: dataclasses.replace(e, needs=needs) for n, e in study.experiments.items()})
  return study


def test_run_study_writes_rows_results_files_and_names_failures(tmp_path, monkeypatch):
  study = _fake_study(tmp_path, monkeypatch)
  res = runner.run_study(study, tmp_path / "out", "paper")
  assert res["failed"] == ["bad"]
  rows = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert all(list(r) == list(runner.FIELDS) for r in rows)
  assert [(r["experiment"], r["status"]) for r in rows] == [
      ("good", "match"), ("good", "qualitative"), ("bad", "failed"), ("quick_only", "missing")]
  assert rows[0]["per_seed"] == [0.5, 0.5002] and rows[0]["scale"] == "paper"
  assert rows[0]["seeds"] == [0, 1] and rows[0]["n"] == 2
  assert rows[1]["note"] == "a figure's look"
  assert "RuntimeError: boom" in rows[2]["note"] and rows[3]["note"] == "CPU only"
  doc = json.loads((tmp_path / "out" / "results" / "paper" / "good.json").read_text())
  assert doc["rows"] == rows[:2] and doc["seeds"] == [0, 1]
  assert doc["data"] == {"value": [0.5, 0.5002]} and doc["settings"] == {"seeds": [0, 1]}
  assert {"commit", "dirty", "jax", "jaxlib", "flax", "backend", "device_kind", "cpu",
          "xla_flags", "wall_s"} <= set(doc["provenance"])
  assert not (tmp_path / "out" / "results" / "paper" / "bad.json").exists()
  md = (tmp_path / "out" / "summary.md").read_text()
  assert md.startswith("# Fake: paper vs ours (paper scale)")
  assert "| good | Fig 1: value |  | experiment |  | v | 0.5 | 0.5001 |" in md
  assert ("Counts by paper item: 3 paper items: at the paper's setting match 1, mismatch 0, "
          "inconclusive 0, open 0; proxy 0 (measured at another setting, counted apart, "
          "never a match); missing 1, failed 1 (from 4 experiment rows") in md
  assert study.resolve("FIG1,good") == ["good"]
  with pytest.raises(ValueError, match="unknown experiment 'fig9'"):
    study.resolve("fig9")


def test_a_measured_value_without_a_declared_claim_is_an_error(tmp_path, monkeypatch):
  """The runner judges only what the module declared before it ran."""
  study = _fake_study(tmp_path, monkeypatch)
  (study.folder / "good.py").write_text(
      (study.folder / "good.py").read_text().replace('measured("Fig 1: look"',
                                                     'measured("Fig 2: made up"'))
  sys.modules.pop("fake.good", None)
  res = runner.run_study(study, tmp_path / "out", "paper", only="good")
  assert res["failed"] == ["good"]
  assert "measured 'Fig 2: made up' is not a declared claim" in res["results"]["good"]["error"]


def test_an_experiment_module_without_claims_is_refused(tmp_path, monkeypatch):
  study = _fake_study(tmp_path, monkeypatch)
  (study.folder / "good.py").write_text("SCALES = {'quick': {}}\ndef run(o, s):\n  return {}\n")
  sys.modules.pop("fake.good", None)
  with pytest.raises(ValueError, match="defines no CLAIMS"):
    runner.run_study(study, tmp_path / "out", "quick", only="good")


def test_record_then_check_fails_when_a_number_moves(tmp_path, monkeypatch, capsys):
  from rankjax._src.studies import expected
  study = _fake_study(tmp_path, monkeypatch)
  (study.folder / "EXPECTED.md").write_text(
      "prose\n<!-- results quick/good fields=item,ours,status -->\n<!-- end results -->\n")
  out, own = str(tmp_path / "r"), ["--studies", str(tmp_path / "studies")]
  assert cli.main(["reproduce", "fake", *own, "--out", out, "--only", "good", "--record"]) == 0
  committed = study.folder / "results" / "quick"            # in the study's own folder
  assert json.loads((committed / "summary.json").read_text())[0]["ours"] == pytest.approx(0.5001)
  assert "| Fig 1: value | 0.5001 | match |" in expected.path_of(study).read_text()
  assert "Rendered from `fake/results/quick/good.json`" in expected.path_of(study).read_text()
  assert cli.main(["reproduce", "fake", *own, "--out", out, "--only", "good", "--check"]) == 0
  _fake_study(tmp_path, monkeypatch, value=0.52)                   # the number moves
  assert cli.main(["reproduce", "fake", *own, "--out", out, "--only", "good", "--check"]) == 1
  err = capsys.readouterr().err
  assert "fake/good / Fig 1: value: status match -> mismatch (ours 0.5001 -> 0.5201)" in err
  # a qualitative row's number is rechecked too (its own tolerance, not a paper band)
  assert "fake/good / Fig 1: look: ours 0.5 -> 0.52, moved more than 0.0001" in err
  # --check with --record records nothing when a number moved
  before = (committed / "good.json").read_text()
  assert cli.main(["reproduce", "fake", *own, "--out", out, "--only", "good", "--check",
                   "--record"]) == 1
  assert (committed / "good.json").read_text() == before
  assert "not recorded fake: --check found" in capsys.readouterr().out


def test_check_refuses_a_rerun_that_read_another_data_set(tmp_path, monkeypatch, capsys):
  out, own = str(tmp_path / "r"), ["--studies", str(tmp_path / "studies")]
  for dataset, flag, code in (("fashion_mnist", "--record", 0), ("fashion_mnist", "--check", 0),
                              ("digits", "--check", 1)):
    study = _fake_study(tmp_path, monkeypatch, dataset=dataset)     # the same numbers
    (study.folder / "EXPECTED.md").write_text("prose\n")
    assert cli.main(["reproduce", "fake", *own, "--out", out, "--only", "good", flag]) == code
  err = capsys.readouterr().err
  assert ("fake/good: committed results read the data set 'fashion_mnist', this rerun read "
          "'digits': not comparable") in err


def test_unprepared_data_stops_before_anything_runs(tmp_path, monkeypatch):
  needs = lambda scale: "cifar10 is not prepared; tfds build cifar10" if scale == "paper" else None
  study = _fake_study(tmp_path, monkeypatch, needs)
  with pytest.raises(runner.NotPrepared, match="fake --scale paper: cifar10 is not prepared"):
    runner.run_study(study, tmp_path / "out", "paper")
  assert not (tmp_path / "out").exists()
  with pytest.raises(ValueError, match="--scale 'huge' is not known"):
    runner.run_study(study, tmp_path / "out", "huge")


def test_reproduce_command_exits_nonzero_naming_the_failed(tmp_path, monkeypatch, capsys):
  _fake_study(tmp_path, monkeypatch)
  own = ["--studies", str(tmp_path / "studies")]
  assert cli.main(["reproduce", "fake", *own, "--out", str(tmp_path / "r"), "--only",
                   "good"]) == 0
  assert cli.main(["reproduce", "fake", *own, "--out", str(tmp_path / "r"), "--only", "good",
                   "--check"]) == 1       # nothing committed to check against
  assert cli.main(["reproduce", "fake", *own, "--out", str(tmp_path / "r")]) == 1
  out, err = capsys.readouterr()
  assert "FAILED: fake/bad" in err
  md = (tmp_path / "r" / "fake" / "summary.md").read_text()
  counts = md.split("Counts by paper item: ")[1].split(". Each")[0]
  assert out.splitlines()[-1] == (f"verdicts fake: {counts} "
                                  f"({tmp_path / 'r' / 'fake' / 'summary.json'})")
  assert counts.startswith("3 paper items: at the paper's setting match 2, mismatch 0, "
                           "inconclusive 0, open 0; proxy 0") and "failed 1" in counts
  assert (tmp_path / "r" / "fake" / "report" / "report.html").is_file()


def test_studies_are_the_folders():
  assert reproduce.studies() == ("postnorm_collapse", "softmax_sensitivity", "transforming_rank")
  for name in reproduce.studies():
    st = reproduce.study(name)
    assert st.name == name and st.experiments and set(st.aliases.values()) <= set(st.experiments)


def test_studies_import_without_experiments_on_sys_path(tmp_path):
  """The checkout's experiments/ is found next to the rankjax package, not on sys.path
  (a clone run from anywhere): a fresh interpreter that sees only rankjax."""
  import pathlib
  import subprocess
  import sys
  root = pathlib.Path(reproduce.__file__).resolve().parents[2]
  code = ("import sys; sys.path = [p for p in sys.path if p not in ('', %r)]\n"
          "import importlib.util; assert importlib.util.find_spec('experiments') is None\n"
          "from rankjax._src import reproduce\n"
          "s = reproduce.study('softmax_sensitivity')\n"
          "print(s.name, s.package, s.folder, sys.modules['experiments'].__file__)"
          % str(root))
  out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin"})
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["softmax_sensitivity", "experiments.softmax_sensitivity",
                                str(root / "experiments" / "softmax_sensitivity"),
                                str(root / "experiments" / "__init__.py")]


def test_paper_scale_refuses_a_cpu_and_a_missing_experiment_fails(tmp_path, monkeypatch,
                                                                   capsys):
  _fake_study(tmp_path, monkeypatch)
  out, own = str(tmp_path / "r"), ["--studies", str(tmp_path / "studies")]
  assert cli.main(["reproduce", "fake", *own, "--out", out, "--scale", "paper"]) == 2
  assert "no accelerator found" in capsys.readouterr().err
  assert not (tmp_path / "r").exists()                      # refused before anything ran
  reproduce.check_accelerator("paper", False, backend="gpu")  # an accelerator: no refusal
  reproduce.check_accelerator("quick", False, backend="cpu")
  # quick_only has no paper path: its row says missing and the command says so, exit 1
  assert cli.main(["reproduce", "fake", *own, "--out", out, "--scale", "paper",
                   "--allow-cpu", "--only", "good,quick_only"]) == 1
  err = capsys.readouterr().err
  assert "NOT RUN at paper scale (no path): fake/quick_only" in err
  rows = json.loads((tmp_path / "r" / "fake" / "summary.json").read_text())
  assert [r["status"] for r in rows] == ["match", "qualitative", "missing"]


@pytest.mark.slow   # fig12 at quick scale: a checkpoint and three GPT-2 initializations
def test_checkpoint_reaches_fig12(tmp_path):
  """``rankjax reproduce transforming_rank --only fig12 --checkpoint`` measures the given
  GPT-2 weights."""
  import json

  from rankjax._src import cli
  from rankjax._src.models import hf
  folder = hf.write_random_gpt2(tmp_path / "gpt2", num_layers=2, d_model=64, num_heads=1,
                                vocab_size=50257, n_positions=64)
  out = tmp_path / "out"
  assert cli.main(["reproduce", "transforming_rank", "--only", "fig12", "--out", str(out),
                   "--checkpoint", str(folder)]) == 0
  result = json.loads((out / "transforming_rank" / "results" / "quick" / "fig12.json")
                      .read_text())
  assert result["settings"]["checkpoints"] == [str(folder)]
  assert "ckpt0/pretrained" in json.dumps(result)


def test_checkpoint_is_refused_where_nothing_takes_it(tmp_path, capsys):
  """A study without an experiment that takes --checkpoint, or --record with it: one
  line, exit 2, before anything runs."""
  from rankjax._src import cli
  (tmp_path / "weights").write_bytes(b"")       # exists: the refusals come after that check
  for argv, message in [(["--only", "fig3"], "no requested experiment takes 'checkpoints'"),
                        (["--only", "fig12", "--record"], "no --record or --check")]:
    assert cli.main(["reproduce", "transforming_rank", *argv, "--out", str(tmp_path / "o"),
                     "--checkpoint", str(tmp_path / "weights")]) == 2
    assert message in capsys.readouterr().err
  assert not (tmp_path / "o" / "transforming_rank").exists()
  assert cli.main(["reproduce", "transforming_rank", "--only", "fig12", "--out",
                   str(tmp_path / "o"), "--checkpoint", str(tmp_path / "nosuch")]) == 2
  assert "--checkpoint" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_rows_away_from_the_papers_setting_are_proxies(tmp_path, monkeypatch):
  """A scale declared as another setting turns its judged rows into proxies (never a
  match), except the scale-free items; an undeclared scale stops before anything runs."""
  study = _fake_study(tmp_path, monkeypatch)
  good = study.experiments["good"]
  proxied = dataclasses.replace(good, setting={"quick": "a toy model (paper: a big one)"},
                                scale_free=frozenset())
  study = dataclasses.replace(study, experiments={"good": proxied})
  res = runner.run_study(study, tmp_path / "out", "quick")
  value = next(r for r in res["rows"] if r["item"] == "Fig 1: value")
  assert value["status"] == "proxy" and value["ours"] == pytest.approx(0.5001)
  assert value["note"].startswith("proxy: a toy model (paper: a big one); ours 0.5001")
  free = dataclasses.replace(proxied, scale_free=frozenset({"Fig 1: value"}))
  res = runner.run_study(dataclasses.replace(study, experiments={"good": free}),
                         tmp_path / "out2", "quick")
  assert next(r for r in res["rows"] if r["item"] == "Fig 1: value")["status"] == "match"
  undeclared = dataclasses.replace(good, setting={})
  with pytest.raises(ValueError, match="does not say whether --scale quick is the paper"):
    runner.run_study(dataclasses.replace(study, experiments={"good": undeclared}),
                     tmp_path / "out3", "quick")


def test_studies_path_errors_are_one_line(tmp_path, capsys):
  (tmp_path / "empty").mkdir()
  for path, message in ((tmp_path / "nosuch", "no such folder"),
                        (tmp_path / "empty", "neither a study")):
    assert cli.main(["reproduce", "fake", "--studies", str(path), "--out",
                     str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
  assert cli.main(["reproduce", "nosuchstudy", "--out", str(tmp_path / "o")]) == 2
  assert "(a study of your own: --studies PATH)" in capsys.readouterr().err
