"""The softmax-sensitivity study's training runs at paper and tiny scale.

Paper (Sec 5, App D.1): Pre-LN and Post-LN GPT-2 774M models, seeds 42, 123, 456, 2000
updates, warmup 500, batch 64 of T = 1024 tokens, on FineWeb (``RANKJAX_FINEWEB``);
tiny: the same six runs through ``rankjax._src.studies.training.tiny``.
"""
import json
import os

import pytest

from rankjax._src import config as config_lib
from rankjax._src.studies import runner, training
from rankjax._src.train import run_reader
from experiments.softmax_sensitivity import prepost_training as pt
from rankjax._src import reproduce

STUDY = reproduce.study("softmax_sensitivity")
NAMES = {f"{a}_s{s}" for a in ("pre", "post") for s in (42, 123, 456)}


def test_paper_runs_are_the_papers_protocol_and_tiny_shrinks_them(tmp_path, monkeypatch):
  monkeypatch.setenv(pt.FINEWEB, str(tmp_path))
  monkeypatch.delenv(training.TINY_DATA_DIR, raising=False)
  prepost, bounds = (STUDY.experiments[n] for n in ("prepost_training", "trained_bounds"))
  assert prepost.folder == bounds.folder     # one set of runs, read by both
  runs = prepost.runs("paper")
  assert set(runs) == NAMES and bounds.runs("paper") == runs
  for name, cfg in runs.items():
    arch, seed = name.split("_s")
    assert (cfg.seed, cfg.model.norm_position) == (int(seed), arch)
    assert (cfg.total_steps, cfg.warmup_steps, cfg.batch_size, cfg.seq_len) == (2000, 500, 64, 1024)
    lm = cfg.model
    assert (lm.num_layers, lm.d_model, lm.num_heads, lm.d_ff, lm.vocab_size) == (36, 1280, 20, 5120, 50257)
    assert (lm.attn_dropout_rate, lm.dropout_rate, lm.embed_norm) == (0.1, 0.1, False)
    assert (cfg.learning_rate, cfg.dataset) == (3e-4, str(tmp_path))
    assert cfg.tokenizer.endswith("gpt2.tiktoken") and cfg.diagnostics == ("basic", "attention")
  tiny = prepost.runs("tiny")
  assert tiny == {n: training.tiny(c) for n, c in runs.items()} and bounds.runs("tiny") == tiny
  assert all(c.model.num_layers == 4 and c.total_steps == training.TINY_STEPS
             for c in tiny.values())
  # the quick scales keep training inside ``run`` (their committed numbers unchanged)
  assert prepost.runs("quick") == {} and bounds.runs("quick_sharpen") == {}


@pytest.mark.parametrize("value", [None, "/nonexistent/fineweb"])
def test_paper_scale_refuses_without_fineweb(tmp_path, monkeypatch, value):
  if value is None:
    monkeypatch.delenv(pt.FINEWEB, raising=False)
  else:
    monkeypatch.setenv(pt.FINEWEB, value)
  assert STUDY.experiments["prepost_training"].runs("paper") == {}
  with pytest.raises(runner.NotPrepared) as err:
    runner.preflight(STUDY, STUDY.resolve(None), "paper", tmp_path)
  line = str(err.value)
  assert line.startswith("softmax_sensitivity --scale paper: ") and "\n" not in line
  assert pt.FINEWEB in line and line.count(pt.FINEWEB) == 1   # both experiments: one line
  with pytest.raises(ValueError, match=pt.FINEWEB):     # the script alone refuses too
    pt.run(str(tmp_path), "paper")
  assert not (tmp_path / "runs").exists()


def _metrics(folder):
  """Each run's metrics.jsonl rows (one per update, and the evaluations)."""
  return {n: [json.loads(line) for line in
              (folder / "runs" / n / "metrics.jsonl").read_text().splitlines()] for n in NAMES}


@pytest.mark.slow   # trains six tiny LMs and runs every experiment (~5 min on 2 shared cores)
def test_whole_study_at_tiny_scale(tmp_path, monkeypatch):
  monkeypatch.delenv(training.TINY_DATA_DIR, raising=False)
  res = runner.run_study(STUDY, tmp_path, "tiny")
  assert res["failed"] == []
  by_exp = {}
  for r in res["rows"]:
    by_exp.setdefault(r["experiment"], []).append(r["status"])
  assert set(by_exp) == set(STUDY.experiments)
  assert all(s and set(s) == {"tiny"} for s in by_exp.values()), by_exp
  folder = tmp_path / "prepost_training"
  tiny = pt.runs("tiny")
  assert all(run_reader.finished(training.workdir(folder, n), c) for n, c in tiny.items())
  metrics = _metrics(folder)
  train_rows = {n: [r["step"] for r in rows if r.get("kind", "train") == "train"]
                for n, rows in metrics.items()}
  assert all(s == list(range(1, training.TINY_STEPS + 1)) for s in train_rows.values())
  tb = res["results"]["trained_bounds"]
  assert tb["settings"]["runs"] == str(folder / "runs") and tb["scale"] == "tiny"
  assert res["results"]["prepost_training"]["settings"]["config"] == config_lib.to_dict(
      tiny["pre_s42"])
  # a rerun trains nothing: the same checkpoints, no new metrics rows
  stamps = {n: os.path.getmtime(folder / "runs" / n / "checkpoints") for n in NAMES}
  again = runner.run_study(STUDY, tmp_path, "tiny", only="prepost_training,trained_bounds")
  assert again["failed"] == [] and _metrics(folder) == metrics
  assert {n: os.path.getmtime(folder / "runs" / n / "checkpoints") for n in NAMES} == stamps
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert {r["scale"] for r in summary} == {"tiny"}
