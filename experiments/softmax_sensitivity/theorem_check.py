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

from rankjax.studies import Abs, Bound, Claim, claims, measured, runner
from rankjax import plotting
from rankjax.measure import sensitivity as sens
from .policy import FRACTION_FLOOR, REL

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

CLAIMS = claims([
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
      theta = np.asarray(sens.theta_exact(p))
      stats = {m: _certificate_stats(theta, np.asarray(sens.theta_certificate(p, m)))
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
      lhs = np.asarray(sens.softmax_jacobian_inf_to_one(u, PAPER_TAU))
      rhs = np.asarray(sens.theta_exact(p)) / PAPER_TAU
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
        lhs = np.asarray(sens.softmax_jacobian_inf_to_one(u, tau))
        theta = np.asarray(sens.theta_exact(p))
        rhs = theta / tau
        rel = np.abs(lhs - rhs) / rhs
        greedy = np.asarray(sens.theta_certificate(p, "greedy_prefix"))
        balance = np.asarray(sens.theta_certificate(p, "balance"))
        per_tau[f"tau={tau:g}"] = dict(
            max_rel_error=float(rel.max()), median_rel_error=float(np.median(rel)),
            mitm_vs_enumeration_max_abs=float(np.abs(sens.theta_mitm(p) - theta).max()),
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
  runner.write_json(out_dir, "theorem_check.json", results)
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
  axes[0].set(xlabel="log10 |LHS - RHS| / RHS  (exact zeros at -18)", ylabel="count",
              title="Thm 3.2: ||J||_inf->1 vs theta/tau (tau = 1)")
  axes[0].legend()
  for ax, L in zip(axes[1:], plots):
    lo = min(plots[L][1].min(), plots[L][2].min())
    ax.plot([lo, 1], [lo, 1], "k--", lw=0.8)
    ax.set(xlabel="exact theta", ylabel="certificate", title=f"App D.2 certificates, L = {L}")
    ax.legend()
  fig.tight_layout()
  plotting.save_figure(fig, path, dpi=120)
  plt.close(fig)

