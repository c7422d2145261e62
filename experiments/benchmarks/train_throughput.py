"""Training throughput: tokens/s, step time and MFU, with and without diagnostics.

For two LMs, the training system's compiled steps (``rankjax._src.train.loop.build``):

* ``small``: the model of ``experiments/configs/lm_tiny_shakespeare.json``;
* ``postnorm48``: the paper's 48-layer d=512 Post-Norm model
  (``experiments/configs/postnorm_48l_d512_c4.json``). On a CPU the sequence length
  and batch are reduced (T=128, B=2, float32) so a step takes seconds; on a GPU/TPU
  it runs at T=2048 in bfloat16 with the config's remat.

Each is timed as the plain step and as the diagnostics step (the built-in "basic"
diagnostic: per-layer gradient and parameter norms, token similarity of every X_k /
Y_k and the gradients with respect to them), on synthetic token batches (the data
pipeline is not timed). MFU = model FLOPs per step (6 per matmul weight + 6 L T d per
token, causal attention at half: ``Task.flops_per_example``; older RESULTS.md rows
counted 6N + 12 L T d) / step time / the peak rate of a large matmul measured
in the same run (float32 on a CPU, the compute dtype on an accelerator). The
diagnostics cost amortized at one diagnostics step per 100 updates is
``(t_diag - t_plain) / (100 * t_plain)`` (target < 10%).

Second part, **rankjax vs plain flax**: rankjax's plain step (``build(cfg).step``)
against the step a user would write (``plain_flax.py``: a nanodo-style model of the same
shape, unrolled blocks, no extras, the same AdamW, schedule and clipping), both on the
same synthetic tokens, timed in alternating rounds in one process; the ratio is
plain-flax time / rankjax time (throughput ratio, target >= 1.0), per round and its
median. Shapes: (D, H, N, F, T, B) = (128, 4, 8, 512, 128, 16) and
(256, 4, 4, 1024, 256, 8), Pre-LayerNorm without bias, GELU, learned positions, tied
embeddings, float32.

Prints the tables and writes the sections ``## Training throughput`` and
``## rankjax vs plain flax`` of ``experiments/benchmarks/RESULTS.md`` (others are kept).

Run:  python experiments/benchmarks/train_throughput.py [--steps 10] [--large-steps 2]
      [--parts diagnostics,plain] [--no-write]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import common
import plain_flax
from common import matmul_peak
from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig, TransformerConfig
from rankjax._src.train import mfu as mfu_lib
from rankjax._src.train import sharding as shard_lib
from rankjax._src.train.loop import build
from rankjax._src.train.tasks import count_params

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(HERE), "configs")
SECTION = "## Training throughput"
PLAIN_SECTION = "## rankjax vs plain flax"
PLAIN_SHAPES = "128,4,8,512,128,16;256,4,4,1024,256,8"   # D, H, N, F, T, B


def model_configs(accelerator: bool) -> dict[str, tuple[TrainConfig, str]]:
  small = config_lib.from_json(TrainConfig, os.path.join(CONFIGS, "lm_tiny_shakespeare.json"))
  paper = config_lib.from_json(TrainConfig, os.path.join(CONFIGS, "postnorm_48l_d512_c4.json"))
  n = jax.device_count()
  if accelerator:
    small = dataclasses.replace(small, batch_size=64 * n, seq_len=64)
    paper = dataclasses.replace(paper, batch_size=4 * n, grad_accum=1)
    note = "T=2048, bf16, remat (config as is), micro-batch 4 per device"
  else:
    paper = dataclasses.replace(paper, batch_size=2, grad_accum=1, seq_len=128,
                                compute_dtype="float32",
                                model=config_lib.override(paper.model, ["kernels.remat=none"]))
    note = "reduced for the CPU: T=128, B=2, float32, no remat"
  small_note = f"config as is (T={small.seq_len}, B={small.batch_size})"
  common = dict(diag_every=1, diagnostics=("basic",))
  return {"small": (dataclasses.replace(small, **common), small_note),
          "postnorm48": (dataclasses.replace(paper, diag_every=1, diagnostics=("basic",),
                                             diag_examples=min(paper.diag_examples, 4)), note)}


def time_steps(fns: dict, state, batch, steps: int, rounds: int = 3):
  """Median seconds per call of each step function, timed in alternating rounds.

  Two warm-up calls each (the first compiles); then ``rounds`` rounds of ``steps``
  calls of every function in turn, so a change in the machine's load hits all alike.
  """
  times = {name: [] for name in fns}
  for fn in fns.values():
    for _ in range(2):
      state, metrics, diag = fn(state, batch)
      jax.block_until_ready((state, metrics, diag))
  loss = float(metrics["loss"])
  for _ in range(rounds):
    for name, fn in fns.items():
      for _ in range(steps):
        t = time.perf_counter()
        state, metrics, diag = fn(state, batch)
        jax.block_until_ready((state, metrics, diag))
        times[name].append(time.perf_counter() - t)
  return {name: statistics.median(v) for name, v in times.items()}, loss


def bench(name: str, cfg: TrainConfig, steps: int, peak: float) -> dict:
  c = build(cfg)
  state = c.init()
  n_params = count_params(state.params)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 257, size=(cfg.batch_size, cfg.seq_len + 1)).astype(np.int32)
  batch = shard_lib.global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]},
                                 cfg.grad_accum, c.batch_sharding)
  t, loss = time_steps({"plain": c.step, "diag": c.diag_step}, state, batch, steps)
  t_plain, t_diag = t["plain"], t["diag"]
  flops = c.task.flops_per_example() * cfg.batch_size
  tokens_per_step = cfg.batch_size * cfg.seq_len
  return dict(
      name=name, batch=cfg.batch_size, seq_len=cfg.seq_len, params=n_params,
      t_plain=t_plain, t_diag=t_diag, tokens_s=tokens_per_step / t_plain,
      tokens_s_diag=tokens_per_step / t_diag, mfu=flops / t_plain / peak,
      mfu_diag=flops / t_diag / peak, loss=loss, steps=steps,
      mfu_spec=mfu_lib.mfu(flops, t_plain, jax.device_count(),
                           mfu_lib.local_spec_peak(cfg.compute_dtype)),
      diag_ratio=t_diag / t_plain, amortized=(t_diag - t_plain) / (100 * t_plain))


def plain_config(d: int, heads: int, layers: int, d_ff: int, seq_len: int, batch: int) -> TrainConfig:
  """rankjax's config of the plain-flax comparison model (see ``plain_flax.py``)."""
  lm = TransformerConfig(vocab_size=257, num_layers=layers, d_model=d, num_heads=heads,
                         d_ff=d_ff, max_seq_len=seq_len, norm_position="pre", norm_op="layer",
                         ffn="gelu", pos_embedding="learned", init="gpt2", tie_embeddings=True)
  return TrainConfig(model=lm, batch_size=batch, seq_len=seq_len, warmup_steps=10,
                     total_steps=1000, diag_every=0)


def step_pair(shape: tuple[int, ...]) -> dict:
  """rankjax's plain step and the plain flax step at one shape, on the same tokens:
  ``{"cfg", "compiled", "holder", "rj", "plain", "rj_batch", "tokens"}``, where ``rj()``
  and ``plain()`` run one update each on the states kept in ``holder``."""
  d, heads, layers, d_ff, seq_len, batch = shape
  cfg = plain_config(*shape)
  c = build(cfg)
  tokens = np.random.default_rng(0).integers(0, 257, (batch, seq_len + 1)).astype(np.int32)
  rj_batch = shard_lib.global_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]},
                                    1, c.batch_sharding)
  init, plain_step = plain_flax.make(257, d, heads, d_ff, layers, seq_len, cfg.learning_rate,
                                     cfg.warmup_steps, cfg.total_steps, cfg.clip_norm,
                                     cfg.weight_decay)
  plain_tokens = jax.numpy.asarray(tokens)
  holder = {"rj": c.init(), "plain": init(jax.random.key(0))}

  def rj():
    holder["rj"], metrics, _ = c.step(holder["rj"], rj_batch)
    return metrics

  def plain():
    holder["plain"], loss = plain_step(holder["plain"], plain_tokens)
    return loss

  return dict(cfg=cfg, compiled=c, holder=holder, rj=rj, plain=plain, rj_batch=rj_batch,
              tokens=plain_tokens)


def versus_plain(shape: tuple[int, ...], steps: int, rounds: int) -> dict:
  """rankjax's plain step vs the plain flax step at one shape, alternating rounds."""
  pair = step_pair(shape)
  rj, plain = pair["rj"], pair["plain"]
  for fn in (rj, plain, rj, plain):   # compile and warm up
    jax.block_until_ready(fn())
  per_round = []
  for _ in range(rounds):
    # the two steps alternate one by one within a round, so that the machine's drift
    # (seconds) hits both sides alike; each round's ratio is of the two medians
    ts = {"rj": [], "plain": []}
    for _ in range(steps):
      for name, fn in (("rj", rj), ("plain", plain)):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts[name].append(time.perf_counter() - t)
    per_round.append({name: statistics.median(v) for name, v in ts.items()})
  ratios = [r["plain"] / r["rj"] for r in per_round]
  return dict(shape=shape, rj=min(r["rj"] for r in per_round),
              plain=min(r["plain"] for r in per_round), ratios=ratios,
              median_ratio=statistics.median(ratios))


def plain_markdown(rows: list[dict], steps: int, rounds: int) -> str:
  lines = [PLAIN_SECTION, "",
           f"Machine: {common.machine_name()}, jax {jax.__version__} ({jax.default_backend()}); "
           f"1-minute load average at the end {common.load_average():.1f}.",
           f"Command: `python experiments/benchmarks/train_throughput.py --parts plain "
           f"--plain-steps {steps} --rounds {rounds}`. rankjax's plain step "
           "(`build(cfg).step`) against `plain_flax.py` (nanodo-style, unrolled blocks, same "
           "AdamW / schedule / clipping), same tokens; each round alternates the two steps one by "
           f"one ({steps} steps each, median); ratio = plain-flax time / rankjax time (>= 1: rankjax at "
           "least as fast; target >= 1.0).", "",
           "| D, H, N, F, T, B | rankjax step (best round) | plain flax step | "
           "ratio, median round (min-max) |", "|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {', '.join(map(str, r['shape']))} | {r['rj'] * 1e3:.1f} ms | "
                 f"{r['plain'] * 1e3:.1f} ms | {r['median_ratio']:.3f} "
                 f"({min(r['ratios']):.3f}-{max(r['ratios']):.3f}) |")
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=10,
                      help="timed steps per round and variant for the small model (3 rounds)")
  parser.add_argument("--large-steps", type=int, default=2,
                      help="the same for the 48-layer model")
  parser.add_argument("--models", default="small,postnorm48")
  parser.add_argument("--parts", default="diagnostics,plain",
                      help="diagnostics (the diagnostics-cost table), plain (vs plain flax)")
  parser.add_argument("--plain-steps", type=int, default=5,
                      help="timed steps per round and side in the plain-flax comparison")
  parser.add_argument("--rounds", type=int, default=5, help="rounds of the plain-flax comparison")
  parser.add_argument("--plain-shapes", default=PLAIN_SHAPES,
                      help="';'-separated D,H,N,F,T,B shapes of the plain-flax comparison")
  parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
  args = parser.parse_args()
  parts = args.parts.split(",")
  if "plain" in parts:
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.plain_shapes.split(";")]
    rows = [versus_plain(shape, args.plain_steps, args.rounds) for shape in shapes]
    for r in rows:
      print(f"{r['shape']}: rankjax {r['rj'] * 1e3:.1f} ms, plain flax {r['plain'] * 1e3:.1f} ms, "
            f"ratio {r['median_ratio']:.3f} (rounds {', '.join(f'{x:.3f}' for x in r['ratios'])})",
            flush=True)
    text = plain_markdown(rows, args.plain_steps, args.rounds)
    print(text)
    if not args.no_write:
      common.write_section(PLAIN_SECTION, text)
  if "diagnostics" not in parts:
    return

  accelerator = jax.default_backend() != "cpu"
  peak_dtype = jnp.bfloat16 if accelerator else jnp.float32
  peak_n = 8192 if accelerator else 2048
  peaks = [matmul_peak(peak_dtype, peak_n)]
  configs = model_configs(accelerator)
  rows = []
  for name in args.models.split(","):
    cfg, note = configs[name]
    row = bench(name, cfg, args.large_steps if name == "postnorm48" else args.steps, peaks[0])
    row["note"] = note
    rows.append(row)
    peaks.append(matmul_peak(peak_dtype, peak_n))
  peak = max(peaks)   # the best rate seen: MFU is then a lower bound on a loaded machine
  for row in rows:
    row["mfu"] *= peaks[0] / peak
    row["mfu_diag"] *= peaks[0] / peak
    print(f"{row['name']}: plain {row['t_plain'] * 1e3:.1f} ms ({row['tokens_s']:.4g} tok/s, MFU "
          f"{row['mfu']:.1%}), diagnostics {row['t_diag'] * 1e3:.1f} ms (x{row['diag_ratio']:.2f}),"
          f" amortized at 1/100: {row['amortized']:.2%}", flush=True)

  machine = common.machine_name()
  load = common.load_average()
  lines = [
      SECTION, "",
      f"Machine: {machine}, jax {jax.__version__} ({jax.default_backend()}); 1-minute load "
      f"average at the end {load:.1f} (a shared machine: times are upper bounds).",
      f"Command: `python experiments/benchmarks/train_throughput.py --steps {args.steps} "
      f"--large-steps {args.large_steps}`. Peak: {peak / 1e9:.1f} GFLOP/s, the best "
      f"{np.dtype(peak_dtype).name} {peak_n}^2 matmul seen in the same run (measured before "
      "and after each model; "
      f"{', '.join(f'{p / 1e9:.1f}' for p in peaks)} GFLOP/s). Synthetic token batches "
      "(the input pipeline is not timed); step times are medians over 3 rounds that "
      "alternate the plain and the diagnostics step; diagnostics = the built-in `basic` "
      "diagnostic in the second compiled step variant.", "",
      "| model | params | batch x T | plain step | tokens/s | MFU (measured peak) | "
      "MFU (spec peak) | diagnostics step | diag / plain | amortized at 1 per 100 |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
        f"| {r['name']} ({r['note']}) | {r['params'] / 1e6:.2f}M | {r['batch']} x {r['seq_len']} "
        f"| {r['t_plain'] * 1e3:.1f} ms | {r['tokens_s']:.4g} | {r['mfu']:.1%} "
        f"| {'n/a' if r['mfu_spec'] is None else format(r['mfu_spec'], '.1%')} "
        f"| {r['t_diag'] * 1e3:.1f} ms ({r['tokens_s_diag']:.4g} tok/s) "
        f"| {r['diag_ratio']:.2f} | {r['amortized']:.2%} |")
  lines += ["", "Target: diagnostics amortized at one step per 100 under 10% of a plain step. "
            "The 40% MFU target for the 48-layer d=512 model applies to a GPU/TPU; this table "
            "is from the machine named above." + (" No accelerator was available for this run."
                                                  if not accelerator else ""), ""]
  text = "\n".join(lines)
  print(text)
  if not args.no_write:
    common.write_section(SECTION, text)
    print(f"wrote {SECTION!r} to {common.RESULTS}")


if __name__ == "__main__":
  main()
