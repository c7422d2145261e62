"""rankjax._src.studies.training (tiny configs) and rankjax._src.train.plan (the plan, the refusals),
and the runner's use of
them (the plan printed and a one-line refusal before anything trains)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from rankjax._src.studies import evidence, finder, runner, training
from rankjax._src.train import mfu as mfu_lib
from rankjax._src.train import plan as plan_lib
from rankjax._src.train import run_reader
from rankjax._src import cli

PAPER_LM = "experiments/configs/postnorm_48l_d512_c4.json"


def test_tiny_shrinks_sizes_and_keeps_every_other_setting():
  cfg = training.load(PAPER_LM, ["learning_rate=8e-4", "diag_every=1"])
  t = training.tiny(cfg)
  m = t.model
  assert (m.num_layers, m.d_model, m.num_heads, t.seq_len, m.max_seq_len) == (4, 32, 2, 32, 32)
  assert t.model.d_ff == 96                             # 1536 / 512 = 3: the ratio kept
  assert (t.total_steps, t.batch_size, t.grad_accum) == (training.TINY_STEPS, 8, 2)
  assert t.warmup_steps == 1                         # 2000 / 40000 of 24 updates, at least 1
  assert (t.tokenizer, t.dataset, t.model.vocab_size) == ("byte", "shakespeare", 257)
  assert t.diag_every == training.TINY_STEPS // 8      # every update asked: at most 8 here
  for field in ("norm_position", "norm_op", "ffn", "init", "pos_embedding", "rope",
                "tie_embeddings", "dropout_rate"):
    assert getattr(t.model, field) == getattr(cfg.model, field), field
  assert t.model.kernels.remat == cfg.model.kernels.remat
  for field in ("learning_rate", "b1", "b2", "weight_decay", "lr_schedule", "clip_norm",
                "compute_dtype", "diagnostics", "seed", "optimizer"):
    assert getattr(t, field) == getattr(cfg, field), field
  gpt2 = training.tiny(training.load("experiments/configs/gpt2_774m.json"))
  assert gpt2.model.d_ff == 128 and gpt2.model.num_layers == 4   # 5120 / 1280 = 4
  assert gpt2.warmup_steps == 6                            # 500 / 2000 of 24
  mlp = training.tiny(training.load("experiments/configs/mlp_classifier.json"))
  assert (mlp.model.depth, mlp.model.width, mlp.dataset) == (4, 32, "digits")
  assert training.at_scale(cfg, "paper") is cfg


def test_tiny_reads_the_papers_set_from_a_data_dir(monkeypatch):
  monkeypatch.setenv(training.TINY_DATA_DIR, "/data/tfds")
  t = training.at_scale(training.load(PAPER_LM), "tiny")
  assert (t.dataset, t.data_dir) == ("c4/en", "/data/tfds")


def _lm_params(cfg) -> int:
  """The decoder's parameter count by hand: untied embedding and head, per layer the four
  attention matrices, SwiGLU's three, two RMSNorm gains; the embedding norm (Post-Norm)."""
  lm = cfg.model
  d, f, v = lm.d_model, lm.d_ff, lm.padded_vocab_size
  return 2 * v * d + lm.num_layers * (4 * d * d + 3 * d * f + 2 * d) + d


def test_plan_counts_the_paper_run_and_its_device_hours(monkeypatch):
  cfg = training.load(PAPER_LM, ["learning_rate=8e-4"])
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("NVIDIA H200", 8, 141e9))
  monkeypatch.setattr(mfu_lib, "measured_mfu", lambda kind: None)
  p = plan_lib.plan({"/x/runs/post": cfg})
  (row,) = p["rows"]
  assert row["tokens"] == 256 * 2048 * 40000 and row["updates"] == 40000
  assert row["parameters"] == _lm_params(cfg)
  tokens = 256 * 2048 * 40000                 # 6 N per token + causal attention at half
  norms = (2 * 48 + 1) * 512                 # gains: no matmul; the embedding is a lookup
  flops = tokens * (6.0 * (_lm_params(cfg) - norms - 32000 * 512) + 6.0 * 48 * 2048 * 512)
  assert row["flops"] == pytest.approx(flops, rel=1e-9)
  # no device check recorded: the estimate for the 48L d512 family on an H200 (the
  # middle of issue 54's 32-44%), labelled so
  estimate = mfu_lib.estimated_mfu(cfg, "NVIDIA H200")
  assert estimate[0] == pytest.approx(0.38) and "estimate for 48L d512" in estimate[1]
  assert (p["mfu"], p["mfu_source"]) == estimate == (row["mfu"], row["mfu_source"])
  assert row["device_hours"] == pytest.approx(flops / (989e12 * 0.38) / 3600, rel=1e-6)
  assert row["checkpoint_gb"] == pytest.approx(12 * row["parameters"] * cfg.max_to_keep / 1e9)
  monkeypatch.setattr(mfu_lib, "measured_mfu", lambda kind: 0.4)
  assert plan_lib.plan({"/x/runs/post": cfg})["device_hours"] == pytest.approx(
      row["device_hours"] * 0.38 / 0.4)
  text = plan_lib.plan_text(p)
  assert "/x/runs/post" in text and "8 x NVIDIA H200" in text


def test_refusals_name_the_missing_tokenizer_and_a_config_too_big(monkeypatch, tmp_path):
  cfg = training.load(PAPER_LM)
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("NVIDIA H200", 1, 141e9))
  lines = plan_lib.refusals({str(tmp_path / "runs" / "a"): cfg})
  assert len(lines) == 1 and "tokenizers/llama2/tokenizer.model" in lines[0]
  ok = training.load(PAPER_LM, ["tokenizer=byte", "model.vocab_size=257", "dataset=shakespeare"])
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("NVIDIA H200", 1, 10e9))
  (line,) = plan_lib.refusals({str(tmp_path / "runs" / "big"): ok})
  assert line.startswith("big: an estimated") and "10.0 GB" in line and "\n" not in line
  # the memory check runs whatever else failed: both refusals named
  both = plan_lib.refusals({str(tmp_path / "runs" / "a"): cfg})
  assert len(both) == 2 and "tokenizer.model" in both[0] and "an estimated" in both[1]
  est = plan_lib.memory_estimate(ok, 1)
  assert 15e9 < est["total"] < 40e9        # configs/README.md estimates ~25 GB on one H200


def test_paper_scale_prints_the_plan_then_refuses_in_one_line(tmp_path, capsys):
  """Without Llama-2's tokenizer file the paper-scale collapse runs stop before anything
  trains: exit 2, one line, the plan printed before it."""
  code = cli.main(["reproduce", "postnorm_collapse", "--scale", "paper", "--allow-cpu",
                   "--only", "fig3", "--out", str(tmp_path / "out")])
  out, err = capsys.readouterr()
  assert code == 2
  assert "plan: 3 training runs (3 to train)" in out and "post_lr8e-4_seed2" in out
  assert "tokenizer file tokenizers/llama2/tokenizer.model does not exist" in err
  assert len(err.strip().splitlines()) == 1
  assert not (tmp_path / "out" / "postnorm_collapse" / "fig3_fig5" / "runs").exists()
  assert not list((tmp_path / "out").rglob("config.json"))


def test_finished_ignores_resumable_fields_and_needs_the_last_checkpoint(tmp_path):
  from rankjax._src import config as config_lib
  cfg = training.tiny(training.load(PAPER_LM))
  path = tmp_path / "run"
  (path / "checkpoints" / str(cfg.total_steps - 1)).mkdir(parents=True)
  config_lib.to_json(cfg, path / "config.json")
  assert not run_reader.finished(str(path), cfg)            # the last step is not saved
  (path / "checkpoints" / str(cfg.total_steps)).mkdir()
  assert run_reader.finished(str(path), cfg)
  import dataclasses
  assert run_reader.finished(str(path), dataclasses.replace(cfg, log_every=1))   # resumable
  assert not run_reader.finished(str(path), dataclasses.replace(cfg, learning_rate=1e-3))


def test_two_experiments_training_one_workdir_differently_is_an_error(tmp_path, monkeypatch):
  cfg = training.tiny(training.load(PAPER_LM))
  other = training.tiny(training.load(PAPER_LM, ["learning_rate=1e-3"]))
  (tmp_path / "fakeruns").mkdir()
  (tmp_path / "fakeruns" / "__init__.py").write_text("")
  (tmp_path / "fakeruns" / "m.py").write_text(
      "CLAIMS = {}\nSCALES = {'tiny': {}}\ndef run(out_dir, scale):\n  return {}\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  study = runner.Study("fake", "Fake", {
      "a": runner.Experiment("m", folder="f", runs=lambda s: {"r": cfg}),
      "b": runner.Experiment("m", folder="f", runs=lambda s: {"r": other})},
      package="fakeruns")
  assert list(runner.training_runs(study, ["a"], "tiny", tmp_path)) == [
      training.workdir(tmp_path / "f", "r")]
  with pytest.raises(ValueError, match="two experiments train"):
    runner.training_runs(study, ["a", "b"], "tiny", tmp_path)


def test_tiny_rows_are_not_judged():
  row = runner._filled("x", {"item": "i", "status": "mismatch"}, "tiny")
  assert row["status"] == "tiny"
  assert runner._filled("x", {"item": "i", "status": "failed"}, "tiny")["status"] == "failed"
  assert json.dumps(row)


def test_the_device_checks_measured_mfu_feeds_the_plan(tmp_path, monkeypatch):
  import importlib
  monkeypatch.syspath_prepend(str(finder.CHECKOUT_STUDIES / "benchmarks"))  # a script
  device_check = importlib.import_module("device_check")
  path = tmp_path / "device_check.json"
  assert mfu_lib.measured_mfu("NVIDIA H200", path) is None
  device_check.write_measured_mfu("NVIDIA H200", [{"mfu_spec": 0.41}, {"mfu_spec": 0.47}], path)
  device_check.write_measured_mfu("TPU v5 lite", [{"mfu_spec": None}], path)   # no peak: none
  assert mfu_lib.measured_mfu("NVIDIA H200", path) == 0.41     # the lower of the two steps
  assert mfu_lib.measured_mfu("TPU v5 lite", path) is None


def test_a_preempted_run_stops_reproduce_with_exit_75(tmp_path, monkeypatch, capsys):
  """SIGTERM during a run (the loop saved and returned "preempted"): nothing after it
  runs (no analysis of an unfinished run), and the command exits 75 as rankjax train."""
  from rankjax._src.train import loop
  from rankjax._src.train import runs as runs_lib
  seen = []

  def preempted(cfg, workdir, **kw):
    seen.append([str(workdir)])
    return loop.TrainResult(workdir=workdir, step=3, status="preempted", metrics={},
                            start_step=0)

  def preempted_program(cfgs, **kw):      # the runs of one shape: one program
    seen.append(list(cfgs))
    return {p: loop.TrainResult(workdir=p, step=3, status="preempted", metrics={},
                                start_step=0) for p in cfgs}
  monkeypatch.setattr(loop, "train", preempted)
  monkeypatch.setattr(runs_lib, "train_runs", preempted_program)
  code = cli.main(["reproduce", "postnorm_collapse", "--scale", "tiny", "--only", "fig3",
                   "--out", str(tmp_path / "out")])
  err = capsys.readouterr().err
  assert code == 75 and len(seen) == 1      # the first program, then nothing else
  assert len(seen[0]) == 2                  # fig3's two seeds at tiny: one program
  assert "saved and stopped" in err and "run the same command again" in err
  assert not (tmp_path / "out" / "postnorm_collapse" / "summary.json").exists()


def test_a_failed_run_fails_the_experiments_that_read_it_only(tmp_path, monkeypatch):
  """A run that raises (here: a NaN loss) is one failed row for each experiment reading
  it; an experiment that does not read it still runs."""
  from rankjax._src import reproduce
  STUDY = reproduce.study("postnorm_collapse")
  monkeypatch.setattr(training, "train_all", lambda runs, cache_dir=None, groups_of=None: {
      p: "training x: NonFiniteLossError: loss is nan at update 3"
      for p in runs if "post_lr0.0012" in p})
  res = runner.run_study(STUDY, tmp_path / "out", "tiny", ["fig7", "fig12"])
  assert res["failed"] == ["fig12"]
  (row,) = [r for r in res["rows"] if r["experiment"] == "fig12"]
  assert row["status"] == "failed" and "NonFiniteLossError: loss is nan" in row["note"]
  assert {r["status"] for r in res["rows"] if r["experiment"] == "fig7"} == {"tiny"}


def test_train_all_records_a_failure_and_goes_on_but_stops_on_preemption(monkeypatch):
  from rankjax._src.train import loop
  done = []

  def train(path, cfg):
    if path == "b":
      raise loop.NonFiniteLossError("loss is nan at update 3\nmore")
    if path == "d":
      raise training.Preempted("d: saved at update 2 and stopped")
    done.append(path)
  from rankjax._src.config import TrainConfig
  monkeypatch.setattr(training, "train", train)
  monkeypatch.setattr(run_reader, "finished", lambda path, cfg: False)
  # runs of different step shapes (total_steps), so each trains alone
  cfg = {p: TrainConfig(total_steps=10 + i, warmup_steps=1) for i, p in enumerate("abcde")}
  assert training.train_all({p: cfg[p] for p in "abc"}) == {
      "b": "training b: NonFiniteLossError: loss is nan at update 3"}
  assert done == ["a", "c"]
  with pytest.raises(training.Preempted):
    training.train_all({p: cfg[p] for p in "de"})
  assert done == ["a", "c"]


def test_train_all_trains_a_group_of_one_shape_as_one_program(monkeypatch):
  """Runs differing only in seed or learning rate are one program, formed over the
  study's every run (``groups_of``): a selected run brings its whole group; a group
  whose selected runs are finished does not train."""
  from rankjax._src.config import TrainConfig
  from rankjax._src.train import runs as runs_lib
  calls = []
  monkeypatch.setattr(training, "train", lambda path, cfg: calls.append([path]))
  monkeypatch.setattr(runs_lib, "train_runs", lambda cfgs: calls.append(list(cfgs)) or {})
  monkeypatch.setattr(run_reader, "finished", lambda path, cfg: path == "z")
  monkeypatch.delenv(runs_lib.ONE_PROGRAM, raising=False)
  base = TrainConfig(total_steps=10, warmup_steps=1)
  every = {"a": base, "b": dataclasses.replace(base, seed=1),
           "c": dataclasses.replace(base, learning_rate=0.1),
           "d": dataclasses.replace(base, total_steps=11),
           "y": dataclasses.replace(base, total_steps=12), "z": dataclasses.replace(base, total_steps=12, seed=2)}
  assert training.train_all({"b": every["b"], "d": every["d"], "z": every["z"]},
                            groups_of=every) == {}
  assert calls == [["a", "b", "c"], ["d"]]
  # RANKJAX_ONE_PROGRAM=0: each selected run alone (the single runs' floats)
  calls.clear()
  monkeypatch.setenv(runs_lib.ONE_PROGRAM, "0")
  training.train_all({"b": every["b"], "d": every["d"]}, groups_of=every)
  assert calls == [["b"], ["d"]]


@pytest.mark.parametrize("flag", ["--record", "--check"])
def test_tiny_results_are_never_recorded_as_evidence(tmp_path, capsys, flag):
  code = cli.main(["reproduce", "postnorm_collapse", "--scale", "tiny", "--only", "fig7",
                   flag, "--out", str(tmp_path / "out")])
  assert code == 2 and "its rows are not evidence" in capsys.readouterr().err
  assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.json"))


GPT2_774M = "experiments/configs/gpt2_774m.json"
DEVICES = {"NVIDIA H200": 141e9, "TPU v5 lite": 16e9, "TPU v4": 32e9}


def test_the_batch_split_is_fitted_to_any_device_count():
  """The global batch is kept; grad_accum falls to the largest value whose micro-batch
  splits over the devices; a batch no grad_accum splits is left for the refusal."""
  cfg = training.load(PAPER_LM)                       # batch 256, grad_accum 16
  assert (cfg.batch_size, cfg.grad_accum) == (256, 16)
  for n, accum in ((1, 16), (8, 16), (16, 16), (32, 8), (64, 4), (256, 1)):
    fitted, note = plan_lib.fit_batch(cfg, n)
    assert fitted.batch_size == 256 and fitted.grad_accum == accum, n
    assert (fitted.batch_size // fitted.grad_accum) % n == 0
    assert (note is None) == (accum == 16) and (note is None or "batch 256 kept" in note)
  assert plan_lib.fit_batch(cfg, 512) == (cfg, None)
  assert plan_lib.fit_batch(cfg, 3) == (cfg, None)


def test_the_plan_prints_how_the_batch_split_was_fitted(monkeypatch):
  """On 32 devices a paper run's grad_accum falls 16 -> 8 (batch 256 kept) and the plan
  row says so; on 8 devices nothing changes and the plan says nothing of it."""
  import jax
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("NVIDIA H200", 32, 141e9))
  monkeypatch.setattr(jax, "device_count", lambda: 32)
  cfg = training.at_scale(training.load(PAPER_LM), "paper")
  assert cfg.grad_accum == 8
  text = plan_lib.plan_text(plan_lib.plan({"/o/runs/a": cfg}))
  assert "grad_accum 16 -> 8: micro-batch 32 over 32 devices (batch 256 kept)" in text
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  cfg = training.at_scale(training.load(PAPER_LM), "paper")
  assert cfg.grad_accum == 16
  assert "grad_accum" not in plan_lib.plan_text(plan_lib.plan({"/o/runs/b": cfg}))


@pytest.mark.parametrize("config, sets", [(PAPER_LM, ()), (GPT2_774M, (
    "model.attn_dropout_rate=0.1", "model.embed_norm=false"))])
def test_both_paper_configs_plan_on_every_device_count(config, sets):
  """Every (device kind, count) gives either no refusal or refusals that each name a fix;
  applying the named fix (mesh_fsdp) removes a memory refusal; a batch smaller than the
  device count is refused naming the largest usable count. Pure arithmetic: no devices."""
  cfg = training.load(config, list(sets))
  for kind, memory in DEVICES.items():
    for n in (1, 8, 16, 32, 64, 256, 512):
      lines = plan_lib.device_refusals(cfg, n, memory, kind, processes=max(1, n // 8))
      for line in lines:
        assert "\n" not in line and ("--set" in line or "run on" in line), (kind, n, line)
      split = [x for x in lines if "splits over no" in x]
      assert bool(split) == (n > cfg.batch_size), (kind, n, lines)
      if split:
        assert f"run on {cfg.batch_size} devices" in split[0]
      mem = [x for x in lines if "an estimated" in x]
      if mem and "--set mesh_fsdp=" in mem[0]:
        fsdp = int(mem[0].split("--set mesh_fsdp=")[1].split()[0])
        sharded = training.load(config, [*sets, f"mesh_fsdp={fsdp}"])
        before = plan_lib.memory_estimate(plan_lib.fit_batch(cfg, n)[0], n)["total"]
        after = plan_lib.memory_estimate(plan_lib.fit_batch(sharded, n)[0], n)["total"]
        assert after < before, (kind, n)
  # the 48-layer run fits one H200; the 774M runs need sharding on a 16 GB v5e
  assert not plan_lib.device_refusals(cfg, 8, 141e9, "NVIDIA H200", processes=1)


def test_reproduce_set_reaches_every_run_and_plan_stops_before_training(tmp_path, capsys,
                                                                      monkeypatch):
  """``--set`` reaches each paper-scale run of the study (in the plan the runs are the
  overridden configs); ``--plan`` prints and stops with exit 0 and nothing trained; a bad
  key is one line, exit 2; --set with --record is refused."""
  tr = plan_lib
  monkeypatch.setattr(tr, "device_memory", lambda: ("NVIDIA H200", 8, 141e9))
  seen = []
  real = tr.plan

  def spy(runs):
    seen.extend(runs.values())
    return real(runs)
  import unittest.mock
  with unittest.mock.patch.object(tr, "plan", spy):
    code = cli.main(["reproduce", "postnorm_collapse", "--scale", "paper", "--only", "fig3",
                     "--plan", "--out", str(tmp_path / "out"), "--set", "tokenizer=byte",
                     "--set", "model.vocab_size=257", "--set", "dataset=shakespeare",
                     "--set", "mesh_fsdp=2"])
  out, err = capsys.readouterr()
  assert code == 0, err
  assert "plan: 3 training runs" in out and seen and len(seen) == 3
  assert all(c.tokenizer == "byte" and c.mesh_fsdp == 2 for c in seen)
  assert not list((tmp_path / "out").rglob("config.json"))
  code = cli.main(["reproduce", "postnorm_collapse", "--scale", "paper", "--only", "fig3",
                   "--plan", "--out", str(tmp_path / "out"), "--set", "no_such_key=1"])
  err = capsys.readouterr().err
  assert code == 2 and "no_such_key" in err and len(err.strip().splitlines()) == 1
  code = cli.main(["reproduce", "postnorm_collapse", "--scale", "quick", "--only", "fig3",
                   "--record", "--out", str(tmp_path / "out"), "--set", "mesh_fsdp=2"])
  err = capsys.readouterr().err
  assert code == 2 and "no --record or --check" in err


def test_paper_scale_on_a_cpu_prints_the_plan_before_refusing(tmp_path, capsys,
                                                              monkeypatch):
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("cpu", 1, 100e9))
  code = cli.main(["reproduce", "postnorm_collapse", "--scale", "paper", "--only", "fig3",
                   "--out", str(tmp_path / "out")])          # and no Llama-2 tokenizer
  out, err = capsys.readouterr()
  assert code == 2 and "plan: 3 training runs" in out and len(err.strip().splitlines()) == 1
  assert "no accelerator found" in err and "tokenizer.model does not exist" in err
  code = cli.main(["reproduce", "postnorm_collapse", "--scale", "paper", "--only", "fig3",
                   "--out", str(tmp_path / "out"), "--set", "tokenizer=byte",
                   "--set", "model.vocab_size=257", "--set", "dataset=shakespeare"])
  out, err = capsys.readouterr()
  assert code == 2 and "plan: 3 training runs" in out
  assert "no accelerator found" in err and len(err.strip().splitlines()) == 1


def test_rows_of_partial_runs_are_proxies_named_partial(tmp_path):
  """An experiment whose runs stop early (stop_at) is judged as a proxy at any scale, its
  note naming the runs and the update they reached; a run with its whole schedule is
  not partial; the plan counts the updates to stop_at."""
  import dataclasses
  cfg = training.load(PAPER_LM)
  part = dataclasses.replace(cfg, stop_at=4000)
  assert runner.partial_setting({"/o/runs/a": cfg}) is None
  setting = runner.partial_setting({"/o/runs/a": part, "/o/runs/b": cfg})
  assert setting == "partial: a trained to update 4000 of 40000"
  exp = runner.Experiment("m", setting={"paper": runner.PAPER_SETTING})
  row = evidence.Claim("x", "q", 1.0, evidence.Abs(0.1)).judge(1.0)
  assert runner._complete("m", row, "paper", exp)["status"] == "match"
  done = runner._complete("m", row, "paper", exp, setting)
  assert done["status"] == "proxy" and done["note"].startswith("proxy: partial: a trained")
  assert evidence.recheck(done) == "proxy"
  (r,) = plan_lib.plan({str(tmp_path / "runs" / "a"): part})["rows"]
  assert r["updates"] == 4000 and r["tokens"] == 256 * 2048 * 4000
  # a run that stopped itself on collapse is partial too, and finished for the runner
  from rankjax._src.train import checkpoint
  watched = dataclasses.replace(cfg, stop_on_collapse=500, diag_every=1)
  (tmp_path / "runs" / "c").mkdir(parents=True)
  assert runner.partial_setting({str(tmp_path / "runs" / "c"): watched}) is None
  checkpoint.write_stopped(tmp_path / "runs" / "c", 3100, "collapsed: ...")
  assert runner.partial_setting({str(tmp_path / "runs" / "c"): watched}) == (
      "partial: c stopped itself at update 3100 of 40000 (stop_on_collapse)")
  from rankjax._src import config as config_lib
  config_lib.to_json(watched, tmp_path / "runs" / "c" / "config.json")
  assert run_reader.finished(str(tmp_path / "runs" / "c"), watched)


def test_user_setting_reads_the_last_set_and_counts_as_applied(tmp_path):
  """A study's own data check reads --set data_dir (training.user_setting): outside
  user_sets nothing; inside, the last assignment, and reading it counts as applied."""
  assert training.user_setting("data_dir") is None
  with training.user_sets(["seed=3", "data_dir=/a", "data_dir = /data/tfds"]):
    assert training.sets_applied() == 0
    assert training.user_setting("tokenizer") is None and training.sets_applied() == 0
    assert training.user_setting("data_dir") == "/data/tfds"
    assert training.sets_applied() == 1
  assert training.missing_directory(str(tmp_path), "data_dir") is None
  assert training.missing_directory(str(tmp_path / "x"), "data_dir") == \
      f"data_dir={tmp_path / 'x'} is not a directory"


def _plan_lines(capsys, *args) -> tuple[int, str]:
  code = cli.main(["reproduce", *args, "--scale", "paper", "--plan"])
  out, err = capsys.readouterr()
  assert code == 0, err               # a plan printed: exit 0, whatever it refuses
  return code, out


def test_plan_for_a_target_uses_its_devices_memory_and_peak(tmp_path, capsys, monkeypatch):
  """--plan --target h200:8 and v5e:64 from this CPU: grad_accum fitted to the target's
  count, the memory per device and the remat choice against the target's memory,
  device-hours at the target's peak and the family's MFU on that kind (the same FLOPs),
  the wall hours on N; the missing tokenizer listed in the plan, exit 0. The memory by
  the estimate (RANKJAX_PLAN_MEMORY=estimate: no compile here; the compiled plan is
  tests/train/test_plan_memory.py's)."""
  monkeypatch.setattr(mfu_lib, "measured_mfu", lambda kind: None)
  monkeypatch.setenv(plan_lib.PLAN_MEMORY_ENV, "estimate")
  plans = {}
  for target in ("h200:8", "v5e:64"):
    _, out = _plan_lines(capsys, "postnorm_collapse", "--only", "fig3", "--target", target,
                         "--out", str(tmp_path / "out"))
    rows = [line.split() for line in out.splitlines() if "/runs/post_lr8e-4_seed0" in line]
    total = next(line for line in out.splitlines() if line.startswith("  total:"))
    plans[target] = (float(rows[0][-2]), float(total.split()[1]), out)
    assert "tokenizer.model does not exist" in out.split("refusals (1;")[1]
  (gb_h, hours_h, out_h), (gb_v, hours_v, out_v) = plans["h200:8"], plans["v5e:64"]
  assert "for 8 x h200 (NVIDIA H200: 141 GB each, 989 TFLOP/s bf16" in out_h
  assert "for 64 x v5e (TPU v5 lite: 16 GB each, 197 TFLOP/s bf16" in out_v
  assert "85% of 141.0 GB" in out_h and "85% of 16.0 GB" in out_v     # never this host's
  assert "mesh data 8 x fsdp 1" in out_h and "mesh data 64 x fsdp 1" in out_v
  assert "grad_accum" not in out_h and "grad_accum 16 -> 4" in out_v
  assert gb_v < gb_h                             # micro-batch 64 over 64 vs 16 over 8
  assert "MFU 0.38: estimate for 48L d512: the middle" in out_h
  assert "MFU 0.32: estimate for 48L d512 on v5e: the low end" in out_v
  assert hours_v / hours_h == pytest.approx(989 * 0.38 / (197 * 0.32), rel=1e-2)
  for out in (out_h, out_v):
    assert "runs: estimated (rankjax._src.train.memory: RANKJAX_PLAN_MEMORY=estimate)" in out
  wall = float(out_h.split(" hours on 8 devices)")[0].rsplit("(", 1)[1])
  assert wall == pytest.approx(hours_h / 8, rel=2e-3)          # both printed to 3 digits
  assert list((tmp_path / "out").rglob("config.json")) == []


def test_a_missing_data_set_is_a_refusal_inside_the_plan(tmp_path, capsys, monkeypatch):
  """The softmax study without RANKJAX_FINEWEB: the plan says it has no runs to plan and
  lists the refusal with its fix, exit 0; against a target too small for a run, the
  refusal names the target's memory, never this host's (by the estimate here)."""
  monkeypatch.delenv("RANKJAX_FINEWEB", raising=False)
  monkeypatch.setenv(plan_lib.PLAN_MEMORY_ENV, "estimate")
  _, out = _plan_lines(capsys, "softmax_sensitivity", "--target", "h200:8",
                       "--out", str(tmp_path / "out"))
  assert "has no rankjax train runs to plan" in out
  assert "- the paper's FineWeb is not given: set RANKJAX_FINEWEB=" in out
  from rankjax._src.train import mfu
  cfg = training.load(GPT2_774M, ["tokenizer=byte", "dataset=shakespeare"])  # 774M
  with plan_lib.planning_for(mfu.parse_target("v5e:1")):
    assert plan_lib.device_memory() == ("TPU v5 lite", 1, 16e9)
    (line,) = plan_lib.refusals({str(tmp_path / "runs" / "a"): cfg})
  assert "16.0 GB of a TPU v5 lite (1 devices)" in line
  assert plan_lib.device_memory()[0] != "TPU v5 lite"          # the context is left


def test_a_bad_target_is_one_line(tmp_path, capsys):
  for args in (["--plan", "--target", "h300:8"], ["--plan", "--target", "h200:0"],
               ["--target", "h200:8"]):
    code = cli.main(["reproduce", "postnorm_collapse", "--scale", "paper", "--only", "fig3",
                     "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, (args, err)
    assert ("KIND:N" in err) if "--plan" in args else ("add --plan" in err)


def test_a_plan_without_a_spec_peak_says_why_it_has_no_device_hours(monkeypatch):
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("cpu", 1, 100e9))
  text = plan_lib.plan_text(plan_lib.plan({"/o/runs/a": training.load(PAPER_LM)}))
  assert "device-hours '-': cpu has no spec peak" in text and "--target KIND:N" in text
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("NVIDIA H200", 1, 141e9))
  assert "no spec peak" not in plan_lib.plan_text(
      plan_lib.plan({"/o/runs/a": training.load(PAPER_LM)}))


def test_a_program_holds_the_runs_that_fit_the_device_memory(monkeypatch):
  """On an accelerator a group is cut into programs of as many runs as fit a device at
  one run's planned peak; a CPU (no device limit) holds the whole group."""
  from rankjax._src.config import TrainConfig
  from rankjax._src.train import memory
  cfg = TrainConfig(total_steps=10, warmup_steps=1)
  monkeypatch.setattr(memory, "device_limit", lambda: None)
  assert plan_lib.program_size(cfg) >= 1 << 20
  monkeypatch.setattr(memory, "device_limit", lambda: 100e9)
  monkeypatch.setattr(plan_lib, "memory_estimate", lambda c, n: {"total": 30e9})
  assert plan_lib.program_size(cfg) == 3            # 0.9 x 100 GB // 30 GB
  monkeypatch.setattr(plan_lib, "memory_estimate", lambda c, n: {"total": 95e9})
  assert plan_lib.program_size(cfg) == 1            # a paper-scale run fills it alone
  assert plan_lib.fitting(list("abcdefg"), 3) == [list("abc"), list("def"), ["g"]]
