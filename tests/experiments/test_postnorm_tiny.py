"""The Post-Norm collapse study's paper-scale code path at --scale tiny: the paper's runs
(experiments/postnorm_collapse/paper_runs.py) shrunk, trained as rankjax train runs,
analysed from their saved diagnostics; rerun skips them; two processes joined by
jax.distributed train together and process 0 alone analyses."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rankjax._src import reproduce
from rankjax._src.studies import runner, training
from experiments.postnorm_collapse import paper_runs

STUDY = reproduce.study("postnorm_collapse")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_paper_runs_are_the_papers_protocol():
  cfg = paper_runs.config(paper_runs.post_collapse(0), "paper")
  lm = cfg.model
  assert (lm.num_layers, lm.d_model, lm.d_ff, lm.num_heads, lm.norm_position, lm.ffn,
          lm.norm_op, lm.vocab_size) == (48, 512, 1536, 4, "post", "swiglu", "rms", 32000)
  assert (cfg.seq_len, cfg.batch_size, cfg.total_steps, cfg.warmup_steps, cfg.lr_schedule,
          cfg.clip_norm, cfg.weight_decay, cfg.b1, cfg.b2, cfg.dataset) == \
      (2048, 256, 40000, 2000, "cosine", 1.0, 0.1, 0.9, 0.95, "c4/en")
  lrs = {n: paper_runs.config(n, "paper").learning_rate for n in paper_runs.RUNS}
  assert sorted(set(lrs.values())) == [6e-4, 8e-4, 1.2e-3, 1.5e-3, 1.8e-3]
  assert paper_runs.config(paper_runs.pre_same_lr(1), "paper").model.norm_position == "pre"
  assert paper_runs.config(paper_runs.post_collapse(2), "paper").diag_every == 1   # Fig 5
  runs = STUDY.experiments["collapse"].runs("paper")
  assert len(runs) == 9 and {c.seed for c in runs.values()} == {0, 1, 2}
  assert STUDY.experiments["collapse"].runs("quick") == {}
  ablation = STUDY.experiments["fig12"].runs("paper")
  assert sorted(c.learning_rate for c in ablation.values()) == [8e-4, 1.2e-3, 1.5e-3, 1.8e-3]
  assert all(c.warmup_steps == 2000 and c.diag_every == 1 for c in ablation.values())
  assert all("paper" in STUDY.scales_of(n) for n in STUDY.experiments)   # every one
  sec43 = STUDY.experiments["sec43"].runs("paper")
  assert len(sec43) == 9 and all(c.label_frequency for c in sec43.values())  # logged refs


@pytest.mark.slow
def test_tiny_collapse_and_figs_3_5_train_once_and_give_tiny_rows(tmp_path, capsys):
  out = tmp_path / "pn"
  only = ["collapse", "fig3", "fig6", "fig10", "fig12", "thm38", "propd2", "sec43"]
  res = runner.run_study(STUDY, out, "tiny", only)
  assert res["failed"] == [] and res["analysed"]
  rows = res["rows"]
  assert {r["experiment"] for r in rows} == {"collapse", "fig3_fig5", "fig6", "fig10", "fig12",
                                             "thm38", "propd2", "sec43"}
  assert {r["status"] for r in rows} == {"tiny"} and {r["scale"] for r in rows} == {"tiny"}
  seeds = {r["experiment"]: r["seeds"] for r in rows if r["seeds"]}
  assert seeds == {"collapse": [0, 1], "fig3_fig5": [0, 1], "fig6": [0, 1], "fig10": [1],
                   "fig12": [0], "sec43": [0, 1]}   # tiny seeds 0, 1;
  #                       Figs 10-11 the seed after 0; App F.4 one run per rate
  workdirs = sorted((out / "collapse" / "runs").iterdir())
  assert [w.name for w in workdirs] == sorted(
      {n for e in only for n in STUDY.experiments[STUDY.aliases.get(e, e)].runs("tiny")})
  results = json.loads((out / "results" / "tiny" / "collapse.json").read_text())
  assert results["provenance"]["commit"] and results["scale"] == "tiny"
  plan = capsys.readouterr().out
  # 3 roles x 2 seeds, 3 ablation LRs, Fig 6's no-warmup run x 2 seeds
  assert "plan: 11 training runs (11 to train)" in plan
  stamps = {w.name: (w / "metrics.jsonl").stat().st_mtime_ns for w in workdirs}
  again = runner.run_study(STUDY, out, "tiny", only)      # nothing retrained
  assert "plan: 11 training runs (0 to train)" in capsys.readouterr().out
  assert stamps == {w.name: (w / "metrics.jsonl").stat().st_mtime_ns for w in workdirs}
  assert [r["ours"] for r in again["rows"]] == [r["ours"] for r in rows]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_together_and_process_0_alone_analyses(tmp_path):
  """`rankjax reproduce` on both processes of a jax.distributed job (localhost, gloo,
  2 host devices each): the runs are trained once by both (one mesh over the two
  processes' four devices, the parameters and optimizer state sharded over all four:
  ``mesh_fsdp`` 4, the paper step's code path), the summary and report come from
  process 0 only."""
  port, procs = _free_port(), []
  out = tmp_path / "out"
  for i in range(2):
    env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(i), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
               XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    procs.append(subprocess.Popen(
        [sys.executable, "-c", "import sys; from rankjax._src import cli; sys.exit(cli.main())",
         "reproduce", "postnorm_collapse", "--scale", "tiny",
         "--only", "fig3", "--out", str(out)], env=env, cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  deadline, logs = time.time() + 600, []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=max(1, deadline - time.time())))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert [p.returncode for p in procs] == [0, 0], logs
  study = out / "postnorm_collapse"
  rows = json.loads((study / "summary.json").read_text())
  assert rows and {r["status"] for r in rows} == {"tiny"}
  assert "report:" in logs[0][0] and "report:" not in logs[1][0]
  for name in STUDY.experiments["fig3_fig5"].runs("tiny"):
    metrics = (study / "collapse" / "runs" / name / "metrics.jsonl").read_text()
    assert len(metrics.splitlines()) >= training.TINY_STEPS
    saved = json.loads((study / "collapse" / "runs" / name / "config.json").read_text())
    assert saved["mesh_fsdp"] == 4, saved["mesh_fsdp"]
  assert "2 process(es)" in logs[0][0]


@pytest.mark.slow
def test_the_analyses_run_on_partial_runs_and_name_them(tmp_path, monkeypatch):
  """Runs cut short (``--set stop_on_collapse=2`` with the collapse threshold at 0: every
  run stops itself a few updates into its 24, after its second diagnostics step) still
  give every row of Figs 3-5 and the LR ablation (App F.4): the analyses read what was
  saved, and each row's note names the partial runs. (A run to ``stop_at`` is named the
  same way: ``test_training_runs.test_rows_of_partial_runs_are_proxies_named_partial``.)"""
  from rankjax._src.train import loop
  monkeypatch.setattr(loop, "COLLAPSED_SIM", 0.0)
  why = "of 24 (stop_on_collapse)"
  with training.user_sets(["stop_on_collapse=2"]):
    res = runner.run_study(STUDY, tmp_path / "pn", "tiny", ["fig3", "fig12"])
  assert res["failed"] == [], res["rows"]
  rows = res["rows"]
  assert {r["experiment"] for r in rows} == {"fig3_fig5", "fig12"}
  for r in rows:
    assert r["status"] == "tiny" and r["note"].startswith("partial: ") and why in r["note"], r
