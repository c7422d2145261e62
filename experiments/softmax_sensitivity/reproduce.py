"""Every experiment of the softmax-sensitivity paper: ``STUDY`` for ``rankjax.studies.runner``.

Scripts (each ``run(out_dir, scale) -> dict``, output in ``out_dir/<name>/``):
  lemma_checks          Lemmas 2.3 / 2.4 / A.2 (i-iii), Remarks 3.3 / B.1, Thm 4.5's
                        example on random draws
  theorem_check         Theorem 3.2 at L in {8, 16}, greedy certificate (App D.2)
  certificates_large_L  certificates at L up to 1024 (Fig 2)
  prepost_training      Pre-LN vs Post-LN early training (Fig 1, Table 1, Fig 3, Fig 4);
                        also at ``--scale quick_paper_lr`` (the paper's rate 3e-4) and
                        ``--scale quick_sharpen`` (800 updates, 3 seeds; chosen
                        after seed 42's outcome, no committed results)
  trained_bounds        Thm 4.1 vs measured MHA Jacobian norms and Lemma A.2(iv) / Cor A.3
                        on the trained prepost checkpoints (seeds 42, 123, 456)

At ``--scale paper`` and ``tiny`` the runner trains the six runs of both training
experiments (``prepost_training.runs``: 2 placements x seeds 42, 123, 456 of
``experiments/configs/gpt2_774m.json``, through ``rankjax.studies.training.tiny`` at tiny)
into ``prepost_training/runs/`` before any experiment runs; the two experiments share
that folder, so ``trained_bounds`` reads the same runs. Paper scale reads the paper's
FineWeb from the directory named by the env var ``RANKJAX_FINEWEB`` (text or
ArrayRecord files) and refuses before anything runs without it. ``tiny``: every
experiment's paper path shrunk (rows of status tiny).

Each experiment's claims (``evidence.Claim``: item, quantity, the paper's number, the
rule) are declared below at import, before anything runs; the row functions only
measure and call ``judge``. The rules follow one policy (the constants below and
EXPECTED.md, "How rows are judged").

Run:  python -m experiments.softmax_sensitivity.reproduce --out runs/softmax --scale quick
      [--only theorem_check,prepost_training]
      RANKJAX_FINEWEB=/data/fineweb python -m experiments.softmax_sensitivity.reproduce \
          --out runs/softmax_paper --scale paper
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from rankjax.studies import evidence, runner
from rankjax.studies.evidence import Abs, Bound, Claim, OneMinus, Qualitative, Rel
from . import prepost_training

SCRIPTS = ("theorem_check", "certificates_large_L", "prepost_training", "trained_bounds",
           "lemma_checks")

# How rows are judged (EXPECTED.md, "How rows are judged"), fixed before any run from
# the paper's printed precision and the kind of quantity, never from our outcomes:
REL = Rel(0.05)            # a printed number away from 0 and 1: 5% relative
NEAR_ONE = OneMinus(0.25)  # a quantity bounded by 1 printed >= 0.9: 25% relative on 1 - x
FRACTION_FLOOR = 0.005     # near 0 (< 0.05): shares of samples, half a percentage point
P_MAX_FLOOR = 0.0005       # near 0: attention weights, half the paper's last digit (0.010)
COUNT_TOL = Abs(0.5)       # a count of seeds: half a unit
# several seeds are judged on their mean's 95% interval (rankjax.studies.evidence); worded claims are
# Bound predicates on the measured values; identities are Bound("<", the paper's limit).

SCALE_NOTE = {"quick": "quick scale: 6-layer d=64 LM, 200 updates, byte-level Shakespeare, "
                       "not GPT-2 774M on FineWeb",
              "quick_paper_lr": "quick_paper_lr: the quick LM at the paper's peak rate 3e-4 "
                                "(200 updates, byte-level Shakespeare), not GPT-2 774M",
              "quick_sharpen": "quick_sharpen: the quick LM run 800 updates; chosen after "
                               "seed 42's outcome (EXPECTED.md), not the preregistered setting",
              "tiny": "tiny: the 774M config shrunk by rankjax.studies.training.tiny (4 layers, "
                      "d=32, 24 updates, byte-level Shakespeare): not judged"}
LOSS_UNITS = ("the paper's loss is per GPT-2 BPE token of FineWeb, ours per byte of "
              "Shakespeare at quick scale: not the same unit")

THEOREM = evidence.claims([
    Claim("App D.2 / Thm 3.2, L = 8", "max |LHS - RHS| / RHS over the vectors, tau = 1",
          1e-13, Bound("<", every_seed=True), "paper: below 1e-13 over 500 vectors"),
    Claim("App D.2 / Thm 3.2, L = 16", "max |LHS - RHS| / RHS over the vectors, tau = 1",
          1e-13, Bound("<", every_seed=True), "paper: below 1e-13 over 500 vectors"),
    Claim("App D.2, L = 8: greedy certificate = exact theta",
          "share of vectors, mean over seeds", 0.178, REL,
          "paper: one draw of 500 vectors"),
    Claim("App D.2, L = 16: greedy certificate = exact theta",
          "share of vectors, mean over seeds", 0.026, Abs(max(0.0005, FRACTION_FLOOR)),
          "paper: one draw of 500 vectors"),
    Claim("App D.2: worst gap theta - theta_cert", "max over L in {8, 16}, mean over seeds",
          0.11, REL, "paper: ~0.11"),
])

CERTIFICATES = evidence.claims([
    Claim(f"Fig 2, L = {L}: greedy certificate", "median over the distributions, per seed",
          None, Qualitative("Fig 2 plots the certificate for L = 32 .. 1024 and states no "
                            "number ('certificates close to one')"))
    for L in (32, 1024)])

MIDDLE_P5 = "middle sampled layer's greedy-certificate p5, last checkpoint"
PREPOST = evidence.claims([
    Claim("Table 1, Pre-LN loss", "mean loss over the final 50 updates", 4.509, REL,
          LOSS_UNITS),
    Claim("Table 1, Post-LN loss", "mean loss over the final 50 updates", 6.771, REL,
          LOSS_UNITS),
    Claim("Sec 5: Pre-LN has lower loss for each matched seed",
          "loss(Post-LN) - loss(Pre-LN), final 50 updates", 0.0, Bound(">", every_seed=True)),
    Claim("Table 1, Pre-LN spike updates", "spike updates per run", 9.0, REL),
    Claim("Table 1, Post-LN spike updates", "spike updates per run", 35.3, REL),
    Claim("Sec 5: Post-LN registers more spike updates than Pre-LN",
          "spikes(Post-LN) - spikes(Pre-LN), matched seeds", 0.0, Bound(">"),
          "paper: 35.3 vs 9.0, 'roughly four times as many'"),
    Claim("Table 1, Pre-LN last-checkpoint theta_cert",
          "mean over sampled layers of the per-layer median greedy certificate", 0.99870,
          NEAR_ONE),
    Claim("Table 1, Post-LN last-checkpoint theta_cert",
          "mean over sampled layers of the per-layer median greedy certificate", 0.99999,
          NEAR_ONE),
    Claim("Table 1: Post-LN's median certificate above Pre-LN's",
          "theta_cert(Post-LN) - theta_cert(Pre-LN), last checkpoint", 0.0, Bound(">"),
          "paper: 0.99999 vs 0.99870"),
    Claim("Sec 5, Pre-LN largest pre-clip gradient norm", "largest over the three runs",
          35.0, REL),
    Claim("Sec 5, Post-LN largest pre-clip gradient norm", "largest over the three runs",
          112.0, REL),
    Claim("Sec 5: Post-LN's largest gradient norm above Pre-LN's",
          "largest(Post-LN) - largest(Pre-LN) over the runs", 0.0, Bound(">"),
          "paper: 112 vs 35"),
    Claim("Sec 5: two of three Post-LN seeds plateau at uniform attention",
          "Post-LN seeds whose last-checkpoint mean p_max is within 5% of the uniform-support "
          "value", 2.0, COUNT_TOL, "paper: mean p_max 0.0041 vs uniform 0.0041 in its two "
          "plateaued seeds; the 5% criterion is ours, fixed before the run"),
    Claim("Fig 3, Pre-LN normalized entropy, first checkpoint",
          "mean over sampled layers of the row-mean H / log(t + 1)", 0.987, NEAR_ONE),
    Claim("Fig 3, Pre-LN normalized entropy, last checkpoint",
          "mean over sampled layers of the row-mean H / log(t + 1)", 0.726, REL),
    Claim("Fig 3, Pre-LN mean p_max, first checkpoint",
          "mean over sampled layers of the row-mean p_max", 0.010, Abs(P_MAX_FLOOR),
          "uniform attention has p_max = 1/(t + 1): rows with t < 64 at quick scale, < 1024 "
          "in the paper"),
    Claim("Fig 3, Pre-LN mean p_max, last checkpoint",
          "mean over sampled layers of the row-mean p_max", 0.174, REL),
    Claim("Fig 3: Pre-LN normalized entropy falls", "entropy first - last checkpoint", 0.0,
          Bound(">"), "paper: 0.987 -> 0.726"),
    Claim("Fig 3: Pre-LN mean p_max rises", "p_max last - first checkpoint", 0.0, Bound(">"),
          "paper: 0.010 -> 0.174"),
    Claim("Sec 5: Pre-LN median certificate >= 0.995 at every sampled layer and checkpoint",
          "lowest per-layer median certificate over layers and checkpoints", 0.995,
          Bound(">=", every_seed=True)),
    Claim("Fig 3, Pre-LN envelope low edge, last checkpoint",
          "min over layers and seeds of the per-layer p5", 0.26, REL),
    Claim("Fig 3, Pre-LN envelope high edge, last checkpoint",
          "max over layers and seeds of the per-layer p95", 1.00, Abs(0.005),
          "paper prints 1.00: half its last digit"),
    Claim("Sec 5: Pre-LN middle-layer p5 falls to 0.26-0.58 across seeds", MIDDLE_P5, 0.58,
          Bound("<=", every_seed=True),
          "the upper end of the paper's range, asked of every seed"),
    Claim("Fig 4: Pre-LN's widened lower whisker is at the middle layer",
          "p5(middle) - min(p5(first), p5(last)), last checkpoint", 0.0, Bound("<"),
          "paper: seed 123 (down to ~0.35); ours: mean over seeds"),
    Claim("Fig 4: Post-LN medians near one at all three sampled depths",
          "lowest per-layer median certificate, last checkpoint", 0.995,
          Bound(">=", every_seed=True),
          "'near one' read as the paper's Pre-LN floor 0.995 (Sec 5)"),
    Claim("Fig 1(d): Pre-LN per-block gradient norm largest at layer 0",
          "g(0) - max over blocks 1..N-1, last checkpoint", 0.0, Bound(">"),
          "paper (seed 123): 0.15 at layer 0, then 0.02-0.06"),
    Claim("Fig 1(d): Post-LN per-block gradient norm increases toward the output",
          "log10(g(N-1) / g(0)), last checkpoint", 0.0, Bound(">"),
          "paper: every Post-LN seed, plateaued or not"),
    Claim("Sec 5: plateaued Post-LN blocks 0..N-3 four orders below the last block",
          "log10(g(N-1) / max over blocks 0..N-3), last checkpoint",
          round(math.log10(0.04 / 7e-6), 3), Bound(">="),
          "paper: <= 7e-6 through layers 0-33 vs 0.04 at layer 35 in its two plateaued "
          "seeds; ours: mean over every Post-LN seed"),
    Claim("Sec 5: Pre-LN's gradient profile smoother than Post-LN's",
          "log10(max / min per-block norm): Post-LN - Pre-LN", 0.0, Bound(">")),
])

TRAINED = evidence.claims([
    Claim(f"Thm 4.1 on the trained {arch} checkpoints",
          "max over layers and sequences of measured ||D MHA(U)|| (lower end) / bound", 1.0,
          Bound("<=", every_seed=True), "a theorem: the bound holds on any weights")
    for arch in ("Pre-LN", "Post-LN")] + [
    Claim("Lemma A.2(iv) / Cor A.3 on the trained Post-LN LayerNorms",
          "log ||prod_k J_LN,k||_2 measured - log of the token bound", 0.0,
          Bound("<=", every_seed=True), "over the 2N in-block LayerNorms, all tokens")])


_EXACT = "the paper: an exact statement; 1e-12 is our float64 rounding allowance"
LEMMAS = evidence.claims([
    Claim("Lemma 2.3: attention mixing is nonexpansive",
          "max over draws of ||A V||_inf,rms / ||V||_inf,rms - 1", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma 2.4: LayerNorm magnitude reset",
          "max over draws of ||LN(x)||_rms - (||gamma||_inf + ||beta||_inf)", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Remark 3.3: theta(p) is 4 x the max cut of the p_i p_j graph",
          "max |x^T (Diag(p) - p p^T) x - 4 p(S)(1 - p(S))| and |max_x x^T M x - theta|",
          1e-12, Bound("<=", every_seed=True), _EXACT),
    Claim("Remark B.1: TV(p_eps, p) = |eps| / 2 ||J x||_1 + o(|eps|)",
          "max relative difference at eps = 1e-6", 1e-4, Bound("<=", every_seed=True),
          "o(|eps|): the relative error is O(eps); the limit 1e-4 at eps = 1e-6 is ours"),
    Claim("Thm 4.5's example: alternating chain decays as (1 - a^2)^((m - l) / 2)",
          "max relative |d x_m / d x_l (autodiff) - (1 - a^2)^((m - l) / 2)|", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma A.2(i): J_LN(y) 1 = 0", "max ||J 1||_2 / ||J||_2 (autodiff J)", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma A.2(ii): ||J v|| <= ||gamma||_inf / sigma ||v|| on centered v",
          "max ratio - 1 (autodiff J)", 1e-12, Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma A.2(iii): extra factor rho(y) along y_hat",
          "max ||J y_hat|| / (||gamma||_inf / sigma rho ||y_hat||) - 1 (autodiff J)", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
])
_LEMMA_KEYS = ("lemma_2_3", "lemma_2_4", "remark_3_3", "remark_b_1", "theorem_4_5_example",
               "lemma_a_2_i", "lemma_a_2_ii", "lemma_a_2_iii")


def _lemma_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
  """Item 7's exact statements: the largest violation per seed (``lemma_checks``)."""
  n = r["settings"]["draws"]
  return [claim.judge(r["per_seed"][key], seeds=r["seeds"], note=f"{n} draws per seed")
          for claim, key in zip(LEMMAS.values(), _LEMMA_KEYS)]


def _note(*parts: str) -> str:
  return "; ".join(p for p in parts if p)


def _fmt(xs) -> str:
  return ", ".join(f"{x:.4g}" for x in xs)


def _theorem_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
  """App D.2: the identity per seed, the greedy match rates and worst gap over the
  spread seeds (the headline; seed 0 alone in the note)."""
  sp, out = r["match_rate_spread"], []
  ident = r["settings"]["identity_seeds"]
  spread_seeds = list(range(sp["seeds"]))
  for L in ("8", "16"):
    out.append(THEOREM[f"App D.2 / Thm 3.2, L = {L}"].judge(
        r["identity_max_rel_error"][L], seeds=ident, note=f"{r['num']} vectors per seed"))
  for L in ("8", "16"):
    seed0 = r["per_length"][L]["tau=1"]["greedy_prefix"]["match_fraction"]
    out.append(THEOREM[f"App D.2, L = {L}: greedy certificate = exact theta"].judge(
        sp[f"L={L}/greedy_prefix"]["per_seed"], seeds=spread_seeds,
        note=f"{sp['num']} vectors per seed; seed {r['seed']} alone: {100 * seed0:.1f}%"))
  gaps = np.maximum(sp["L=8/greedy_worst_gap"]["per_seed"], sp["L=16/greedy_worst_gap"]["per_seed"])
  out.append(THEOREM["App D.2: worst gap theta - theta_cert"].judge(
      gaps.tolist(), seeds=spread_seeds, note=f"{sp['num']} vectors per length and seed"))
  return out


def _certificate_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
  seeds = r["settings"]["seeds"]
  return [CERTIFICATES[f"Fig 2, L = {L}: greedy certificate"].judge(
      r["greedy_median_by_seed"][L], seeds=seeds, note=f"{r['num']} distributions per seed")
      for L in ("32", "1024")]


def _by_seed(r: dict[str, Any], arch: str) -> list[dict[str, Any]]:
  per = r["per_seed"][arch]
  return [per[s] if s in per else per[str(s)] for s in r["seeds"]]


def _prepost_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
  """Table 1, Fig 1(d), Fig 3, Fig 4 and Sec 5's worded claims, judged at any scale
  against the paper's numbers (a quick-scale row says so in its note)."""
  seeds, scale = list(r["seeds"]), r.get("scale", "quick")
  pre, post = _by_seed(r, "pre"), _by_seed(r, "post")
  base = SCALE_NOTE.get(scale, "")
  out = []

  def add(item, values, note="", per_seed=True):
    out.append(PREPOST[item].judge(values, seeds=seeds if per_seed else None,
                                   note=_note(base, note)))

  col = lambda runs, k: [d[k] for d in runs]
  cert = lambda d: float(np.mean(d["last_theta_cert_median_per_layer"]))
  add("Table 1, Pre-LN loss", col(pre, "final_loss"))
  add("Table 1, Post-LN loss", col(post, "final_loss"))
  add("Sec 5: Pre-LN has lower loss for each matched seed",
      [b["final_loss"] - a["final_loss"] for a, b in zip(pre, post)])
  add("Table 1, Pre-LN spike updates", col(pre, "spikes"))
  add("Table 1, Post-LN spike updates", col(post, "spikes"))
  add("Sec 5: Post-LN registers more spike updates than Pre-LN",
      [b["spikes"] - a["spikes"] for a, b in zip(pre, post)])
  add("Table 1, Pre-LN last-checkpoint theta_cert", [cert(d) for d in pre])
  add("Table 1, Post-LN last-checkpoint theta_cert", [cert(d) for d in post])
  add("Table 1: Post-LN's median certificate above Pre-LN's",
      [cert(b) - cert(a) for a, b in zip(pre, post)])
  g_pre, g_post = col(pre, "max_grad_norm"), col(post, "max_grad_norm")
  add("Sec 5, Pre-LN largest pre-clip gradient norm", max(g_pre),
      f"per seed {_fmt(g_pre)}", per_seed=False)
  add("Sec 5, Post-LN largest pre-clip gradient norm", max(g_post),
      f"per seed {_fmt(g_post)}", per_seed=False)
  add("Sec 5: Post-LN's largest gradient norm above Pre-LN's", max(g_post) - max(g_pre),
      f"{max(g_post):.4g} vs {max(g_pre):.4g}", per_seed=False)
  ratio = [d["last_p_max_mean"] / d["uniform_p_max_mean"] for d in post]
  add("Sec 5: two of three Post-LN seeds plateau at uniform attention",
      float(sum(abs(x - 1.0) <= 0.05 for x in ratio)),
      f"mean p_max / uniform per seed {_fmt(ratio)}", per_seed=False)
  add("Fig 3, Pre-LN normalized entropy, first checkpoint", col(pre, "entropy_first"))
  add("Fig 3, Pre-LN normalized entropy, last checkpoint", col(pre, "entropy_last"))
  add("Fig 3, Pre-LN mean p_max, first checkpoint", col(pre, "p_max_first"))
  add("Fig 3, Pre-LN mean p_max, last checkpoint", col(pre, "p_max_last"),
      f"uniform support: {_fmt(col(pre, 'uniform_p_max_mean'))}")
  add("Fig 3: Pre-LN normalized entropy falls",
      [d["entropy_first"] - d["entropy_last"] for d in pre])
  add("Fig 3: Pre-LN mean p_max rises", [d["p_max_last"] - d["p_max_first"] for d in pre])
  add("Sec 5: Pre-LN median certificate >= 0.995 at every sampled layer and checkpoint",
      col(pre, "min_cert_median_any"))
  low = col(pre, "lowest_p5_last")
  add("Fig 3, Pre-LN envelope low edge, last checkpoint", min(low),
      f"per seed {_fmt(low)}", per_seed=False)
  high = col(pre, "last_theta_cert_p95_max")
  add("Fig 3, Pre-LN envelope high edge, last checkpoint", max(high),
      f"per seed {_fmt(high)}", per_seed=False)
  mid = lambda d: d["last_theta_cert_p5_per_layer"][len(d["sampled_layers"]) // 2]
  add("Sec 5: Pre-LN middle-layer p5 falls to 0.26-0.58 across seeds", [mid(d) for d in pre],
      f"sampled layers {pre[0]['sampled_layers']}")
  add("Fig 4: Pre-LN's widened lower whisker is at the middle layer",
      [mid(d) - min(d["last_theta_cert_p5_per_layer"][0], d["last_theta_cert_p5_per_layer"][-1])
       for d in pre])
  add("Fig 4: Post-LN medians near one at all three sampled depths",
      [min(d["last_theta_cert_median_per_layer"]) for d in post])
  g = lambda d: np.asarray(d["last_block_grad_norm"], np.float64)
  add("Fig 1(d): Pre-LN per-block gradient norm largest at layer 0",
      [float(g(d)[0] - g(d)[1:].max()) for d in pre])
  add("Fig 1(d): Post-LN per-block gradient norm increases toward the output",
      [float(np.log10(g(d)[-1] / g(d)[0])) for d in post])
  add("Sec 5: plateaued Post-LN blocks 0..N-3 four orders below the last block",
      [float(np.log10(g(d)[-1] / g(d)[:-2].max())) for d in post])
  span = lambda d: float(np.log10(g(d).max() / g(d).min()))
  add("Sec 5: Pre-LN's gradient profile smoother than Post-LN's",
      [span(b) - span(a) for a, b in zip(pre, post)])
  return out


def _trained_bounds_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
  """Thm 4.1 against the measured MHA Jacobian and Lemma A.2(iv) on the Post-LN
  LayerNorms, per trained seed."""
  seeds = list(r["seeds"])
  per = [r["per_seed"][str(s)] for s in seeds]
  out = []
  for arch, name in (("pre", "Pre-LN"), ("post", "Post-LN")):
    s = [p[arch]["summary"] for p in per]
    out.append(TRAINED[f"Thm 4.1 on the trained {name} checkpoints"].judge(
        [x["max_lower_over_thm41"] for x in s], seeds=seeds,
        note=f"update {per[0][arch]['step']}; upper end of the bracket / bound, per seed: "
             f"{_fmt([x['max_upper_over_thm41'] for x in s])}; bound / measured median "
             f"{_fmt([x['thm41_over_measured_median'] for x in s])}"))
  a3 = [p["post"]["cor_a3"] for p in per]
  out.append(TRAINED["Lemma A.2(iv) / Cor A.3 on the trained Post-LN LayerNorms"].judge(
      [a["log_norm_measured"] - a["log_bound_token"] for a in a3], seeds=seeds,
      note=f"share of modules with max_i a_k,i < 1: "
           f"{_fmt([a['frac_modules_worst_below_1'] for a in a3])}"))
  return out


# Whether each scale is the paper's setting (Experiment.setting): paper scale runs the
# paper's sample counts and its 774M GPT-2 runs; the quick scales sample less and train
# a 0.3M-parameter byte-level LM, whose rows are proxies (counted apart, never a match)
# except SCALE_FREE's.
_QUICK_LM = ("a 6-layer d=64 byte-level LM (0.3M parameters) on Shakespeare, {updates} "
             "updates at peak LR {lr} (paper: 774M GPT-2 on FineWeb, 2000 updates at 3e-4)")
QUICK_SETTING = {
    "lemma_checks": {"quick": "random draws at d=16, t=8 (the paper states no experiment)"},
    "theorem_check": {"quick": "100 logit vectors per length and seed (paper: 500)"},
    "certificates_large_L": {"quick": "100 distributions per length (paper: 500)"},
    "prepost_training": {
        "quick": _QUICK_LM.format(updates=200, lr="1e-3"),
        "quick_paper_lr": _QUICK_LM.format(updates=200, lr="3e-4"),
        "quick_sharpen": _QUICK_LM.format(updates=800, lr="1e-3")},
    "trained_bounds": {
        "quick": _QUICK_LM.format(updates=200, lr="1e-3"),
        "quick_sharpen": _QUICK_LM.format(updates=800, lr="1e-3")}}
# rows judged against the paper at any scale: exact lemmas and theorems (on random draws
# or on the trained checkpoints), and rates and medians whose estimate only widens with
# fewer samples (the worst gap, a maximum over draws, is not one of them)
SCALE_FREE = {
    "lemma_checks": {"Lemma 2.3: attention mixing is nonexpansive",
                     "Lemma 2.4: LayerNorm magnitude reset", "Lemma A.2(i): J_LN(y) 1 = 0",
                     "Lemma A.2(ii): ||J v|| <= ||gamma||_inf / sigma ||v|| on centered v",
                     "Lemma A.2(iii): extra factor rho(y) along y_hat",
                     "Remark 3.3: theta(p) is 4 x the max cut of the p_i p_j graph",
                     "Remark B.1: TV(p_eps, p) = |eps| / 2 ||J x||_1 + o(|eps|)",
                     "Thm 4.5's example: alternating chain decays as (1 - a^2)^((m - l) / 2)"},
    "theorem_check": {"App D.2 / Thm 3.2, L = 8", "App D.2 / Thm 3.2, L = 16",
                      "App D.2, L = 8: greedy certificate = exact theta",
                      "App D.2, L = 16: greedy certificate = exact theta"},
    "certificates_large_L": {"Fig 2, L = 32: greedy certificate",
                             "Fig 2, L = 1024: greedy certificate"},
    "trained_bounds": {"Lemma A.2(iv) / Cor A.3 on the trained Post-LN LayerNorms",
                       "Thm 4.1 on the trained Post-LN checkpoints",
                       "Thm 4.1 on the trained Pre-LN checkpoints"}}


def _experiment(name: str, rows, **kw) -> runner.Experiment:
  """``runner.Experiment`` of module ``name`` with its settings and scale-free rows."""
  return runner.Experiment(name, rows, setting={"paper": runner.PAPER_SETTING,
                                                **QUICK_SETTING[name]},
                           scale_free=frozenset(SCALE_FREE.get(name, ())), **kw)


_TRAINING_ONLY = "quick_paper_lr and quick_sharpen are training-only scales"
STUDY = runner.Study(
    name="softmax_sensitivity", title="Softmax sensitivity: paper vs ours",
    experiments={"lemma_checks": _experiment(
                     "lemma_checks", _lemma_rows, folder="lemma_checks", claims=LEMMAS,
                     scales=("quick", "paper", "tiny"), why_missing=_TRAINING_ONLY),
                 "theorem_check": _experiment(
                     "theorem_check", _theorem_rows, folder="theorem_check", claims=THEOREM,
                     recheck_atol=1e-14, recheck_why="Thm 3.2's identity errors are float64 "
                     "rounding residuals (~4e-16) that another compilation moves",
                     scales=("quick", "paper", "tiny"), why_missing=_TRAINING_ONLY),
                 "certificates_large_L": _experiment(
                     "certificates_large_L", _certificate_rows, folder="certificates_large_L",
                     claims=CERTIFICATES, scales=("quick", "paper", "tiny"),
                     why_missing=_TRAINING_ONLY),
                 # the two training experiments share one folder: the runs the runner
                 # trains there at paper and tiny (prepost_training.runs) are read by both
                 "prepost_training": _experiment(
                     "prepost_training", _prepost_rows, folder="prepost_training",
                     claims=PREPOST, scales=("quick", "quick_paper_lr", "quick_sharpen",
                                             "paper", "tiny"),
                     needs=prepost_training.needs, runs=prepost_training.runs, trained=True),
                 "trained_bounds": _experiment(
                     "trained_bounds", _trained_bounds_rows, folder="prepost_training",
                     claims=TRAINED, scales=("quick", "quick_sharpen", "paper", "tiny"),
                     needs=prepost_training.needs, runs=prepost_training.runs, trained=True,
                     why_missing="it reads the prepost_training checkpoints of quick, "
                                 "quick_sharpen, paper and tiny only (CPU cost)")},
    scales=("quick", "quick_paper_lr", "quick_sharpen", "paper", "tiny"),
    notes={"quick": "Details, settings the paper leaves open and deviations: EXPECTED.md.",
           "quick_paper_lr": "quick_paper_lr: the quick LM at the paper's peak learning rate "
                             "3e-4, the second quick setting, fixed before its run.",
           "quick_sharpen": "quick_sharpen: the quick model trained 800 updates (warmup 200), "
                            "chosen after seed 42's outcome and overturned by seeds 123 and "
                            "456 (EXPECTED.md); the preregistered setting is quick.",
           "tiny": "tiny: every experiment's paper path shrunk to a laptop CPU (the six "
                   "774M runs through rankjax.studies.training.tiny, fewer draws elsewhere); "
                   "measured, not judged against the paper."})


def names() -> set[str]:
  """Every name ``run_all(only=...)`` accepts (experiments and aliases)."""
  return STUDY.names()


def run_all(out_dir: str, scale: str = "quick", only: Sequence[str] | None = None
            ) -> dict[str, Any]:
  """Runs the scripts (all, or ``only``); writes ``summary.json`` and ``summary.md``."""
  return runner.run_study(STUDY, out_dir, scale, only)


if __name__ == "__main__":
  raise SystemExit(runner.main(STUDY))
