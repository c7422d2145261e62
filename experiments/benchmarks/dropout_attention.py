"""Attention-probability dropout: the training step with threefry masks over every key
(``attention.blocked_attention``, the default), with hash masks and the hidden key blocks
skipped (``attn_dropout_mask="hash"``: ``attention.causal_dropout_attention``), and
without attention dropout (the fused kernel: XLA's on a CPU, cuDNN's on a GPU).

Two LMs, the training system's compiled step (``rankjax._src.train.loop.build``) on synthetic
tokens: ``quick``, the softmax study's quick config as it trains
(``experiments/softmax_sensitivity/configs/quick.json``: 6 layers, d=64, T=64, batch 16
in 2 micro-batches, float32; T=64 is one query block, so only the masks differ), and
``long``, the same model at T=1024 (4 layers, batch 4, one micro-batch), where 8 query
blocks of 128 rows skip 44% of the square. Sublayer dropout (0.1) stays on in every
variant. Timed in interleaved rounds (each variant the best of ``--reps`` steps per
round), the median over rounds reported, with the load average.

Writes the section ``## Dropout attention`` of RESULTS.md (notes below its marker kept).

Run:  python experiments/benchmarks/dropout_attention.py [--rounds 5] [--reps 3]
      [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import time

import jax
import numpy as np

import common
from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src.models import flash_dropout
from rankjax._src.train import sharding as shard_lib
from rankjax._src.train.loop import build

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICK = ROOT / "experiments" / "softmax_sensitivity" / "configs" / "quick.json"
SECTION = "## Dropout attention"
VARIANTS = {"threefry (every key)": ("model.attn_dropout_mask=threefry",),
            "hash (causal key blocks)": ("model.attn_dropout_mask=hash",),
            "no attention dropout (fused xla)": ("model.attn_dropout_rate=0.0",)}
SHAPES = {"quick": (),
          "long": ("seq_len=1024", "model.max_seq_len=1024", "model.num_layers=4",
                   "batch_size=4", "grad_accum=1")}


def step_fn(cfg: TrainConfig):
  """A closure running one update of ``cfg`` on fixed synthetic tokens."""
  c = build(cfg)
  holder = {"state": c.init()}
  tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size,
                                             (cfg.batch_size, cfg.seq_len + 1)).astype(np.int32)
  batch = shard_lib.global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]},
                                 cfg.grad_accum, c.batch_sharding)

  def one():
    holder["state"], metrics, _ = c.step(holder["state"], batch)
    return metrics
  jax.block_until_ready(one())      # compile
  return one


def best_of(fn, reps: int) -> float:
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t)
  return best


# --- the H200 estimate (FLOP / byte accounting; no device measured it) ----------------
# H200 spec: bf16 dense peak (rankjax._src.train.mfu) and HBM3e bandwidth; the share of each a
# materialized attention block reaches (its dots contract over d_head = 64 only, its
# softmax and mask fusions stream from HBM); INT32 throughput (64 INT32 lanes per SM
# against 128 FP32: half of the 67 TFLOP/s float32 peak).
H200 = dict(peak=989e12, hbm=4.8e12, dot_share=0.5, hbm_share=0.8, int_ops=33.5e12)
# MFU of the 774M step without attention dropout (cuDNN flash), the estimate
BASE_MFU = (0.40, 0.53)
# HBM bytes per element of a block's (B, H, rows, keys) tensors, forward + backward
# (the backward recomputes the block): a softmax fused in one pass per row (XLA GPU's
# Triton softmax rewriter; row <= 1024 fits) -- forward: float32 logits written and read
# (8), bf16 P written and read by P V (4); backward: the recomputed logits and P (10), dP
# written (4), the softmax backward reading dP and the logits (8), bf16 dS written and read
# by dQ and dK (6), P read by dV (2) -- 42; unfused (max, exp-sum and normalize passes
# each reading the float32 logits, dS kept float32): 70.
BYTES_PER_ENTRY = (42, 70)
# uint32 operations per mask entry: threefry-2x32 (20 rounds of add, rotate (3 ops) and
# xor per two words, plus the key injections: ~55 per word) and bernoulli's float
# conversion and compare (~60); the hash (dropout_mask: ~21). Drawn twice (the backward
# recomputes).
MASK_OPS = {"threefry": 60, "hash": 21}
# The fused kernel (``rankjax._src.models.flash_dropout``, GPU default for hash masks): no block
# of logits or probabilities in HBM (flash attention's traffic: q, k, v, O, dO and the row
# statistics, as in the no-dropout step, so none is added); 9 block products over the
# visible key blocks of FLASH_BLOCK (forward QK^T, PV; the backward of JAX's fused Triton
# kernel, which it follows: QK^T, dP, dV, dK per key block and QK^T, dP, dQ per query
# block) against cuDNN's 7; its Triton dots at TRITON_EFF of cuDNN's rate (an assumption:
# untuned blocks of 64, no device measured it); the hash evaluated 3 times per visible
# entry (forward, both backward loops) in the integer units, overlapped with the dots at
# the optimistic end, added at the pessimistic end.
TRITON_EFF = (0.8, 0.4)
FUSED_PRODUCTS = 9


def h200_estimate() -> list[str]:
  """Estimated MFU on one H200 of the softmax study's paper step (micro-batch 16 x 1024
  tokens), per path: the no-dropout step's time at ``BASE_MFU``, less its flash
  attention, plus the materialized blocks' dots (``H200["dot_share"]`` of the peak), HBM
  traffic (``BYTES_PER_ENTRY``) and mask bits (``MASK_OPS``: overlapped with the traffic
  at the optimistic end, added at the pessimistic end); and the fused kernel's
  (``TRITON_EFF``, ``FUSED_PRODUCTS``: its products and hashes, no HBM traffic beyond
  flash attention's)."""
  from experiments.softmax_sensitivity import prepost_training as pt
  from rankjax._src.train import tasks
  cfg = config_lib.override(config_lib.from_json(TrainConfig, pt.CONFIGS["paper"]),
                            pt.SCALE_SETS["paper"])
  lm, b = cfg.model, cfg.batch_size // cfg.grad_accum
  t, layers, heads, dh = cfg.seq_len, lm.num_layers, lm.num_heads, lm.d_head
  flops = b * tasks.make_task(cfg).flops_per_example()          # model FLOPs, micro-batch
  square = b * heads * t * t * layers                            # T x T entries, all layers
  n_blocks = -(-t // 128)
  # flash attention in the no-dropout step: the causal half of QK^T and PV, 3.5 passes
  # (forward 1, backward 2.5 with its recomputation), at the dots' share of the peak
  t_flash = 3.5 * 4 * dh * square / 2 / (H200["dot_share"] * H200["peak"])
  rows = []
  for path, share in (("threefry", 1.0), ("hash", (n_blocks + 1) / (2 * n_blocks))):
    entries = square * share
    t_dots = 7 * 2 * dh * entries / (H200["dot_share"] * H200["peak"])  # 2 fwd + 5 bwd
    t_mask = 2 * MASK_OPS[path] * entries / H200["int_ops"]
    mfus = []
    for base, bpe, add_mask in ((BASE_MFU[1], BYTES_PER_ENTRY[0], False),
                                (BASE_MFU[0], BYTES_PER_ENTRY[1], True)):
      t_bytes = bpe * entries / (H200["hbm_share"] * H200["hbm"])
      t_attn = t_dots + (t_bytes + t_mask if add_mask else max(t_bytes, t_mask))
      t_step = flops / (base * H200["peak"]) - t_flash + t_attn
      mfus.append(flops / t_step / H200["peak"])
    rows.append(f"| {path} (query blocks) | {share:.3f} | {t_dots * 1e3:.0f} | "
                f"{BYTES_PER_ENTRY[0] * entries / 1e9:.0f} - {BYTES_PER_ENTRY[1] * entries / 1e9:.0f} | "
                f"{t_mask * 1e3:.0f} | {min(mfus):.0%} - {max(mfus):.0%} |")
  n_fused = -(-t // flash_dropout.BLOCK)
  share = (n_fused + 1) / (2 * n_fused)
  t_mask = 3 * MASK_OPS["hash"] * square * share / H200["int_ops"]
  mfus, dots_ms = [], []
  for base, eff, add_mask in ((BASE_MFU[1], TRITON_EFF[0], False),
                              (BASE_MFU[0], TRITON_EFF[1], True)):
    t_dots = FUSED_PRODUCTS * 2 * dh * square * share / (eff * H200["dot_share"] * H200["peak"])
    t_attn = t_dots + t_mask if add_mask else max(t_dots, t_mask)
    mfus.append(flops / (flops / (base * H200["peak"]) - t_flash + t_attn) / H200["peak"])
    dots_ms.append(t_dots * 1e3)
  rows.append(f"| hash (fused Pallas kernel, Triton at {TRITON_EFF[0]:g} - {TRITON_EFF[1]:g} "
              f"of cuDNN's rate) | {share:.3f} | {min(dots_ms):.0f} - {max(dots_ms):.0f} | "
              f"none beyond flash attention's | {t_mask * 1e3:.0f} | "
              f"{min(mfus):.0%} - {max(mfus):.0%} |")
  head = (f"Estimate (not a measurement) for one H200, the softmax study's paper step "
          f"(774M, T={t}, micro-batch {b}; {flops / 1e12:.1f} model TFLOP; without "
          f"attention dropout {BASE_MFU[0]:.0%} - {BASE_MFU[1]:.0%} MFU, flash attention "
          f"{t_flash * 1e3:.0f} ms of it): `h200_estimate` in the script states every "
          "assumption.")
  return [head, "", "| masks | share of the T x T square | block dots ms | HBM GB "
          "(42 - 70 B per entry) | mask bits ms | MFU |", "|---|---|---|---|---|---|", *rows]


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--no-write", action="store_true")
  args = parser.parse_args(argv)
  start, load0 = time.time(), common.load_average()
  base = config_lib.from_json(TrainConfig, str(QUICK))
  rows = []
  for shape, sets in SHAPES.items():
    fns = {v: step_fn(config_lib.override(base, (*sets, *vs))) for v, vs in VARIANTS.items()}
    times = {v: [] for v in fns}
    for r in range(args.rounds):
      order = list(fns) if r % 2 == 0 else list(fns)[::-1]
      for v in order:
        times[v].append(best_of(fns[v], args.reps))
    cfg = config_lib.override(base, sets)
    med = {v: float(np.median(ts)) for v, ts in times.items()}
    ref = med["no attention dropout (fused xla)"]
    for v, ts in times.items():
      rows.append(f"| {shape} (T={cfg.seq_len}, L={cfg.model.num_layers}, "
                  f"B={cfg.batch_size}) | {v} | {med[v] * 1e3:.1f} | "
                  f"{min(ts) * 1e3:.1f} - {max(ts) * 1e3:.1f} | {med[v] / ref:.2f} |")
    print("\n".join(rows[-len(times):]), flush=True)
  load1 = common.load_average()
  text = "\n".join([
      SECTION, "",
      f"`experiments/benchmarks/dropout_attention.py`, {datetime.date.today()}: "
      f"{common.machine_name()}; jax {jax.__version__}; load average {load0:.2f} at the "
      f"start, {load1:.2f} at the end; {args.rounds} interleaved rounds, each the best of "
      f"{args.reps} steps; {time.time() - start:.0f} s in all. The softmax study's quick "
      "LM (d=64, 4 heads, sublayer dropout 0.1), its training step; attention dropout 0.1 "
      "with threefry masks over every key (the default), with hash masks skipping the "
      "hidden key blocks (`attn_dropout_mask=hash`), and without attention dropout.", "",
      "| model | attention | step ms (median) | min - max | / no attention dropout |",
      "|---|---|---|---|---|", *rows, "", *h200_estimate(), ""])
  if not args.no_write:
    common.write_section(SECTION, text)
  print(text)
  return text


if __name__ == "__main__":
  main()
