"""Device check: what only an accelerator shows, in one run of a few minutes.

Run once whenever a GPU/TPU is lent (one H200: under 5 minutes), then paste nothing:
the script writes the section ``## Device check`` of RESULTS.md itself.

1. **Default float32 matmul precision**: the relative error of a float32 matmul at the
   backend's default precision and at 'highest', against float64 on the host. On
   Ampere+ GPUs the default is TF32 (error ~1e-3), on TPUs bf16 passes (~1e-2);
   rankjax's measurement code must run at 'highest' (~1e-6).
2. **Fused vs einsum attention**, forward + backward, at (B, T, H, d_head) =
   (16, 2048, 4, 128) (the 48-layer d=512 model) and (16, 1024, 20, 64) (774M):
   ``jax.nn.dot_product_attention`` with the backend's fused implementation (cuDNN on
   GPU) against the einsum softmax path the model keeps for captured probabilities;
   and the softmax study's dropout attention at the 774M shape, the fused Pallas kernel
   (``rankjax._src.models.flash_dropout``, Triton on a GPU) against the query blocks with the
   same hash masks: max relative difference of outputs and gradients, and the time of
   each.
3. **Paper training steps**: the 48-layer d=512 Post-Norm config and the 774M config
   (experiments/configs/, as they are, with one micro-batch per update and synthetic
   tokens), and the 774M step as the softmax study runs it (attention-probability
   dropout 0.1 with hash masks: on a GPU the fused Pallas kernel
   ``rankjax._src.models.flash_dropout``, a failed check if the step takes another path;
   elsewhere the query blocks of ``rankjax._src.models.attention.causal_dropout_attention``):
   step time, tokens/s, MFU against the device's spec peak (``rankjax._src.train.mfu``) and
   the step's own peak memory (XLA's ``memory_analysis`` of its compiled program); a
   config with dropout (774M) again with ``unsafe_rbg`` dropout keys, the cost of
   threefry's bits. With ``--out`` each step leaves a 3-step ``jax.profiler`` trace.
4. **Jacobian engine**: ``mlp_jacobian_study`` at L=48, d=256, 8 seeds (Pre-Norm ReLU,
   4x expansion): time per call after compilation, and its reconstruction error.
5. **rankjax analyze at 7B width**: a random checkpoint of Llama-2-7B's layer shape
   (d=4096, d_ff=11008, 32 heads, vocabulary 32000) with 4 layers, bf16, analyzed in
   bfloat16 on one sequence of 2048 tokens (stream, attention, gradients), layer at a
   time (as a 7B run goes): the device seconds per layer of the forward and backward
   passes (median over the layers; x32 for the 7B model) and the peak device memory of
   its own process.

Each part runs in a process of its own (unless ``--smoke``), so a part's peak device
memory (``peak_bytes_in_use``) is its own, not the largest of the earlier parts.

Every part has a check fixed here in advance (``TOLERANCES``): 'highest' float32
matmuls within 1e-5 of float64 (what the measurement code relies on); the fused
attention within the compute dtype's tolerance of the einsum reference, forward and
backward; finite losses; the Jacobian study's reconstruction error. A failed check is
printed by name and the script exits 1 (after writing what it measured). MFU is not a
check: the table shows the measured MFU (causal attention at half, and counted whole)
beside a review's estimate for the shipped step and the target (>= 50% for the 48-layer
d=512 step, >= 55% for 774M).

Run it with the launchers' XLA flags to measure what a launched run gets:
``source launch/xla_flags.sh; XLA_FLAGS="$RANKJAX_GPU_XLA_FLAGS" python ...``; the
flags in effect are printed with the results.

``--smoke`` runs every part at tiny sizes (on the CPU in the test suite); it never
writes RESULTS.md.

Run:  python experiments/benchmarks/device_check.py [--smoke] [--no-write] [--only PARTS]
      [--out DIR]   (DIR/device_check.json and DIR/traces/<step>: where the caller says)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import common
import rankjax
from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src.models import attention, flash_dropout
from rankjax._src.train import mfu as mfu_lib
from rankjax._src.train import sharding as shard_lib
from rankjax._src.train.loop import build
from rankjax._src.train.tasks import count_params

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SECTION = "## Device check"
PARTS = ("precision", "attention", "steps", "jacobian", "analyze")

# The pass/fail bands, fixed before any device run. Attention: relative norm difference
# of the fused kernel from the einsum path (outputs; gradients of q, k, v), by the
# inputs' dtype: float32 paths agree to rounding, bfloat16 ones to a few bf16 ulps of
# the probabilities (2^-8 = 3.9e-3 each).
TOLERANCES = {
    "precision_highest": 1e-5,
    "attention": {"float32": (1e-5, 1e-4), "bfloat16": (2e-2, 2e-2)},
    "jacobian_reconstruction": 1e-3,
}
# MFU of the shipped step on one H200 as a review estimated it (before its changes), and
# the targets; shown beside the measurement, never judged.
MFU_ESTIMATE = {"postnorm_48l_d512_c4.json": (0.38, 0.43), "gpt2_774m.json": (0.41, 0.46)}
MFU_TARGET = {"postnorm_48l_d512_c4.json": 0.50, "gpt2_774m.json": 0.55}
# the softmax study's 774M step: App D.1's attention dropout with the study's hash masks
# (its SCALE_SETS["paper"] but the log cadence; tests/models/test_dropout_attention.py)
SOFTMAX_SETS = ("model.attn_dropout_rate=0.1", "model.embed_norm=false",
                "model.attn_dropout_mask=hash")


def failed_checks(r: dict) -> list[str]:
  """The names of the checks ``r`` fails, each with the value and its band."""
  bad = []
  p = r.get("precision")
  if p and not p["err_highest"] <= TOLERANCES["precision_highest"]:
    bad.append(f"precision: 'highest' float32 matmul error {p['err_highest']:.1e} > "
               f"{TOLERANCES['precision_highest']:.0e}")
  for a in r.get("attention", []):
    out_tol, grad_tol = TOLERANCES["attention"][a["dtype"]]
    if not (a["out_rel_diff"] <= out_tol and a["grad_rel_diff"] <= grad_tol):
      bad.append(f"attention {a['shape']}: fused vs einsum {a['out_rel_diff']:.1e} (outputs), "
                 f"{a['grad_rel_diff']:.1e} (gradients) > {out_tol:.0e} / {grad_tol:.0e}")
  for st in r.get("steps", []):
    if not np.isfinite(st["loss"]):
      bad.append(f"steps {st['config']}: loss {st['loss']}")
    if (r.get("backend") == "gpu" and st.get("attn_dropout")
        and st.get("attn_kernel") != "flash_dropout"):
      bad.append(f"steps {st['config']}: attention dropout on {st.get('attn_kernel')}, "
                 "not the fused kernel")
  j = r.get("jacobian")
  if j and not j["reconstruction_error"] <= TOLERANCES["jacobian_reconstruction"]:
    bad.append(f"jacobian: reconstruction error {j['reconstruction_error']:.1e} > "
               f"{TOLERANCES['jacobian_reconstruction']:.0e}")
  a = r.get("analyze")
  if a and not np.isfinite(a["loss"]):
    bad.append(f"analyze: loss {a['loss']}")
  return bad


def timed(fn: Callable[[], Any], reps: int) -> float:
  """Median seconds of ``reps`` calls after one warm-up (compiling) call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def rel_err(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# --------------------------------------------------------------------------- 1.

def check_precision(smoke: bool) -> dict:
  n = 256 if smoke else 4096
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  out = {"n": n}
  for name in ("default", "high", "highest"):
    prec = None if name == "default" else name
    f = jax.jit(lambda x, y, p=prec: jnp.matmul(x, y, precision=p))
    out[f"err_{name}"] = rel_err(f(a, b), ref)
    out[f"tflops_{name}"] = 2 * n ** 3 / timed(lambda f=f: f(a, b), 5) / 1e12
  out["default_is_tf32_or_bf16"] = out["err_default"] > 1e-5
  return out


# --------------------------------------------------------------------------- 2.

def einsum_attention(q, k, v, scale):
  """The reference path: float32 logits, causal mask, softmax, probabilities @ V."""
  t = q.shape[1]
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * scale
  logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(q.dtype), v)


def fused_attention(q, k, v, scale):
  impl = "cudnn" if jax.default_backend() == "gpu" else None
  return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                      implementation=impl)


def check_attention(smoke: bool) -> list[dict]:
  shapes = [(2, 64, 2, 16), (2, 32, 4, 8)] if smoke else [(16, 2048, 4, 128), (16, 1024, 20, 64)]
  dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  rows = []
  for b, t, h, dh in shapes:
    keys = jax.random.split(jax.random.key(2), 4)
    q, k, v, g = (jax.random.normal(kk, (b, t, h, dh), dtype) for kk in keys)
    scale = 1.0 / np.sqrt(dh)

    def fwd_bwd(attn):
      def loss(q, k, v):
        return jnp.sum(attn(q, k, v, scale).astype(jnp.float32) * g.astype(jnp.float32))
      return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    fused, ref = fwd_bwd(fused_attention), fwd_bwd(einsum_attention)
    out_f = jax.jit(lambda q, k, v: fused_attention(q, k, v, scale))(q, k, v)
    out_r = jax.jit(lambda q, k, v: einsum_attention(q, k, v, scale))(q, k, v)
    (_, grads_f), (_, grads_r) = fused(q, k, v), ref(q, k, v)
    rows.append(dict(
        shape=f"B={b} T={t} H={h} d_head={dh} {jnp.dtype(dtype).name}",
        pair="fused vs einsum", dtype=jnp.dtype(dtype).name,
        out_rel_diff=rel_err(out_f, out_r),
        grad_rel_diff=max(rel_err(x, y) for x, y in zip(grads_f, grads_r)),
        fused_ms=1e3 * timed(lambda: fused(q, k, v), 5),
        einsum_ms=1e3 * timed(lambda: ref(q, k, v), 5)))
  # the softmax study's dropout attention at the 774M shape: the fused Pallas kernel
  # (rankjax._src.models.flash_dropout; Triton on a GPU) against the query blocks, the same
  # hash masks (dropout 0.1, one key)
  b, t, h, dh = (2, 64, 2, 16) if smoke else (16, 1024, 20, 64)
  keys = jax.random.split(jax.random.key(3), 4)
  q, k, v, g = (jax.random.normal(kk, (b, t, h, dh), dtype) for kk in keys)
  scale, key = 1.0 / np.sqrt(dh), jax.random.key(4)
  flash = lambda q, k, v: flash_dropout.causal_attention(q, k, v, scale, 0.1, key)
  blocks = lambda q, k, v: attention.causal_dropout_attention(q, k, v, scale, 0.0, 0.1, key)
  run = {name: jax.jit(lambda q, k, v, f=f: (f(q, k, v), jax.grad(
      lambda *a: jnp.sum(f(*a).astype(jnp.float32) * g.astype(jnp.float32)),
      argnums=(0, 1, 2))(q, k, v))) for name, f in (("flash", flash), ("blocks", blocks))}
  (out_f, grads_f), (out_r, grads_r) = run["flash"](q, k, v), run["blocks"](q, k, v)
  rows.append(dict(
      shape=f"B={b} T={t} H={h} d_head={dh} {jnp.dtype(dtype).name}, dropout 0.1",
      pair="flash dropout vs query blocks", dtype=jnp.dtype(dtype).name,
      out_rel_diff=rel_err(out_f, out_r),
      grad_rel_diff=max(rel_err(x, y) for x, y in zip(grads_f, grads_r)),
      fused_ms=1e3 * timed(lambda: run["flash"](q, k, v), 5),
      einsum_ms=1e3 * timed(lambda: run["blocks"](q, k, v), 5)))
  return rows


# --------------------------------------------------------------------------- 3.

def step_config(name: str, smoke: bool, prng_impl: str | None = None,
                sets: tuple[str, ...] = ()) -> TrainConfig:
  cfg = config_lib.override(config_lib.from_json(TrainConfig, CONFIGS / name), sets)
  if prng_impl is not None:
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, prng_impl=prng_impl))
  n = jax.device_count()
  micro = cfg.micro_batch_size
  cfg = dataclasses.replace(cfg, batch_size=micro * n if micro % n else micro, grad_accum=1,
                            diag_every=0, eval_every=0)
  if smoke:
    lm = dataclasses.replace(cfg.model, num_layers=2, d_model=64, num_heads=2, d_ff=128,
                             vocab_size=300, max_seq_len=64)
    cfg = dataclasses.replace(cfg, model=lm, seq_len=32, batch_size=2 * n,
                              compute_dtype="float32")
  return cfg


def compiled_peak_bytes(jitted, *args) -> float:
  """Peak bytes of one compiled program (XLA's ``memory_analysis``: arguments, outputs
  and temporaries, less what the outputs alias), or NaN where the backend gives none."""
  m = jitted.lower(*args).compile().memory_analysis()
  if m is None:
    return float("nan")
  return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def dropout_kernel(cfg: TrainConfig) -> str | None:
  """The attention-dropout path ``CausalSelfAttention`` takes for this step (None
  without attention dropout): the fused Pallas kernel, or the query blocks."""
  lm = cfg.model
  if not lm.attn_dropout_rate:
    return None
  if attention.kernel_for(lm, jnp.dtype(cfg.compute_dtype), cfg.seq_len,
                         dropout=True).name == "flash":
    return "flash_dropout"
  return f"query blocks ({lm.attn_dropout_mask})"


def check_step(name: str, smoke: bool, prng_impl: str | None = None,
               sets: tuple[str, ...] = (), trace_dir: pathlib.Path | None = None) -> dict:
  """One paper config's step; ``prng_impl``: its dropout keys' PRNG instead of the
  config's (the same step with cheaper dropout bits: how much threefry costs); ``sets``:
  overrides (the softmax study's dropout); ``trace_dir``: a 3-step profiler trace."""
  cfg = step_config(name, smoke, prng_impl, sets)
  c = build(cfg)
  state = c.init()
  n_params = count_params(state.params)
  vocab = min(cfg.model.vocab_size, 257 if smoke else cfg.model.vocab_size)
  tokens = np.random.default_rng(0).integers(0, vocab, (cfg.batch_size, cfg.seq_len + 1))
  tokens = tokens.astype(np.int32)
  batch = shard_lib.global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]},
                                 cfg.grad_accum, c.batch_sharding)
  holder = {"state": state}

  def one():
    holder["state"], metrics, _ = c.step(holder["state"], batch)
    return metrics

  step_bytes = compiled_peak_bytes(c.step, holder["state"], batch)
  t = timed(one, 2 if smoke else 5)
  loss = float(one()["loss"])
  if trace_dir is not None:
    with jax.profiler.trace(str(trace_dir)):
      for _ in range(3):
        jax.block_until_ready(one())
  peak = mfu_lib.local_spec_peak(cfg.compute_dtype)
  mfu = {key: mfu_lib.mfu(c.task.flops_per_example(causal=causal) * cfg.batch_size, t,
                          jax.device_count(), peak)
         for key, causal in (("mfu_spec", True), ("mfu_full_attention", False))}
  return dict(config=name, prng_impl=cfg.model.prng_impl, variant=prng_impl is not None,
              sets=list(sets), attn_dropout=cfg.model.attn_dropout_rate,
              attn_kernel=dropout_kernel(cfg),
              params=n_params, batch=cfg.batch_size, seq_len=cfg.seq_len,
              compute_dtype=cfg.compute_dtype, model=config_lib.to_dict(cfg.model),
              remat=c.task.model.cfg.kernels.remat,
              remat_note=c.remat_note,                    # lm.kernels.remat="auto"
              step_s=t, tokens_s=cfg.batch_size * cfg.seq_len / t, loss=loss, **mfu,
              peak_memory_gib=step_bytes / 2 ** 30)


# --------------------------------------------------------------------------- 4.

def check_jacobian(smoke: bool) -> dict:
  L, d, seeds = (4, 16, 2) if smoke else (48, 256, 8)
  cfg = rankjax.MLPConfig(depth=L, width=d, norm_position="pre", activation="relu")
  key = jax.random.key(0)

  def run():
    return rankjax.mlp_jacobian_study(cfg, key, num_inputs=1, num_seeds=seeds)

  t = timed(run, 1 if smoke else 3)
  study = run()
  return dict(L=L, d=d, seeds=seeds, time_s=t,
              reconstruction_error=float(jnp.max(study.reconstruction_error)),
              erank_last=float(jnp.mean(study.erank[..., -1])))


def check_analyze(smoke: bool) -> dict:
  import tempfile
  from rankjax._src import cli
  from rankjax._src.models import hf
  shape = (dict(hidden_size=64, num_layers=2, intermediate_size=96, num_heads=4,
                num_kv_heads=4, vocab_size=300) if smoke else
           dict(hidden_size=4096, num_layers=4, intermediate_size=11008, num_heads=32,
                num_kv_heads=32, vocab_size=32000))
  tokens = 32 if smoke else 2048
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    folder = hf.write_random_checkpoint(tmp / "llama", dtype="bfloat16",
                                              max_position_embeddings=4096, **shape)
    (tmp / "ids.txt").write_text(" ".join(str(i % 300) for i in range(tokens)))
    start = time.perf_counter()
    rc = cli.main(["analyze", str(folder), "--out", str(tmp / "out"), "--token-ids",
                   str(tmp / "ids.txt"), "--tokens", str(tokens), "--sequences", "1",
                   "--dtype", "bfloat16", "--layer-at-a-time", "on",
                   "--measures", "stream,attention,gradients"])
    wall = time.perf_counter() - start
    if rc:
      raise RuntimeError(f"rankjax analyze exited {rc}")
    r = json.loads((tmp / "out" / "analysis.json").read_text())
  med = lambda xs: float(np.median(xs[1:] if len(xs) > 1 else xs))   # first: compiles
  stats = jax.local_devices()[0].memory_stats() or {}
  return dict(**shape, tokens=tokens, wall_s=wall, loss=r["loss"],
              forward_s=med(r["seconds_per_layer"]["forward"]),
              attention_s=med(r["seconds_per_layer"]["attention"]),
              backward_s=med(r["seconds_per_layer"]["backward"]),
              peak_memory_gib=stats.get("peak_bytes_in_use", float("nan")) / 2 ** 30)


# ---------------------------------------------------------------------------

def markdown(r: dict, command: str) -> str:
  lines = [SECTION, "",
           f"Machine: {common.machine_name()}, jax {jax.__version__} ({jax.default_backend()}).",
           f"Command: `{command}` ({r['wall_s']:.0f} s in all); XLA_FLAGS: "
           f"`{r['xla_flags'] or '(none)'}`.", "",
           ("**Checks: all passed.**" if not r["failures"] else
            "**Checks FAILED:** " + "; ".join(r["failures"]) + "."), ""]
  if "precision" in r:
    p = r["precision"]
    lines += [f"**float32 matmul precision** ({p['n']}^2, error vs float64): default "
              f"{p['err_default']:.1e} ({p['tflops_default']:.1f} TFLOP/s), 'high' "
              f"{p['err_high']:.1e} ({p['tflops_high']:.1f}), 'highest' {p['err_highest']:.1e} "
              f"({p['tflops_highest']:.1f}). Default float32 dots run "
              + ("**below float32 (TF32/bf16 passes)**." if p["default_is_tf32_or_bf16"]
                 else "at full float32."), ""]
  if "attention" in r:
    lines += ["**Attention, fused vs reference** (forward + backward):", "",
              "| shape | fused vs reference | out rel. diff | grad rel. diff | fused | reference |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {a['shape']} | {a.get('pair', 'fused vs einsum')} | {a['out_rel_diff']:.1e} | "
              f"{a['grad_rel_diff']:.1e} | {a['fused_ms']:.2f} ms | {a['einsum_ms']:.2f} ms |"
              for a in r["attention"]]
    lines.append("")
  if "steps" in r:
    lines += ["**Paper training steps** (synthetic tokens, one micro-batch per update):", "",
              "| config | params | batch x T | dtype | step | tokens/s | MFU, causal at half "
              "(full attention) | estimated (review) | target | step's peak memory |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    pct = lambda x: "n/a" if x is None else f"{x:.1%}"
    for s in r["steps"]:
      est = None if s.get("variant") or s.get("sets") else MFU_ESTIMATE.get(s["config"])
      est = f"{est[0]:.0%}-{est[1]:.0%}" if est else "-"
      target = MFU_TARGET.get(s["config"])
      mem = s["peak_memory_gib"]
      mem = "n/a" if np.isnan(mem) else f"{mem:.1f} GiB"
      name = s["config"] + (f", {s['prng_impl']} dropout" if s.get("variant") else "") + (
          f", attention dropout {s['attn_dropout']:g} (softmax study"
          + (f"; {s['attn_kernel']})" if s.get("attn_kernel") else ")")
          if s.get("attn_dropout") else "")
      lines.append(f"| {name} (remat {s['remat']}) | {s['params'] / 1e6:.1f}M | "
                   f"{s['batch']} x {s['seq_len']} "
                   f"| {s['compute_dtype']} | {s['step_s'] * 1e3:.1f} ms | {s['tokens_s']:.4g} "
                   f"| {pct(s['mfu_spec'])} ({pct(s['mfu_full_attention'])}) | {est} | "
                   f"{pct(target) if target else '-'} | {mem} |")
    lines.append("")
  if "jacobian" in r:
    j = r["jacobian"]
    lines += [f"**Jacobian engine** (L={j['L']}, d={j['d']}, {j['seeds']} seeds): "
              f"{j['time_s']:.3g} s per study, reconstruction error {j['reconstruction_error']:.1e}, "
              f"erank/d at L {j['erank_last']:.3f}.", ""]
  if "analyze" in r:
    a = r["analyze"]
    lines += [f"**rankjax analyze** (random Llama, {a['num_layers']} layers of d="
              f"{a['hidden_size']}, d_ff={a['intermediate_size']}, bf16, {a['tokens']} tokens): "
              f"per layer forward {a['forward_s'] * 1e3:.1f} ms, attention measures "
              f"{a['attention_s'] * 1e3:.1f} ms, backward {a['backward_s'] * 1e3:.1f} ms "
              f"(x32 layers for 7B); {a['wall_s']:.0f} s in all; peak device memory "
              f"{a['peak_memory_gib']:.1f} GiB; loss {a['loss']:.3f}.", ""]
  return "\n".join(lines)


def run_part(part: str, smoke: bool, out: pathlib.Path | None) -> Any:
  """One part's results, in this process."""
  if part == "precision":
    return check_precision(smoke)
  if part == "attention":
    return check_attention(smoke)
  if part == "steps":
    trace = lambda tag: None if out is None else out / "traces" / tag
    steps = [check_step(n, smoke, trace_dir=trace(n.removesuffix(".json")))
             for n in ("postnorm_48l_d512_c4.json", "gpt2_774m.json")]
    # the softmax study's 774M step (attention dropout with hash masks: the fused kernel
    # on a GPU, the query blocks elsewhere)
    steps.append(check_step("gpt2_774m.json", smoke, sets=SOFTMAX_SETS,
                            trace_dir=trace("gpt2_774m_softmax")))
    # the configs with dropout again with unsafe_rbg dropout bits (does the dropout RNG
    # dominate?)
    steps += [check_step(s["config"], smoke, "unsafe_rbg") for s in steps[:2]
              if s["model"]["dropout_rate"] > 0 and s["prng_impl"] != "unsafe_rbg"]
    return steps
  if part == "jacobian":
    return check_jacobian(smoke)
  return check_analyze(smoke)


def run_in_own_process(part: str, tmp: pathlib.Path, out: pathlib.Path | None,
                       smoke: bool = False) -> Any:
  """``run_part`` in a child process (its peak device memory is its own)."""
  import subprocess
  path = tmp / f"{part}.json"
  cmd = [sys.executable, __file__, "--part-json", str(path), "--only", part]
  if smoke:
    cmd.append("--smoke")
  if out is not None:
    cmd += ["--out", str(out)]
  subprocess.run(cmd, check=True)
  return json.loads(path.read_text())[part]


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU); never writes")
  parser.add_argument("--no-write", action="store_true", help="print only")
  parser.add_argument("--only", default=",".join(PARTS), help=f"comma list of {PARTS}")
  parser.add_argument("--json", default=None, help="also write the raw results here")
  parser.add_argument("--out", default=None, type=pathlib.Path,
                      help="a folder for device_check.json and the profiler traces")
  parser.add_argument("--part-json", default=None, help=argparse.SUPPRESS)  # a child
  args = parser.parse_args(argv)
  parts = [p for p in args.only.split(",") if p]
  unknown = sorted(set(parts) - set(PARTS))
  if unknown:
    parser.error(f"unknown part(s) {unknown}; choose from {list(PARTS)}")
  if args.part_json:                       # a child: one part, its JSON, nothing else
    (part,) = parts
    pathlib.Path(args.part_json).write_text(
        json.dumps({part: run_part(part, args.smoke, args.out)}, default=str))
    return {}
  if args.out is not None:
    args.out.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  r: dict[str, Any] = {"device": common.machine_name(), "backend": jax.default_backend()}
  import tempfile
  with tempfile.TemporaryDirectory() as tmp:
    for part in (p for p in PARTS if p in parts):
      r[part] = (run_part(part, True, args.out) if args.smoke
                 else run_in_own_process(part, pathlib.Path(tmp), args.out))
  r["wall_s"] = time.perf_counter() - start
  r["xla_flags"] = os.environ.get("XLA_FLAGS", "")
  r["failures"] = failed_checks(r)
  command = "python experiments/benchmarks/device_check.py " + " ".join(argv or sys.argv[1:])
  text = markdown(r, command.strip())
  print(text)
  for path in [args.json] + ([args.out / "device_check.json"] if args.out else []):
    if path:
      pathlib.Path(path).write_text(json.dumps(r, indent=2, default=str))
  if not (args.smoke or args.no_write):
    common.write_section(SECTION, text)
    print(f"wrote {SECTION!r} to {common.RESULTS}")
    if r.get("steps"):
      write_measured_mfu(jax.devices()[0].device_kind, r["steps"])
  for failure in r["failures"]:
    print(f"device check FAILED: {failure}", file=sys.stderr)
  return r


def write_measured_mfu(device_kind: str, steps: list[dict],
                       path: pathlib.Path | None = None) -> pathlib.Path:
  """``device_check.json``'s ``train_mfu[device_kind]``: the lower MFU of the two paper
  steps (a conservative figure for ``rankjax reproduce``'s device-hours:
  ``rankjax._src.train.mfu.measured_mfu``)."""
  path = path or pathlib.Path(__file__).with_name("device_check.json")
  data = json.loads(path.read_text()) if path.is_file() else {}
  values = [s["mfu_spec"] for s in steps if s.get("mfu_spec") and not s.get("variant")]
  if values:
    data.setdefault("train_mfu", {})[device_kind] = min(values)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
  return path


if __name__ == "__main__":
  sys.exit(1 if main().get("failures") else 0)
