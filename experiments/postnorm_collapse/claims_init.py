"""The claims of the Post-Norm collapse paper's initialization-time figures (Figs 1, 2,
7, 8, 9), declared before anything runs, and the rows their results give.

How a row is judged is the one policy of EXPECTED.md ("How rows are judged"), written
here as the constants below (decided from the paper's wording and printed precision,
not from our outcomes):

- a number the paper prints, below 0.1 in size: ``Abs`` of half a unit of its last
  printed digit (Fig 7's m(0) ~ 0.006: 5e-4; Fig 9's 2.7%: 5e-4); otherwise ``Rel(0.05)``
  (Fig 7's m(1) ~ 0.100);
- "tracked (well) by Theorem X": the layer sum of the measured change over the
  theorem's within 25% of 1 (``Rel(TRACKS)``);
- "much smaller": at most a tenth (``MUCH_SMALLER``, an order of magnitude);
- "small" (a relative deviation): below 5% (``SMALL``; the paper calls Fig 9's <= 2.7% close);
- "approximately linear": R^2 of the linear fit >= 0.99 (``LINEAR_R2``);
- "most": a share above one half; "positive"/"negative"/"increasing": the sign.

Several seeds are judged on their mean's 95% interval (``rankjax.studies.evidence``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rankjax.studies import evidence
from rankjax.studies.evidence import Abs, Bound, Claim, Rel

TRACKS = 0.25
MUCH_SMALLER = 0.1
SMALL = 0.05
LINEAR_R2 = 0.99
FIG1_SETTINGS = ("post_x1", "post_x2", "post_x4", "pre_x1", "pre_x2", "pre_x4")
# issue 25: x4 also under the reading that scales only W_V, W_O, W_2, W_3 (beside the
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


def _fig1_claims():
  out = []
  for key in FIG1_SETTINGS + FIG1_ALT_SETTINGS + FIG1_SPLIT_SETTINGS:
    lab = _label(key)
    split = key in FIG1_SPLIT_SETTINGS
    out += [c if not split else dataclasses.replace(c, note=f"{c.note}; {SPLIT_NOTE}")
            for c in [
        Claim(f"Fig 1 {lab}: attention increment positive", "share of layers with a "
              "positive attention increment (per init)", 1.0, Bound(">="),
              "caption: the attention branch produces a positive one-step increment"),
        Claim(f"Fig 1 {lab}: attention tracked by Thm 3.2", "layer sum of the measured "
              "attention increment / Thm 3.2's (per init)", 1.0, Rel(TRACKS),
              "caption: magnitude tracked well by Theorem 3.2; 'tracked' = within 25%"),
        Claim(f"Fig 1 {lab}: SwiGLU change negative", "share of layers with a negative "
              "SwiGLU change (per init)", 0.5, Bound(">"),
              "caption: a smaller negative correction; judged as 'in most layers'"),
        Claim(f"Fig 1 {lab}: SwiGLU tracked by Thm 3.4", "layer sum of the measured SwiGLU "
              "change / Thm 3.4's (per init)", 1.0, Rel(TRACKS),
              "caption: tracked by Theorem 3.4; 'tracked' = within 25%"),
        Claim(f"Fig 1 {lab}: SwiGLU much smaller than attention", "sum over layers "
              "|SwiGLU change| / |attention increment| (per init)", MUCH_SMALLER,
              Bound("<"), "Sec 4.1: magnitude much smaller than the attention "
              "contribution; 'much smaller' = at most a tenth")]
            if not split or c.item.split(": ", 1)[1] in FIG1_SPLIT_ITEMS]
  for sc in ("x1", "x2", "x4"):
    out.append(Claim(f"Fig 1 {sc}: Post-Norm saturates faster", "last-layer t_sim(X_1): "
                     "Post minus Pre (per init, the same inits)", 0.0, Bound(">"),
                     "Sec 4.1: Post-Norm saturates more quickly"))
  for sc in ("x1", "x2", "x4"):   # issue 25 item 7
    out.append(Claim(f"Sec 3.1 Pre {sc}: s^l of order 1/l", "slope of log s^l on log l, "
                     "layers 1-48 (per init)", -1.0, Rel(TRACKS),
                     "Sec 3.1: in Pre-Norm the amount of attention is O(d sigma_W^2 / l); "
                     "'of order' = the slope within 25% of -1"))
  return out


FIG1 = evidence.claims(_fig1_claims())
FIG2 = evidence.claims([
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
])
FIG7 = evidence.claims([
    Claim("Fig 7: m(0)", "m(0) (Gauss-Hermite quadrature)", 0.006, Abs(0.0005),
          "App C.4 prints ~0.006; half its last digit"),
    Claim("Fig 7: m(1)", "m(1)", 0.100, Rel(0.05), "App C.4 prints ~0.100"),
    Claim("Fig 7: xi m(1), xi = 1/9", "xi m(1)", 0.011, Abs(0.0005),
          "App C.4 prints ~0.011; half its last digit"),
    Claim("Fig 7: m increasing on [0, 1]", "min over the grid of m(rho_i+1) - m(rho_i)",
          0.0, Bound(">"), "App C.4: m is increasing"),
    Claim("Fig 7: rho m(rho) increasing on [0, 1]", "min over the grid of the step of "
          "rho m(rho)", 0.0, Bound(">"), "App C.4: rho m(rho) is increasing"),
    Claim("Fig 7: m approximately linear", "R^2 of a linear fit of m on [0, 1]", LINEAR_R2,
          Bound(">="), "App C.4: approximately linear; read as R^2 >= 0.99"),
])
FIG8_FIG9 = evidence.claims([
    Claim("Fig 9: ||E[P]-C_n||/||C_n||, layer 1", "relative error at layer 1", 0.027,
          Abs(0.0005), "App F.2 prints 2.7% (d=512, n=2048)"),
    Claim("Fig 9: ||E[P]-C_n||/||C_n||, last layer", "relative error at the last layer",
          0.012, Abs(0.0005), "App F.2 prints 1.2%"),
    Claim("Fig 9: ||E[P]-C_n||/||C_n||, mean over layers", "mean over layers of the "
          "relative error", 0.021, Abs(0.0005), "App F.2 prints ~2.1%"),
    Claim("Fig 8: delta_attn small throughout the stack", "max over layers of delta_attn",
          SMALL, Bound("<"), "App F.1: small throughout the stack (no numbers); 'small' = "
          "below 5%"),
    Claim("Fig 8: delta_proj small throughout the stack", "max over layers of delta_proj",
          SMALL, Bound("<"), "App F.1: small throughout the stack; 'small' = below 5%"),
])


def _scale_note(res: dict[str, Any]) -> str:
  s = res.get("settings", {})
  return (f"{res.get('scale')} scale: d={s.get('d_model')}, n={s.get('seq_len')}, "
          f"{s.get('num_layers')} layers")


def fig1_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
  o, note = res["ours"], _scale_note(res)
  rows = []
  for key in FIG1_SETTINGS + FIG1_ALT_SETTINGS + FIG1_SPLIT_SETTINGS:
    pi, lab = o[key]["per_init"], _label(key)
    seeds = list(range(len(pi["attn_sum_ratio"])))
    for item, field in (("attention increment positive", "attn_positive_share"),
                        ("attention tracked by Thm 3.2", "attn_sum_ratio"),
                        ("SwiGLU change negative", "ffn_negative_share"),
                        ("SwiGLU tracked by Thm 3.4", "ffn_sum_ratio"),
                        ("SwiGLU much smaller than attention", "ffn_over_attn_abs_ratio")):
      if f"Fig 1 {lab}: {item}" in FIG1:     # the split settings judge FIG1_SPLIT_ITEMS
        rows.append(FIG1[f"Fig 1 {lab}: {item}"].judge(pi[field], seeds=seeds,
                                                       note=f"{note}; seeds = init index"))
  for sc in ("x1", "x2", "x4"):
    diff = np.subtract(o[f"post_{sc}"]["per_init"]["tsim_last_layer"],
                       o[f"pre_{sc}"]["per_init"]["tsim_last_layer"])
    rows.append(FIG1[f"Fig 1 {sc}: Post-Norm saturates faster"].judge(
        diff.tolist(), seeds=list(range(len(diff))), note=note))
  for sc in ("x1", "x2", "x4"):
    s_SxL = np.asarray(o[f"pre_{sc}"]["per_init"]["amount"], np.float64)
    log_l = np.log(np.arange(1, s_SxL.shape[1] + 1))
    slopes = [float(np.polyfit(log_l, np.log(s), 1)[0]) for s in s_SxL]
    rows.append(FIG1[f"Sec 3.1 Pre {sc}: s^l of order 1/l"].judge(
        slopes, seeds=list(range(len(slopes))), note=note + "; s^l from fig1.json "
        "(theory.amount_of_attention of the un-normalized stream)"))
  return rows


def fig2_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
  pi, note = res["ours"]["per_init"], _scale_note(res)
  seeds = list(range(len(pi["increment_ratio_alpha1_over_alpha0"])))
  return [FIG2[item].judge(pi[field], seeds=seeds, note=note) for item, field in (
      ("Fig 2: growth suppressed uniformly in alpha", "max_step_change_tsim_x1_layers2plus"),
      ("Fig 2: last-layer similarity falls with alpha", "max_step_change_tsim_last_layer"),
      ("Fig 2: alpha = 1 removes most of the increment", "increment_ratio_alpha1_over_alpha0"))]


def fig7_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
  o = res["ours"]
  note = "deterministic (quadrature); Monte Carlo agreement is in the results file"
  return [FIG7["Fig 7: m(0)"].judge(o["m0"], note=note),
          FIG7["Fig 7: m(1)"].judge(o["m1"], note=note),
          FIG7["Fig 7: xi m(1), xi = 1/9"].judge(o["xi_m1"], note=note),
          FIG7["Fig 7: m increasing on [0, 1]"].judge(o["min_step_m"]),
          FIG7["Fig 7: rho m(rho) increasing on [0, 1]"].judge(o["min_step_rho_m"]),
          FIG7["Fig 7: m approximately linear"].judge(o["linear_fit"]["r2"])]


def fig8_fig9_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
  o, note = res["ours"], _scale_note(res)
  ps, seeds = o["per_seed"], o["seeds"]
  note += (f"; each seed averages {res['settings'].get('num_inits')} inits x 4 heads; the "
           "mean's sampling noise is in the results file (fig9_noise_floor_mean)")
  return [FIG8_FIG9[item].judge(ps[field], seeds=seeds, note=note) for item, field in (
      ("Fig 9: ||E[P]-C_n||/||C_n||, layer 1", "fig9_layer1"),
      ("Fig 9: ||E[P]-C_n||/||C_n||, last layer", "fig9_last_layer"),
      ("Fig 9: ||E[P]-C_n||/||C_n||, mean over layers", "fig9_mean"),
      ("Fig 8: delta_attn small throughout the stack", "fig8_delta_attn_max"),
      ("Fig 8: delta_proj small throughout the stack", "fig8_delta_proj_max"))]


CLAIMS = {"fig1": FIG1, "fig2": FIG2, "fig7": FIG7, "fig8_fig9": FIG8_FIG9}
ROWS = {"fig1": fig1_rows, "fig2": fig2_rows, "fig7": fig7_rows, "fig8_fig9": fig8_fig9_rows}
