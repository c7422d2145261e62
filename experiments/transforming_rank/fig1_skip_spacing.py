"""Fig 1: skip connections restore the rank each feedforward block contracts.

erank(dh_l/dh_0)/d across depth for a Pre-Norm ReLU residual MLP (L=48, d=256,
beta=alpha=1, 4x expansion, 12 seeds): (left) no skips / a skip every block / a skip
every 4th block; (center) beta = 1 vs 1/sqrt(L); (right) width expansion 1x..8x with
skips every 4th block.

  python -m experiments.transforming_rank.fig1_skip_spacing --scale quick --out runs/tr
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from experiments.transforming_rank import common
from rankjax.config import MLPConfig

NAME = "fig1_skip_spacing"
SCALES = {
    "quick": dict(depth=48, width=64, seeds=3, expansions=(1.0, 2.0, 4.0, 8.0)),
    "paper": dict(depth=48, width=256, seeds=12, expansions=(1.0, 2.0, 4.0, 8.0)),
}


def _erank(cfg: MLPConfig, beta: float, s: dict) -> np.ndarray:
  out = common.jacobian_samples(cfg, jax.random.PRNGKey(1), 1.0, beta, num_seeds=s["seeds"])
  return out["erank"].mean(axis=(0, 1))


def _sawtooth(erank: np.ndarray, every: int) -> tuple[float, float]:
  """Mean change of erank/d across inner blocks and across skip-closing blocks."""
  prev = np.concatenate([[1.0], erank[:-1]])
  delta = erank - prev
  closes = (np.arange(1, len(erank) + 1) % every) == 0
  return float(delta[~closes].mean()), float(delta[closes].mean())


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  L, d = s["depth"], s["width"]
  base = MLPConfig(depth=L, width=d, expansion=4.0, norm_position="pre")
  curves: dict[str, list] = {}
  for every, label in ((0, "no skips"), (1, "skip every block"), (4, "skip every 4th")):
    cfg = dataclasses.replace(base, skip_every=every)
    curves[f"left/{label}"] = _erank(cfg, 1.0, s)
  for every in (4, 1):
    cfg = dataclasses.replace(base, skip_every=every)
    curves[f"center/every {every}, beta=1"] = (curves["left/skip every 4th"] if every == 4
                                               else curves["left/skip every block"])
    curves[f"center/every {every}, beta=1/sqrt(L)"] = _erank(cfg, 1 / math.sqrt(L), s)
  for e in s["expansions"]:
    cfg = dataclasses.replace(base, skip_every=4, expansion=e)
    curves[f"right/{e:g}x"] = (curves["left/skip every 4th"] if e == 4.0 else _erank(cfg, 1.0, s))

  inner, closing = _sawtooth(curves["left/skip every 4th"], 4)
  inner_s, closing_s = _sawtooth(curves["center/every 4, beta=1/sqrt(L)"], 4)
  troughs = {k: float(np.min(v)) for k, v in curves.items() if k.startswith("right/")}
  summary = [
      common.row("Fig 1 left: no skips, erank(dh_L/dh_0)/d", "collapses (gray)",
                 common.fmt(curves["left/no skips"][-1])),
      common.row("Fig 1 left: skip every block, erank_L/d", "decays smoothly (blue)",
                 common.fmt(curves["left/skip every block"][-1])),
      common.row("Fig 1 left: skip every 4th, mean d(erank/d) inner / closing blocks",
                 "contracts inside, restored at skips",
                 f"{inner:+.3f} / {closing:+.3f}"),
      common.row("Fig 1 center: every 4th, beta=1/sqrt(L): inner / closing; erank_L/d",
                 "skip nearly restores each loss; rank preserved",
                 f"{inner_s:+.3f} / {closing_s:+.3f}; "
                 f"{common.fmt(curves['center/every 4, beta=1/sqrt(L)'][-1])}"),
      common.row("Fig 1 center: every block, beta=1/sqrt(L), erank_L/d", "preserved (near 1)",
                 common.fmt(curves["center/every 1, beta=1/sqrt(L)"][-1])),
      common.row("Fig 1 right: sawtooth trough (min erank/d) by expansion",
                 "higher expansion raises the troughs",
                 ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in troughs.items())),
  ]

  fig, axes = common.plt.subplots(1, 3, figsize=(14, 4), sharey=True)
  ls = np.arange(1, L + 1)
  for key, val in curves.items():
    panel, label = key.split("/", 1)
    ax = axes[{"left": 0, "center": 1, "right": 2}[panel]]
    ax.plot(ls, val, label=label)
  for ax, title in zip(axes, ("skip spacing", "branch scale (skip every 4th / every)",
                              "width expansion (skip every 4th)")):
    ax.set_title(title)
    ax.set_xlabel("layer l")
    ax.legend(fontsize=7)
  axes[0].set_ylabel("erank(dh_l/dh_0) / d")
  result = {"settings": s, "curves": curves, "summary": summary}
  return common.write(out_dir, NAME, result, fig)


if __name__ == "__main__":
  common.main(run, __doc__)
