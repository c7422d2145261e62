"""MetricsWriter: metrics.jsonl, console lines or a progress bar, TensorBoard."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from rankjax._src.train.logging import MetricsWriter
from rankjax._src.train.run_reader import read_metrics_jsonl


class _Tty(io.StringIO):
  def isatty(self):
    return True


def test_jsonl_every_step_console_every_n_and_truncate(tmp_path):
  out = io.StringIO()
  w = MetricsWriter(tmp_path, total_steps=6, log_every=3, stream=out)
  for step in range(1, 7):
    w.write(step, {"loss": 2.0 / step, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s_avg": 100.0})
  w.write(6, {"eval_loss": 0.5}, kind="eval")
  w.write(7, {"loss": float("nan"), "grad_norm": float("inf")})
  w.close()
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("step 3  loss 0.6667  grad_norm 1  lr 0.001  tokens/s 100")
  assert lines[1].startswith("step 6  loss") and lines[2] == "step 6 eval: eval_loss 0.5"
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 6, 7]
  assert rows[6] == {"step": 6, "eval_loss": 0.5, "kind": "eval"}
  assert rows[7]["loss"] != rows[7]["loss"] and rows[7]["grad_norm"] == float("inf")  # NaN, Inf
  MetricsWriter.truncate(tmp_path, 4)           # a run resumed from step 4
  assert [r["step"] for r in read_metrics_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 5, "lo')                  # a line cut short by SIGKILL is skipped
  assert len(read_metrics_jsonl(tmp_path / "metrics.jsonl")) == 4


def test_progress_bar_on_a_terminal(tmp_path):
  out = _Tty()
  w = MetricsWriter(tmp_path, total_steps=4, log_every=2, stream=out)
  for step in range(1, 5):
    w.write(step, {"loss": 1.0, "tokens_per_s_avg": 10.0})
  w.close()
  text = out.getvalue()
  assert "4/4" in text and "loss=1.0000" in text and "step 2  loss" not in text


def test_tensorboard_events_when_installed(tmp_path):
  pytest.importorskip("tensorboardX")
  w = MetricsWriter(tmp_path, total_steps=2, log_every=1, stream=io.StringIO())
  w.write(1, {"loss": 1.0})
  w.close()
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_without_tensorboardx_the_run_says_tensorboard_is_off(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)      # import raises ImportError
  out = io.StringIO()
  w = MetricsWriter(tmp_path, total_steps=2, log_every=1, stream=out, progress_bar=False)
  w.close()
  assert out.getvalue().splitlines() == [
      'TensorBoard off: tensorboardX is not installed (pip install "rankjax[logging]"); '
      "metrics.jsonl has every metric"]


def test_logging_extra_installs_what_the_readme_recipe_runs():
  """docs/training.md: pip install "rankjax[logging]", then the tensorboard command."""
  import pathlib
  import re
  import tomllib
  root = pathlib.Path(__file__).resolve().parents[2]
  extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
      "optional-dependencies"]["logging"]
  assert {re.split(r"[<>=\[ ]", r)[0] for r in extra} == {"tensorboardX", "tensorboard"}
  page = (root / "docs" / "training.md").read_text()
  assert 'pip install "rankjax[logging]"' in page and "tensorboard --logdir" in page


def test_tensorboard_log_every_diagnostics_and_resume_purge(tmp_path):
  """Train scalars every log_every steps; diagnostics per layer + histogram; a writer
  resumed at step 4 after a killed one wrote steps 1-6 leaves each step once."""
  pytest.importorskip("tensorboardX")
  import numpy as np
  from rankjax._src.train import tensorboard as tb
  w = MetricsWriter(tmp_path, total_steps=8, log_every=2, stream=io.StringIO())
  for step in range(1, 7):
    w.write(step, {"loss": float(step)})
    if step % 3 == 0:
      w.write_diagnostics(step, {"basic": {"tsim_x1": np.array([0.1, 0.2]) * step,
                                           "loss": np.float32(step)}})
  w.close()   # everything on disk, as after a kill that happened after a flush
  with open(tb.event_files(str(tmp_path / "tensorboard"))[0], "ab") as f:
    f.write(b"\x10\x00")                       # and a record cut short by the kill
  w = MetricsWriter(tmp_path, total_steps=8, log_every=2, start_step=4, stream=io.StringIO())
  for step in range(5, 9):
    w.write(step, {"loss": 10.0 + step})
    if step % 3 == 0:
      w.write_diagnostics(step, {"basic": {"tsim_x1": np.array([1.0, 2.0]), "loss": 9.0}})
  w.close()
  scalars = tb.read_scalars(str(tmp_path / "tensorboard"))
  assert scalars["train/loss"] == [(2, 2.0), (4, 4.0), (6, 16.0), (8, 18.0)]
  assert scalars["diagnostics/basic/tsim_x1/layer_01"] == [(3, pytest.approx(0.6)), (6, 2.0)]
  assert scalars["diagnostics/basic/loss"] == [(3, 3.0), (6, 9.0)]
  hist = [e.step for e in tb.read_events(str(tmp_path / "tensorboard"))
          if any(v.HasField("histo") for v in e.summary.value)]
  assert hist == [3, 6]
  images = tb.read_images(str(tmp_path / "tensorboard"))
  assert list(images) == ["diagnostics/basic/per_layer"]     # the scalar `loss` has none
  assert [s for s, _ in images["diagnostics/basic/per_layer"]] == [3, 6]


def test_a_diagnostics_steps_scalars_are_one_event_and_its_histograms_another(tmp_path):
  """Hundreds of per-layer scalars a step go in one event (not one event per tag, which
  made the loop wait on tensorboardX's queue), every tag still its own series."""
  pytest.importorskip("tensorboardX")
  import numpy as np
  from rankjax._src.train import tensorboard as tb
  w = MetricsWriter(tmp_path, total_steps=4, log_every=1, stream=io.StringIO(), image_every=100)
  for step in (2, 3):
    w.write_diagnostics(step, {"basic": {"tsim_x1": np.arange(40.0) * step, "loss": 1.0 * step},
                               "postnorm": {"grad": np.arange(12.0) + step}})
  w.close()
  events = [e for e in tb.read_events(str(tmp_path / "tensorboard")) if e.summary.value]
  kinds = [(e.step, sorted({v.WhichOneof("value") for v in e.summary.value})) for e in events]
  assert kinds == [(2, ["simple_value"]), (2, ["histo"]), (3, ["simple_value"]), (3, ["histo"])]
  assert len(events[0].summary.value) == 40 + 1 + 12
  scalars = tb.read_scalars(str(tmp_path / "tensorboard"))
  assert scalars["diagnostics/basic/tsim_x1/layer_39"] == [(2, 78.0), (3, 117.0)]
  assert scalars["diagnostics/postnorm/grad/layer_00"] == [(2, 2.0), (3, 3.0)]
  try:   # TensorBoard's own reader, where installed, sees every tag
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  except ImportError:
    return
  acc = EventAccumulator(str(tmp_path / "tensorboard"))
  acc.Reload()
  assert [e.value for e in acc.Scalars("diagnostics/basic/tsim_x1/layer_39")] == [78.0, 117.0]
  assert len(acc.Tags()["scalars"]) == 53 and len(acc.Tags()["histograms"]) == 2


def test_tensorboard_run_started_over_at_step_0_drops_the_killed_runs_steps(tmp_path):
  """A run killed before its first checkpoint wrote steps 1-6; the rerun starts at
  step 0 and writes 1-4: each step is in the files once, with the rerun's values."""
  pytest.importorskip("tensorboardX")
  from rankjax._src.train import tensorboard as tb
  w = MetricsWriter(tmp_path, total_steps=8, log_every=1, stream=io.StringIO())
  for step in range(1, 7):
    w.write(step, {"loss": float(step)})
  w.close()
  [path] = tb.event_files(str(tmp_path / "tensorboard"))
  os.rename(path, path + "1")     # another process's file (the name has the pid)
  MetricsWriter.truncate(tmp_path, 0)
  w = MetricsWriter(tmp_path, total_steps=8, log_every=1, stream=io.StringIO())
  for step in range(1, 5):
    w.write(step, {"loss": 10.0 + step})
  w.close()
  assert tb.read_scalars(str(tmp_path / "tensorboard"))["train/loss"] == [
      (s, 10.0 + s) for s in range(1, 5)]
  assert [json.loads(line)["step"] for line in
          (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_resume_backfills_events_a_kill_lost(tmp_path):
  """metrics.jsonl and the diagnostics history have steps 1-4, the event files only
  1-2 (tensorboardX's queue died with the process): the resumed writer adds 3-4 once."""
  pytest.importorskip("tensorboardX")
  import numpy as np
  from rankjax._src.train import tensorboard as tb
  from rankjax._src.train.diagnostics import DiagnosticsHistory
  w = MetricsWriter(tmp_path, total_steps=8, log_every=1, stream=io.StringIO())
  for step in (1, 2):
    w.write(step, {"loss": float(step)})
  w.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    for step in (3, 4):
      f.write(json.dumps({"step": step, "loss": float(step)}) + "\n")
    f.write(json.dumps({"step": 4, "eval_loss": 0.5, "kind": "eval"}) + "\n")
  history = DiagnosticsHistory()
  for step in (2, 4):
    history.append(step, {"basic": {"tsim_x1": np.array([0.1, 0.2]) * step}})
  w = MetricsWriter(tmp_path, total_steps=8, log_every=1, start_step=4, stream=io.StringIO())
  assert w.backfill(4, history) == 3 + 4       # loss 3, 4, eval 4; 2 layers x 2 steps
  assert w.backfill(4, history) == 0           # nothing twice
  w.close()
  scalars = tb.read_scalars(str(tmp_path / "tensorboard"))
  assert sorted(scalars["train/loss"]) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
  assert scalars["eval/eval_loss"] == [(4, 0.5)]
  assert sorted(scalars["diagnostics/basic/tsim_x1/layer_01"]) == [
      (2, pytest.approx(0.4)), (4, pytest.approx(0.8))]
  images = tb.read_images(str(tmp_path / "tensorboard"))   # drawn once per step
  assert sorted(s for s, _ in images["diagnostics/basic/per_layer"]) == [2, 4]


def test_backfill_draws_only_the_images_a_kill_lost(tmp_path):
  """Scalars and histograms of step 4 reached the files, its image did not (the tail
  of tensorboardX's queue): the resumed writer draws that image alone."""
  pytest.importorskip("tensorboardX")
  import numpy as np
  from rankjax._src.train import tensorboard as tb
  from rankjax._src.train.diagnostics import DiagnosticsHistory
  diag = {"basic": {"tsim_x1": np.array([0.1, 0.2, 0.4])}}
  w = MetricsWriter(tmp_path, total_steps=8, log_every=1, stream=io.StringIO())
  w.write_diagnostics(2, diag)
  for tag, value in tb.diagnostic_scalars(diag):
    w._tb.add_scalar(tag, value, 4)
  for tag, values in tb.diagnostic_histograms(diag):
    w._tb.add_histogram(tag, values, 4)
  w.close()
  history = DiagnosticsHistory()
  for step in (2, 4):
    history.append(step, diag)
  w = MetricsWriter(tmp_path, total_steps=8, log_every=1, start_step=4, stream=io.StringIO())
  assert w.backfill(4, history) == 0               # no scalar was missing
  w.close()
  logdir = str(tmp_path / "tensorboard")
  assert [s for s, _ in tb.read_images(logdir)["diagnostics/basic/per_layer"]] == [2, 4]
  hist = sorted(e.step for e in tb.read_events(logdir)
                if any(v.HasField("histo") for v in e.summary.value))
  assert hist == [2, 4]


def test_per_layer_profiles_pick_the_layer_arrays():
  """Images get the (L,) profiles with a finite value; scalars, one-layer and 2-D
  arrays, and all-NaN profiles are left to the scalars and histograms."""
  import numpy as np
  from rankjax._src.train import tensorboard as tb
  diag = {"basic": {"tsim": np.array([0.5, 0.9]), "loss": np.float32(1.0),
                    "one": np.array([1.0]), "grid": np.ones((2, 3)),
                    "nan": np.full(3, np.nan), "grad": np.array([1e-4, np.nan, 1.0])},
          "empty": {"loss": 2.0}}
  picked = list(tb.per_layer_profiles(diag))
  assert [(tag, [k for k, _, _ in p]) for tag, p in picked] == [
      ("diagnostics/basic/per_layer", ["tsim", "grad"])]
  (tag, image), = tb.diagnostic_images(5, diag)
  assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
  height, width = image.shape[:2]
  cols, rows = 2, 1                                  # two panels side by side
  assert (height, width) == (round((tb.PANEL_INCHES[1] * rows + 0.4) * tb.IMAGE_DPI),
                             round(tb.PANEL_INCHES[0] * cols * tb.IMAGE_DPI))
  assert len(np.unique(image.reshape(-1, 3), axis=0)) > 2    # something is drawn
  assert list(tb.diagnostic_images(5, diag, skip={(tag, 5)})) == []


def test_matplotlib_is_imported_only_to_draw_an_image(tmp_path):
  """Scalars alone never import matplotlib; drawing uses the Agg canvas without
  pyplot, so no process-wide backend is chosen."""
  pytest.importorskip("tensorboardX")
  import os
  import subprocess
  import sys
  from tests.train.conftest import ROOT
  code = f"""
import io, sys
import numpy as np
from rankjax._src.train.logging import MetricsWriter
w = MetricsWriter({str(tmp_path)!r}, total_steps=2, log_every=1, stream=io.StringIO())
w.write(1, {{"loss": 1.0}})
print("matplotlib" in sys.modules)
w.write_diagnostics(1, {{"basic": {{"tsim_x1": np.array([0.1, 0.2])}}}})
w.close()
print("matplotlib" in sys.modules, "matplotlib.pyplot" in sys.modules)
"""
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["False", "True", "False"]


def test_profile_images_at_most_once_per_image_every_updates(tmp_path):
  """Diagnostics at every update, images on update 1 and the first diagnostics step of
  every 4 updates; scalars at every step."""
  pytest.importorskip("tensorboardX")
  import numpy as np
  from rankjax._src.train import tensorboard as tb
  w = MetricsWriter(tmp_path, total_steps=10, log_every=1, stream=io.StringIO(),
                    image_every=4, diag_every=1)
  for step in range(1, 11):
    w.write_diagnostics(step, {"basic": {"tsim_x1": np.array([0.1, 0.2]) * step}})
  w.close()
  logdir = str(tmp_path / "tensorboard")
  assert [s for s, _ in tb.read_images(logdir)["diagnostics/basic/per_layer"]] == [1, 4, 8]
  assert len(tb.read_scalars(logdir)["diagnostics/basic/tsim_x1/layer_01"]) == 10
  w = MetricsWriter(tmp_path / "b", total_steps=10, log_every=1, stream=io.StringIO(),
                    image_every=4, diag_every=3)        # steps 1, 3, 6, 9: blocks 0, 0, 1, 2
  assert [s for s in (1, 3, 6, 9) if w.draws_images(s)] == [1, 6, 9]
  w.close()


def test_throughput_excludes_the_steps_that_compiled():
  """A resumed run's first update holds the compile (5 s against 0.1 s steady): the
  window's mean leaves it out; a window of compile steps alone has no mean."""
  from rankjax._src.train.loop import throughput
  times, compiled = [5.0, 0.1, 0.1, 0.1], [True, False, False, False]
  assert throughput(100, times, compiled) == pytest.approx(1000.0)
  assert throughput(100, times, [False] * 4) == pytest.approx(400 / 5.3)   # what it was
  assert throughput(100, [5.0], [True]) is None


def test_a_step_variants_first_call_and_any_recompile_count_as_compile_steps():
  import jax
  import jax.numpy as jnp

  from rankjax._src.train.loop import _Loop
  loop = object.__new__(_Loop)
  loop.state, loop._called, loop._compiling = jnp.ones(3), set(), False
  fn = jax.jit(lambda state, batch: state + batch)
  seen = []
  for batch in (jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones((2, 3))):
    loop._dispatch(fn, batch)
    seen.append(loop._compiling)
    loop._compiling = False          # what _finish does with the step it measures
  assert seen == [True, False, False, True]


def test_image_throughput_is_logged_as_images_per_second(tmp_path):
  out = io.StringIO()
  w = MetricsWriter(tmp_path, total_steps=2, log_every=2, stream=out)
  w.write(1, {"loss": 1.0, "images_per_s": 3.0, "compile_step": 1.0})
  w.write(2, {"loss": 1.0, "images_per_s": 50.0, "images_per_s_avg": 50.0})
  w.close()
  assert out.getvalue().splitlines()[-1] == "step 2  loss 1.0000  images/s 50"


def test_a_diagnostic_of_sampled_layers_is_tagged_and_drawn_at_those_layers():
  """The attention diagnostic measures layers 0, 2, 3 of 4 and says so in its
  ``layers`` key: its scalars were tagged layer_00, layer_01, layer_02 (the last
  layer's attention read as layer 2's), its images drew them at 0, 1, 2 and a
  ``layers/layer_01`` scalar held the value 2."""
  import numpy as np
  from rankjax._src.train import tensorboard as tb
  diag = {"attention": {"theta_cert_p50": np.array([0.9, 0.8, 0.7]),
                        "p_max_uniform_mean": np.float32(0.1),
                        "layers": np.array([0, 2, 3], np.int32)},
          "basic": {"tsim": np.array([0.1, 0.2, 0.3, 0.4])}}
  tags = dict(tb.diagnostic_scalars(diag))
  assert sorted(t for t in tags if t.startswith("diagnostics/attention/")) == [
      "diagnostics/attention/p_max_uniform_mean",
      "diagnostics/attention/theta_cert_p50/layer_00",
      "diagnostics/attention/theta_cert_p50/layer_02",
      "diagnostics/attention/theta_cert_p50/layer_03"]
  assert tags["diagnostics/attention/theta_cert_p50/layer_03"] == pytest.approx(0.7)
  assert [f"diagnostics/basic/tsim/layer_0{i}" in tags for i in range(4)] == [True] * 4
  assert "diagnostics/attention/layers" not in dict(tb.diagnostic_histograms(diag))
  profiles = dict(tb.per_layer_profiles(diag))["diagnostics/attention/per_layer"]
  (key, layers, values), = profiles
  assert key == "theta_cert_p50" and list(layers) == [0, 2, 3]
  assert tb.render_profiles("attention", profiles).ndim == 3
  floats = {"mine": {"layers": np.array([0.5, 0.25]), "x": np.array([1.0, 2.0])}}
  assert sorted(dict(tb.diagnostic_scalars(floats))) == [     # not indices: a series
      "diagnostics/mine/layers/layer_00", "diagnostics/mine/layers/layer_01",
      "diagnostics/mine/x/layer_00", "diagnostics/mine/x/layer_01"]


@pytest.mark.slow   # trains a 4-layer LM for one update with the attention diagnostic (~20 s)
def test_a_4_layer_lms_attention_is_tagged_by_the_layers_it_measures(tmp_path):
  """End to end: the run's TensorBoard scalars, ``load_run`` and the report agree
  that the attention diagnostic measured layers 0, 2 and 3."""
  import numpy as np
  from rankjax._src import report
  from rankjax._src.config import TransformerConfig
  from rankjax._src.train import tensorboard as tb
  from rankjax._src.train.loop import train
  from rankjax._src.train.run_reader import load_run
  from tests.train.conftest import tiny_lm
  lm = TransformerConfig(vocab_size=257, num_layers=4, d_model=16, num_heads=2, d_ff=32,
                         max_seq_len=32, norm_position="pre")
  cfg = tiny_lm(model=lm, seq_len=20, total_steps=1, diag_every=1, eval_every=0,
                checkpoint_every=1, warmup_steps=0, grad_accum=1, diagnostics=("attention",))
  train(cfg, tmp_path / "run", stream=io.StringIO(), progress_bar=False)
  tags = [t for t in tb.read_scalars(str(tmp_path / "run" / "tensorboard"))
          if t.startswith("diagnostics/attention/theta_cert_p50")]
  assert sorted(tags) == [f"diagnostics/attention/theta_cert_p50/layer_0{i}" for i in (0, 2, 3)]
  assert not [t for t in tb.read_scalars(str(tmp_path / "run" / "tensorboard"))
              if t.startswith("diagnostics/attention/layers")]
  np.testing.assert_array_equal(load_run(tmp_path / "run").diagnostics["attention/layers"][-1],
                                [0, 2, 3])
  page = report.build_report(tmp_path / "run").read_text()
  assert "3 values (layers 0, 2, 3)" in page
