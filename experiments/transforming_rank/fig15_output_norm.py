"""Fig 15 (App C): only a branch-output normalization that subtracts the mean removes the spike.

erank(Z_l)/d for a one-matrix ReLU branch at initialization (beta=1, d=256, 3 seeds):
(a) Pre-RMSNorm vs Pre-LayerNorm (0.009 vs 0.078 at depth 512); (b) with a
Pre-RMSNorm, a branch-output operation none / RMSNorm / mean subtraction / LayerNorm
(0.009 / 0.008 / 0.745 / 0.745). Probe size n = 512 (the paper's rank-panel size).

  rankjax reproduce transforming_rank --only fig15
"""
from __future__ import annotations

import jax
import numpy as np

from . import common
from rankjax import measure
from rankjax.config import MLPConfig
from rankjax.studies import claims, measured

NAME = "fig15_output_norm"
SCALES = {
    "quick": dict(depth=512, width=64, seeds=10, inputs=512, layer_every=16),
    "paper": dict(depth=512, width=256, seeds=3, inputs=512, layer_every=8),
    "tiny": dict(depth=512, width=16, seeds=2, inputs=128, layer_every=32),
}
PANELS = {
    "a/pre rms": dict(p_norm="rms"),
    "a/pre layer": dict(p_norm="layer"),
    "b/out none": dict(p_norm="rms", b_norm="none"),
    "b/out rms": dict(p_norm="rms", b_norm="rms"),
    "b/out mean": dict(p_norm="rms", b_norm="mean"),
    "b/out layer": dict(p_norm="rms", b_norm="layer"),
}
PAPER = {"a/pre rms": 0.009, "a/pre layer": 0.078, "b/out none": 0.009, "b/out rms": 0.008,
         "b/out mean": 0.745, "b/out layer": 0.745}
ITEMS = {"a/pre rms": "Fig 15a: Pre-RMSNorm", "a/pre layer": "Fig 15a: Pre-LayerNorm",
         "b/out none": "Fig 15b: Pre-RMSNorm, branch-output none",
         "b/out rms": "Fig 15b: Pre-RMSNorm, branch-output RMSNorm",
         "b/out mean": "Fig 15b: Pre-RMSNorm, branch-output mean subtraction",
         "b/out layer": "Fig 15b: Pre-RMSNorm, branch-output LayerNorm"}
CLAIMS = claims(
    common.frac(ITEMS[k], "erank(Z_512)/d, one-matrix ReLU branch", v) for k, v in PAPER.items())

_A = ("Pre-LayerNorm, which centers the branch input, reaches ... by depth ... against ... for "
      "Pre-RMSNorm")
_B = ("mean subtraction and LayerNorm preserve the rank ... while RMSNorm and no branch "
      "normalization collapse")
WORDS = [
    ("Fig 15a", "Fig 15a", _A),
    ("branch-output none", "Fig 15b", _B, {"kind": "identity", "note": (
        "a duplicate: Pre-RMSNorm with no branch-output norm is Fig 15a's Pre-RMSNorm network, "
        "the same run (shown, not counted)")}),
    ("Fig 15b", "Fig 15b", _B),
]
CLAIMS = common.worded(CLAIMS, WORDS)


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  L = s["depth"]
  layers = tuple(range(s["layer_every"], L + 1, s["layer_every"]))
  curves, final = {}, {}
  with common.single_blas_thread():
    for name, kw in PANELS.items():
      if name == "b/out none":
        curves[name] = curves["a/pre rms"]
        continue
      cfg = MLPConfig(depth=L, width=s["width"], branch_matrices=1, norm_position="none", **kw)
      st = measure.mlp_representation_study(cfg, jax.random.PRNGKey(10), s["inputs"],
                                            s["seeds"], layers)
      curves[name] = np.asarray(st.erank)
      final[name] = np.asarray(st.per_seed["erank"])[:, -1].tolist()
  final["b/out none"] = final["a/pre rms"]
  seeds = list(range(s["seeds"]))   # mlp_representation_study(PRNGKey(10), ..., seeds)
  note = "" if L == 512 else f"at L={L}"
  summary = [measured(ITEMS[k], final[k], seeds=seeds, note=note) for k in PANELS]
  fig, axes = common.plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
  for name, c in curves.items():
    panel, label = name.split("/")
    line, = axes[0 if panel == "a" else 1].plot(layers, c, label=label)
    axes[0 if panel == "a" else 1].plot([512], [PAPER[name]], "x", color=line.get_color(),
                                         ms=8)   # the paper's printed value at depth 512
  for ax in axes:
    ax.set_xlabel("layer l")
    ax.legend()
  axes[0].set_ylabel("erank(Z_l)/d")
  result = {"settings": s, "layers": layers, "curves": curves, "final_per_seed": final,
            "measured": summary}
  return common.write(out_dir, NAME, result, fig)
