"""Fig 2: the rank depends on beta and alpha only through beta * alpha^M (Sec 3, App A.4).

erank(dh_L/dh_0)/d at initialization for Pre-Norm and Post-Norm residual MLPs
(d=256, L=48, two square d x d branch matrices, ReLU; the paper draws one sample,
we take 3 seeds so every row has a spread), sweeping alpha at
several beta. The same weight draw is used at every (alpha, beta) (alpha rescales
it), so for ReLU the symmetry is exact: points with equal beta * alpha^2 coincide up
to rounding.

  rankjax reproduce transforming_rank --only fig2
"""
from __future__ import annotations

import jax
import numpy as np

from . import common
from rankjax.config import MLPConfig
from rankjax.studies import claims, measured

NAME = "fig2_branch_scale"
# alpha = 2^(i/2), beta = 2^j: beta * alpha^2 = 2^(i + j), so many points coincide.
SCALES = {
    "quick": dict(depth=48, width=64, seeds=10, alpha_exponents=tuple(range(-6, 5)),
                  beta_exponents=(-3, -2, -1, 0)),
    "paper": dict(depth=48, width=256, seeds=3, alpha_exponents=tuple(range(-8, 7)),
                  beta_exponents=(-3, -2, -1, 0)),
    "tiny": dict(depth=48, width=16, seeds=2, alpha_exponents=tuple(range(-8, 7, 2)),
                 beta_exponents=(-3, -2, -1, 0)),
}
CLAIMS = claims([
    *(common.exact(f"Fig 2b/d: {pos}, equal beta*alpha^2 coincide",
                   "max spread of erank_L/d among (alpha, beta) with equal beta*alpha^2",
                   note="Sec 3 / App A.4: the rank depends on beta, alpha only through "
                        "beta*alpha^M; exact for ReLU with one weight draw (float32 rounding)")
      for pos in ("pre", "post")),
    common.exact("Fig 2b: pre, equal beta*alpha^2 coincide, float64",
                 "max spread of erank_L/d among (alpha, beta) with equal beta*alpha^2, "
                 "float64 parameters and arithmetic", dtype="float64",
                 note="float64: rounding ~1e-15"),
    common.bound("Fig 2: post below pre at beta*alpha^2 = 1",
                 "erank_L/d(pre) - erank_L/d(post) at beta*alpha^2 = 1", ">", 0.0,
                 "Fig 2: Post-Norm collapses further than Pre-Norm", every_seed=True),
])

_SYM = ("we show that the effective rank at initialization depends on ... only through ... "
        "for both Pre- and Post-Norm (Figure 2)")
WORDS = [
    ("float64", "Fig 2", _SYM, {"kind": "sensitivity", "post_hoc": (
        "added after the paper-scale float32 row's mismatch (seed 0: 6e-5), to test whether "
        "it is float32 rounding; the float32 row is the headline")}),
    ("coincide", "Fig 2", _SYM),
    ("post below pre", "Fig 2", "The same holds for Post-Norm, but the rank collapses further "
     "at a given ratio"),
]
CLAIMS = common.worded(CLAIMS, WORDS)


def _sweep(cfg: MLPConfig, s: dict) -> tuple[list, dict[int, list]]:
  """Every (alpha, beta) point's seed-mean erank_L/d, and the per-seed values by
  log2(beta * alpha^2)."""
  pts, by_ratio = [], {}
  for j in s["beta_exponents"]:
    for i in s["alpha_exponents"]:
      alpha, beta = 2.0 ** (i / 2), 2.0 ** j
      er = common.jacobian_samples(cfg, jax.random.PRNGKey(2), alpha, beta,
                                   num_seeds=s["seeds"])["erank"][..., -1].mean(axis=-1)
      pts.append((i + j, alpha, beta, float(er.mean())))
      by_ratio.setdefault(i + j, []).append(np.asarray(er, dtype=np.float64))
  return pts, by_ratio


def _spread(by_ratio: dict[int, list]) -> np.ndarray:
  """Per seed: the largest spread among the points of equal ratio."""
  return np.max([np.max(v, axis=0) - np.min(v, axis=0)
                 for v in by_ratio.values() if len(v) > 1], axis=0)


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  grid, spreads, per_seed_spread, at_one = {}, {}, {}, {}
  for pos in ("pre", "post"):
    cfg = MLPConfig(depth=s["depth"], width=s["width"], expansion=1.0, norm_position=pos)
    grid[pos], by_ratio = _sweep(cfg, s)
    per_seed_spread[pos] = _spread(by_ratio)
    spreads[pos] = float(per_seed_spread[pos].max())
    at_one[pos] = np.mean(by_ratio[0], axis=0)   # per seed, mean over the points at ratio 1
  with jax.enable_x64(True):     # the same weights in float64: is the pre spread rounding?
    cfg = MLPConfig(depth=s["depth"], width=s["width"], expansion=1.0, norm_position="pre",
                    param_dtype="float64")
    per_seed_spread["pre_float64"] = _spread(_sweep(cfg, s)[1])
  spreads["pre_float64"] = float(per_seed_spread["pre_float64"].max())

  seeds = list(range(s["seeds"]))   # jacobian_samples(PRNGKey(2), num_seeds)
  summary = [measured(f"Fig 2b/d: {pos}, equal beta*alpha^2 coincide",
                 per_seed_spread[pos].tolist(), seeds=seeds) for pos in ("pre", "post")]
  summary.append(measured("Fig 2b: pre, equal beta*alpha^2 coincide, float64",
      per_seed_spread["pre_float64"].tolist(), seeds=seeds))
  summary.append(measured("Fig 2: post below pre at beta*alpha^2 = 1",
      (at_one["pre"] - at_one["post"]).tolist(), seeds=seeds,
      note=f"erank_L/d pre {at_one['pre'].mean():.3f}, post {at_one['post'].mean():.3f}"))
  fig, axes = common.plt.subplots(1, 4, figsize=(16, 3.8))
  for col, pos in enumerate(("pre", "post")):
    pts = np.array(grid[pos])
    for j in s["beta_exponents"]:
      sel = np.isclose(pts[:, 2], 2.0 ** j)
      axes[2 * col].plot(pts[sel, 1], pts[sel, 3], "o-", ms=3, label=f"beta=2^{j}")
      axes[2 * col + 1].plot(pts[sel, 2] * pts[sel, 1] ** 2, pts[sel, 3], "o", ms=3,
                             label=f"beta=2^{j}")
    axes[2 * col].set_xlabel("alpha")
    axes[2 * col + 1].set_xlabel("beta * alpha^M")
    for ax in axes[2 * col: 2 * col + 2]:
      ax.set_xscale("log")
      ax.set_title(f"{pos}-norm")
      ax.legend(fontsize=7)
  axes[0].set_ylabel("erank(dh_L/dh_0) / d")
  result = {"settings": s, "points": {k: [dict(zip(("log2_ratio", "alpha", "beta", "erank"), p))
                                          for p in v] for k, v in grid.items()},
            "max_spread_at_equal_ratio": spreads,
            "erank_at_ratio_one_per_seed": at_one, "measured": summary}
  return common.write(out_dir, NAME, result, fig)
