"""Figure 1 of the Post-Norm collapse paper: one-step similarity change per layer.

At initialization (no training), for Post-Norm and Pre-Norm stacks and sublayer
init variance x1, x2, x4 (``TransformerConfig.init_scale``), we measure per layer

  attention:  Delta_attn^l = mean_b [t_sim(Y_1^l) - t_sim(h^l)]
  SwiGLU:     Delta_FFN^l  = mean_b [t_sim(Y_2^l) - t_sim(Z^l)]

where ``h^l`` is the stream the attention skip carries (``X_1^l`` in Post-Norm, the
un-normalized residual in Pre-Norm) and ``Z^l`` is what the FFN skip carries
(``X_2^l`` in Post-Norm, ``Y_1^l`` in Pre-Norm). The predictions are Theorem 3.2
``Delta_attn(s^l, t^l)`` with the measured ``t^l = t_sim(h^l)`` and the amount of
attention ``s^l = n d^2 sigma_W^2 / ||h^l||_F^2`` (Post-Norm: ``d sigma_W^2``), and
Theorem 3.4 ``Delta_FFN(xi^l, t_2^l)`` with ``xi^l = xi n d / ||Z^l||_F^2`` (our Pre-Norm
analogue of ``s^l``; Post-Norm: ``xi``) and ``var_u = init_scale / 3``.

``CLAIMS``: per setting, the signs of the two changes, the layer sums against the
theorems, SwiGLU against attention; Post-Norm against Pre-Norm saturation; Sec 3.1's
1/l decay of the Pre-Norm amount of attention (the policy: ``common``).

Run:  rankjax reproduce postnorm_collapse --only fig1 [--scale paper]
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import studies
from rankjax.config import TransformerConfig
from rankjax.measure import (
    amount_of_attention,
    delta_attn,
    delta_ffn,
    folded_attention_variance,
    swiglu_xi,
    token_similarity,
)
from rankjax.models import DecoderLM
from rankjax.studies import Abs, Bound, Claim, Qualitative, claims, measured

SCALES: dict[str, dict[str, Any]] = {
    # the paper's depth and heads; narrow and short so it runs on a CPU in ~1 minute
    "quick": dict(num_layers=48, d_model=128, d_ff=384, num_heads=4, seq_len=128,
                  num_inits=10, batch=1, vocab_size=32000, scales=(1.0, 2.0, 4.0)),
    # Sec 4: 48 layers, d=512, d_ff=1536, 4 heads, n=2048 (accelerator)
    "paper": dict(num_layers=48, d_model=512, d_ff=1536, num_heads=4, seq_len=2048,
                  num_inits=8, batch=1, vocab_size=32000, scales=(1.0, 2.0, 4.0)),
    # the paper's settings at laptop size (--scale tiny: the code path, not judged)
    "tiny": dict(num_layers=8, d_model=32, d_ff=96, num_heads=2, seq_len=32,
                 num_inits=2, batch=1, vocab_size=257, scales=(1.0, 2.0, 4.0)),
}


# the other reading of "sublayer initialization variance": x4 on W_V, W_O, W_2,
# W_3 only (TransformerConfig.init_scale_to="value_ffn"), beside the headline's x4 on
# every matrix; settings keyed f"{pos}_x4_{ALT_READING}"
ALT_READING = "value_ffn"
# a diagnostic chosen after the x4 over-prediction was seen: the second reading plus the
# logits' W_Q, W_K, or plus the gate's W_1 (FIG1_SPLIT_SETTINGS)
SPLIT_READINGS = ("value_ffn_qk", "value_ffn_gate")
# the readings whose x4 scales the gate's W_1, so Thm 3.4's var_u = init_scale / 3
GATE_SCALED = ("all", "value_ffn_gate")
ORDER_BAND = 0.5   # 'of order 1/l': the slope within half a power of -1
DEEP_FROM = 24     # the deep half's first layer (the 'deep layers' reading of O(1/l))

FIG1_SETTINGS = ("post_x1", "post_x2", "post_x4", "pre_x1", "pre_x2", "pre_x4")
# x4 also under the reading that scales only W_V, W_O, W_2, W_3 (beside the
# headline settings above, which scale every matrix)
FIG1_ALT_SETTINGS = ("post_x4_value_ffn", "pre_x4_value_ffn")
# a diagnostic added after the x4 over-prediction was seen (not a reading of the paper):
# the second reading plus W_Q, W_K (the logits) or plus W_1 (the gate), to separate which
# of the matrices the theorems do not carry moves the measurement away from them
FIG1_SPLIT_SETTINGS = tuple(f"{pos}_x4_value_ffn_{extra}" for pos in ("post", "pre")
                            for extra in ("qk", "gate"))
FIG1_SPLIT_ITEMS = ("attention tracked by Thm 3.2", "SwiGLU tracked by Thm 3.4",
                    "SwiGLU much smaller than attention")
SPLIT_NOTE = ("diagnostic chosen after the outcome: which of W_Q, W_K, W_1 (scaled in the "
              "headline x4, not in the theorems' variances) causes the x4 departures")
_ALT_LABELS = {"value_ffn": " on W_V, W_O, W_2, W_3",
               "value_ffn_qk": " on W_V, W_O, W_2, W_3 and W_Q, W_K",
               "value_ffn_gate": " on W_V, W_O, W_2, W_3 and W_1"}


def _label(key: str) -> str:
  pos, sc, *alt = key.split("_", 2)
  return f"{pos.capitalize()} {sc}" + (_ALT_LABELS[alt[0]] if alt else "")


# the paper's words (Sec 3.1, Sec 4.1, the caption of Figure 1)
Q_ATTN = ("Left column: the attention branch produces a positive one-step increment whose "
          "magnitude is tracked well by Theorem (3.2).")
Q_ATTN_TEXT = ("For both Post-Norm and Pre-Norm, attention produces a positive one-step "
               "increment with strong dependence on layer index. The dashed theorem curves "
               "capture the sign and overall scale of this increment, although a visible "
               "mismatch remains.")
Q_FFN = ("Right column: the SwiGLU feed-forward branch contributes a smaller negative "
         "correction tracked by Theorem (3.4).")
Q_MUCH = ("SwiGLU produces a small damping effect whose magnitude is much smaller than the "
          "attention contribution, so the initial similarity increase is dominated by "
          "attention rather than FFN.")
Q_SAT = "but Post-Norm saturates more quickly"
Q_ORDER = ("the amount of attention is of order $\\mathcal{O}(d\\sigma_{\\mathbf{W}}^{2}/l)$ "
           "and decreases as $l$ increases")
W_ATTN, W_FFN = "Fig 1 (attention)", "Fig 1 (SwiGLU)"
W_MUCH, W_SAT = "Sec 4.1: SwiGLU much smaller", "Sec 4.1: Post-Norm saturates faster"
W_ORDER, W_DECR = "Sec 3.1: Pre-Norm s^l of order 1/l", "Sec 3.1: Pre-Norm s^l decreases"
NO_FIGURE_BAND = ("qualitative with our figure (fig1.png: measured dots, theorem dashed): the "
                  "paper prints no number for 'tracked', its Sec 4.1 says the theorem curves "
                  "'capture the sign and overall scale ... although a visible mismatch "
                  "remains', and its Figure 1 is not in our text copy of the paper, so no band "
                  "can be read off what it resolves; the layer sum measured / theorem is shown, "
                  "not judged (the sign is judged by the 'positive' / 'negative' rows)")
BRANCH = ("the caption and Sec 4.1 speak of the branch: 'the attention branch produces a "
          "positive one-step increment' / 'the SwiGLU ... branch contributes a smaller "
          "negative correction'; the headline is the branch's increment summed over the 48 "
          "layers, of each init")
BRANCH_POST_HOC = ("issue 52's review read the caption's 'the attention branch' as the branch "
                   "as a whole after the every-layer reading (now a sensitivity row) had come "
                   "out as mismatches at Post x2, Pre x4")
HEADLINE_SCALES = 6   # Post / Pre x1, x2, x4: one claim over six settings (Sidak)


def _fig1_claims():
  out = []
  for key in FIG1_SETTINGS + FIG1_ALT_SETTINGS + FIG1_SPLIT_SETTINGS:
    lab = _label(key)
    split = key in FIG1_SPLIT_SETTINGS
    headline = key in FIG1_SETTINGS
    kind = "experiment" if headline else "sensitivity"
    fam = HEADLINE_SCALES if headline else 1
    extra = ("" if headline else SPLIT_NOTE if split else
             "another reading of 'sublayer initialization variance' (x4 on W_V, W_O, W_2, "
             "W_3 only); the headline scales every matrix of the sublayer, as 'we sweep the "
             "sublayer initialization variance' reads")
    cs = [
        Claim(f"Fig 1 {lab}: attention increment positive", "layer sum of the measured "
              "attention increment (per init)", 0.0, Bound(">", every_seed=True),
              BRANCH, where=W_ATTN, quote=Q_ATTN, kind=kind, post_hoc=BRANCH_POST_HOC),
        Claim(f"Fig 1 {lab}: attention increment positive at every layer", "share of "
              "layers with a positive attention increment (per init)", 1.0,
              Bound(">=", every_seed=True),
              "the stricter reading (every layer of every init), beside the headline's "
              "branch sum", where=W_ATTN, quote=Q_ATTN, kind="sensitivity"),
        Claim(f"Fig 1 {lab}: attention tracked by Thm 3.2", "layer sum of the measured "
              "attention increment / Thm 3.2's (per init)", None,
              Qualitative(NO_FIGURE_BAND), "", where=W_ATTN,
              quote=Q_ATTN + " ... " + Q_ATTN_TEXT, kind=kind),
        Claim(f"Fig 1 {lab}: SwiGLU change negative", "layer sum of the measured SwiGLU "
              "change (per init)", 0.0, Bound("<", every_seed=True), BRANCH,
              where=W_FFN, quote=Q_FFN, kind=kind, post_hoc=BRANCH_POST_HOC),
        Claim(f"Fig 1 {lab}: SwiGLU change negative in most layers", "share of layers with "
              "a negative SwiGLU change (per init)", None, Bound(">", limit=0.5),
              "the earlier reading ('in most layers': a share above 1/2, ours), beside the "
              "headline's branch sum", where=W_FFN, quote=Q_FFN, kind="sensitivity"),
        Claim(f"Fig 1 {lab}: SwiGLU tracked by Thm 3.4", "layer sum of the measured SwiGLU "
              "change / Thm 3.4's (per init)", None, Qualitative(NO_FIGURE_BAND.replace(
                  "the theorem curves 'capture the sign and overall scale ... although a "
                  "visible mismatch remains'", "nothing more of Thm 3.4's curves")),
              "", where=W_FFN, quote=Q_FFN, kind=kind),
        Claim(f"Fig 1 {lab}: SwiGLU much smaller than attention", "sum over layers "
              "|SwiGLU change| / |attention increment| (per init)", None,
              Bound("<", limit=common.MUCH_SMALLER),
              "Sec 4.1: 'much smaller'; the limit is ours: an order of magnitude (1/10), "
              "declared before the run", where=W_MUCH, quote=Q_MUCH, kind=kind, family=fam)]
    out += [c if headline else dataclasses.replace(
        c, note="; ".join(x for x in (c.note, "" if split else extra) if x),
        post_hoc=SPLIT_NOTE if split else c.post_hoc)
            for c in cs
            if not split or c.item.split(": ", 1)[1] in FIG1_SPLIT_ITEMS]
  for sc in ("x1", "x2", "x4"):
    out.append(Claim(f"Fig 1 {sc}: Post-Norm saturates faster", "last-layer t_sim(X_1): "
                     "Post minus Pre (per init, the same inits)", 0.0,
                     Bound(">", every_seed=True),
                     "Sec 4.1: Post-Norm saturates more quickly; an ordering of the two "
                     "stacks, judged at every init", where=W_SAT, quote=Q_SAT))
  for sc in ("x1", "x2", "x4"):
    out.append(Claim(f"Sec 3.1 Pre {sc}: s^l of order 1/l", "slope of log s^l on log l, "
                     "layers 1-48 (per init)", -1.0, Abs(ORDER_BAND),
                     "Sec 3.1: O(d sigma_W^2 / l); 'of order 1/l' names the integer power "
                     "of l: the slope within 0.5 of -1, half-way to the neighbouring powers "
                     "l^0 and l^-2 (the band read from the words, not from our outcome; the "
                     "paper has no figure of s^l)", where=W_ORDER, quote=Q_ORDER,
                     reading="every layer", family=3))
    out.append(Claim(f"Sec 3.1 Pre {sc}: s^l of order 1/l in the deep half", "slope of "
                     "log s^l on log l, layers 24-48 (per init)", -1.0, Abs(ORDER_BAND),
                     "Sec 3.1 derives O(1/l) from 'the hidden state's Frobenius norm grows "
                     "linearly with depth': ||h||^2 = a + b l, so the order shows once b l "
                     "outgrows the embedding's a; the same band, over layers 24-48",
                     where=W_ORDER, quote=Q_ORDER, reading="deep layers", family=3,
                     post_hoc="added by issue 52 after the every-layer slope of x1 (-0.20) "
                     "was seen"))
    out.append(Claim(f"Sec 3.1 Pre {sc}: s^l decreases with l", "slope of log s^l on log l, "
                     "layers 1-48 (per init)", 0.0, Bound("<", every_seed=True),
                     "Sec 3.1: 'decreases as l increases': the fitted slope is negative at "
                     "every init", where=W_DECR, quote=Q_ORDER))
  return out


CLAIMS = claims(_fig1_claims())


def model_config(cfg: dict[str, Any], norm_position: str, init_scale: float,
                 prefix_avg_removal: float = 0.0, init_scale_to: str = "all"
                 ) -> TransformerConfig:
  return TransformerConfig(
      vocab_size=cfg["vocab_size"], num_layers=cfg["num_layers"], d_model=cfg["d_model"],
      num_heads=cfg["num_heads"], d_ff=cfg["d_ff"], max_seq_len=cfg["seq_len"],
      norm_position=norm_position, init="paper_collapse", init_scale=init_scale,
      init_scale_to=init_scale_to, prefix_avg_removal=prefix_avg_removal)


def measure(cfg: dict[str, Any], mcfg: TransformerConfig, seed: int = 0
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """Per-layer mean (over inits x sequences) of the measured changes and predictions,
  and the same per sequence, (L, inits x batch)."""
  model = DecoderLM(mcfg)
  n, d = cfg["seq_len"], cfg["d_model"]
  scale = mcfg.init_scale
  sigma_w2 = folded_attention_variance(d) * scale ** 2
  xi = swiglu_xi(d, cfg["d_ff"]) * scale ** 2
  # sigma_W^2 (W_V, W_O) and xi (W_2, W_3) scale under every reading; the gate's
  # pre-activation variance only where W_1 is scaled
  var_u = (scale if mcfg.init_scale_to in GATE_SCALED else 1.0) / 3.0

  @jax.jit
  def one(key):
    k_init, k_tok = jax.random.split(key)
    tokens = jax.random.randint(k_tok, (cfg["batch"], n), 0, mcfg.vocab_size)
    params = model.init(k_init, tokens)["params"]
    s = common.init_sites(model, params, tokens)
    z = s["x2"] if mcfg.norm_position == "post" else s["y1"]
    t_h, t_y1 = token_similarity(s["h"]), token_similarity(s["y1"])
    t_z, t_y2 = token_similarity(z), token_similarity(s["y2"])
    amount = amount_of_attention(s["h"], sigma_w2)                    # (L, B)
    xi_l = xi * n * d / jnp.sum(z * z, axis=(-2, -1))
    pred_attn = delta_attn(amount, t_h, n)
    pred_ffn = delta_ffn(xi_l, t_z, n, var_u)
    return dict(attn=t_y1 - t_h, ffn=t_y2 - t_z, pred_attn=pred_attn, pred_ffn=pred_ffn,
                t_h=t_h, t_z=t_z, amount=amount, tsim_x1=token_similarity(s["x1"]))

  keys = jax.random.split(jax.random.PRNGKey(seed), cfg["num_inits"])
  outs = [jax.device_get(one(k)) for k in keys]
  per_seq = {k: np.concatenate([o[k] for o in outs], axis=1) for k in outs[0]}  # (L, S)
  return {k: np.mean(v, axis=1) for k, v in per_seq.items()}, per_seq


def sequence_spread(per_seq: dict[str, np.ndarray]) -> dict[str, Any]:
  """Per-sequence (one per init at paper scale) summed increments, measured and
  predicted, and their ratio: mean, sd and min-max over the sequences."""
  out = {}
  stats = lambda x: {"mean": float(np.mean(x)), "sd": float(np.std(x, ddof=1)) if len(x) > 1
                     else float("nan"), "min": float(np.min(x)), "max": float(np.max(x))}
  attn, pred = per_seq["attn"].sum(axis=0), per_seq["pred_attn"].sum(axis=0)
  out["attn_sum"], out["pred_attn_sum"] = stats(attn), stats(pred)
  out["attn_sum_ratio"] = stats(attn / pred)
  out["ffn_over_attn_abs_ratio"] = stats(np.abs(per_seq["ffn"]).sum(axis=0)
                                         / np.abs(per_seq["attn"]).sum(axis=0))
  out["tsim_last_layer"] = stats(per_seq["tsim_x1"][-1])
  out["sequences"] = int(attn.shape[0])
  return out


def per_init(per_seq: dict[str, np.ndarray]) -> dict[str, list[float]]:
  """One value per sequence (= per init, batch 1) of each quantity a claim judges:
  the share of layers with a positive attention increment (Thm 3.2's sign) and a
  negative SwiGLU change (Thm 3.4's), the layer sums measured / predicted, |SwiGLU| /
  |attention| summed over layers, the last-layer t_sim(X_1) and the per-layer
  increments (for the Pre-Norm 1/l fit)."""
  a, pa, f, pf = (per_seq[k] for k in ("attn", "pred_attn", "ffn", "pred_ffn"))
  return {"attn_sum": a.sum(axis=0).tolist(), "ffn_sum": f.sum(axis=0).tolist(),
          "attn_positive_share": np.mean(a > 0, axis=0).tolist(),
          "attn_sum_ratio": (a.sum(axis=0) / pa.sum(axis=0)).tolist(),
          "ffn_negative_share": np.mean(f < 0, axis=0).tolist(),
          "ffn_sum_ratio": (f.sum(axis=0) / pf.sum(axis=0)).tolist(),
          "ffn_over_attn_abs_ratio": (np.abs(f).sum(axis=0) / np.abs(a).sum(axis=0)).tolist(),
          "tsim_last_layer": per_seq["tsim_x1"][-1].tolist(),
          "amount": per_seq["amount"].T.tolist()}


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Measures Fig 1; writes ``fig1.json`` and ``fig1.png``."""
  cfg = SCALES[scale]
  start = time.time()
  per: dict[str, dict[str, Any]] = {}
  ours: dict[str, Any] = {}
  settings = [(pos, sc, "all") for pos in ("post", "pre") for sc in cfg["scales"]]
  settings += [(pos, 4.0, to) for pos in ("post", "pre") for to in (ALT_READING,
                                                                   *SPLIT_READINGS)]
  for pos, sc, to in settings:
    m, per_seq = measure(cfg, model_config(cfg, pos, sc, init_scale_to=to))
    key = f"{pos}_x{sc:g}" + ("" if to == "all" else f"_{to}")
    per[key] = {k: v.tolist() for k, v in m.items()}
    rel = lambda a, b: float(np.sum(np.abs(a - b)) / max(np.sum(np.abs(a)), 1e-30))
    ours[key] = {
        "attn_measured_max": float(m["attn"].max()),
        "attn_measured_layer": int(np.argmax(m["attn"]) + 1),
        "attn_predicted_max": float(m["pred_attn"].max()),
        "attn_all_positive": bool(np.all(m["attn"] > 0)),
        "attn_rel_l1_error": rel(m["attn"], m["pred_attn"]),
        "ffn_measured_min": float(m["ffn"].min()),
        "ffn_predicted_min": float(m["pred_ffn"].min()),
        "ffn_frac_negative": float(np.mean(m["ffn"] < 0)),
        "ffn_over_attn_abs_ratio": float(np.sum(np.abs(m["ffn"]))
                                         / max(np.sum(np.abs(m["attn"])), 1e-30)),
        "tsim_last_layer": float(m["tsim_x1"][-1]),
        "spread_over_sequences": sequence_spread(per_seq),
        "per_init": per_init(per_seq),
    }
  result = {
      "figure": "postnorm_collapse Fig 1 (Sec 4.1)",
      "scale": scale,
      "settings": {**{k: v for k, v in cfg.items() if k != "scales"},
                   "init_scales": list(cfg["scales"]), "init": "paper_collapse",
                   "alternative_reading": f"x4 with init_scale_to={ALT_READING!r} "
                   "(W_V, W_O, W_2, W_3 only)",
                   "split_readings": {"value_ffn_qk": "W_V, W_O, W_2, W_3 and W_Q, W_K",
                                      "value_ffn_gate": "W_V, W_O, W_2, W_3 and W_1"},
                   "tokens": "iid uniform over vocab", "seed": 0},
      "paper": {"attn": "positive, layer-dependent, tracked by Thm 3.2 (visible mismatch)",
                "ffn": "small negative, tracked by Thm 3.4",
                "post_vs_pre": "Post-Norm saturates faster; Pre-Norm increments decay slower"},
      "ours": ours,
      "per_layer": per,
  }
  plt = common.pyplot()
  layers = np.arange(1, cfg["num_layers"] + 1)
  fig, ax = plt.subplots(2, 2, figsize=(11, 7))
  colors = {1.0: "C0", 2.0: "C1", 4.0: "C2"}
  for r, pos in enumerate(("post", "pre")):
    series = [(f"{pos}_x{sc:g}", colors.get(sc), f"x{sc:g}") for sc in cfg["scales"]]
    series.append((f"{pos}_x4_{ALT_READING}", "C3", "x4 on W_V, W_O, W_2, W_3"))
    for key, c, lab in series:
      m = per[key]
      ax[r, 0].plot(layers, m["attn"], "o", ms=2.5, color=c, label=f"measured {lab}")
      ax[r, 0].plot(layers, m["pred_attn"], "--", color=c, label=f"Thm 3.2 {lab}")
      ax[r, 1].plot(layers, m["ffn"], "o", ms=2.5, color=c, label=f"measured {lab}")
      ax[r, 1].plot(layers, m["pred_ffn"], "--", color=c, label=f"Thm 3.4 {lab}")
    ax[r, 0].set(title=f"{pos}-norm: attention", xlabel="layer", ylabel="one-step change in t_sim")
    ax[r, 1].set(title=f"{pos}-norm: SwiGLU", xlabel="layer")
    ax[r, 1].axhline(0, color="gray", lw=0.5)
  ax[0, 0].legend(fontsize=7)
  fig.suptitle(f"Fig 1 ({scale}: d={cfg['d_model']}, n={cfg['seq_len']}, "
               f"{cfg['num_inits']}x{cfg['batch']} sequences)", fontsize=9)
  fig.tight_layout()
  os.makedirs(out_dir, exist_ok=True)
  studies.save_figure(fig, os.path.join(out_dir, "fig1.png"), dpi=120)
  plt.close(fig)
  result["seconds"] = time.time() - start
  common.write_json(out_dir, "fig1.json", result)
  result["measured"] = measurements(result)
  return result


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: the value(s) of each claim of ``CLAIMS``, from the result."""
  o, note = res["ours"], common.scale_note(res)
  rows = []
  for key in FIG1_SETTINGS + FIG1_ALT_SETTINGS + FIG1_SPLIT_SETTINGS:
    pi, lab = o[key]["per_init"], _label(key)
    seeds = list(range(len(pi["attn_sum_ratio"])))
    for item, field in (("attention increment positive", "attn_sum"),
                        ("attention increment positive at every layer",
                         "attn_positive_share"),
                        ("attention tracked by Thm 3.2", "attn_sum_ratio"),
                        ("SwiGLU change negative", "ffn_sum"),
                        ("SwiGLU change negative in most layers", "ffn_negative_share"),
                        ("SwiGLU tracked by Thm 3.4", "ffn_sum_ratio"),
                        ("SwiGLU much smaller than attention", "ffn_over_attn_abs_ratio")):
      if f"Fig 1 {lab}: {item}" not in CLAIMS:   # the split settings judge FIG1_SPLIT_ITEMS
        continue
      if field not in pi:     # a results file recorded before the quantity existed
        rows.append(measured(f"Fig 1 {lab}: {item}", float("nan"), note=note, untested=(
            f"the recorded run predates {field!r}; rerun fig1 to measure it")))
        continue
      rows.append(measured(f"Fig 1 {lab}: {item}", pi[field], seeds=seeds,
                           note=f"{note}; seeds = init index"))
  for sc in ("x1", "x2", "x4"):
    diff = np.subtract(o[f"post_{sc}"]["per_init"]["tsim_last_layer"],
                       o[f"pre_{sc}"]["per_init"]["tsim_last_layer"])
    rows.append(measured(f"Fig 1 {sc}: Post-Norm saturates faster",
                         diff.tolist(), seeds=list(range(len(diff))), note=note))
  for sc in ("x1", "x2", "x4"):
    s_SxL = np.asarray(o[f"pre_{sc}"]["per_init"]["amount"], np.float64)
    log_l = np.log(np.arange(1, s_SxL.shape[1] + 1))
    slopes = [float(np.polyfit(log_l, np.log(s), 1)[0]) for s in s_SxL]
    deep = slice(DEEP_FROM - 1, None)
    deep_slopes = [float(np.polyfit(log_l[deep], np.log(s[deep]), 1)[0]) for s in s_SxL]
    seeds = list(range(len(slopes)))
    why = note + ("; s^l from fig1.json (theory.amount_of_attention of the un-normalized "
                  "stream)")
    rows.append(measured(f"Sec 3.1 Pre {sc}: s^l of order 1/l", slopes, seeds=seeds,
                         note=why))
    rows.append(measured(f"Sec 3.1 Pre {sc}: s^l of order 1/l in the deep half",
                         deep_slopes, seeds=seeds, note=why))
    rows.append(measured(f"Sec 3.1 Pre {sc}: s^l decreases with l", slopes, seeds=seeds,
                         note=why))
  return rows
