"""Figure 2 of the Post-Norm collapse paper: removing alpha * C_n from attention.

At initialization (no training), the Post-Norm stack's attention matrix ``P`` is
replaced by ``P - alpha C_n`` (``TransformerConfig.prefix_avg_removal``, Cor 3.3) for
alpha in [0, 1]. We measure the batch-mean token similarity ``t_sim(X_1^l)`` per layer
and the one-step attention change ``t_sim(Y_1^l) - t_sim(X_1^l)``, and compare the
latter with Corollary 3.3's ``Delta_de(s, t^l, alpha)`` at the measured ``t^l``.
The paper (Fig 2): growth is suppressed uniformly as alpha grows; alpha = 1 removes
most of the increment.

Run:  rankjax reproduce postnorm_collapse --only fig2
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

from . import common
from . import fig1_one_step as fig1
from rankjax import studies
from rankjax.measure import (
    amount_of_attention_postnorm,
    delta_de,
    folded_attention_variance,
    token_similarity,
)
from rankjax.models import DecoderLM
from rankjax.studies import Bound, Claim, claims, measured

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
SCALES: dict[str, dict[str, Any]] = {
    # 10 inits x 1 sequence: one value per init for every claim (at least 10 seeds)
    "quick": {**fig1.SCALES["quick"], "num_inits": 10, "batch": 1},
    "paper": {**fig1.SCALES["paper"], "num_inits": 8, "batch": 1},
    "tiny": {**fig1.SCALES["tiny"], "num_inits": 2, "batch": 1},
}
CLAIMS = claims(common.words([
    Claim("Fig 2: growth suppressed uniformly in alpha", "max over layers l >= 2 and "
          "consecutive alphas of the change in t_sim(X_1^l) (per init)", 0.0, Bound("<"),
          "Sec 4.1: as alpha increases from 0 to 1, token-similarity growth is uniformly "
          "suppressed; alphas 0, 0.25, 0.5, 0.75, 1 (ours: the paper's grid is not stated)"),
    Claim("Fig 2: last-layer similarity falls with alpha", "max over consecutive alphas of "
          "the change in last-layer t_sim(Y_2) (per init)", 0.0, Bound("<"),
          "Sec 4.1: growth suppressed as alpha grows"),
    Claim("Fig 2: alpha = 1 removes most of the increment", "attention increment summed "
          "over layers, alpha = 1 / alpha = 0 (per init)", 0.5, Bound("<"),
          "Sec 4.1: alpha = 1 removes most of the increment ('most' = more than half)"),
], [("uniformly|falls with alpha", {
    "where": "Fig 2", "quote": common.QUOTES["fig2"],
    "note": "'uniformly': at every layer and every step of alpha (the max over them); "
            "judged on the mean over inits, as Cor 3.3 states it of the expected "
            "similarity ('the expected post-attention similarity is monotonically "
            "decreasing in alpha')"}),
    ("removes most", {"where": "Fig 2", "quote": common.QUOTES["fig2"], "ours": True})]))


def measure(cfg: dict[str, Any], alpha: float, seed: int = 0) -> dict[str, np.ndarray]:
  mcfg = fig1.model_config(cfg, "post", 1.0, prefix_avg_removal=alpha)
  model = DecoderLM(mcfg)
  n, d = cfg["seq_len"], cfg["d_model"]
  s_post = amount_of_attention_postnorm(d, folded_attention_variance(d))

  @jax.jit
  def one(key):
    k_init, k_tok = jax.random.split(key)
    tokens = jax.random.randint(k_tok, (cfg["batch"], n), 0, mcfg.vocab_size)
    params = model.init(k_init, tokens)["params"]
    s = common.init_sites(model, params, tokens)
    t1, ty = token_similarity(s["x1"]), token_similarity(s["y1"])
    return dict(tsim_x1=t1, tsim_y2=token_similarity(s["y2"]), attn=ty - t1,
                pred=delta_de(s_post, t1, n, alpha))

  keys = jax.random.split(jax.random.PRNGKey(seed), cfg["num_inits"])
  outs = [jax.device_get(one(k)) for k in keys]
  per_seq = {k: np.concatenate([o[k] for o in outs], axis=1) for k in outs[0]}   # (L, S)
  return {**{k: np.mean(v, axis=1) for k, v in per_seq.items()},
          **{f"{k}_per_seq": v for k, v in per_seq.items()}}


def plot(per_layer: dict[str, dict[str, Any]], cfg: dict[str, Any], scale: str,
         out_dir: str) -> None:
  """``fig2.png`` from the results file's ``per_layer`` (keyed by alpha)."""
  per = {float(a): {k: np.asarray(v) for k, v in m.items()} for a, m in per_layer.items()}
  plt = common.pyplot()
  layers = np.arange(1, cfg["num_layers"] + 1)
  fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
  for i, (a, m) in enumerate(per.items()):
    c = f"C{i}"
    ax[0].plot(layers, m["tsim_x1"], "-", color=c, label=f"alpha={a:g}")
    ax[1].plot(layers, m["attn"], "o", ms=2.5, color=c, label=f"measured alpha={a:g}")
    ax[1].plot(layers, m["pred"], "--", color=c)
  ax[0].set(xlabel="layer", ylabel="t_sim(X_1^l)", title="token similarity at init")
  ax[1].set(xlabel="layer", ylabel="t_sim(Y_1) - t_sim(X_1)",
            title="attention increment (dashed: Cor 3.3)")
  ax[0].legend(fontsize=7)
  fig.suptitle(f"Fig 2 ({scale}): P - alpha C_n, Post-Norm, d={cfg['d_model']}, "
               f"n={cfg['seq_len']}", fontsize=9)
  fig.tight_layout()
  os.makedirs(out_dir, exist_ok=True)
  studies.save_figure(fig, os.path.join(out_dir, "fig2.png"), dpi=120)
  plt.close(fig)


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Measures Fig 2; writes ``fig2.json`` and ``fig2.png``."""
  cfg = SCALES[scale]
  start = time.time()
  per = {a: measure(cfg, a) for a in ALPHAS}
  base = float(np.sum(per[0.0]["attn"]))
  ours = {f"alpha_{a:g}": {
      "tsim_last_layer": float(m["tsim_y2"][-1]),
      "tsim_x1_mean_over_layers": float(m["tsim_x1"].mean()),
      "attn_increment_sum": float(np.sum(m["attn"])),
      "attn_increment_fraction_of_alpha0": float(np.sum(m["attn"]) / base),
      "pred_increment_sum": float(np.sum(m["pred"])),
  } for a, m in per.items()}
  lasts = [ours[f"alpha_{a:g}"]["tsim_last_layer"] for a in ALPHAS]
  ours["last_layer_tsim_monotone_decreasing"] = bool(np.all(np.diff(lasts) <= 0))
  # per init (the same inits at every alpha): "uniformly suppressed" = t_sim(X_1^l) falls
  # from each alpha to the next at every layer l >= 2 (layer 1's input precedes any
  # attention); "alpha = 1 removes most of the increment" = increment sum ratio
  tx = np.stack([per[a]["tsim_x1_per_seq"] for a in ALPHAS])          # (A, L, S)
  ours["per_init"] = {
      "max_step_change_tsim_x1_layers2plus": np.max(np.diff(tx[:, 1:], axis=0),
                                                    axis=(0, 1)).tolist(),
      "max_step_change_tsim_last_layer": np.max(np.diff(np.stack(
          [per[a]["tsim_y2_per_seq"][-1] for a in ALPHAS]), axis=0), axis=0).tolist(),
      "increment_ratio_alpha1_over_alpha0": (per[1.0]["attn_per_seq"].sum(axis=0)
                                             / per[0.0]["attn_per_seq"].sum(axis=0)).tolist()}
  result = {
      "figure": "postnorm_collapse Fig 2 (Sec 4.1, Cor 3.3)",
      "scale": scale,
      "settings": {**{k: v for k, v in cfg.items() if k != "scales"}, "alphas": list(ALPHAS),
                   "norm_position": "post", "init": "paper_collapse", "seed": 0},
      "paper": {"claim": "growth suppressed uniformly in alpha; alpha=1 removes most of it"},
      "ours": ours,
      "per_layer": {f"{a:g}": {k: v.tolist() for k, v in m.items() if not k.endswith("_per_seq")}
                    for a, m in per.items()},
  }
  plot(result["per_layer"], cfg, scale, out_dir)
  result["seconds"] = time.time() - start
  common.write_json(out_dir, "fig2.json", result)
  result["measured"] = measurements(result)
  return result


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: the per-init values of each claim of ``CLAIMS``."""
  pi, note = res["ours"]["per_init"], common.scale_note(res)
  seeds = list(range(len(pi["increment_ratio_alpha1_over_alpha0"])))
  return [measured(item, pi[field], seeds=seeds, note=note) for item, field in (
      ("Fig 2: growth suppressed uniformly in alpha", "max_step_change_tsim_x1_layers2plus"),
      ("Fig 2: last-layer similarity falls with alpha", "max_step_change_tsim_last_layer"),
      ("Fig 2: alpha = 1 removes most of the increment", "increment_ratio_alpha1_over_alpha0"))]
