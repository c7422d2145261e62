"""Several runs of one step shape as one program (``rankjax._src.train.runs``).

The references are single runs (``loop.train``, the code of ``rankjax train``) of the
same configs: a run of the program must follow its single run up to the order of
float32 reductions (``jax.vmap`` batches the matmuls over runs). Stated tolerance:
relative 1e-5 on every logged loss of these 6-update runs (measured: at most 3e-7 on
a 4-layer model over 12 updates; the LR here is high enough that a wrong key, data
order or hyperparameter moves the loss by far more than that). The resume, stop, CLI
and 8-device tests are marked slow (CI's slow stage); the default suite keeps the
parsing and the seeds-and-sweep equivalence.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from rankjax import load_run
from rankjax._src.errors import UserError
from rankjax._src.train import loop as loop_lib
from rankjax._src.train import runs
from tests.train.conftest import ROOT, tiny_lm, tiny_mlp

RTOL = 1e-5


def _lm(**kw):
  return tiny_lm(**{**dict(total_steps=6, checkpoint_every=3, diag_every=3, eval_every=0,
                           log_every=1), **kw})


def losses(workdir) -> np.ndarray:
  rows = [json.loads(line) for line in open(pathlib.Path(workdir) / "metrics.jsonl")]
  return np.array([r["loss"] for r in rows if "loss" in r and r.get("kind") != "eval"])


def test_seeds_sweeps_and_shapes_parse():
  assert runs.parse_seeds("0-3,8") == [0, 1, 2, 3, 8]
  assert runs.parse_seeds("5") == [5]
  for bad in ("", "a", "1,1", "-1", "3-x"):
    with pytest.raises(UserError, match="--seeds"):
      runs.parse_seeds(bad)
  assert runs.parse_sweep(["learning_rate=1e-3,2e-3"]) == {"learning_rate": ["1e-3", "2e-3"]}
  for bad in (["learning_rate"], ["seed=1,2"], ["model.d_model=8,16"],
              ["b1=0.9", "b1=0.8"]):
    with pytest.raises(UserError, match="--sweep"):
      runs.parse_sweep(bad)
  cfg = _lm()
  out = runs.expand(cfg, "/w", [0, 2], {"learning_rate": ["0.001", "0.002"]})
  assert list(out) == ["/w/learning_rate_0.001/seed_0", "/w/learning_rate_0.001/seed_2",
                       "/w/learning_rate_0.002/seed_0", "/w/learning_rate_0.002/seed_2"]
  assert [(c.seed, c.learning_rate) for c in out.values()] == [
      (0, 0.001), (2, 0.001), (0, 0.002), (2, 0.002)]
  assert list(runs.expand(cfg, "/w", [1], {})) == ["/w/seed_1"]
  # one program per step shape: seeds and learning rates group, a depth does not
  deeper = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_layers=2))
  cfgs = {"a": cfg, "b": dataclasses.replace(cfg, seed=3, learning_rate=0.5),
          "c": deeper, "d": dataclasses.replace(cfg, total_steps=7)}
  assert runs.group(cfgs) == [["a", "b"], ["c"], ["d"]]
  with pytest.raises(UserError, match="differ in model"):
    runs.train_runs({"/tmp/x/a": cfg, "/tmp/x/c": deeper})


@pytest.mark.slow   # the default suite's heaviest (6-15 s): CI runs it in the slow stage
def test_seeds_and_a_learning_rate_sweep_follow_their_single_runs(tmp_path):
  """Three runs (two seeds at one LR, one at another) in one program: each follows its
  own single run (init, data order, dropout keys, the LR schedule), each folder is a
  run that ``load_run`` reads, and a group of one is the single run bit for bit."""
  base = _lm()
  cfgs = {str(tmp_path / "g" / "a"): dataclasses.replace(base, seed=0),
          str(tmp_path / "g" / "b"): dataclasses.replace(base, seed=1),
          str(tmp_path / "g" / "c"): dataclasses.replace(base, seed=1, learning_rate=3e-2)}
  results = runs.train_runs(cfgs)
  assert [(r.status, r.step) for r in results.values()] == [("completed", 6)] * 3
  for i, (workdir, cfg) in enumerate(cfgs.items()):
    single = loop_lib.train(cfg, tmp_path / f"single{i}")
    assert single.status == "completed"
    np.testing.assert_allclose(losses(workdir), losses(tmp_path / f"single{i}"), rtol=RTOL)
    run = load_run(workdir)
    assert run.config.seed == cfg.seed and run.step == 6
  # the seeds and the sweep are different runs (not one run written thrice)
  a, b, c = (losses(w) for w in cfgs)
  assert not np.allclose(a, b) and not np.allclose(b[1:], c[1:])
  assert a[0] != b[0] and b[0] == c[0]         # update 1's loss is the init's: seed only
  # a group of one is ``loop.train``: bit for bit
  one = {str(tmp_path / "one"): dataclasses.replace(base, seed=1)}
  runs.train_runs(one)
  np.testing.assert_array_equal(losses(tmp_path / "one"), losses(tmp_path / "single1"))


@pytest.mark.slow
def test_a_stopped_group_resumes_exactly_with_runs_at_different_updates(tmp_path):
  """stop_at 3, then one run's folder removed: that run starts over from update 1 while
  the others are masked until it reaches their update 3, and every run's losses equal
  the uninterrupted program's bit for bit (the same program, the same masks' effect)."""
  base = tiny_mlp(total_steps=6, checkpoint_every=3, max_to_keep=2)
  names = ["s0", "s1", "s2"]
  whole = {str(tmp_path / "whole" / n): dataclasses.replace(base, seed=i)
           for i, n in enumerate(names)}
  runs.train_runs(whole)
  parts = {str(tmp_path / "parts" / n): dataclasses.replace(base, seed=i, stop_at=3)
           for i, n in enumerate(names)}
  assert {r.status for r in runs.train_runs(parts).values()} == {"stopped"}
  import shutil
  shutil.rmtree(tmp_path / "parts" / "s1")
  resumed = runs.train_runs({w: dataclasses.replace(c, stop_at=0) for w, c in parts.items()})
  assert [(r.start_step, r.step, r.status) for r in resumed.values()] == [
      (3, 6, "completed"), (0, 6, "completed"), (3, 6, "completed")]
  for n in names:
    np.testing.assert_array_equal(losses(tmp_path / "parts" / n), losses(tmp_path / "whole" / n))
  # finished runs are skipped; the program then trains nothing
  final = {w: dataclasses.replace(c, stop_at=0) for w, c in parts.items()}
  again = runs.train_runs(final)
  assert {r.status for r in again.values()} == {"already_complete"}
  # a run trained again beside finished ones: they stay in the program (masked), so the
  # run count, hence its floats, are the uninterrupted program's
  shutil.rmtree(tmp_path / "parts" / "s2")
  redo = runs.train_runs(final)
  assert [r.status for r in redo.values()] == ["already_complete"] * 2 + ["completed"]
  np.testing.assert_array_equal(losses(tmp_path / "parts" / "s2"), losses(tmp_path / "whole" / "s2"))


@pytest.mark.slow
def test_a_diverging_run_stops_alone_and_a_collapse_stops_its_run(tmp_path, monkeypatch):
  """A learning rate that turns the loss to NaN fails its own run (its last good
  checkpoint kept) while the other run of the program completes."""
  base = tiny_mlp(total_steps=6, checkpoint_every=2, lr_schedule="constant")
  cfgs = {str(tmp_path / "ok"): base,
          str(tmp_path / "nan"): dataclasses.replace(base, learning_rate=1e30)}
  results = runs.train_runs(cfgs)
  ok, nan = results.values()
  assert (ok.status, ok.step) == ("completed", 6)
  assert nan.status == "failed" and "not finite" in nan.error and nan.step < 6
  bad_step = int(re.search(r"at step (\d+)", nan.error).group(1))
  ckpts = tmp_path / "nan" / "checkpoints"
  saved = [int(p.name) for p in ckpts.iterdir() if p.name.isdigit()] if ckpts.exists() else []
  assert all(s < bad_step for s in saved)      # nothing of the non-finite step is saved
  # stop_on_collapse, every run collapsing at once (threshold below any similarity)
  monkeypatch.setattr(loop_lib, "COLLAPSED_SIM", -2.0)
  lm = _lm(stop_on_collapse=1, diagnostics=("basic",))
  got = runs.train_runs({str(tmp_path / f"c{s}"): dataclasses.replace(lm, seed=s)
                         for s in (0, 1)})
  for workdir, r in got.items():
    assert r.status == "collapsed"
    stopped = json.loads((pathlib.Path(workdir) / "stopped.json").read_text())
    assert stopped["step"] == r.step and load_run(workdir).step == r.step


@pytest.mark.slow
def test_the_cli_trains_seeds_as_one_program(tmp_path):
  cfg = tmp_path / "c.json"
  _lm(total_steps=2, checkpoint_every=2, diag_every=0).to_json(cfg)
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  base = [sys.executable, "-m", "rankjax._src.cli", "train", "--config", str(cfg), "--workdir",
          str(tmp_path / "w")]
  proc = subprocess.run(base + ["--seeds", "0-1"], capture_output=True, text=True, env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "2 runs as one program" in proc.stdout
  assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["seed_0", "seed_1"]
  bad = subprocess.run(base + ["--seeds", "0,0"], capture_output=True, text=True, env=env)
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
  assert "--seeds" in bad.stderr


WORKER = r"""
import jax, json, sys
jax.config.update("jax_num_cpu_devices", 8)
import dataclasses
from rankjax._src.train import runs
from tests.train.conftest import tiny_lm
root = sys.argv[1]
cfg = tiny_lm(total_steps=4, checkpoint_every=4, diag_every=2, eval_every=0, log_every=1,
              batch_size=16, mesh_data=0)
cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout_rate=0.0))
out = {}
for name, n in (("by_run", 8), ("replicated", 3)):
  cfgs = {f"{root}/{name}/s{s}": dataclasses.replace(cfg, seed=s) for s in range(n)}
  runs.train_runs(cfgs)
  prog = runs.build_program(list(cfgs.values()),
                            __import__("rankjax._src.train.loop", fromlist=["x"]).build_for_run(cfg),
                            ())
  out[name] = str(prog.batch_sharding.spec)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_runs_on_8_host_devices_shard_the_run_axis_or_replicate_it(tmp_path):
  """8 runs over 8 CPU devices: the run axis sharded (each device its run); 3 runs: the
  run axis replicated and each run's batch over the devices. Both follow the same runs
  trained on one device (without dropout: a run whose batch is split over ``data`` draws
  its dropout masks per data shard, ``state.accumulate_grads``)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path / "eight")], env=env,
                        capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  specs = json.loads(proc.stdout.strip().splitlines()[-1])
  assert specs["by_run"].startswith("P('data'")
  assert specs["replicated"].startswith("P(None, None")
  cfg = tiny_lm(total_steps=4, checkpoint_every=4, diag_every=2, eval_every=0, log_every=1,
                batch_size=16)
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout_rate=0.0))
  for name, n in (("by_run", 8), ("replicated", 3)):
    one = {str(tmp_path / "one" / name / f"s{s}"): dataclasses.replace(cfg, seed=s)
           for s in range(n)}
    runs.train_runs(one)
    for s in range(n):
      np.testing.assert_allclose(losses(tmp_path / "eight" / name / f"s{s}"),
                                 losses(tmp_path / "one" / name / f"s{s}"), rtol=RTOL)


def test_a_refused_run_of_a_program_writes_nothing(tmp_path):
  """A workdir holding another run refuses the whole program before any file is
  written (the other runs' folders stay absent)."""
  base = _lm()
  loop_lib.train(dataclasses.replace(base, seed=5, total_steps=2, checkpoint_every=2),
                 tmp_path / "b")
  cfgs = {str(tmp_path / "a"): base, str(tmp_path / "b"): dataclasses.replace(base, seed=1)}
  with pytest.raises(UserError):
    runs.train_runs(cfgs)
  assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_sigterm_saves_every_run_and_the_same_command_resumes_exactly(tmp_path):
  """SIGTERM after update 2: every run saves update 2 and reports "preempted"; the same
  call again finishes them with the uninterrupted program's losses, bit for bit."""
  import signal
  base = tiny_mlp(total_steps=5, checkpoint_every=5, max_to_keep=2)
  whole = {str(tmp_path / "whole" / f"s{s}"): dataclasses.replace(base, seed=s)
           for s in range(3)}
  runs.train_runs(whole)
  cut = {str(tmp_path / "cut" / f"s{s}"): dataclasses.replace(base, seed=s) for s in range(3)}
  first = runs.train_runs(cut, on_step=lambda s: s == 2 and os.kill(os.getpid(),
                                                                       signal.SIGTERM))
  assert [(r.status, r.step) for r in first.values()] == [("preempted", 2)] * 3
  again = runs.train_runs(cut)
  assert [(r.status, r.start_step) for r in again.values()] == [("completed", 2)] * 3
  for s in range(3):
    np.testing.assert_array_equal(losses(tmp_path / "cut" / f"s{s}"),
                                  losses(tmp_path / "whole" / f"s{s}"))
