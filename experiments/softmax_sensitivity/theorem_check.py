"""Theorem 3.2 check and the greedy certificate at small L (App D.2, Fig 2 left part).

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability".
Protocol (App D.2): for L in {8, 16}, 500 logit vectors u ~ N(0, I_L); p =
softmax(u / tau) with tau = 1; the left side ||J||_{inf->1} by exhaustive search over
all 2^L sign vectors, the right side theta(p) / tau by exhaustive search over all
subsets; record |LHS - RHS| / RHS. The paper reports a maximum below 1e-13. It also
reports that the greedy-prefix certificate equals the exact theta on 17.8% (L = 8)
and 2.6% (L = 16) of the distributions, worst gap theta - theta_cert ~ 0.11.

Here the left side is the autodiff Jacobian of softmax(u / tau) (``jax.jacfwd``),
maximized over all 2^L sign vectors; the right side is subset enumeration; both in
float64. We also cross-check the meet-in-the-middle theta, add tau in {0.5, 2} (not in
the paper) and report our "balance" certificate next to the paper's greedy prefix.

Its claims (``CLAIMS``: the identity per seed, the greedy match rates and worst gap
over the spread seeds) are declared below, judged by the study's policy (``policy``).

Run:  rankjax reproduce softmax_sensitivity --only theorem_check [--scale paper]
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

from rankjax import measure, studies
from rankjax.studies import Abs, Bound, Claim, Draw, claims, measured

SCALES: dict[str, dict[str, Any]] = {
    # logit vectors per length (the paper uses 500); spread_seeds: how many seeds
    # (0, 1, ...) of the same protocol give the certificate match rates' spread;
    # identity_seeds: the seeds whose vectors check Thm 3.2's identity (seed 0 also runs
    # the extra temperatures). Fixed before any run (at least 10 seeds where cheap).
    "quick": dict(num=100, spread_seeds=10, identity_seeds=(0, 1, 2)),
    "paper": dict(num=500, spread_seeds=40, identity_seeds=(0, 1, 2)),
    # the paper path shrunk to a laptop CPU in seconds (rows of status tiny)
    "tiny": dict(num=20, spread_seeds=3, identity_seeds=(0, 1, 2)),
}
LENGTHS = (8, 16)        # App D.2
PAPER_TAU = 1.0          # App D.2, step 1
EXTRA_TAUS = (0.5, 2.0)  # ours
MATCH_RTOL = 1e-12       # "certificate equals the exact value": |theta - cert| <= rtol * theta

Q_IDENTITY = ("For the tested lengths $L\\in\\{8,16\\}$, the maximum relative error across all "
              "tests is below $10^{-13}$, consistent with double-precision floating-point "
              "arithmetic")
Q_RATES = ("over $500$ distributions per length, it matches the exact value on $17.8\\%$ of "
           "instances at $L=8$ and $2.6\\%$ at $L=16$, with worst-case gap "
           "$\\theta-\\theta_{\\mathrm{cert}}\\approx 0.11$")
_ONE_DRAW = ("the paper reports one draw of 500 vectors (App D.2: 'over 500 distributions per "
             "length'), not a mean: its number is placed among our single draws of the same "
             "protocol, one per seed (2.5-97.5% range), widened by half its last printed digit")
_SEED0 = ("seed 0 of numpy default_rng, L = 8 drawn before L = 16, 500 vectors: the draw that "
          "gives all three of App D.2's printed numbers at once (89/500, 13/500, worst gap "
          "0.105); the paper names no generator or seed, so this is a reproduction of its draw "
          "only in that sense; the headline is the row judged against the single draws' range")
_SEED0_POST_HOC = ("that seed 0 is the paper's draw is inferred from this very agreement: the "
                   "draw was not identified before its numbers were seen")
CLAIMS = claims([
    Claim("App D.2 / Thm 3.2, L = 8", "max |LHS - RHS| / RHS over the vectors, tau = 1",
          1e-13, Bound("<", every_seed=True), "paper: below 1e-13 over 500 vectors, asked of "
          "every seed's 500", where="App D.2: exhaustive check", quote=Q_IDENTITY),
    Claim("App D.2 / Thm 3.2, L = 16", "max |LHS - RHS| / RHS over the vectors, tau = 1",
          1e-13, Bound("<", every_seed=True), "paper: below 1e-13 over 500 vectors, asked of "
          "every seed's 500", where="App D.2: exhaustive check", quote=Q_IDENTITY),
    Claim("App D.2, L = 8: greedy certificate = exact theta",
          "share of vectors, one draw per seed", 0.178, Draw(0.0005), _ONE_DRAW,
          where="App D.2: greedy certificate", quote=Q_RATES),
    Claim("App D.2, L = 16: greedy certificate = exact theta",
          "share of vectors, one draw per seed", 0.026, Draw(0.0005), _ONE_DRAW,
          where="App D.2: greedy certificate", quote=Q_RATES),
    Claim("App D.2: worst gap theta - theta_cert", "max over L in {8, 16}, one draw per seed",
          0.11, Draw(0.005), _ONE_DRAW + "; '~0.11' read as 0.11 +- 0.005 (its two decimals)",
          where="App D.2: greedy certificate", quote=Q_RATES),
    Claim("App D.2, L = 8, seed 0: greedy certificate = exact theta",
          "share of seed 0's 500 vectors", 0.178, Abs(0.0005), _SEED0,
          where="App D.2: greedy certificate", quote=Q_RATES, kind="sensitivity",
          post_hoc=_SEED0_POST_HOC),
    Claim("App D.2, L = 16, seed 0: greedy certificate = exact theta",
          "share of seed 0's 500 vectors", 0.026, Abs(0.0005), _SEED0,
          where="App D.2: greedy certificate", quote=Q_RATES, kind="sensitivity",
          post_hoc=_SEED0_POST_HOC),
    Claim("App D.2, seed 0: worst gap theta - theta_cert",
          "max over L in {8, 16} of seed 0's 500 vectors", 0.11, Abs(0.005), _SEED0,
          where="App D.2: greedy certificate", quote=Q_RATES, kind="sensitivity",
          post_hoc=_SEED0_POST_HOC),
])
PAPER_NUM = 500   # App D.2's draw size: the seed-0 rows exist only at this size


def _certificate_stats(theta: np.ndarray, cert: np.ndarray) -> dict[str, float]:
  gap = theta - cert
  return dict(match_fraction=float(np.mean(gap <= MATCH_RTOL * theta)),
              worst_gap=float(gap.max()), mean_gap=float(gap.mean()),
              max_excess=float(max(0.0, -gap.min())))


def certificate_match_rates(seed: int, num: int) -> dict[str, dict[str, float]]:
  """App D.2's match rates for one seed of the protocol: ``num`` vectors u ~ N(0, I_L)
  for L = 8 then L = 16 from ``default_rng(seed)``, p = softmax(u) (tau = 1), the
  fraction where the greedy-prefix certificate (the paper's) and the balance
  certificate (ours) equal the exact theta (subset enumeration, float64), and the
  greedy prefix's worst gap theta - theta_cert (``greedy_worst_gap``)."""
  rng = np.random.default_rng(seed)
  out = {}
  with jax.enable_x64(True):
    for L in LENGTHS:
      p = np.asarray(jax.nn.softmax(rng.standard_normal((num, L)) / PAPER_TAU, axis=-1),
                     np.float64)
      theta = np.asarray(measure.theta_exact(p))
      stats = {m: _certificate_stats(theta, np.asarray(measure.theta_certificate(p, m)))
               for m in ("greedy_prefix", "balance")}
      out[str(L)] = {m: st["match_fraction"] for m, st in stats.items()}
      out[str(L)]["greedy_worst_gap"] = stats["greedy_prefix"]["worst_gap"]
  return out


def identity_errors(seed: int, num: int) -> dict[str, float]:
  """Thm 3.2 at tau = 1 on one seed's vectors (drawn as in :func:`run`: L = 8 then
  L = 16 from ``default_rng(seed)``): max over the vectors of |LHS - RHS| / RHS, LHS
  = ||J||_{inf->1} of the autodiff Jacobian over all 2^L sign vectors, RHS = theta(p)
  by subset enumeration (App D.2 steps 1-4)."""
  rng = np.random.default_rng(seed)
  out = {}
  with jax.enable_x64(True):
    for L in LENGTHS:
      u = rng.standard_normal((num, L))
      p = np.asarray(jax.nn.softmax(u / PAPER_TAU, axis=-1), np.float64)
      lhs = np.asarray(measure.softmax_jacobian_inf_to_one(u, PAPER_TAU))
      rhs = np.asarray(measure.theta_exact(p)) / PAPER_TAU
      out[str(L)] = float((np.abs(lhs - rhs) / rhs).max())
  return out


def match_rate_spread(seeds: int, num: int) -> dict[str, Any]:
  """Mean and sample sd over ``seeds`` seeds of ``certificate_match_rates``."""
  per_seed = [certificate_match_rates(s, num) for s in range(seeds)]
  out: dict[str, Any] = {"seeds": seeds, "num": num}
  for L in map(str, LENGTHS):
    for m in ("greedy_prefix", "balance", "greedy_worst_gap"):
      x = np.array([r[L][m] for r in per_seed])
      out[f"L={L}/{m}"] = dict(mean=float(x.mean()), sd=float(x.std(ddof=1)) if seeds > 1
                               else 0.0, min=float(x.min()), max=float(x.max()),
                               per_seed=x.tolist())
  return out


def measurements(r: dict[str, Any]) -> list[dict[str, Any]]:
  """App D.2: the identity per seed, the greedy match rates and worst gap over the
  spread seeds (the headline; seed 0 alone in the note), from :func:`run`'s result."""
  sp, out = r["match_rate_spread"], []
  ident = r["settings"]["identity_seeds"]
  spread_seeds = list(range(sp["seeds"]))
  for L in ("8", "16"):
    out.append(measured(f"App D.2 / Thm 3.2, L = {L}", r["identity_max_rel_error"][L],
                        seeds=ident, note=f"{r['num']} vectors per seed"))
  for L in ("8", "16"):
    seed0 = r["per_length"][L]["tau=1"]["greedy_prefix"]["match_fraction"]
    out.append(measured(
        f"App D.2, L = {L}: greedy certificate = exact theta",
        sp[f"L={L}/greedy_prefix"]["per_seed"], seeds=spread_seeds,
        note=f"{sp['num']} vectors per seed; seed {r['seed']} alone: {100 * seed0:.1f}%"))
  gaps = np.maximum(sp["L=8/greedy_worst_gap"]["per_seed"], sp["L=16/greedy_worst_gap"]["per_seed"])
  out.append(measured("App D.2: worst gap theta - theta_cert", gaps.tolist(),
                      seeds=spread_seeds, note=f"{sp['num']} vectors per length and seed"))
  if sp["num"] == PAPER_NUM and spread_seeds and spread_seeds[0] == 0:
    for L in ("8", "16"):
      x = sp[f"L={L}/greedy_prefix"]["per_seed"][0]
      out.append(measured(f"App D.2, L = {L}, seed 0: greedy certificate = exact theta", x,
                          note=f"{round(x * PAPER_NUM)}/{PAPER_NUM}"))
    out.append(measured("App D.2, seed 0: worst gap theta - theta_cert", float(gaps[0]),
                        note=f"L = 8: {sp['L=8/greedy_worst_gap']['per_seed'][0]:.4g}, L = 16: "
                             f"{sp['L=16/greedy_worst_gap']['per_seed'][0]:.4g}"))
  return out


def run(out_dir: str, scale: str = "quick", seed: int = 0) -> dict[str, Any]:
  """Runs the check, writes ``theorem_check.json`` and ``.png`` under ``out_dir``;
  returns the results with their ``measured`` values (:func:`measurements`)."""
  cfg = SCALES[scale]
  os.makedirs(out_dir, exist_ok=True)
  rng = np.random.default_rng(seed)
  start = time.time()
  results: dict[str, Any] = dict(scale=scale, seed=seed, num=cfg["num"], lengths=list(LENGTHS),
                                 sampling="u ~ N(0, I_L), numpy default_rng(seed), "
                                          "L = 8 drawn before L = 16", per_length={})
  plots = {}
  with jax.enable_x64(True):
    for L in LENGTHS:
      u = rng.standard_normal((cfg["num"], L))
      per_tau = {}
      for tau in (PAPER_TAU,) + EXTRA_TAUS:
        p = np.asarray(jax.nn.softmax(u / tau, axis=-1), np.float64)
        lhs = np.asarray(measure.softmax_jacobian_inf_to_one(u, tau))
        theta = np.asarray(measure.theta_exact(p))
        rhs = theta / tau
        rel = np.abs(lhs - rhs) / rhs
        greedy = np.asarray(measure.theta_certificate(p, "greedy_prefix"))
        balance = np.asarray(measure.theta_certificate(p, "balance"))
        per_tau[f"tau={tau:g}"] = dict(
            max_rel_error=float(rel.max()), median_rel_error=float(np.median(rel)),
            mitm_vs_enumeration_max_abs=float(np.abs(measure.theta_mitm(p) - theta).max()),
            theta_min=float(theta.min()), theta_median=float(np.median(theta)),
            greedy_prefix=_certificate_stats(theta, greedy),
            balance=_certificate_stats(theta, balance))
        if tau == PAPER_TAU:
          plots[L] = (rel, theta, greedy, balance)
      results["per_length"][str(L)] = per_tau
  t0 = time.time()
  results["match_rate_spread"] = match_rate_spread(cfg["spread_seeds"], cfg["num"])
  results["match_rate_spread"]["seconds"] = time.time() - t0
  errors = {seed: {L: results["per_length"][L][f"tau={PAPER_TAU:g}"]["max_rel_error"]
                for L in results["per_length"]}}
  errors.update({s: identity_errors(s, cfg["num"]) for s in cfg["identity_seeds"] if s != seed})
  results["identity_max_rel_error"] = {
      L: [errors[s][L] for s in cfg["identity_seeds"]] for L in map(str, LENGTHS)}
  results["settings"] = dict(num=cfg["num"], spread_seeds=list(range(cfg["spread_seeds"])),
                             identity_seeds=list(cfg["identity_seeds"]), seeds=list(
                                 range(cfg["spread_seeds"])), tau=PAPER_TAU,
                             match_rtol=MATCH_RTOL)
  results["seconds"] = time.time() - start
  studies.write_json(out_dir, "theorem_check.json", results)
  _plot(plots, os.path.join(out_dir, "theorem_check.png"))
  results["measured"] = measurements(results)
  return results


def _plot(plots, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(14, 4))
  for L, (rel, theta, greedy, balance) in plots.items():
    axes[0].hist(np.log10(np.maximum(rel, 1e-18)), bins=30, alpha=0.6, label=f"L = {L}")
    axes[1 if L == 8 else 2].scatter(theta, greedy, s=6, label="greedy prefix (paper)")
    axes[1 if L == 8 else 2].scatter(theta, balance, s=6, label="balance (ours)")
  axes[0].axvline(-13, color="k", ls=":", lw=1, label="paper: below 1e-13")
  axes[0].set(xlabel="log10 |LHS - RHS| / RHS  (exact zeros at -18)", ylabel="count")
  axes[0].set_title("Thm 3.2: ||J||_inf->1 vs theta/tau (tau = 1)", fontsize=9)
  axes[0].legend()
  for ax, L in zip(axes[1:], plots):
    lo = min(plots[L][1].min(), plots[L][2].min())
    ax.plot([lo, 1], [lo, 1], "k--", lw=0.8)
    theta, greedy = plots[L][1], plots[L][2]
    ours = 100 * float(np.mean(theta - greedy <= MATCH_RTOL * theta))
    paper = {8: 17.8, 16: 2.6}[L]
    ax.set(xlabel="exact theta", ylabel="certificate")
    ax.set_title(f"App D.2 certificates, L = {L}\ngreedy = exact on {ours:.1f}% of these "
                 f"(paper's draw: {paper}%)", fontsize=9)
    ax.legend()
  fig.tight_layout()
  studies.save_figure(fig, path, dpi=120)
  plt.close(fig)

