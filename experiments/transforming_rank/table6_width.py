"""Table 6 (App C): the single-matrix rank collapse is not a narrow-network artifact.

erank(Z_l)/d for a one-matrix ReLU branch at initialization (Pre-RMSNorm, beta=1,
3 seeds, n = max(1024, 2d) Gaussian probe inputs) at layers 32..512 and widths
128..1024 (quick: widths 64, 128, 2 seeds).

  rankjax reproduce transforming_rank --only table6
"""
from __future__ import annotations

import jax
import numpy as np

from . import common
from rankjax import measure
from rankjax.config import MLPConfig
from rankjax.studies import claims, measured

NAME = "table6_width"
SCALES = {
    "quick": dict(widths=(64, 128), layers=(32, 64, 128, 256, 512), seeds=10, min_inputs=1024),
    "paper": dict(widths=(128, 256, 512, 1024), layers=(32, 64, 128, 256, 512), seeds=3,
                  min_inputs=1024),
    "tiny": dict(widths=(16, 32), layers=(32, 64, 128, 256, 512), seeds=2, min_inputs=128),
}
PAPER = {128: (0.216, 0.097, 0.044, 0.023, 0.015), 256: (0.229, 0.100, 0.040, 0.018, 0.010),
         512: (0.250, 0.109, 0.040, 0.015, 0.007), 1024: (0.296, 0.136, 0.047, 0.015, 0.006)}
PAPER_LAYERS = (32, 64, 128, 256, 512)
CLAIMS = claims(
    [common.frac(f"Table 6: d={d}, l={l}", f"erank(Z_l)/d, one-matrix ReLU branch, d={d}", v)
     for d, vals in PAPER.items() for l, v in zip(PAPER_LAYERS, vals)]
    + [common.frac("App C: top-direction energy at l=512", "energy share of the top (mean) "
                    "direction of Z_512, widest width run", 1.0,
                    "App C: the surviving direction is the mean; its energy share -> 1")])

WORDS = [
    ("Table 6", "Table 6", "Effective rank as a fraction of width ... The collapse occurs at "
     "every width."),
    ("top-direction energy", "Table 6", "and the mean fraction reaches ... by the same depth"),
]
CLAIMS = common.worded(CLAIMS, WORDS)


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  table = {}
  with common.single_blas_thread():
    for d in s["widths"]:
      cfg = MLPConfig(depth=max(s["layers"]), width=d, branch_matrices=1, norm_position="pre")
      st = measure.mlp_representation_study(
          cfg, jax.random.PRNGKey(9), max(s["min_inputs"], 2 * d), s["seeds"], s["layers"])
      table[d] = {"erank": np.asarray(st.erank), "top_energy": np.asarray(st.top_energy),
                  "per_seed_erank": np.asarray(st.per_seed["erank"]),
                  "per_seed_top_energy": np.asarray(st.per_seed["top_energy"])}
  seeds = list(range(s["seeds"]))   # mlp_representation_study(PRNGKey(9), ..., seeds)
  summary = []
  for d in s["widths"]:
    for j, l in enumerate(s["layers"]):
      item = f"Table 6: d={d}, l={l}"
      if item in CLAIMS:
        summary.append(measured(item, table[d]["per_seed_erank"][:, j].tolist(), seeds=seeds))
      elif d not in PAPER:   # a quick-scale width the paper does not have: no claim
        pass
  widest = max(s["widths"])
  summary.append(measured("App C: top-direction energy at l=512",
      table[widest]["per_seed_top_energy"][:, -1].tolist(), seeds=seeds, note=f"d={widest}"))
  fig, ax = common.plt.subplots(figsize=(5, 3.5))
  for d in s["widths"]:
    line, = ax.plot(s["layers"], table[d]["erank"], "o-", label=f"d={d}")
    if d in PAPER:
      ax.plot(PAPER_LAYERS, PAPER[d], "x", color=line.get_color(), ms=8)
  ax.set_title("x: the paper's Table 6", fontsize=8)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("layer l")
  ax.set_ylabel("erank(Z_l)/d")
  ax.legend()
  result = {"settings": s, "table": {str(d): v for d, v in table.items()}, "measured": summary}
  return common.write(out_dir, NAME, result, fig)
