"""Fig 4, Fig 10 and App B.2: normalization placement, operation, and the projection split.

Residual MLPs at initialization with a two-matrix ReLU branch (both matrices d x d,
d=256), beta=1, one sample of weights and input shared by every operation (Sec 4):
(a) placements pre / output / post / none (RMSNorm), alpha=1; (b) a Pre-RMSNorm with
the post-residual operation rms / detached rescale / mean subtraction / LayerNorm /
none; (c) the rank a post-residual RMSNorm removes, split into a rescaling part
erank(none) - erank(detached) and a projection part erank(detached) - erank(rms),
across alpha in {0.5, 1, 2}; Fig 10: (b) without the Pre-RMSNorm. App B.2 also states
the detached-vs-ordinary gap over L in {48..384}, beta in {1, 1/sqrt(L)}, with and
without the Pre-RMSNorm. Depth curves come from one network of the largest depth (the
first L blocks of it are a depth-L network).

  python -m experiments.transforming_rank.fig4_placement --scale quick --out runs/tr
"""
from __future__ import annotations

import math

import jax
import numpy as np

from experiments.transforming_rank import common
from rankjax.config import MLPConfig

NAME = "fig4_placement"
SCALES = {
    "quick": dict(depth=384, width=64, seeds=1, report_depths=(48, 96, 192, 384),
                  alphas=(0.5, 1.0, 2.0), gap_depths=(48, 384)),
    "paper": dict(depth=384, width=256, seeds=1, report_depths=(48, 96, 192, 384),
                  alphas=(0.5, 1.0, 2.0), gap_depths=(48, 96, 192, 384)),
}
KEY = jax.random.PRNGKey(4)


def _cfg(s, p="none", b="none", r="none") -> MLPConfig:
  return MLPConfig(depth=s["depth"], width=s["width"], expansion=1.0, norm_position="none",
                   p_norm=p, b_norm=b, r_norm=r)


def _curve(cfg, s, alpha=1.0, beta=1.0) -> np.ndarray:
  return common.jacobian_samples(cfg, KEY, alpha, beta, num_seeds=s["seeds"])["erank"].mean(
      axis=(0, 1))


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  at = [l - 1 for l in s["report_depths"]]
  placements = {"pre": _cfg(s, p="rms"), "output": _cfg(s, b="rms"), "post": _cfg(s, r="rms"),
                "none": _cfg(s)}
  panel_a = {k: _curve(c, s) for k, c in placements.items()}
  ops = ("rms", "detached_rms", "mean", "layer", "none")
  panel_b = {op: _curve(_cfg(s, p="rms", r=op), s) for op in ops}
  fig10 = {op: _curve(_cfg(s, r=op), s) for op in ops}

  split = {}
  for a in s["alphas"]:
    er = {op: _curve(_cfg(s, p="rms", r=op), s, alpha=a) for op in ("none", "detached_rms", "rms")}
    split[a] = {"rescaling": (er["none"] - er["detached_rms"])[at],
                "projection": (er["detached_rms"] - er["rms"])[at]}
  gaps = []
  for p_op in ("rms", "none"):
    for a in s["alphas"]:
      # beta = 1: one network gives every depth; beta = 1/sqrt(L): one run per depth.
      er = {op: _curve(_cfg(s, p=p_op, r=op), s, alpha=a) for op in ("detached_rms", "rms")}
      gaps.extend(np.abs(er["detached_rms"] - er["rms"])[[l - 1 for l in s["gap_depths"]]])
      for depth in s["gap_depths"]:
        er = {op: _curve(_cfg(s, p=p_op, r=op), s, alpha=a, beta=1 / math.sqrt(depth))[depth - 1]
              for op in ("detached_rms", "rms")}
        gaps.append(abs(er["detached_rms"] - er["rms"]))
  max_proj = max(float(np.max(np.abs(v["projection"]))) for v in split.values())

  fmt_at = lambda c: ", ".join(f"{c[i]:.3f}" for i in at)
  summary = [
      common.row(f"Fig 4a: erank/d at L={s['report_depths']} pre", "floor", fmt_at(panel_a["pre"])),
      common.row("Fig 4a: output-norm", "floor, marginally below pre (App B.5)",
                 fmt_at(panel_a["output"])),
      common.row("Fig 4a: post-norm", "collapses at the rate of no norm", fmt_at(panel_a["post"])),
      common.row("Fig 4a: no norm", "collapses", fmt_at(panel_a["none"])),
      common.row("Fig 4b (Pre-RMSNorm): post detached rescale", "collapses like RMSNorm",
                 fmt_at(panel_b["detached_rms"])),
      common.row("Fig 4b (Pre-RMSNorm): post mean subtraction", "keeps a floor",
                 fmt_at(panel_b["mean"])),
      common.row("Fig 4b (Pre-RMSNorm): post LayerNorm / RMSNorm", "collapse",
                 f"{fmt_at(panel_b['layer'])} / {fmt_at(panel_b['rms'])}"),
      common.row("Fig 4c: max |projection part| over alpha in {0.5,1,2} and depths",
                 "<= 0.004 of full rank (d=256: ~1 direction)",
                 f"{max_proj:.4f} (= {max_proj * s['width']:.2f} directions at d={s['width']})"),
      common.row("Fig 4c: rescaling part at L_max, alpha = " + ", ".join(map(str, s["alphas"])),
                 "accounts for essentially all",
                 ", ".join(f"{split[a]['rescaling'][-1]:.3f}" for a in s["alphas"])),
      common.row("App B.2: max |erank(detached) - erank(rms)|/d over L, beta, alpha, +-Pre-RMSNorm",
                 "<= 0.004 (largest 0.0039 = 1.0 directions at d=256)",
                 f"{max(gaps):.4f} (= {max(gaps) * s['width']:.2f} directions)"),
      common.row("Fig 10a (no Pre-RMSNorm): post none / mean / rms / detached at L_max",
                 "all four collapse, indistinguishable",
                 " / ".join(f"{fig10[o][-1]:.3f}" for o in ("none", "mean", "rms", "detached_rms"))),
      common.row("Fig 10b: post RMSNorm / LayerNorm with vs without Pre-RMSNorm at L_max",
                 "coincide", f"{panel_b['rms'][-1]:.3f} vs {fig10['rms'][-1]:.3f}; "
                 f"{panel_b['layer'][-1]:.3f} vs {fig10['layer'][-1]:.3f}"),
  ]
  fig, axes = common.plt.subplots(1, 4, figsize=(17, 3.8))
  ls = np.arange(1, s["depth"] + 1)
  for k, v in panel_a.items():
    axes[0].plot(ls, v, label=k)
  for k, v in panel_b.items():
    axes[1].plot(ls, v, label=f"pre-rms + post {k}")
  for a, v in split.items():
    axes[2].plot(s["report_depths"], v["rescaling"], "o-", label=f"rescaling, alpha={a}")
    axes[2].plot(s["report_depths"], v["projection"], "x--", label=f"projection, alpha={a}")
  for k, v in fig10.items():
    axes[3].plot(ls, v, label=f"post {k} (no pre-norm)")
  titles = ("(a) placement", "(b) post-residual op", "(c) rank removed by post-RMSNorm",
            "Fig 10: no Pre-RMSNorm")
  for ax, t in zip(axes, titles):
    ax.set_title(t)
    ax.set_xlabel("depth")
    ax.legend(fontsize=6)
  axes[0].set_ylabel("erank(dh_l/dh_0) / d")
  result = {"settings": s, "panel_a": panel_a, "panel_b": panel_b, "fig10": fig10,
            "split": {str(a): v for a, v in split.items()},
            "max_detached_gap": max(gaps), "summary": summary}
  return common.write(out_dir, NAME, result, fig)


if __name__ == "__main__":
  common.main(run, __doc__)
