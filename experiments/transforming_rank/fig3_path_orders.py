"""Fig 3 and App A.1: per-order path magnitudes, normalized profiles and mean order.

Pre-Norm ReLU residual MLP at initialization (d=256, L=48, 4x expansion, 8 seeds):
(a) mu_k = ||beta^k S_k||_F for beta in {1, 1/sqrt(L), 1/L}; (b) the same normalized to
sum to one; (c) alpha sweep at beta=1; (d) mean order <k> against beta*alpha^M for
alpha sweeps at three betas (independent draws at every grid point, App A.1). Also the
reconstruction check sum_k beta^k S_k = dh_L/dh_0 against autodiff in float64.

  rankjax reproduce transforming_rank --only fig3
"""
from __future__ import annotations

import math

import jax
import numpy as np
from scipy.special import logsumexp

from . import common
from rankjax.config import MLPConfig
from rankjax.studies import Abs, Bound, Claim, claims, measured

NAME = "fig3_path_orders"
SCALES = {
    "quick": dict(depth=48, width=64, seeds=10, alphas=(0.25, 0.5, 0.71, 1.0, 1.41, 2.0),
                  panel_c_alphas=(0.5, 1.0, 2.0)),
    "paper": dict(depth=48, width=256, seeds=8,
                  alphas=(0.25, 0.35, 0.5, 0.71, 1.0, 1.41, 2.0),
                  panel_c_alphas=(0.5, 1.0, 2.0)),
    "tiny": dict(depth=48, width=16, seeds=2, alphas=(0.25, 0.5, 1.0, 2.0),
                 panel_c_alphas=(0.5, 1.0, 2.0)),
}

INT = Abs(0.5)   # an integer (an order): equal as integers
_PEAK_WORDS = ("gives the profile in Figure 3, whose peak (the order of largest magnitude) "
               "sits at order three for ... and at the order-0 skip for")
_FIG3_AVG = ("App A.1 fixes the statistic: 'Figure 3 reports the mu_k and their normalized "
             "profile, averaged over 8 seeds', and the profile's peak is the figure's")
_ONE_CURVE = "depends only on the branch-to-skip ratio ... so all points fall on a single curve"
_THREE_SE = ("max over the overlapping points of |<k> - <k>(beta=1 curve)| in units of its "
             "standard error; the paper prints no tolerance: 3 s.e. is our limit on the "
             "largest of about 9 deviations (a family-wise threshold: a two-sided Sidak "
             "level for 9 normal deviations is 2.8 s.e.)")
CLAIMS = claims([
    *(Claim(f"Fig 3b: peak of the mean profile, beta={b}", "argmax_k of the "
            "seed-mean normalized profile mu_k / sum mu_k (what Fig 3b plots)",
            k, INT, _FIG3_AVG, where="Fig 3b", quote=_PEAK_WORDS,
            post_hoc="made the headline after a review reported that the "
            "mean profile's peak (computed, used by no row) equals the "
            "paper's 3; the text fixes this statistic")
      for b, k in (("1", 3), ("1/sqrt(L)", 0), ("1/L", 0))),
    *(Claim(f"Fig 3b: peak order, beta={b}", "argmax_k of the normalized "
            "profile mu_k / sum mu_k (per seed)", k, INT,
            "another statistic than the figure's: the per-seed argmax (the "
            "former headline)", where="Fig 3b", quote=_PEAK_WORDS,
            kind="sensitivity")
      for b, k in (("1", 3), ("1/sqrt(L)", 0), ("1/L", 0))),
    Claim(
        "Fig 3d: <k> on one curve of beta*alpha^M", _THREE_SE + "; the beta=1 curve "
        "interpolated linearly in log(beta*alpha^2)", None, Bound(
            "<", limit=3.0), "Fig 3d: points of equal beta*alpha^M fall on one curve; "
        "independent draws per point; the text does not say how the curve between the "
        "beta=1 points is read (the figure's axis scale is not in the text): two readings",
        where="Fig 3d", quote=_ONE_CURVE, reading="interpolation in log(beta*alpha^2)"),
    Claim(
        "Fig 3d: <k> on one curve of beta*alpha^M, linear interpolation", _THREE_SE + "; the "
        "beta=1 curve interpolated linearly in beta*alpha^2", None, Bound(
            "<", limit=3.0), "Fig 3d: the same stored points as the log reading",
        where="Fig 3d", quote=_ONE_CURVE, reading="interpolation linear in beta*alpha^2",
        post_hoc="declared after a review reported 0.98 s.e. under it (3.43 under the log "
        "reading)"),
    Claim(
        "App A.1: reconstruction, float64", "max relative error of sum_k beta^k S_k vs "
        "autodiff dh_L/dh_0", None, Bound("<", limit=common.FLOAT64_EXACT),
        "App A.1: 'of order 1e-15'; our limit 1e-12 (float64 rounding)", where="App A.1",
        quote="confirm the two agree to a relative Frobenius error of order"),
])


def _orders(cfg, key, alpha, beta, seeds):
  out = common.jacobian_samples(cfg, key, alpha, beta, num_seeds=seeds, path_sums=True)
  lm = out["order_log_mass"].reshape(-1, cfg.depth + 1)
  log_mu = logsumexp(lm, axis=0) - math.log(lm.shape[0])       # log of the mean mu_k
  k = out["mean_order"].ravel()
  # ln, as everywhere else (the study's order_log_mass, rankjax measure's path_mass_unit);
  # only the figure's axis is log10, as the paper's Fig 3a
  peaks = np.argmax(out["order_profile"].mean(axis=1), axis=-1)   # per seed
  return {"log_mu": log_mu, "profile": out["order_profile"].mean(axis=(0, 1)),
          "peak_per_seed": [int(p) for p in peaks],
          "mean_order": float(k.mean()), "mean_order_se": float(k.std(ddof=1) / math.sqrt(k.size)),
          "reconstruction_error": float(out["reconstruction_error"].max())}


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  L = s["depth"]
  cfg = MLPConfig(depth=L, width=s["width"], expansion=4.0, norm_position="pre")
  betas = {"1": 1.0, "1/sqrt(L)": 1 / math.sqrt(L), "1/L": 1 / L}
  key = jax.random.PRNGKey(3)
  panel_ab = {name: _orders(cfg, key, 1.0, b, s["seeds"]) for name, b in betas.items()}
  panel_c = {a: _orders(cfg, jax.random.fold_in(key, 100 + i), a, 1.0, s["seeds"])
             for i, a in enumerate(s["panel_c_alphas"])}
  panel_d = {}
  for bi, (name, b) in enumerate(betas.items()):
    pts = []
    for ai, a in enumerate(s["alphas"]):
      r = _orders(cfg, jax.random.fold_in(key, 1000 * (bi + 1) + ai), a, b, s["seeds"])
      pts.append((b * a * a, r["mean_order"], r["mean_order_se"]))
    panel_d[name] = pts

  # Collapse of <k> onto one curve of beta*alpha^2: compare each beta's curve with the
  # beta=1 curve, interpolated in log(beta*alpha^2) where their ranges overlap.
  ref = np.array(panel_d["1"])
  # Two readings of the curve between the beta=1 points: in log(beta*alpha^2), and linear.
  collapse = {}
  for reading, f in (("log", np.log), ("linear", lambda x: x)):
    dev, dev_se, zs = [], [], []
    for name, pts in panel_d.items():
      p = np.array(pts)
      inside = (p[:, 0] >= ref[:, 0].min()) & (p[:, 0] <= ref[:, 0].max())
      if name != "1" and inside.any():
        interp = np.interp(f(p[inside, 0]), f(ref[:, 0]), ref[:, 1])
        se = np.hypot(p[inside, 2], np.interp(f(p[inside, 0]), f(ref[:, 0]), ref[:, 2]))
        z = np.abs(p[inside, 1] - interp)
        dev.extend(z.tolist())
        dev_se.extend(se.tolist())
        zs.extend((z / se).tolist())
    collapse[reading] = {"dev": dev, "dev_se": dev_se, "z": zs}

  recon64 = None
  with jax.enable_x64(True):
    cfg64 = MLPConfig(depth=L, width=s["width"], expansion=4.0, param_dtype="float64")
    out = common.jacobian_samples(cfg64, key, 1.0, 1.0, num_seeds=1, path_sums=True,
                                  reference="network")
    recon64 = float(out["reconstruction_error"].max())
  recon32 = max(r["reconstruction_error"] for r in panel_ab.values())

  peaks = {n: int(np.argmax(r["profile"])) for n, r in panel_ab.items()}
  seeds = list(range(s["seeds"]))   # jacobian_samples(PRNGKey(3), num_seeds)
  summary = [measured(f"Fig 3b: peak of the mean profile, beta={n}", peaks[n],
                      note=f"per-seed argmaxes {panel_ab[n]['peak_per_seed']}")
             for n in betas]
  summary += [measured(f"Fig 3b: peak order, beta={n}", panel_ab[n]["peak_per_seed"],
                       seeds=seeds) for n in betas]
  for reading, item in (("log", "Fig 3d: <k> on one curve of beta*alpha^M"),
                        ("linear", "Fig 3d: <k> on one curve of beta*alpha^M, linear "
                                   "interpolation")):
    c = collapse[reading]
    worst = int(np.argmax(c["z"]))
    summary.append(measured(item, float(c["z"][worst]),
        note=f"{len(c['z'])} points compared; largest deviation {c['dev'][worst]:.3f}, its "
             f"s.e. {c['dev_se'][worst]:.3f}; <k> at beta=alpha=1: "
             f"{panel_ab['1']['mean_order']:.2f}"))
  summary.append(measured("App A.1: reconstruction, float64",
      recon64, note=f"float32 vs the block product: {recon32:.1e}"))

  fig, axes = common.plt.subplots(1, 4, figsize=(17, 3.8))
  ks = np.arange(L + 1)
  for n, r in panel_ab.items():
    axes[0].plot(ks, np.asarray(r["log_mu"]) / math.log(10), label=f"beta={n}")
    axes[1].plot(ks, r["profile"], label=f"beta={n}")
  axes[1].axvline(3, ls=":", color="gray", label="paper: peak at k=3 (beta=1)")
  for a, r in panel_c.items():
    axes[2].plot(ks, r["profile"], label=f"alpha={a}")
  for n, pts in panel_d.items():
    p = np.array(pts)
    axes[3].plot(p[:, 0], p[:, 1], "o", label=f"beta={n}")
  axes[0].set_ylabel("log10 mu_k")
  axes[1].set_ylabel("mu_k / sum mu")
  for ax in axes[1:3]:
    ax.set_xlim(0, 16)
  axes[3].set_xscale("log")
  axes[3].set_xlabel("beta * alpha^M")
  axes[3].set_ylabel("<k>")
  for ax in axes[:3]:
    ax.set_xlabel("order k")
  for ax in axes:
    ax.legend(fontsize=7)
  result = {"settings": s, "panel_ab": panel_ab, "panel_c": {str(a): r for a, r in panel_c.items()},
            "panel_d": panel_d, "reconstruction_error_float64": recon64, "peaks": peaks,
            "fig3d_collapse": collapse,
            "measured": summary}
  return common.write(out_dir, NAME, result, fig)
