"""rankjax._src.train.plan_memory and the plan's MFU table: the step compiled for a target's
device count in a worker process (``--xla_force_host_platform_device_count``), depth
shrunk and scaled per layer, refusals against the target's memory, the labels."""

from __future__ import annotations

import dataclasses

import pytest

from rankjax._src.studies import training
from rankjax._src.train import mfu as mfu_lib
from rankjax._src.train import plan as plan_lib
from rankjax._src.train import mfu, plan_memory
from tests.train.conftest import tiny_lm
from tests.conftest import with_kernels


def _parts(scale: float) -> dict:
  return {k: scale * (i + 1) for i, k in enumerate(plan_memory.PARTS)}


def test_extrapolate_is_the_per_layer_line():
  """m(L) = m(d2) + (L - d2) (m(d2) - m(d1)) / (d2 - d1), every part of every variant."""
  small = {"step": _parts(10.0), "diag_step": _parts(3.0)}
  large = {"step": _parts(18.0), "diag_step": _parts(5.0)}
  out = plan_memory.extrapolate(small, large, (4, 8), 48)
  for name in small:
    for k in plan_memory.PARTS:
      per_layer = (large[name][k] - small[name][k]) / 4
      assert out[name][k] == pytest.approx(large[name][k] + 40 * per_layer)
  assert out["step"]["peak"] == pytest.approx(5 * (18 + 40 * 2.0))


def test_depths_shrink_only_an_unrolled_layer_scan():
  cfg = tiny_lm()
  deep = lambda n, unroll=1: dataclasses.replace(cfg, model=dataclasses.replace(
      with_kernels(cfg.model, scan_unroll=unroll), num_layers=n))
  assert plan_memory.depths(deep(48)) is None            # rolled: full depth
  assert plan_memory.depths(deep(48, 48)) == (4, 8)
  assert plan_memory.depths(deep(8, 8)) is None   # no deeper
  assert "at depths 4 and 8, the per-layer difference scaled to 48 layers" in \
      plan_memory.how(deep(48, 48), 8)
  assert "at its full depth 48" in plan_memory.how(deep(48), 64)
  assert "512 > 256 host devices are not compiled" in plan_memory.how(cfg, 512)


def test_runs_of_one_program_share_a_compile_key():
  """Seeds, learning rates, warmup, diag_every > 0, logging and stopping fields do not
  change the compiled steps; the batch, the diagnostics and the model do."""
  cfg = tiny_lm()
  key = plan_memory.program_key(cfg)
  for change in (dict(seed=3), dict(learning_rate=1e-3), dict(warmup_steps=5),
                 dict(diag_every=7), dict(log_every=3), dict(stop_on_collapse=10),
                 dict(checkpoint_every=2), dict(eval_every=8)):
    assert plan_memory.program_key(dataclasses.replace(cfg, **change)) == key, change
  for change in (dict(batch_size=16), dict(diag_every=0), dict(diagnostics=("basic", "attention")),
                 dict(grad_accum=1), dict(mesh_fsdp=2)):
    assert plan_memory.program_key(dataclasses.replace(cfg, **change)) != key, change


def test_the_mfu_table_per_family_and_kind():
  """One table (rankjax._src.train.mfu.MFU_ESTIMATES): a GPU kind takes the middle of issue
  54's H200 range, a TPU kind its low end, a config of no family 0.35; each labelled an
  estimate; the kinds as jax spells them map to the --target names."""
  load = training.load
  post = load("experiments/configs/postnorm_48l_d512_c4.json")
  gpt2 = load("experiments/configs/gpt2_774m.json")
  soft = load("experiments/configs/gpt2_774m.json", ["model.attn_dropout_rate=0.1"])
  assert [mfu.step_family(c) for c in (post, gpt2, soft, tiny_lm())] == [
      "48L d512", "774M", "774M, attention dropout", None]
  for cfg, (low, high) in ((post, (0.32, 0.44)), (gpt2, (0.40, 0.53)), (soft, (0.15, 0.24))):
    for kind in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"):
      value, label = mfu.estimated_mfu(cfg, kind)
      assert value == pytest.approx((low + high) / 2) and label.startswith("estimate for")
      assert f"{low:.0%}-{high:.0%} on one H200" in label
    for kind in ("TPU v5 lite", "TPU v4", "TPU v6 lite", "TPU v5"):
      value, label = mfu.estimated_mfu(cfg, kind)
      assert value == low and "low end" in label and "no TPU measurement" in label
  # the softmax study's paper scale (hash masks): the fused kernel's estimate on a GPU,
  # the query blocks' low end on a TPU (the kernel is GPU-only)
  hashed = load("experiments/configs/gpt2_774m.json",
                ["model.attn_dropout_rate=0.1", "model.attn_dropout_mask=hash"])
  assert mfu.step_family(hashed) == "774M, attention dropout, hash masks"
  value, label = mfu.estimated_mfu(hashed, "NVIDIA H200")
  assert value == pytest.approx(0.42) and "34%-50% on one H200" in label
  value, label = mfu.estimated_mfu(hashed, "TPU v5 lite")
  assert value == 0.24 and "GPU-only" in label and "no TPU measurement" in label
  assert mfu.estimated_mfu(tiny_lm(), "NVIDIA H200")[0] == mfu.OTHER_MFU == 0.35
  assert {k: mfu.hardware_of(h.device_kind).name for k, h in mfu.HARDWARE.items()} == {
      k: k for k in mfu.HARDWARE}
  assert mfu.hardware_of("cpu") is None


def test_a_measured_mfu_replaces_the_estimate(monkeypatch):
  monkeypatch.setattr(mfu_lib, "measured_mfu", lambda kind: 0.41 if "H200" in kind else None)
  cfg = training.load("experiments/configs/gpt2_774m.json")
  value, label = mfu_lib.mfu_for(cfg, "NVIDIA H200")
  assert value == 0.41 and label.startswith("measured by the device check on NVIDIA H200")
  assert mfu_lib.mfu_for(cfg, "TPU v5 lite") == mfu.estimated_mfu(cfg, "TPU v5 lite")


def _runs(cfg):
  """Three runs of one program (seeds, diag_every) and their workdirs."""
  return {f"/o/runs/r{i}": dataclasses.replace(cfg, seed=i, diag_every=2 + i)
          for i in range(3)}


@pytest.mark.slow   # a worker on 8 host devices compiles one plain and one diagnostics step (~20 s)
def test_the_target_plan_compiles_once_refuses_against_its_memory_and_says_so(
    monkeypatch, compile_cache):
  """Three runs of one program on a target of 8 devices: one compile of the plain and
  the diagnostics step (``plan_memory.COMPILES`` +2), their peak the larger of XLA's
  two analyses in the worker; a target whose devices hold less than it is refused naming
  the target's memory (never this host's), as XLA:CPU's compiled number, uncorrected;
  the plan prints how each number was obtained and the MFU's label."""
  monkeypatch.setattr(plan_memory, "_CACHE", {})
  monkeypatch.setattr(mfu_lib, "measured_mfu", lambda kind: None)
  monkeypatch.delenv(plan_lib.PLAN_MEMORY_ENV, raising=False)
  lm = dataclasses.replace(with_kernels(tiny_lm().model, remat="dots"), dropout_rate=0.0)
  cfg = tiny_lm(model=lm, batch_size=16, grad_accum=2)
  big = mfu.Target(mfu.HARDWARE["h200"], 8)
  before = plan_memory.COMPILES[0]
  with plan_lib.planning_for(big):
    p = plan_lib.plan(_runs(cfg))
    assert plan_lib.refusals(_runs(cfg)) == []
  assert plan_memory.COMPILES[0] - before == p["compiles"] == 2       # step + diag_step
  parts = plan_memory.compiled_memory(cfg, 8)
  peak = max(parts["step"]["peak"], parts["diag_step"]["peak"])
  assert parts["diag_step"]["peak"] > parts["step"]["peak"] > parts["step"]["arguments"] > 0
  for r in p["rows"]:
    assert r["peak_compiled"] and r["peak_gb_per_device"] == peak / 1e9
  text = plan_lib.plan_text(p)
  assert ("GB/dev of 3 runs: compiled by XLA:CPU on 8 host devices at its full depth 1 "
          "at the target's mesh, uncorrected for the target's compiler") in text
  assert "CPU to target: uncorrected" in text and "2 steps compiled for this plan" in text
  assert "MFU 0.35: estimate for a config of no measured family" in text
  small = mfu.Target(dataclasses.replace(mfu.HARDWARE["h200"], name="small",
                                         memory_bytes=peak), 8)
  with plan_lib.planning_for(small):
    lines = plan_lib.refusals(_runs(cfg))
  assert plan_memory.COMPILES[0] - before == 2                    # nothing compiled again
  assert len(lines) == 3 and all("\n" not in line for line in lines)
  assert lines[0] == (f"r0: XLA:CPU's compiled (uncorrected) {plan_lib._gb(peak)} GB per "
                      f"device exceeds 90% of the {plan_lib._gb(peak)} GB of a NVIDIA H200 "
                      "(8 devices): --set mesh_fsdp=8 (parameters and optimizer state "
                      "sharded over 8 devices), --set model.kernels.remat=full or a larger grad_accum")


@pytest.mark.slow   # four compiles of a 12-layer unrolled step on 8 host devices (~90 s)
def test_the_shrunk_depth_scaled_per_layer_is_a_direct_compile_within_5_percent(
    monkeypatch, compile_cache):
  """The shrunk Post-Norm paper config (tests/train/conftest.py: d=64, vocab 1024,
  40 tokens, its diagnostics) with 12 layers unrolled: compiled at depths 4 and 8 and
  scaled to 12 (what the plan does for an unrolled scan) against the 12-layer step
  compiled directly, on 8 host devices with mesh_fsdp=8. The state (arguments, aliased)
  is linear in depth: equal within 0.1%; the peaks within 5% (XLA's buffer assignment
  is not exactly linear in depth; measured 1.7% on this model at 16 layers, 3% on the
  48-layer d=512 step scaled from 4 and 8)."""
  from tests.train.conftest import shrunk_paper_config
  monkeypatch.setattr(plan_memory, "_CACHE", {})
  cfg = shrunk_paper_config("postnorm_48l_d512_c4.json")
  cfg = dataclasses.replace(cfg, mesh_fsdp=8, model=dataclasses.replace(
      with_kernels(cfg.model, scan_unroll=12, remat="dots"), num_layers=12))
  assert plan_memory.depths(cfg) == (4, 8)
  scaled = plan_memory.compiled_memory(cfg, 8)
  direct = plan_memory._worker(8).ask(cfg)
  assert set(scaled) == set(direct) == {"step", "diag_step"}
  for name in direct:
    for k in ("arguments", "aliased", "outputs"):
      assert scaled[name][k] == pytest.approx(direct[name][k], rel=1e-3), (name, k)
    assert scaled[name]["peak"] == pytest.approx(direct[name]["peak"], rel=0.05), name


def test_a_compile_that_fails_leaves_the_estimate_labelled_with_why(monkeypatch):
  """A worker that cannot compile (it stopped, XLA refused): the plan still prints, the
  run's memory is the estimate, and the label says why; nothing is raised."""
  class Broken:
    def ask(self, cfg):
      raise RuntimeError("the plan's compile worker on 8 host devices stopped: Killed")
  monkeypatch.setattr(plan_memory, "_CACHE", {})
  monkeypatch.setattr(plan_memory, "_FAILED", {})
  monkeypatch.setattr(plan_memory, "_worker", lambda devices: Broken())
  monkeypatch.setattr(mfu_lib, "measured_mfu", lambda kind: None)
  monkeypatch.delenv(plan_lib.PLAN_MEMORY_ENV, raising=False)
  cfg = tiny_lm(model=with_kernels(tiny_lm().model, remat="auto"))  # estimate chooses
  with plan_lib.planning_for(mfu.Target(mfu.HARDWARE["h200"], 8)):
    p = plan_lib.plan({"/o/runs/a": cfg})
    (row,) = p["rows"]
    assert not row["peak_compiled"] and row["remat_note"].startswith(
        "remat auto -> none (estimated peak GB")
    assert row["peak_gb_per_device"] == plan_lib.memory_estimate(cfg, 8)["total"] / 1e9
  assert row["peak_source"] == ("estimated (rankjax._src.train.memory: the plan's compile "
                                "worker on 8 host devices stopped: Killed)")
  assert "CPU to target" not in plan_lib.plan_text(p)
