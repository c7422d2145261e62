"""Bad input across the commands, as a new user types it: each case fails with exit 2
(bad input) or 3 (unreadable checkpoints), exactly one line on stderr and no input file
changed or output written (README: "Every command fails with one line on stderr").

``PASSING`` are the cases that held when the set was written; ``FOUND`` are the defects
it found, fixed since (each case names what it was). Everything runs in-process through
``rankjax._src.cli.main`` but the two ``slow`` cases, which need a trained run or the
process's exit.
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from rankjax._src import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
LM_CONFIG = ROOT / "experiments" / "configs" / "lm_tiny_shakespeare.json"
GPT2 = ROOT / "tests" / "fixtures" / "hf" / "gpt2"


def _call(argv) -> int:
  """``cli.main(argv)``'s exit status, argparse's ``SystemExit`` included."""
  try:
    return cli.main([str(a) for a in argv])
  except SystemExit as e:
    return e.code


def _tree(path: pathlib.Path) -> dict[str, str]:
  return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def inputs(tmp_path, monkeypatch):
  """A folder of bad (and good) inputs; the test runs inside it."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "lm.json").write_text(LM_CONFIG.read_text())
  cfg = json.loads(LM_CONFIG.read_text())
  (tmp_path / "malformed.json").write_text('{"model": "lm",\n')
  (tmp_path / "array.json").write_text("[1, 2]\n")
  (tmp_path / "unknownkey.json").write_text(json.dumps({**cfg, "foo": 1}))
  (tmp_path / "format1.json").write_text(json.dumps({"model": "lm", "lm": {"num_layers": 2}}))
  (tmp_path / "afile").write_text("not a directory\n")
  (tmp_path / "emptydir").mkdir()
  (tmp_path / "cfgonly").mkdir()
  (tmp_path / "cfgonly" / "config.json").write_text('{"model": ')
  (tmp_path / "ids_bad.txt").write_text("1 2 three 4\n")
  (tmp_path / "ids_oob.txt").write_text(" ".join(["99999"] * 20) + "\n")
  (tmp_path / "ids20.txt").write_text(" ".join(str(i) for i in range(20)) + "\n")
  (tmp_path / "text.txt").write_text("0123456789 " * 8)     # bytes < gpt2's 61 ids
  (tmp_path / "empty.txt").write_text("")
  (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('plugin exploded')\n")
  (tmp_path / "syntax_plugin.py").write_text("def f(:\n")
  for name in ("gpt2_badcfg", "gpt2_trunc", "gpt2_bloom"):
    d = tmp_path / name
    d.mkdir()
    for f in GPT2.iterdir():
      (d / f.name).write_bytes(f.read_bytes())
  (tmp_path / "gpt2_badcfg" / "config.json").write_text('{"model_type": "gpt2", ')
  weights = (GPT2 / "model.safetensors").read_bytes()
  (tmp_path / "gpt2_trunc" / "model.safetensors").write_bytes(weights[:5000])
  bloom = json.loads((GPT2 / "config.json").read_text())
  (tmp_path / "gpt2_bloom" / "config.json").write_text(json.dumps({**bloom,
                                                                   "model_type": "bloom"}))
  (tmp_path / "s.json").write_text("{}")            # an earlier measure result
  (tmp_path / "damaged_study" / "s1").mkdir(parents=True)      # reproduce output, cut short
  (tmp_path / "damaged_study" / "s1" / "summary.json").write_text('[{"experiment": "x"')
  (tmp_path / "damaged_tour").mkdir()                            # a tour's, cut short
  (tmp_path / "damaged_tour" / "jacobians.json").write_text('{"studies": ')
  (tmp_path / "halfrun").mkdir()                     # a run that saved no checkpoint yet
  (tmp_path / "halfrun" / "config.json").write_text(LM_CONFIG.read_text())
  return tmp_path


def _check_one_line(argv, code, message, tmp_path, capsys, fresh=("w", "out.json", "a")):
  before = _tree(tmp_path)
  assert _call(argv) == code
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert message in err[0]
  assert _tree(tmp_path) == before              # no input changed, no output written
  for name in fresh:
    assert not (tmp_path / name).exists()


TRAIN = ["train", "--config", "lm.json", "--workdir", "w"]
MEASURE = ["measure", "mlp", "--set", "depth=2", "--set", "width=4", "--seeds", "1",
           "--inputs", "1", "--no-paths"]

# (argv, exit status, a part of the one line)
PASSING = [
    (["train", "--config", "missing.json", "--workdir", "w"], 2, "does not exist"),
    (["train", "--config", "malformed.json", "--workdir", "w"], 2, "not valid JSON"),
    (["train", "--config", "array.json", "--workdir", "w"], 2, "expects a JSON object"),
    (["train", "--config", "unknownkey.json", "--workdir", "w"], 2,
     "unknown TrainConfig field(s) ['foo']"),
    (TRAIN + ["--set", "nosuch=1"], 2, "unknown config key 'nosuch'"),
    (TRAIN + ["--set", "model.nosuch=1"], 2,
     "--set model.nosuch: model kind 'transformer' has no field 'nosuch'"),
    (TRAIN + ["--set", "model.kind=cnn"], 2, "model kind 'cnn' is not registered"),
    (TRAIN + ["--set", "model=mlp"], 2, "--set model.kind=mlp switches kind"),
    (["train", "--config", "format1.json", "--workdir", "w"], 2,
     "written by rankjax before config format 2"),
    (["convert-config", "lm.json"], 2, "has config format 3, not 1 or 2: nothing to convert"),
    (TRAIN + ["--set", "model.rope_base=500"], 2,
     "--set model.rope_base: now model.rope.base (since config format 3)"),
    (["convert-config", "nosuch.json"], 2, "nosuch.json does not exist"),
    (TRAIN + ["--set", "total_steps"], 2, "--set expects key=value"),
    (TRAIN + ["--set", "model.num_layers=-2"], 2, "num_layers=-2 must be a positive integer"),
    (TRAIN + ["--set", "total_steps=abc"], 2, "total_steps='abc' must be a positive"),
    (TRAIN + ["--set", "compute_dtype=float17"], 2, "compute_dtype='float17' is not allowed"),
    (TRAIN + ["--set", "model.norm_position=sideways"], 2, "norm_position='sideways'"),
    (TRAIN + ["--set", "model.d_model=63"], 2, "not divisible by num_heads"),
    (TRAIN + ["--set", "diagnostics=nosuchdiag"], 2, "unknown diagnostics ['nosuchdiag']"),
    (TRAIN + ["--set", "total_steps=2"], 2, "warmup_steps=20 exceeds total_steps=2"),
    (["train", "--config", "lm.json", "--set", "total_steps=2", "--set", "warmup_steps=1",
      "--workdir", "afile"], 2, "afile is a file, not a directory"),
    (["train", "--import", "nosuch_module_xyz", "--config", "lm.json", "--workdir", "w"], 2,
     "no module named 'nosuch_module_xyz'"),
    (MEASURE + ["--set", "depth=-1", "--out", "out.json"], 2, "depth=-1 must be a positive"),
    (MEASURE + ["--set", "param_dtype=float17", "--out", "out.json"], 2,
     "param_dtype='float17' is not allowed"),
    (MEASURE + ["--sweep", "depth", "--out", "out.json"], 2, "--sweep expects field=v1,v2"),
    (MEASURE + ["--sweep", "param_dtype=float32,float17", "--out", "out.json"], 2,
     "param_dtype='float17' is not allowed"),
    (MEASURE + ["--sweep", "depth=2,3", "--sweep", "depth=4", "--out", "out.json"], 2,
     "--sweep depth given twice"),
    (MEASURE + ["--seeds", "0", "--out", "out.json"], 2, "must be positive integers"),
    (MEASURE + ["--config", "lm.json", "--out", "out.json"], 2, "unknown MLPConfig field(s)"),
    (MEASURE + ["--out", "afile/x.json"], 2, "afile is a file, not a directory"),
    (MEASURE + ["--out", "s.json"], 2, "add --overwrite"),
    (["report", "nosuch_dir"], 2, "does not exist"),
    (["report", "emptydir"], 2, "holds no rankjax run"),
    (["report", "cfgonly"], 2, "not valid JSON"),
    (["reproduce", "softmax_sensitivity", "--scale", "huge", "--out", "a"], 2,
     "--scale 'huge' is not known"),
    (["reproduce", "softmax_sensitivity", "--scale", "tiny", "--only", "nosuch", "--out",
      "a"], 2, "unknown experiment 'nosuch'"),
    (["reproduce", "softmax_sensitivity", "--scale", "tiny", "--only", "lemma_checks",
      "--out", "afile"], 2, "afile is a file, not a directory"),
    (["reproduce", "softmax_sensitivity", "--scale", "tiny", "--record", "--out", "a"], 2,
     "no --record or --check with it"),
    (["analyze", "nosuch_ckpt", "--dataset", "shakespeare", "--out", "a"], 2, "not found"),
    (["analyze", "emptydir", "--dataset", "shakespeare", "--out", "a"], 2,
     "neither a Hugging Face checkpoint"),
    (["analyze", "gpt2_badcfg", "--token-ids", "ids20.txt", "--out", "a"], 2, "not JSON"),
    (["analyze", "gpt2_trunc", "--token-ids", "ids20.txt", "--tokens", "8", "--out", "a"], 2,
     "not a readable safetensors file"),
    (["analyze", "gpt2_bloom", "--token-ids", "ids20.txt", "--out", "a"], 2,
     "model_type='bloom' is not supported"),
    (["analyze", GPT2, "--step", "3", "--token-ids", "ids20.txt", "--tokens", "8", "--out",
      "a"], 2, "--step reads a rankjax run's checkpoints"),
    (["analyze", GPT2, "--token-ids", "ids_bad.txt", "--tokens", "8", "--out", "a"], 2,
     "not whitespace-separated integers"),
    (["analyze", GPT2, "--token-ids", "ids_oob.txt", "--tokens", "8", "--out", "a"], 2,
     "token ids must lie in"),
    (["analyze", GPT2, "--token-ids", "ids20.txt", "--measures", "nosuch", "--out", "a"], 2,
     "--measures: nosuch"),
    (["analyze", GPT2, "--token-ids", "ids20.txt", "--tokens", "8", "--out", "afile"], 2,
     "afile is a file, not a directory"),
    (["tour", "--smoke", "--workdir", "afile"], 2, "afile is a file, not a directory"),
    # the rest of issue 55's ten: they held
    (TRAIN + ["--set", "total_steps=1e3"], 2, "total_steps=1000.0 must be a positive integer"),
    (TRAIN + ["--set", "model.kind=mlp"], 2, "set model.input_dim and model.num_classes"),
    (["train", "--config", "lm.json", "--workdir", "cfgonly"], 2, "not valid JSON"),
    (MEASURE + ["--sweep", "nosuchfield=1,2", "--out", "out.json"], 2,
     "unknown config key 'nosuchfield' in --sweep"),
]


@pytest.mark.parametrize("argv,code,message", PASSING,
                         ids=[" ".join(map(str, a))[:60] for a, _, _ in PASSING])
def test_bad_input_is_one_line(argv, code, message, inputs, capsys):
  _check_one_line(argv, code, message, inputs, capsys)


FOUND = [
    # A plug-in that raises (or does not parse) when --import loads it: a traceback and
    # exit 1, not one line naming the module and its error.
    pytest.param(["train", "--import", "broken_plugin.py", "--config", "lm.json",
                  "--workdir", "w"], 2, "broken_plugin.py",
                 id="train --import a plug-in that raises"),
    pytest.param(["train", "--import", "syntax_plugin.py", "--config", "lm.json",
                  "--workdir", "w"], 2, "syntax_plugin.py",
                 id="train --import a plug-in with a syntax error"),
    pytest.param(MEASURE + ["--import", "broken_plugin.py", "--out", "out.json"], 2,
                 "broken_plugin.py",
                 id="measure --import a plug-in that raises"),
    # analyze prints "the checkpoint has no tokenizer file; ..." before validating the
    # other arguments: two lines on stderr for one bad input.
    pytest.param(["analyze", GPT2, "--text", "text.txt", "--tokens", "0", "--out", "a"], 2,
                 "--tokens must be >= 2",
                 id="analyze --text --tokens 0"),
    pytest.param(["analyze", GPT2, "--text", "text.txt", "--tokens", "8", "--positions",
                  "999", "--out", "a"], 2, "999 is outside",
                 id="analyze --text --positions 999"),
    pytest.param(["analyze", GPT2, "--text", "empty.txt", "--out", "a"], 2,
                 "the input has 0 token(s)",
                 id="analyze --text empty file"),
    # A --checkpoint that does not exist is not checked up front: the experiment fails
    # (exit 1, "FAILED: transforming_rank/fig12"), its outputs are written, and the cause
    # is only in summary.json's notes.
    pytest.param(["reproduce", "transforming_rank", "--scale", "tiny", "--only", "fig12",
                  "--checkpoint", "nosuch.safetensors", "--out", "a"], 2,
                 "nosuch.safetensors",
                 id="reproduce --checkpoint missing file"),
    # An empty item in a --sweep list is dropped silently (depth=2,,4 measures 2 and 4;
    # depth=2, measures 2), while --sweep depth= alone is refused.
    pytest.param(MEASURE + ["--sweep", "depth=2,,4", "--out", "out.json"], 2, "--sweep",
                 id="measure --sweep with an empty item"),
    # argparse's own errors print the usage (2-10 lines) before the error line; README:
    # "Every command fails with one line on stderr".
    pytest.param(["nosuch"], 2, "invalid choice",
                 id="unknown command"),
    pytest.param(MEASURE + ["--seeds", "many", "--out", "out.json"], 2, "invalid int value",
                 id="measure --seeds many"),
    pytest.param(["analyze", GPT2, "--token-ids", "ids20.txt", "--dtype", "float17",
                  "--out", "a"], 2, "invalid choice",
                 id="analyze --dtype float17"),
    # Fourth pass (issue 55). --steps on a Hugging Face folder said it "holds no
    # checkpoints", not that --steps is for rankjax runs.
    pytest.param(["analyze", GPT2, "--steps", "all", "--token-ids", "ids20.txt", "--out",
                  "a"], 2, "--steps reads the checkpoints of a rankjax run",
                 id="analyze a Hugging Face folder --steps all"),
    # A nested typo listed no known keys (a top-level one did).
    pytest.param(TRAIN + ["--set", "modle.num_layers=4"], 2,
                 "'modle' is not a key; known keys: ['async_checkpointing'",
                 id="train --set modle.num_layers=4"),
    pytest.param(TRAIN + ["--set", "modle.num_layers=4"], 2, "did you mean 'model'?",
                 id="train --set modle.num_layers=4 suggests model"),
    # More of a new user's inputs (issue 55); these seven failed (four more held: see
    # PASSING). A file as the compilation cache: the run trained, the cache silently off.
    pytest.param(TRAIN + ["--set", "compilation_cache_dir=lm.json"], 2,
                 "compilation_cache_dir lm.json is a file, not a directory",
                 id="train --set compilation_cache_dir=a file"),
    # A diagnostic named twice: accepted, computed twice, saved once.
    pytest.param(TRAIN + ["--set", "diagnostics=basic,basic"], 2, "names basic twice",
                 id="train --set diagnostics=basic,basic"),
    # stop_at beyond total_steps: trained to total_steps without a word.
    pytest.param(TRAIN + ["--set", "stop_at=99999"], 2,
                 "stop_at=99999 is beyond total_steps=", id="train --set stop_at=99999"),
    # The attention diagnostic on sequences shorter than its min_query: refused at the
    # first diagnostics step, after the run's files were written (as issue item 2).
    pytest.param(TRAIN + ["--set", "diagnostics=attention", "--set", "seq_len=8"], 2,
                 "no attention rows with t >= 16 in a sequence of length 8",
                 id="train attention diagnostic on 8-token sequences"),
    # A rankjax run that saved no checkpoint yet: "model_type=None is not supported".
    pytest.param(["analyze", "halfrun", "--dataset", "shakespeare", "--out", "a"], 2,
                 "halfrun holds a rankjax run that saved no checkpoint yet",
                 id="analyze a run without checkpoints"),
    # A number as the tokenizer: an AttributeError's traceback.
    pytest.param(TRAIN + ["--set", "tokenizer=3"], 2,
                 "tokenizer=3 must be a non-empty string or null", id="train --set tokenizer=3"),
    # A damaged summary.json of reproduce output, or jacobians.json of a tour: since
    # UserError, a raw JSONDecodeError would read as a bug.
    pytest.param(["report", "damaged_study"], 2,
                 "damaged_study/s1/summary.json is not valid JSON", id="report a damaged summary"),
    pytest.param(["report", "damaged_tour"], 2, "damaged_tour/jacobians.json is not valid JSON",
                 id="report a damaged jacobians.json"),
    # The default --tokens 64 beyond the model's positions named a flag never typed.
    pytest.param(["analyze", GPT2, "--token-ids", "ids20.txt", "--out", "a"], 2,
                 "(--tokens is 64 unless given: give --tokens 16 or fewer)",
                 id="analyze with the default --tokens beyond the positions"),
]


@pytest.mark.parametrize("argv,code,message", FOUND)
def test_bad_input_found_in_the_pass(argv, code, message, inputs, capsys):
  _check_one_line(argv, code, message, inputs, capsys)


def _sys_refuses_writes() -> bool:
  """Whether /sys takes no new folder although ``os.access`` says it is writable (root
  in a container): a write failure that a writability pre-check cannot see."""
  probe = "/sys/rankjax_probe"
  if not (os.path.isdir("/sys") and os.access("/sys", os.W_OK)):
    return False
  try:
    os.mkdir(probe)
  except OSError:
    return True
  os.rmdir(probe)
  return False


UNWRITABLE = [
    MEASURE + ["--out", "/sys/rankjax_x.json"],
    ["analyze", GPT2, "--token-ids", "ids20.txt", "--tokens", "8", "--measures", "stream",
     "--out", "/sys/rankjax_an"],
    ["reproduce", "softmax_sensitivity", "--scale", "tiny", "--only", "lemma_checks",
     "--out", "/sys/rankjax_rep"],
    ["train", "--config", "lm.json", "--set", "total_steps=2", "--set", "warmup_steps=1",
     "--workdir", "/sys/rankjax_run"],
    ["tour", "--smoke", "--workdir", "/sys/rankjax_tour"],
]


@pytest.mark.skipif(not _sys_refuses_writes(),
                    reason="needs a folder that os.access calls writable but refuses writes")
@pytest.mark.parametrize("argv", UNWRITABLE, ids=[a[0] for a in UNWRITABLE])
def test_output_folder_that_refuses_writes_is_one_line(argv, inputs, capsys):
  assert _call(argv) == 2
  assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_tour_refuses_a_train_workdir(inputs, capsys):
  """Refused up front (one line, exit 2, nothing written), not after a full tour."""
  cfg = LM_CONFIG.read_text()
  (inputs / "run").mkdir()
  (inputs / "run" / "config.json").write_text(cfg)
  assert _call(["tour", "--smoke", "--workdir", "run"]) == 2
  assert len(capsys.readouterr().err.strip().splitlines()) == 1
  assert sorted(p.name for p in (inputs / "run").iterdir()) == ["config.json"]


@pytest.mark.slow
def test_all_corrupt_checkpoints_stay_one_line_to_the_process_exit(tmp_path):
  """Exit 3 with exactly one stderr line from the ``rankjax`` executable (the late noise
  comes as the process exits, so this needs subprocesses), ten times each."""
  work = tmp_path / "run"
  sets = ["--set", "total_steps=6", "--set", "checkpoint_every=3", "--set", "diag_every=3",
          "--set", "log_every=1", "--set", "eval_every=3", "--set", "eval_batches=1",
          "--set", "batch_size=4", "--set", "warmup_steps=1"]
  assert cli.main(["train", "--config", str(LM_CONFIG), *sets, "--workdir", str(work)]) == 0
  for f in (work / "checkpoints").rglob("*"):
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(os.urandom(200))
  exe = [sys.executable, "-c", "from rankjax._src.cli import run; run()"]
  commands = [["report", str(work)],
              ["analyze", str(work), "--dataset", "shakespeare", "--out", str(tmp_path / "a")]]
  failures = []
  for _ in range(10):
    for command in commands:
      p = subprocess.run(exe + command, capture_output=True, text=True, timeout=300)
      lines = p.stderr.strip().splitlines()
      if p.returncode != 3 or len(lines) != 1:
        failures.append((command[0], p.returncode, lines[:3]))
  assert not failures, failures


MLP_CONFIG = ROOT / "experiments" / "configs" / "mlp_classifier.json"
MLP_SMALL = ["--set", "model.depth=2", "--set", "model.width=8", "--set", "total_steps=2",
             "--set", "batch_size=8", "--set", "diag_every=1", "--set", "log_every=1",
             "--set", "eval_every=0", "--set", "checkpoint_every=2"]


def test_a_run_refused_for_its_diagnostics_writes_nothing(inputs, capsys):
  """The attention diagnostic on an MLP was refused only when the first diagnostics
  step traced: after config.json, metrics.jsonl, checkpoints/ and tensorboard/ were
  written, so the corrected command was refused as "a different config"."""
  refused = ["train", "--config", MLP_CONFIG, "--workdir", "w", *MLP_SMALL,
             "--set", "diagnostics=basic,attention"]
  _check_one_line(refused, 2, "needs a transformer model", inputs, capsys)
  corrected = ["train", "--config", MLP_CONFIG, "--workdir", "w", *MLP_SMALL,
               "--set", "diagnostics=basic"]
  assert _call(corrected) == 0, capsys.readouterr().err
  assert (inputs / "w" / "config.json").is_file()


def test_a_bug_inside_a_command_shows_its_traceback(inputs, capsys, monkeypatch):
  """A ValueError that is not bad input (a bug planted in ``train``'s config reading)
  was told as one line with exit 2, like a typo; it is a traceback on stderr and in the
  log, and exit 1. Bad input (``UserError``) stays one line: the cases above."""
  import rankjax._src.config

  def planted(*_):
    raise ValueError("planted bug")

  monkeypatch.setattr(rankjax._src.config, "override", planted)
  assert _call(TRAIN) == 1
  err = capsys.readouterr().err
  assert "Traceback (most recent call last)" in err and "in planted" in err
  last = err.strip().splitlines()[-1]
  assert last.startswith("rankjax train: internal error") and "planted bug" in last
  log = last.rsplit("also in ", 1)[1].rstrip(")")
  assert "in planted" in pathlib.Path(log).read_text()
  assert not (inputs / "w").exists()


def test_an_unknown_experiment_lists_the_experiments_with_their_cost(inputs, capsys):
  """``reproduce --only`` with an unknown name listed the names alone; the wall time of
  each experiment's committed results (per scale) helps choose one."""
  from rankjax._src.studies import listing
  committed = ROOT / "experiments" / "softmax_sensitivity" / "results"
  wall = {scale: json.loads((committed / scale / "theorem_check.json").read_text())
          ["provenance"]["wall_s"] for scale in ("paper", "quick")}
  argv = ["reproduce", "softmax_sensitivity", "--scale", "tiny", "--only", "nosuch",
          "--out", "a"]
  cost = ", ".join(f"{s} {listing.duration(w)}" for s, w in wall.items())
  _check_one_line(argv, 2, f"theorem_check ({cost})", inputs, capsys)
