"""Figures 8 and 9 of the Post-Norm collapse paper: checks of the attention surrogates.

Both figures are measured at initialization (no training) on the paper's Post-Norm
stack (App F: 48 layers, d = 512, d_ff = 1536, 4 heads, n = 2048, standard init),
from one pass over ``num_inits`` random initializations:

* Fig 9 (App F.2): the prefix-averaging approximation ``E[P^l] ~ C_n``, reported as
  ``||E[P^l] - C_n||_F / ||C_n||_F`` per layer. The paper: about 2.7% at layer 1,
  1.2% at layer 48, mean over layers ~2.1%, with 32 initializations.
* Fig 8 (App F.1): the unconditional product proxy
  ``E[P X X^T P^T] ~ E[P] E[X X^T] E[P^T]`` with ``X = X_1^l`` (the attention input),
  reported as ``delta_attn^l`` (relative Frobenius error) and ``delta_proj^l`` (the
  same after ``Pi_1 . Pi_1`` on both sides). The paper gives no numbers, only that
  the error is "small throughout the stack".

Expectations are averages over initializations x sequences x heads (each head's
``P`` is one sample; ``X X^T`` is shared by the heads). Tokens are i.i.d. uniform
over the vocabulary (the paper uses C4 text; see EXPECTED.md). We also record the
batch-mean token similarity of ``X_1^l`` and ``sqrt(E ||P - C_n||_F^2)/||C_n||_F``
(the single-sample error, to separate sampling noise from bias).

Run:  rankjax reproduce postnorm_collapse --only fig8_fig9
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import studies
from rankjax.config import TransformerConfig
from rankjax.measure import prefix_average_matrix, token_similarity
from rankjax.models import DecoderLM
from rankjax.studies import Abs, Bound, Claim, claims, measured

SCALES: dict[str, dict[str, Any]] = {
    # The paper's depth and head count with a narrow, short stack that runs on a
    # laptop CPU in about a minute.
    "quick": dict(num_layers=48, d_model=128, d_ff=384, num_heads=4, seq_len=128,
                  num_inits=32, batch=1, vocab_size=32000),
    # App F: 48 layers, d=512, d_ff=1536, 4 heads, n=2048, 32 initializations
    # (P^l is 48 x 4 x 2048 x 2048 floats per sequence: 14.7 GB peak, 20 min on 2 cores).
    "paper": dict(num_layers=48, d_model=512, d_ff=1536, num_heads=4, seq_len=2048,
                  num_inits=32, batch=1, vocab_size=32000),
    "tiny": dict(num_layers=8, d_model=32, d_ff=96, num_heads=2, seq_len=32,
                 num_inits=2, batch=1, vocab_size=257),
}


# the seeds (independent sets of num_inits initializations): 3 at either scale
SEEDS: dict[str, tuple[int, ...]] = {"quick": (0, 1, 2), "paper": (0, 1, 2), "tiny": (0, 1)}
NOISE_REMOVED = ("Fig 9: ||E[P]-C_n||/||C_n|| with the sampling noise removed, mean "
                 "over layers")
NOISE_FLOOR = "Fig 9: sampling-noise floor of a 32-init mean, mean over layers"
FLOOR_NOTE = ("what this row can show: that our protocol (32 inits x 4 heads, the paper's "
              "32 initializations) gives the paper's printed number; what it cannot: that "
              "E[P^l] is within that distance of C_n, since at 32 inits the measured error "
              "is the sampling noise of the mean (seed 0: noise floor 2.08% against 2.10% "
              "measured, mean over layers; fig9_noise_floor_mean); the approximation itself "
              "is judged by the row with the noise removed")
FLOOR_POST_HOC = ("issue 52: the noise-floor reading was added after the 2.09% 'match' was "
                  "seen to equal its own sampling-noise floor (2.08%)")
CLAIMS = claims(common.words([
    Claim("Fig 9: ||E[P]-C_n||/||C_n||, layer 1", "relative error at layer 1", 0.027,
          Abs(0.0005), "App F.2 prints 2.7% (d=512, n=2048)"),
    Claim("Fig 9: ||E[P]-C_n||/||C_n||, last layer", "relative error at the last layer",
          0.012, Abs(0.0005), "App F.2 prints 1.2%"),
    Claim("Fig 9: ||E[P]-C_n||/||C_n||, mean over layers", "mean over layers of the "
          "relative error", 0.021, Abs(0.0005), "App F.2 prints ~2.1%"),
    Claim("Fig 9: ||E[P]-C_n||/||C_n|| with the sampling noise removed, mean over layers",
          "mean over layers of sqrt((K ||mean P - C_n||^2 - mean ||P - C_n||^2) / (K - 1)) "
          "/ ||C_n||, K = 128 samples, seed 0", 0.021, Bound("<"),
          "App F.2: 'stays small ... directly supporting' E[P] ~ C_n: the deviation of "
          "E[P^l] from C_n itself, the 32-init mean's sampling noise removed, is at most "
          "the paper's 2.1% (heads of one sequence share X, so the K samples are not "
          "fully independent: an estimate)", post_hoc=FLOOR_POST_HOC),
    Claim("Fig 9: sampling-noise floor of a 32-init mean, mean over layers",
          "mean over layers of sqrt(mean ||P - C_n||^2 / K) / ||C_n||, seed 0: the error a "
          "32-init mean shows when E[P] = C_n exactly", 0.021, Abs(0.0005),
          "another reading of the printed 2.1%: the noise of a 32-init mean, which it "
          "equals", kind="sensitivity", post_hoc=FLOOR_POST_HOC),
    Claim("Fig 8: delta_attn small throughout the stack", "max over layers of delta_attn",
          common.SMALL, Bound("<"), "App F.1: small throughout the stack (no numbers); "
          "'small' = below 5%, ours (the paper calls Fig 9's 2.7% small)"),
    Claim("Fig 8: delta_proj small throughout the stack", "max over layers of delta_proj",
          common.SMALL, Bound("<"), "App F.1: small throughout the stack; 'small' = below "
          "5%, ours"),
], [(r"Fig 9: .*(layer 1|last layer|, mean over layers)$",
     {"where": "Fig 9", "quote": common.QUOTES["fig9"], "note": FLOOR_NOTE}),
    ("Fig 9: ", {"where": "Fig 9", "quote": common.QUOTES["fig9"]}),
    ("Fig 8: ", {"where": "Fig 8", "quote": common.QUOTES["fig8"], "ours": True})]))


def model_config(cfg: dict[str, Any], norm_position: str = "post") -> TransformerConfig:
  return TransformerConfig(
      vocab_size=cfg["vocab_size"], num_layers=cfg["num_layers"], d_model=cfg["d_model"],
      num_heads=cfg["num_heads"], d_ff=cfg["d_ff"], max_seq_len=cfg["seq_len"],
      norm_position=norm_position, init="paper_collapse")


def init_statistics(cfg: dict[str, Any], seed: int = 0,
                    norm_position: str = "post") -> dict[str, np.ndarray]:
  """Per-layer sums over initializations of P, X X^T and P X X^T P^T, and counts."""
  mcfg = model_config(cfg, norm_position)
  model = DecoderLM(mcfg)
  n, b = cfg["seq_len"], cfg["batch"]
  c_NxN = prefix_average_matrix(n)

  @jax.jit
  def one(key):
    k_init, k_tok = jax.random.split(key)
    tokens_BxN = jax.random.randint(k_tok, (b, n), 0, mcfg.vocab_size)
    params = model.init(k_init, tokens_BxN)["params"]
    (_, sites), state = model.apply({"params": params}, tokens_BxN, capture=True,
                                    capture_probs=True, mutable=["intermediates"])
    x_LxBxNxD = sites["x1"]
    p_LxBxHxNxN = state["intermediates"]["layers"]["attn"]["attn_probs"][0]
    px = jnp.einsum("lbhqk,lbkd->lbhqd", p_LxBxHxNxN, x_LxBxNxD)
    return dict(
        p=jnp.sum(p_LxBxHxNxN, axis=(1, 2)),
        g=jnp.einsum("lbqd,lbkd->lqk", x_LxBxNxD, x_LxBxNxD),
        pgp=jnp.einsum("lbhqd,lbhkd->lqk", px, px),
        p_err_sq=jnp.sum((p_LxBxHxNxN - c_NxN) ** 2, axis=(1, 2, 3, 4)),
        tsim=jnp.sum(token_similarity(x_LxBxNxD), axis=1),
    )

  keys = jax.random.split(jax.random.PRNGKey(seed), cfg["num_inits"])
  sums = None
  for key in keys:
    out = one(key)
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
  sums = jax.tree.map(lambda a: np.asarray(a, np.float64), sums)
  sums["num_p"] = cfg["num_inits"] * b * cfg["num_heads"]
  sums["num_x"] = cfg["num_inits"] * b
  return sums


def layer_errors(stats: dict[str, Any], n: int) -> dict[str, np.ndarray]:
  """Fig 8's delta_attn, delta_proj and Fig 9's relative error per layer."""
  e_p = stats["p"] / stats["num_p"]
  e_g = stats["g"] / stats["num_x"]
  e_pgp = stats["pgp"] / stats["num_p"]
  proxy = e_p @ e_g @ np.swapaxes(e_p, -1, -2)
  fro = lambda a: np.sqrt(np.sum(a * a, axis=(-2, -1)))
  c = np.asarray(prefix_average_matrix(n), np.float64)
  # ||Pi M Pi||_F = n |mean(M)| for Pi = 11^T / n.
  return dict(
      delta_attn=fro(e_pgp - proxy) / fro(e_pgp),
      delta_proj=np.abs(np.mean(e_pgp - proxy, axis=(-2, -1)))
      / np.abs(np.mean(e_pgp, axis=(-2, -1))),
      prefix_rel_err=fro(e_p - c) / fro(c),
      single_sample_rel_err=np.sqrt(stats["p_err_sq"] / stats["num_p"]) / fro(c),
      # ||E[P] - C_n||^2 without the sampling noise of the mean: with K samples,
      # E||mean - C||^2 = ||bias||^2 + V/K and E||P - C||^2 = ||bias||^2 + V, so
      # ||bias||^2 ~ (K ||mean - C||^2 - mean ||P - C||^2) / (K - 1). Heads of one
      # sequence share X, so the K samples are not fully independent.
      prefix_rel_err_debiased=np.sqrt(np.maximum(
          (stats["num_p"] * fro(e_p - c) ** 2 - stats["p_err_sq"] / stats["num_p"])
          / (stats["num_p"] - 1), 0.0)) / fro(c),
      tsim_x1=stats["tsim"] / stats["num_x"],
  )


def plot(errs: dict[str, Any], cfg: dict[str, Any], scale: str, out_dir: str) -> None:
  """``fig8.png`` and ``fig9.png`` from seed 0's per-layer errors (``errs``: the results
  file's ``per_layer``, arrays or lists) and the scale's settings."""
  errs = {k: np.asarray(v, np.float64) for k, v in errs.items()}
  layers = np.arange(1, cfg["num_layers"] + 1)
  pre = errs["prefix_rel_err"]
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
  ax[0].plot(layers, errs["delta_attn"], "o-", ms=3)
  ax[0].set(xlabel="layer l", ylabel=r"$\delta^l_{attn}$", title=r"Fig 8 left: $\delta_{attn}$")
  ax[1].plot(layers, errs["delta_proj"], "o-", ms=3)
  ax[1].set(xlabel="layer l", ylabel=r"$\delta^l_{proj}$", title=r"Fig 8 right: $\delta_{proj}$")
  for a in ax:
    a.set_ylim(bottom=0)
  fig.suptitle(f"{scale}: d={cfg['d_model']}, n={cfg['seq_len']}, "
               f"{cfg['num_inits']} inits", fontsize=9)
  fig.tight_layout()
  studies.save_figure(fig, os.path.join(out_dir, "fig8.png"), dpi=130)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  ax.plot(layers, pre, "o-", ms=3, label=r"$\|E[P^l]-C_n\|_F/\|C_n\|_F$")
  ax.plot(layers, errs["prefix_rel_err_debiased"], "s-", ms=2, lw=0.8,
          label="sampling noise removed (estimate)")
  floor = errs["single_sample_rel_err"] / np.sqrt(cfg["num_inits"] * cfg["batch"]
                                                   * cfg["num_heads"])
  ax.plot(layers, floor, "-", color="C2", lw=0.8, label="sampling-noise floor of the mean")
  ax.axhline(0.021, color="gray", ls=":", label="paper mean (2.1%)")
  ax.plot([1, cfg["num_layers"]], [0.027, 0.012], "r*", ms=9,
          label="paper: 2.7% (layer 1), 1.2% (layer 48)")
  ax.set(xlabel="layer l", ylabel="relative Frobenius error",
         title=f"Fig 9 ({scale}: d={cfg['d_model']}, n={cfg['seq_len']}, "
               f"{cfg['num_inits']} inits)")
  ax.set_ylim(bottom=0)
  ax.legend(fontsize=8)
  fig.tight_layout()
  studies.save_figure(fig, os.path.join(out_dir, "fig9.png"), dpi=130)
  plt.close(fig)



def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Measures Figs 8 and 9, writes ``fig8_fig9.json``, ``fig8.png`` and ``fig9.png``."""
  cfg = SCALES[scale]
  os.makedirs(out_dir, exist_ok=True)
  start = time.time()
  # at least 3 seeds; each seed is an independent set of num_inits initializations
  # (its own E[P]); the figure and "per_layer" show seed 0, "ours" the per-seed values
  seeds = SEEDS[scale]
  per_seed = [layer_errors(init_statistics(cfg, seed=s), cfg["seq_len"]) for s in seeds]
  errs = per_seed[0]
  pre = errs["prefix_rel_err"]
  by_seed = {
      "fig9_layer1": [float(e["prefix_rel_err"][0]) for e in per_seed],
      "fig9_last_layer": [float(e["prefix_rel_err"][-1]) for e in per_seed],
      "fig9_mean": [float(e["prefix_rel_err"].mean()) for e in per_seed],
      "fig8_delta_attn_max": [float(e["delta_attn"].max()) for e in per_seed],
      "fig8_delta_proj_max": [float(e["delta_proj"].max()) for e in per_seed]}
  result: dict[str, Any] = {
      "figures": "postnorm_collapse Fig 8 (App F.1) and Fig 9 (App F.2)",
      "scale": scale,
      "settings": {**cfg, "norm_position": "post", "init": "paper_collapse",
                   "tokens": "iid uniform over vocab", "seeds": list(seeds)},
      "paper": {"fig9_layer1": 0.027, "fig9_layer48": 0.012, "fig9_mean": 0.021,
                "fig8": "small throughout the stack (no numbers given)"},
      "ours": {
          "fig9_layer1": float(pre[0]), "fig9_last_layer": float(pre[-1]),
          "fig9_mean": float(pre.mean()), "fig9_max": float(pre.max()),
          "fig9_single_sample_mean": float(errs["single_sample_rel_err"].mean()),
          "fig9_noise_floor_mean": float(errs["single_sample_rel_err"].mean()
                                         / np.sqrt(cfg["num_inits"] * cfg["batch"]
                                                   * cfg["num_heads"])),
          "fig9_debiased_mean": float(errs["prefix_rel_err_debiased"].mean()),
          "fig8_delta_attn_mean": float(errs["delta_attn"].mean()),
          "fig8_delta_attn_max": float(errs["delta_attn"].max()),
          "fig8_delta_proj_mean": float(errs["delta_proj"].mean()),
          "fig8_delta_proj_max": float(errs["delta_proj"].max()),
          "tsim_x1_layer1": float(errs["tsim_x1"][0]),
          "tsim_x1_last_layer": float(errs["tsim_x1"][-1]),
          "seeds": list(seeds), "per_seed": by_seed,
      },
      "per_layer": {k: v.tolist() for k, v in errs.items()},
  }

  plot(errs, cfg, scale, out_dir)

  result["seconds"] = time.time() - start
  common.write_json(out_dir, "fig8_fig9.json", result)
  result["measured"] = measurements(result)
  return result


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: the per-seed values of each claim of ``CLAIMS``."""
  o, note = res["ours"], common.scale_note(res)
  ps, seeds = o["per_seed"], o["seeds"]
  note += (f"; each seed averages {res['settings'].get('num_inits')} inits x 4 heads; the "
           "mean's sampling noise is in the results file (fig9_noise_floor_mean)")
  rows = [measured(item, ps[field], seeds=seeds, note=note) for item, field in (
      ("Fig 9: ||E[P]-C_n||/||C_n||, layer 1", "fig9_layer1"),
      ("Fig 9: ||E[P]-C_n||/||C_n||, last layer", "fig9_last_layer"),
      ("Fig 9: ||E[P]-C_n||/||C_n||, mean over layers", "fig9_mean"),
      ("Fig 8: delta_attn small throughout the stack", "fig8_delta_attn_max"),
      ("Fig 8: delta_proj small throughout the stack", "fig8_delta_proj_max"))]
  # seed 0's noise floor and the error with the noise removed (the per-layer values of
  # seed 0 are in the results file)
  for item, field in ((NOISE_REMOVED, "fig9_debiased_mean"), (NOISE_FLOOR,
                                                              "fig9_noise_floor_mean")):
    if field in o:
      rows.append(measured(item, o[field], note=note + "; seed 0"))
  return rows
