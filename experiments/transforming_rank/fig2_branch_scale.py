"""Fig 2: the rank depends on beta and alpha only through beta * alpha^M (Sec 3, App A.4).

erank(dh_L/dh_0)/d at initialization for Pre-Norm and Post-Norm residual MLPs
(d=256, L=48, two square d x d branch matrices, ReLU, single seed), sweeping alpha at
several beta. The same weight draw is used at every (alpha, beta) (alpha rescales
it), so for ReLU the symmetry is exact: points with equal beta * alpha^2 coincide up
to rounding.

  python -m experiments.transforming_rank.fig2_branch_scale --scale quick --out runs/tr
"""
from __future__ import annotations

import jax
import numpy as np

from experiments.transforming_rank import common
from rankjax.config import MLPConfig

NAME = "fig2_branch_scale"
# alpha = 2^(i/2), beta = 2^j: beta * alpha^2 = 2^(i + j), so many points coincide.
SCALES = {
    "quick": dict(depth=48, width=64, seeds=1, alpha_exponents=tuple(range(-6, 5)),
                  beta_exponents=(-3, -2, -1, 0)),
    "paper": dict(depth=48, width=256, seeds=1, alpha_exponents=tuple(range(-8, 7)),
                  beta_exponents=(-3, -2, -1, 0)),
}


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  grid = {}
  spreads = {}
  for pos in ("pre", "post"):
    cfg = MLPConfig(depth=s["depth"], width=s["width"], expansion=1.0, norm_position=pos)
    pts = []
    for j in s["beta_exponents"]:
      for i in s["alpha_exponents"]:
        alpha, beta = 2.0 ** (i / 2), 2.0 ** j
        er = common.jacobian_samples(cfg, jax.random.PRNGKey(2), alpha, beta,
                                     num_seeds=s["seeds"])["erank"][..., -1].mean()
        pts.append((i + j, alpha, beta, float(er)))
    grid[pos] = pts
    by_ratio: dict[int, list] = {}
    for key, _, _, er in pts:
      by_ratio.setdefault(key, []).append(er)
    spreads[pos] = max(max(v) - min(v) for v in by_ratio.values() if len(v) > 1)

  def at_ratio(pos, k):
    return np.mean([er for key, _, _, er in grid[pos] if key == k])

  summary = [
      common.row("Fig 2b/d: max spread of erank_L/d among (alpha, beta) with equal beta*alpha^2",
                 "curves collapse (exact symmetry for ReLU)",
                 f"pre {spreads['pre']:.1e}, post {spreads['post']:.1e}"),
      common.row("Fig 2: erank_L/d at beta*alpha^2 = 1 (pre / post)",
                 "post collapses further than pre",
                 f"{at_ratio('pre', 0):.3f} / {at_ratio('post', 0):.3f}"),
  ]
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
            "max_spread_at_equal_ratio": spreads, "summary": summary}
  return common.write(out_dir, NAME, result, fig)


if __name__ == "__main__":
  common.main(run, __doc__)
