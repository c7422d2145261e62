"""Where rankjax's plain step loses to the plain flax step on a CPU.

Same process, alternating rounds, median of steps per round; four programs per shape:
the full update of each side (``train_throughput.versus_plain``'s pair) and the loss
gradient alone (no optimizer, no metrics) of each side, so that
(full - grad) is the optimizer + metrics cost and grad/grad the model's own ratio.

Run:  python experiments/benchmarks/ablate_plain.py [--steps 5] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import optax

import plain_flax
from train_throughput import step_pair
from rankjax._src import config as config_lib
from rankjax._src.train.loop import build

SHAPES = ((128, 4, 8, 512, 128, 16), (256, 4, 4, 1024, 256, 8))


def loss_gradients(pair) -> dict:
  """The loss gradient alone (no optimizer, no metrics) of each side of ``step_pair``'s
  pair: ``{"rj": (jitted, args), "plain": (jitted, args)}`` on the same tokens, where
  ``args()`` reads the side's current parameters (the steps donate and replace them)."""
  cfg, c, holder, tokens = pair["cfg"], pair["compiled"], pair["holder"], pair["tokens"]
  lm = cfg.model
  micro = jax.tree.map(lambda x: x[0], pair["rj_batch"])
  rj_grad = jax.jit(jax.grad(lambda p, b: c.task.loss(p, b, None, deterministic=True)[0]))
  model = plain_flax.PlainLM(lm.vocab_size, lm.d_model, lm.num_heads, lm.d_ff, lm.num_layers,
                             cfg.seq_len)

  def plain_loss(params, toks):
    logits = model.apply({"params": params}, toks[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, toks[:, 1:]).mean()

  return {"rj": (rj_grad, lambda: (holder["rj"].params, micro)),
          "plain": (jax.jit(jax.grad(plain_loss)), lambda: (holder["plain"][0], tokens))}


def programs(shape, variants=()):
  pair = step_pair(shape)
  cfg = pair["cfg"]
  grads = loss_gradients(pair)
  micro = grads["rj"][1]()[1]
  out = {"rj_step": pair["rj"], "plain_step": pair["plain"],
         **{f"{side}_grad": (lambda f=f, a=a: f(*a())) for side, (f, a) in grads.items()}}
  for field, value in variants:      # rankjax's gradient with one TransformerConfig field changed
    vc = build(config_lib.override(cfg, [f"model.{field}={value}"]))   # dotted: kernels.X
    vg = jax.jit(jax.grad(lambda p, b, vc=vc: vc.task.loss(p, b, None, deterministic=True)[0]))
    vp = vc.init().params
    out[f"rj_grad[{field}={value}]"] = lambda vg=vg, vp=vp: vg(vp, micro)
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--variant", action="append", default=[],
                  help="FIELD=VALUE of TransformerConfig (a --set model.FIELD), e.g. "
                       "kernels.attention_impl=einsum, kernels.scan_unroll=8")
  args = ap.parse_args()
  variants = []
  for v in args.variant:
    k, val = v.split("=", 1)
    variants.append((k, val))
  for shape in SHAPES:
    fns = programs(shape, variants)
    for f in fns.values():
      jax.block_until_ready(f()); jax.block_until_ready(f())
    per = {k: [] for k in fns}
    for _ in range(args.rounds):
      for k, f in fns.items():
        ts = []
        for _ in range(args.steps):
          t = time.perf_counter(); jax.block_until_ready(f()); ts.append(time.perf_counter() - t)
        per[k].append(statistics.median(ts))
    best = {k: min(v) for k, v in per.items()}
    print(shape, {k: f"{1e3 * v:.1f} ms" for k, v in best.items()},
          "step ratio plain/rj %.3f" % (best["plain_step"] / best["rj_step"]),
          "grad ratio plain/rj %.3f" % (best["plain_grad"] / best["rj_grad"]),
          {k: "%.3f" % (best["plain_grad"] / v) for k, v in best.items() if k.startswith("rj_grad[")},
          "optimizer+metrics rj %.1f ms plain %.1f ms" % (
              1e3 * (best["rj_step"] - best["rj_grad"]),
              1e3 * (best["plain_step"] - best["plain_grad"])))


if __name__ == "__main__":
  main()
