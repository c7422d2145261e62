"""Fig 7, Fig 14 and App C anchors: the coherent mean spike of a single uncentered matrix.

Residual representation Z_l (rows: h_l of n Gaussian probe inputs) at initialization,
Pre-RMSNorm, beta=1, d=256, L=512, 3 seeds, for a one-matrix ReLU branch (M=1), a
two-matrix ReLU branch (M=2; both matrices d x d, our choice: the paper does not state
the expansion for Fig 7) and a one-matrix tanh branch; plus one-matrix GELU for the
Sec 5 / App C numbers. (a) cos(m_l, m_{l+1}) of consecutive branch means; (b) ||mu_l||
and its growth exponent over l in [50, 512] with the n-sample noise floor; (c) the top
16 singular values of Z_L and the top-direction energy; (d) erank(Z_l)/d. Fig 14: all
pairs cos(m_l, m_l') sampled every 8 layers, off-diagonal mean, drawn for all three
branches in ``fig14_pairwise_cosines.png`` (panels a, b, c). App C: cos(m_l, 1) ->
sqrt(c) and cos(mu_l, 1) -> 1. Probe sizes per panel as the paper gives them
(``SCALES``: 32768 for (b), 4096 for (a) and Fig 14, 512 for (c, d)).

  python -m experiments.transforming_rank.fig7_mean_spike --scale quick --out runs/tr
"""
from __future__ import annotations

import jax
import numpy as np

from experiments.transforming_rank import common
from rankjax import plotting
from rankjax.config import MLPConfig
from rankjax.measure import representations, spectra

NAME = "fig7_mean_spike"
# Probe sizes per panel (App C, "Probe sizes in Figure 7"): the mean-magnitude panel
# (b) n = 32768, the alignment panel (a) and Fig 14 n = 4096, the rank and spectrum
# panels (c, d) n = 512. Quick scale uses one n = 1024 for all.
SCALES = {
    "quick": dict(depth=512, width=64, seeds=2, inputs_mean=1024, inputs_align=1024,
                  inputs_rank=1024, layer_every=8, fit_from=50),
    "paper": dict(depth=512, width=256, seeds=3, inputs_mean=32768, inputs_align=4096,
                  inputs_rank=512, layer_every=8, fit_from=50),
}
PANEL_INPUTS = {"mean": "inputs_mean", "align": "inputs_align", "rank": "inputs_rank"}
CONFIGS = {
    "M=1 relu": dict(branch_matrices=1, activation="relu"),
    "M=2 relu": dict(branch_matrices=2, expansion=1.0, activation="relu"),
    "M=1 tanh": dict(branch_matrices=1, activation="tanh"),
    "M=1 gelu": dict(branch_matrices=1, activation="gelu"),
}


# Fig 14's three panels: (a) one uncentered matrix, (b) two matrices, (c) a centered
# activation.
FIG14_PANELS = ("M=1 relu", "M=2 relu", "M=1 tanh")
NEAR, FAR = 64, 256   # layer separations compared for Fig 14's "no decay with separation"


def separation_means(c_KxK: np.ndarray, layers, near: int = NEAR, far: int = FAR
                     ) -> tuple[float, float]:
  """Mean of ``cos(m_l, m_l')`` over the sampled pairs with ``0 < |l - l'| <= near`` and
  over those with ``|l - l'| >= far`` (Fig 14a: a uniform field, no decay with
  separation). nan where no pair qualifies."""
  ls = np.asarray(layers)
  sep = np.abs(ls[:, None] - ls[None, :])
  c = np.asarray(c_KxK, float)
  pick = lambda m: float(c[m].mean()) if m.any() else float("nan")
  return pick((sep > 0) & (sep <= near)), pick(sep >= far)


def _fig14(out_dir: str, res: dict, layers, s: dict) -> None:
  """Fig 14 (``fig14_pairwise_cosines.png``): cos(m_l, m_l') of the branch means at
  the sampled layers for (a) M=1 relu, (b) M=2 relu, (c) M=1 tanh, each panel titled
  with its off-diagonal mean (paper: 0.320 / 0.002 / -0.000)."""
  import pathlib
  fig, axes = common.plt.subplots(1, 3, figsize=(15, 4.6))
  ext = (layers[0] - 0.5 * s["layer_every"], layers[-1] + 0.5 * s["layer_every"])
  for ax, name, tag in zip(axes, FIG14_PANELS, "abc"):
    im = ax.imshow(res[name]["pairwise"], vmin=-1, vmax=1, cmap="RdBu_r", origin="upper",
                   extent=(ext[0], ext[1], ext[1], ext[0]))
    ax.set_title(f"({tag}) {name}\noff-diagonal mean {res[name]['pairwise_offdiag_mean']:+.3f}",
                 fontsize=9)
    ax.set(xlabel="layer l'", ylabel="layer l" if tag == "a" else "")
  fig.colorbar(im, ax=list(axes), shrink=0.8, label="cos(m_l, m_l')")
  fig.suptitle(f"Fig 14: pairwise branch-mean cosines (d={s['width']}, L={s['depth']}, "
               f"n={s['inputs_align']}, {s['seeds']} seeds, every {s['layer_every']} layers)",
               fontsize=9)
  pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
  plotting.save_figure(fig, pathlib.Path(out_dir) / "fig14_pairwise_cosines.png", dpi=110)
  common.plt.close(fig)


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  L = s["depth"]
  layers = tuple(range(s["layer_every"], L + 1, s["layer_every"]))
  res = {}
  with common.single_blas_thread():
    for name, kw in CONFIGS.items():
      cfg = MLPConfig(depth=L, width=s["width"], norm_position="pre", **kw)
      by_n = {}   # one study per distinct probe size, shared by the panels that use it
      for n in dict.fromkeys(s[k] for k in PANEL_INPUTS.values()):
        st = representations.mlp_representation_study(cfg, jax.random.PRNGKey(7), n,
                                                       s["seeds"], layers)
        by_n[n] = jax.tree.map(np.asarray, st)
      mean, align, rank = (by_n[s[PANEL_INPUTS[k]]] for k in ("mean", "align", "rank"))
      ls = np.arange(L + 1)
      sampled = align.branch_cosine[np.ix_(np.array(layers) - 1, np.array(layers) - 1)]
      deep = slice(s["fit_from"], None)
      res[name] = {
          "consecutive_cos_deep": float(np.mean(align.consecutive_cosine[deep])),
          "pairwise_offdiag_mean": float(representations.off_diagonal_mean(sampled)),
          "cos_ones_deep": float(np.mean(align.cosine_ones[deep])),
          "stream_cos_ones_L": float(align.stream_cosine_ones[-1]),
          "growth_exponent": representations.growth_exponent(
              mean.mean_spike[1:], ls[1:], s["fit_from"], L),
          "top_energy_L": float(rank.top_energy[-1]),
          "erank_L": float(rank.erank[-1]),
          "erank": rank.erank, "mean_spike": mean.mean_spike, "noise_floor": mean.noise_floor,
          "consecutive_cos": align.consecutive_cosine, "top16": rank.top_singular_values[-1][:16],
          "pairwise": sampled,
          "pairwise_near_far": separation_means(sampled, layers),
      }
  c = {a: spectra.coherence_constant(a) for a in ("relu", "gelu")}
  r = lambda n, k: res[n][k]
  summary = [
      common.row("Fig 7a: cos(m_l, m_l+1), deep layers: M=1 relu / M=2 relu / tanh",
                 f"1/pi={c['relu']:.3f} / ~0 / ~0",
                 " / ".join(common.fmt(r(n, "consecutive_cos_deep")) for n in
                            ("M=1 relu", "M=2 relu", "M=1 tanh"))),
      common.row("Fig 14: pairwise cos(m_l, m_l') off-diagonal mean: M=1 relu / M=2 relu / tanh",
                 "0.320 / 0.002 / -0.000",
                 " / ".join(common.fmt(r(n, "pairwise_offdiag_mean")) for n in
                            ("M=1 relu", "M=2 relu", "M=1 tanh"))),
      common.row(f"Fig 14a/b: pairwise cos at layer separation <= {NEAR} vs >= {FAR}: "
                 "M=1 relu / M=2 relu", "uniform in separation (a: ~1/pi at every pair; "
                 "b: ~0 at every pair)",
                 " / ".join("{:.3f} vs {:.3f}".format(*r(n, "pairwise_near_far"))
                            for n in ("M=1 relu", "M=2 relu")), status="qualitative"),
      common.row("Sec 5: pairwise cos for M=1 gelu", f"0.188 (c={c['gelu']:.3f})",
                 common.fmt(r("M=1 gelu", "pairwise_offdiag_mean"))),
      common.row("App C: cos(m_l, 1) deep: M=1 relu / gelu", "0.565 / 0.433 (sqrt c: 0.564 / 0.432)",
                 f"{r('M=1 relu', 'cos_ones_deep'):.3f} / {r('M=1 gelu', 'cos_ones_deep'):.3f}"),
      common.row("App C: cos(mu_L, 1), M=1 relu", "-> 1", common.fmt(r("M=1 relu", "stream_cos_ones_L"))),
      common.row(f"Fig 7b: growth exponent of ||mu_l||, l in [{s['fit_from']}, {L}]: M=1 / M=2 relu",
                 "0.99 / 0.56",
                 f"{r('M=1 relu', 'growth_exponent'):.2f} / {r('M=2 relu', 'growth_exponent'):.2f}"),
      common.row("Fig 7c: top-direction energy of Z_L: M=1 relu / M=2 relu / tanh", "1.00 / 0.70 / 0.08",
                 " / ".join(common.fmt(r(n, "top_energy_L"), 2) for n in
                            ("M=1 relu", "M=2 relu", "M=1 tanh"))),
      common.row("Fig 7d: erank(Z_L)/d: M=1 relu / M=2 relu / tanh",
                 "collapses (0.010 at d=256, Table 6) / ~0.5 / finite",
                 " / ".join(common.fmt(r(n, "erank_L")) for n in ("M=1 relu", "M=2 relu", "M=1 tanh"))),
  ]
  fig, axes = common.plt.subplots(1, 4, figsize=(17, 3.8))
  ls = np.arange(L + 1)
  for n in FIG14_PANELS:
    axes[0].plot(np.arange(1, L), res[n]["consecutive_cos"], lw=0.6, label=n)
    axes[1].plot(ls[1:], res[n]["mean_spike"][1:], label=n)
    axes[2].plot(np.arange(1, 17), res[n]["top16"], "o-", ms=3, label=n)
    axes[3].plot(layers, res[n]["erank"], label=n)
  axes[0].axhline(c["relu"], color="k", ls="--", lw=0.8)
  axes[1].plot(ls[1:], res["M=1 tanh"]["noise_floor"][1:], color="gray", lw=0.8, label="noise floor")
  axes[1].set_xscale("log")
  axes[1].set_yscale("log")
  for ax, t in zip(axes, ("(a) cos(m_l, m_l+1)", "(b) ||mu_l||", "(c) top-16 sv of Z_L",
                          "(d) erank(Z_l)/d")):
    ax.set_title(t)
    ax.legend(fontsize=7)
  _fig14(out_dir, res, layers, s)
  result = {"settings": s, "coherence": c, "results": res, "summary": summary}
  return common.write(out_dir, NAME, result, fig)


if __name__ == "__main__":
  common.main(run, __doc__)
