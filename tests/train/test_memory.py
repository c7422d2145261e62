"""rankjax._src.train.memory: the peak-memory estimate against its formula by hand, and
model.kernels.remat="auto" chosen by it at build (device memory faked), printed at start-up, the
same on resume, and the plan's note."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal

import jax
import pytest

from rankjax._src.train import loop, memory
from tests.train.conftest import tiny_lm
from tests.conftest import with_kernels


def _cfg(remat="auto", **kw):
  lm = dataclasses.replace(with_kernels(tiny_lm().model, remat=remat), dropout_rate=0.0)
  return tiny_lm(model=lm, diag_every=0, eval_every=0, **kw)


def test_estimate_is_its_formula_by_hand():
  """A 1-layer LM, d=16, SwiGLU d_ff=32, vocab 257, micro-batch 8/2 = 4 on 2 devices,
  T=8, float32: state 16 bytes a parameter over fsdp=1; activations per token
  (5 d + 2 d_ff) = 144 floats for dots, 3x for none, d for full; the whole micro-batch's
  logits and their gradient (loss_chunk 0)."""
  cfg = _cfg()
  params = memory.param_count(cfg)
  lm = cfg.model
  d, f, v = 16, 32, 257
  assert params == 2 * v * d + 4 * d * d + 3 * d * f + 2 * d + d   # + norm_final gain
  tokens = 8 / 2 / 2 * 8                                  # per device
  for policy, per_token in (("dots", 5 * d + 2 * f), ("none", 3 * (5 * d + 2 * f)),
                            ("full", d)):
    est = memory.estimate(cfg, 2, params, policy)
    assert est["state"] == 16 * params
    assert est["activations"] == per_token * tokens * lm.num_layers * 4
    assert est["head"] == 2 * tokens * v * 4
    assert est["total"] == est["state"] + est["activations"] + est["head"]
  assert memory.estimate(cfg, 2, params)["total"] == memory.estimate(
      cfg, 2, params, memory.REMAT_AUTO_FALLBACK)["total"]     # auto unresolved: fallback


def _deep(remat="auto"):
  """A 4-layer d=32 LM whose activations dominate its memory (T=16, 64 sequences a
  micro-batch): each remat policy's compiled peak is clearly below the last's."""
  lm = dataclasses.replace(with_kernels(tiny_lm().model, remat=remat), dropout_rate=0.0,
                           num_layers=4, d_model=32, d_ff=64, max_seq_len=16)
  return tiny_lm(model=lm, diag_every=0, eval_every=0, seq_len=16, batch_size=64, grad_accum=1)


def _compiled_peaks(cfg):
  return {p: loop.compiled_peak_bytes(memory.with_remat(cfg, p)) for p in memory.AUTO_ORDER}


def _limits(cfg, peaks=None):
  """A device limit each policy is the cheapest to fit in (85% of it), and one that
  nothing fits in, for this process's devices: by the compiled peaks (``peaks``) or
  the estimate."""
  params = memory.param_count(cfg)
  n = jax.device_count()
  peaks = peaks or {p: memory.estimate(cfg, n, params, p)["total"] for p in memory.AUTO_ORDER}
  assert peaks["none"] > peaks["dots"] > peaks["full"]
  fit = lambda b: b / memory.AUTO_SHARE * 1.001     # a limit whose 85% just holds b
  return {"none": fit(peaks["none"]), "dots": fit(peaks["dots"]),
          "full": fit(peaks["full"]), "nothing": fit(peaks["full"]) / 2}


@pytest.mark.parametrize("size,want", [    # one in the default suite, three slow (~8 s each)
    ("none", "none"), pytest.param("dots", "dots", marks=pytest.mark.slow),
    pytest.param("full", "full", marks=pytest.mark.slow),
    pytest.param("nothing", "full", marks=pytest.mark.slow)])
def test_build_chooses_the_cheapest_policy_whose_compiled_step_fits(size, want,
                                                                    monkeypatch):
  """On devices with a memory limit the choice reads XLA's analysis of each policy's
  compiled step, in the order none, dots, full, up to the first that fits."""
  cfg = _deep()
  peaks = _compiled_peaks(cfg)
  limit = _limits(cfg, peaks)[size]
  monkeypatch.setattr(memory, "device_limit", lambda: limit)
  compiled = loop.build(cfg)
  assert compiled.task.model.cfg.kernels.remat == want
  note = compiled.remat_note
  assert note.startswith(f"remat auto -> {want} (compiled peak GB per device (XLA's "
                         "memory analysis): none ")
  assert f"85% of {limit / 1e9:.1f} GB" in note and "\n" not in note
  measured = note.split(": ")[1].split(";")[0].count(",") + 1
  assert measured == memory.AUTO_ORDER.index(want) + 1    # no policy past the choice
  # deterministic: the same config, devices and limit give the same policy
  n = jax.device_count()
  twice = [memory.resolve_remat(cfg, n, limit, measure=loop.compiled_peak_bytes)
           for _ in range(2)]
  assert twice[0] == twice[1]


def test_the_estimate_chooses_where_no_compiler_is_asked():
  """Planning away from the devices (no ``measure``) chooses by the estimate."""
  cfg = _cfg()
  for size in ("none", "dots", "full"):
    limit = _limits(cfg)[size]
    chosen, note = memory.resolve_remat(cfg, jax.device_count(), limit)
    assert chosen.model.kernels.remat == size and "estimated peak GB per device" in note


def test_compiled_peak_is_xlas_memory_analysis_of_the_step():
  cfg = _deep("dots")
  c = loop.build(cfg)
  state = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                       jax.eval_shape(c.init), c.state_shardings)
  import jax.numpy as jnp
  batch = {k: jax.ShapeDtypeStruct((1, 64, 16), jnp.int32, sharding=c.batch_sharding)
           for k in ("inputs", "targets")}
  m = c.step.lower(state, batch).compile().memory_analysis()
  assert loop.compiled_peak_bytes(cfg) == (m.argument_size_in_bytes + m.output_size_in_bytes
                                           + m.temp_size_in_bytes - m.alias_size_in_bytes)


def test_without_a_device_limit_auto_keeps_the_fallback_and_others_stand():
  assert memory.device_limit() is None                  # XLA:CPU reports no bytes_limit
  compiled = loop.build(_cfg())
  assert compiled.task.model.cfg.kernels.remat == memory.REMAT_AUTO_FALLBACK == "dots"
  assert "reports no memory limit" in compiled.remat_note
  for policy in ("none", "dots", "full"):             # a named policy is never replaced
    cfg = _cfg(policy)
    assert memory.resolve_remat(cfg, 1, 1.0) == (cfg, None)


@pytest.mark.slow   # two trainings (~10 s); the choice itself is tested fast above
def test_auto_run_prints_its_choice_keeps_auto_saved_and_resumes_the_same(tmp_path,
                                                                         monkeypatch):
  """The start-up line names the choice; config.json keeps "auto" (the checkpoint's
  config check passes on resume) and the resumed run chooses the same policy."""
  cfg = _cfg()
  monkeypatch.setattr(memory, "device_limit", lambda: 1e12)
  monkeypatch.setattr(memory, "AUTO_ORDER", ("dots", "full"))   # the compiled choice: dots

  def on_step(step):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  out = io.StringIO()
  first = loop.train(cfg, tmp_path, on_step=on_step, stream=out, progress_bar=False)
  assert (first.status, first.step) == ("preempted", 3)
  assert json.loads((tmp_path / "config.json").read_text())["model"]["kernels"]["remat"] == "auto"
  again = io.StringIO()
  second = loop.train(cfg, tmp_path, stream=again, progress_bar=False)
  assert (second.start_step, second.step) == (3, cfg.total_steps)
  lines = [[ln for ln in s.getvalue().splitlines() if ln.startswith("remat auto")]
           for s in (out, again)]
  assert lines[0] == lines[1] and len(lines[0]) == 1 and "-> dots" in lines[0][0]


def test_the_plan_says_the_choice_and_estimates_its_policy(monkeypatch):
  from rankjax._src.train import mfu as mfu_lib
  from rankjax._src.train import plan as plan_lib
  cfg = _cfg()
  limit = _limits(cfg)["none"]
  monkeypatch.setattr(memory, "device_limit", lambda: limit)
  monkeypatch.setattr(mfu_lib, "measured_mfu", lambda kind: None)
  n = jax.device_count()
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("NVIDIA H200", n, limit))
  p = plan_lib.plan({"/x/runs/auto": cfg})
  (row,) = p["rows"]
  # on the job's own devices (a memory limit): XLA's analysis of the chosen step
  assert row["peak_compiled"] and row["remat"] == "none"
  assert row["peak_gb_per_device"] == loop.compiled_peak_bytes(
      memory.with_remat(cfg, "none")) / 1e9
  assert row["remat_note"].startswith("remat auto -> none (compiled peak")
  assert "    remat auto -> none" in plan_lib.plan_text(p)
  assert "GB/dev of 1 run: compiled: XLA's analysis of the step on these devices" in \
      plan_lib.plan_text(p)
  # planning for other devices: the estimate, said so
  monkeypatch.setattr(plan_lib, "device_memory", lambda: ("NVIDIA H200", n + 7, limit))
  p = plan_lib.plan({"/x/runs/auto": cfg})
  (row,) = p["rows"]
  params = memory.param_count(cfg)
  assert not row["peak_compiled"]
  assert row["peak_gb_per_device"] == memory.estimate(
      memory.with_remat(cfg, row["remat"]), n + 7, params)["total"] / 1e9
  assert "GB/dev of 1 run: estimated (rankjax._src.train.memory;" in plan_lib.plan_text(p)


def test_a_model_built_from_an_auto_config_alone_uses_the_fallback():
  """DecoderLM(remat="auto") outside a build (load_run, analyses): the fallback's
  program exactly, and not the program without remat."""
  import jax.numpy as jnp
  from rankjax._src.models.transformer import DecoderLM
  tokens = jnp.zeros((2, 8), jnp.int32)

  def program(remat):
    model = DecoderLM(with_kernels(_cfg().model, remat=remat))
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)
    loss = lambda p: jnp.sum(model.apply(p, tokens))
    return str(jax.make_jaxpr(jax.grad(loss))(params))

  assert program("auto") == program(memory.REMAT_AUTO_FALLBACK) != program("none")


@pytest.mark.slow   # 6 compiles on 8 host devices in a second process (~30 s)
def test_compiled_state_per_device_is_the_plans_share_on_8_and_4_devices():
  """Both paper configs shrunk (``conftest.shrunk_paper_config``), their training step
  compiled on 8 host devices without and with ``mesh_fsdp=8`` (the fix the plan's memory
  refusal names) and on 4 of them with ``mesh_fsdp=4``: XLA's arguments per device are
  the parameters and AdamW's two moments in float32 (12 bytes a parameter) over
  ``mesh_fsdp`` plus the batch over the devices, within 5% (norm scales and biases stay
  whole: up to 3% of this shrunk state, under 0.1% at the paper's widths); sharding them lowers the compiled peak by at least the state it
  shards, 12 x params x (1 - 1/n), as the estimate's ``state`` term assumes."""
  from tests.train.conftest import run_json_worker
  out = run_json_worker("hlo_worker.py", "memory", timeout=600)
  assert len(out) == 2
  for name, m in out.items():
    p, batch = m["params"], m["batch_bytes"]
    rows = {(r["devices"], r["fsdp"]): r for r in m["rows"]}
    for (n, fsdp), r in rows.items():
      expected = 12 * p / fsdp + batch / n
      assert r["arguments"] == pytest.approx(expected, rel=0.05), (name, n, fsdp)
      assert r["aliased"] == pytest.approx(12 * p / fsdp, rel=0.05), (name, n, fsdp)
    drop = rows[(8, 1)]["peak"] - rows[(8, 8)]["peak"]
    assert drop >= 12 * p * (1 - 1 / 8), (name, drop)
    cfg = dataclasses.replace(_paper(name), mesh_fsdp=1)
    ratio = (memory.estimate(cfg, 8, p)["state"]
             / memory.estimate(dataclasses.replace(cfg, mesh_fsdp=8), 8, p)["state"])
    compiled = rows[(8, 1)]["aliased"] / rows[(8, 8)]["aliased"]
    assert compiled == pytest.approx(ratio, rel=0.05), (name, compiled, ratio)


def _paper(name):
  from rankjax._src.studies import training
  return training.load(f"experiments/configs/{name}")


@pytest.mark.slow   # compiles the policies of two shapes (~40 s under load)
def test_remat_auto_compiles_once_per_step_shape(monkeypatch):
  """Runs that differ only in per-run fields (seed, learning rate) share their compiled
  memory analysis: remat auto compiles each policy's step once for all of them."""
  import dataclasses
  cfg = _deep()
  limit = _limits(cfg, _compiled_peaks(cfg))["dots"]
  monkeypatch.setattr(memory, "device_limit", lambda: limit)
  monkeypatch.setattr(loop, "_MEMORY", {})
  compiled = []
  real = loop._compiled_memory
  monkeypatch.setattr(loop, "_compiled_memory",
                      lambda c, mesh: compiled.append(c.model.kernels.remat) or real(c, mesh))
  first = loop.build(cfg).task.model.cfg.kernels.remat
  n = len(compiled)
  assert n >= 1
  for change in (dict(seed=7), dict(learning_rate=cfg.learning_rate * 2), dict(b1=0.8)):
    assert loop.build(dataclasses.replace(cfg, **change)).task.model.cfg.kernels.remat == first
  assert len(compiled) == n                 # nothing compiled again
  loop.build(dataclasses.replace(cfg, batch_size=cfg.batch_size * 2))
  assert len(compiled) > n                  # another shape compiles
