"""Fig 5, Table 4 and Fig 11: the branch-to-skip ratio across depth and the sqrt(L) law.

Two-matrix ReLU branch (1x: both d x d; 4x: hidden 4d), d=256, beta=1, alpha swept,
Pre-Norm and Post-Norm (App B.3):
(a) stream rms(h_l) and nominal ratio r~_l = r_l/sqrt(p) across depth, alpha in {0.5,1,2};
(b) accumulated branch ||sum_{l<=k} G_l||_F/sqrt(d) (14x post, 2.4x pre at L=384);
(c) iso-rank contours: at each L the beta*alpha^M where erank(dh_L/dh_0)/d crosses
    r* in {0.4, 0.5, 0.6}, by interpolating log(beta*alpha^M) against the rank; the
    fitted exponent of beta*alpha^M ~ L^s is Table 4 (s ~ -1/2);
(d) erank against beta*alpha^M*sqrt(L): one curve per placement.
Fig 11: rms(h_l)^2 = 1 + kappa (beta*alpha^M)^2 l, kappa ~ 0.51; rms(h_L) at L=384:
14.5 (pre), 19.7 (output norm), 1.00 (post).
Each depth is its own network with its own draws (``independent_depths``,
not the prefixes of one network, which ``independent_depths=False`` still gives), 10
seeds (Sec 4 measures a single sample; the seeds give Table 4's per-seed spread); alpha
is a traced argument, so each (placement, width, depth) compiles once. Fig 5a/b read
the deepest network. A depth whose rank never crosses r* from above on the alpha grid
has no contour point: it is left out of that fit and named in the row's note.
Two diagnostics (declared after the paper-scale mismatches): the contour's
slope between consecutive depths (``local_slopes``: a power law has the same slope
between every two depths), and Fig 5d's spread at the x the alpha grid gives exactly
at several depths (``grid_spread``: no interpolation), over all depths and over the
two deepest, on every x the grid reaches and within Fig 5d's window x in [0.1, 10].

  rankjax reproduce transforming_rank --only fig5
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import measure, models
from rankjax.config import MLPConfig
from rankjax.studies import Draw, claims, measured, save_figure

NAME = "fig5_depth_law"
# alpha grids: 2^(i/4) (so 0.5, 1 and 2 are on them).
SCALES = {
    "quick": dict(width=64, seeds=10, independent_depths=True, depths=(48, 96, 192, 384),
                  expansions=(1.0, 4.0),
                  alphas=tuple(2.0 ** (np.arange(-14, 5) / 4)), levels=(0.4, 0.5, 0.6),
                  stream_seeds=8, stream_inputs=32),
    "paper": dict(width=256, seeds=10, independent_depths=True, depths=(48, 96, 192, 384),
                  expansions=(1.0, 4.0),
                  alphas=tuple(2.0 ** (np.arange(-18, 9) / 4)), levels=(0.4, 0.5, 0.6),
                  stream_seeds=8, stream_inputs=64),
    "tiny": dict(width=16, seeds=2, independent_depths=True, depths=(24, 48, 96),
                 expansions=(1.0, 4.0),
                 alphas=tuple(2.0 ** (np.arange(-9, 5) / 2)), levels=(0.4, 0.5, 0.6),
                 stream_seeds=2, stream_inputs=16),
}
KEY = jax.random.PRNGKey(5)
PAPER_T4 = {("pre", 1.0): (-0.46, -0.50, -0.52), ("pre", 4.0): (-0.57, -0.47, -0.48),
            ("post", 1.0): (-0.51, -0.50, -0.49), ("post", 4.0): (-0.52, -0.50, -0.50)}
LEVELS = (0.4, 0.5, 0.6)
EQ22_PRE_RATIO_384 = 1 / math.sqrt(1 + 0.5 * (384 - 1))   # Eq. 22: r~_l = 1/sqrt(1 + p (l-1))
_T4 = "Table 4: iso-rank exponent"
_LOCAL = "Fig 5c: contour slope between two depths"
LOCAL_LEVEL = 0.4                                      # the r* of Table 4's mismatch
LOCAL_RUNS = (("pre", 1.0), ("pre", 4.0), ("post", 1.0))   # post 1x: the clean control
LOCAL_DEPTHS = (48, 96, 192, 384)                      # the quick and paper depths
FIG5D_X = (0.1, 10.0)             # Fig 5d's window in x = beta*alpha^M*sqrt(L): both spreads
_AFTER = ("a diagnostic declared after Table 4's pre 1x r*=0.4 and Fig 5d mismatches at "
          "paper scale, before it ran")
_FIG5D_LOOK = ("the paper prints no number for 'fall onto one curve' (Fig 5c calls the rank "
               "'an approximate function' of beta*alpha^M*sqrt(L)) and its figure is not in "
               "the text we have, so no band can be read off what it resolves: the spread is "
               "shown with our figure, not judged (the former abs 0.005 was our default)")
CLAIMS = claims([
    *(common.claim(f"{_T4}, {pos} {e:g}x, r*={lvl}", "slope s of log(beta*alpha^M) vs log L "
                   "along erank/d = r*, fit per seed", v, "App B.3")
      for (pos, e), vals in PAPER_T4.items() for lvl, v in zip(LEVELS, vals)),
    common.claim("Fig 5b: accumulated branch / skip at L=384, post", "||sum_l G_l||_F/sqrt(d), "
                 "alpha=1, 1x", 14.0, "Fig 5b: 14x"),
    common.claim("Fig 5b: accumulated branch / skip at L=384, pre", "||sum_l G_l||_F/sqrt(d), "
                 "alpha=1, 1x", 2.4, "Fig 5b: 2.4x"),
    common.claim("Fig 5b: post grows as sqrt(L)", "log-log slope of the accumulated branch "
                 "over l in [48, 384]", 0.5),
    common.bound("Fig 5b: pre flattens", "log-log slope of the accumulated branch over l in "
                 "[48, 384]", "<", 0.5, "Fig 5b: Pre-Norm's accumulated branch flattens",
                 every_seed=True),
    *(common.claim(f"Fig 5b: accumulated / uncorrelated at L=384, {pos}", "||sum G_l|| / "
                   "sqrt(sum ||G_l||^2) at alpha=1", 1.0, "App B.3 / Fig 12: branches "
                   "uncorrelated at initialization") for pos in ("post", "pre")),
    common.claim("Fig 5a: nominal ratio r~ at l=1, pre", "r_1/sqrt(p), alpha=1", 1.0,
                 "Fig 5a: ~1"),
    common.claim("Fig 5a: nominal ratio r~ at l=384, pre", "r_384/sqrt(p), alpha=1",
                 round(EQ22_PRE_RATIO_384, 3), "Eq. 22: decays as 1/sqrt(1 + p(l-1))"),
    common.claim("Fig 5a: nominal ratio r~ at l=384, post", "r_384/sqrt(p), alpha=1", 1.0,
                 "Fig 5a: constant beta*alpha^M = 1"),
    *(common.claim(f"Fig 11: kappa, alpha={a:g}", "slope of rms(h_l)^2 - rms(h_0)^2 against "
                   "(beta alpha^M)^2 l, pre 1x, per seed", 0.51, "Fig 11: 0.51 (theory 0.5)")
      for a in (0.5, 1.0, 2.0)),
    *(common.claim(f"App B.3: rms(h_384), {pos}", "rms(h_L) at L=384, alpha=beta=1, 1x", v,
                   "App B.3") for pos, v in (("pre", 14.5), ("output", 19.7), ("post", 1.00))),
    *(common.qualitative(f"Fig 5d: one curve of beta*alpha^M*sqrt(L), {pos}", "max spread "
                         "of erank/d across depths at equal beta*alpha^M*sqrt(L), seed mean",
                         _FIG5D_LOOK, "Fig 5d: the depths fall onto one curve per placement")
      for pos in ("pre", "post")),
    # Diagnostics declared after the paper-scale run showed Table 4's pre 1x r*=0.4 and
    # Fig 5d mismatches, before they were run: is the departure a finite-depth
    # correction (largest between the shallowest depths), and is Fig 5d's spread the
    # interpolation onto a common x grid?
    *(common.claim(f"{_LOCAL}, {pos} {e:g}x, r*={LOCAL_LEVEL}, L={a}-{b}", "log(c_b/c_a) / "
                   "log(b/a) of the iso-rank contour c(L), per seed", -0.5,
                   f"Sec 4: the contours scale as 1/sqrt(L) (measured slope -0.50), so "
                   f"between every two depths")
      for pos, e in LOCAL_RUNS for a, b in zip(LOCAL_DEPTHS[:-1], LOCAL_DEPTHS[1:])),
    *(common.qualitative(f"Fig 5d: one curve of beta*alpha^M*sqrt(L), {pos}, {which}",
                         f"max spread of erank/d across {over} at equal beta*alpha^M*sqrt(L), "
                         "at the alpha grid's own points (no interpolation), seed mean",
                         _FIG5D_LOOK, f"Fig 5d: the depths fall onto one curve per placement")
      for pos in ("pre", "post")
      for which, over in (("on the grid", "depths"),
                          ("two deepest depths", "the two deepest depths"))),
    # the same within Fig 5d's window (the interpolated row's x range), added when the
    # rows above turned out to read every x the grid reaches (a wider range)
    *(common.qualitative(f"Fig 5d: one curve of beta*alpha^M*sqrt(L), {pos}, {which}, "
                         f"x in [{FIG5D_X[0]:g}, {FIG5D_X[1]:g}]", "max spread of erank/d "
                         f"across {over} at equal x = beta*alpha^M*sqrt(L) in Fig 5d's window, "
                         "at the alpha grid's own points (no interpolation), seed mean",
                         _FIG5D_LOOK, "Fig 5d: the depths fall onto one curve per placement; "
                         "the window added after the full-range rows ran")
      for pos in ("pre", "post")
      for which, over in (("on the grid", "depths"),
                          ("two deepest depths", "the two deepest depths"))),
])

_T4_WORDS = ("Fitted exponent ... of the iso-rank contour ... for both placements, three rank "
             "levels")
_5D_WORDS = ("the curves for all depths fall onto one curve per placement, confirming the "
             "rank depends on this combination alone")
_DIAG = {"kind": "sensitivity", "post_hoc": _AFTER}
WORDS = [
    ("Table 4", "Table 4", _T4_WORDS),
    ("Fig 5c: contour slope", "Table 4", "the iso-rank contours scale as ... (Figure 5c; "
     "measured slope", _DIAG),
    ("Fig 5b: accumulated branch / skip", "Fig 5b", "the accumulated branch norm reaches ... "
     "the skip for Post-Norm and ... for Pre-Norm"),
    ("Fig 5b: post grows", "Fig 5b", "The accumulated branch norm relative to the skip grows "
     "as ... for Post-Norm (a random walk of constant-magnitude increments)"),
    ("Fig 5b: pre flattens", "Fig 5b", "and flattens for Pre-Norm (a random walk of shrinking "
     "increments)"),
    ("accumulated / uncorrelated", "Fig 5b", "At initialization, the branch Jacobians at "
     "different blocks are independent, so distinct paths point in nearly uncorrelated "
     "directions and their squared norms add"),
    ("Fig 5a: nominal ratio r~ at l=1", "Fig 5a", "which starts near ... and decays as"),
    ("Fig 5a: nominal ratio r~ at l=384, pre", "Fig 5a", "The Pre-Norm residual stream grows "
     "with depth, faster at larger initialization scale"),
    ("Fig 5a: nominal ratio r~ at l=384, post", "Fig 5a", "Post-Norm rescales the residual "
     "stream to unit scale, which holds the ratio constant"),
    ("Fig 11", "Fig 11", "the measured ... agrees at every initialization scale", {"family": 3}),
    ("rms\\(h_384\\), post", "App B.3", "versus ... for the post-residual placement",
     {"kind": "identity"}),
    ("App B.3", "App B.3", "the stream reaches ... for the Pre-Norm input and ... for a "
     "unit-increment branch-output normalization"),
    ("Fig 5d: .*(grid|deepest)", "Fig 5d", _5D_WORDS, _DIAG),
    ("Fig 5d", "Fig 5d", _5D_WORDS),
]
CLAIMS = common.worded(CLAIMS, WORDS)

# Sec 4: "The rank measurements in this section use a single sample of the weights and
# the input": Table 4's exponents (App B.3: "We measure the depth law in Figure 5 as
# follows") and Fig 5b's printed ratios are one draw each, judged as one draw (Draw: the
# paper's value, widened by the study's band for it, within the 2.5-97.5% range of our
# single draws), not against the interval of our mean.
_ONE_DRAW = ("the paper's number is one draw (Sec 4: 'The rank measurements in this section "
             "use a single sample of the weights and the input'): judged against the range of "
             "our single draws, its tolerance the study's band for the printed number")
_DRAWN = ("Table 4: iso-rank exponent", "Fig 5b: accumulated branch / skip")
CLAIMS = {k: (common.dataclasses.replace(
              c, rule=Draw(common.rule(c.paper).band(c.paper)),
              note="; ".join(x for x in (c.note, _ONE_DRAW) if x),
              post_hoc="the one-draw rule applied on 2026-12-06, after the rows' verdicts "
              "against the mean's interval were known (the text fixes it)")
              if k.startswith(_DRAWN) else c) for k, c in CLAIMS.items()}


def iso_rank_exponent(alphas: np.ndarray, erank_AxL: np.ndarray, depths: np.ndarray,
                      level: float, m: int = 2) -> tuple[float, list]:
  """Fits ``beta*alpha^M ~ L^s`` along the iso-rank contour ``erank = level`` (App B.3).

  ``erank_AxL[i, j]`` is the rank at ``alphas[i]`` and depth ``depths[j]``; at each
  depth ``log(alpha^M)`` is interpolated linearly against the rank at the first
  crossing of ``level`` from above.
  """
  contour = []
  for j in range(len(depths)):
    r = erank_AxL[:, j]
    below = np.nonzero(r < level)[0]
    if len(below) == 0 or below[0] == 0:
      contour.append(np.nan)
      continue
    i = below[0]
    x0, x1 = m * math.log(alphas[i - 1]), m * math.log(alphas[i])
    t = (r[i - 1] - level) / (r[i - 1] - r[i])
    contour.append(math.exp(x0 + t * (x1 - x0)))
  c = np.array(contour)
  ok = np.isfinite(c)
  if ok.sum() < 2:
    return float("nan"), contour
  return float(np.polyfit(np.log(depths[ok]), np.log(c[ok]), 1)[0]), contour


def local_slopes(contour, depths) -> list[float]:
  """The contour's slope ``log(c_{j+1}/c_j) / log(L_{j+1}/L_j)`` between consecutive
  depths (nan where a contour point is missing): constant, -1/2, for the power law
  ``beta*alpha^M ~ L^(-1/2)`` of Sec 4 / App B.3."""
  c, L = np.asarray(contour, float), np.asarray(depths, float)
  return [float(v) for v in np.log(c[1:] / c[:-1]) / np.log(L[1:] / L[:-1])]


def grid_spread(alphas: np.ndarray, erank_AxL: np.ndarray, depths: np.ndarray,
                m: int = 2, window: tuple[float, float] | None = None) -> float:
  """Fig 5d's spread without interpolation: the largest ``max - min`` of the rank across
  depths at a value of ``x = beta*alpha^M sqrt(L)`` (beta = 1) that the alpha grid hits
  exactly at two or more depths (with alpha on 2^(i/4), M = 2 and depths doubling, each
  doubling moves x by one grid step); only x in ``window`` when given; nan when no x is
  shared."""
  logx = np.round(m * np.log2(alphas)[:, None] + 0.5 * np.log2(depths)[None, :], 9)
  lo, hi = (-np.inf, np.inf) if window is None else np.log2(window) - 1e-9 * np.array([1, -1])
  at: dict[float, list[float]] = {}
  for (i, j), k in np.ndenumerate(logx):
    if lo <= k <= hi:
      at.setdefault(float(k), []).append(float(erank_AxL[i, j]))
  spreads = [max(v) - min(v) for v in at.values() if len(v) > 1]
  return max(spreads) if spreads else float("nan")


SLOPE_FROM = 48   # Fig 5b's log-log slope is fitted over l in [48, L]


def _loglog_slope(accumulated_L: np.ndarray, start: int) -> float:
  """Slope of log(accumulated branch / skip) against log(l), l = start..L (Fig 5b:
  0.5 for a random walk of constant increments, less when the increments shrink)."""
  a = np.asarray(accumulated_L, float)
  ls = np.arange(1, len(a) + 1)
  keep = ls >= start
  if keep.sum() < 2:   # a network shallower than the fit range
    return float("nan")
  return float(np.polyfit(np.log(ls[keep]), np.log(a[keep]), 1)[0])


def _fig11(out_dir: str, ms: dict, kappas: dict, kappa: float, L: int) -> None:
  """Fig 11 (``fig11_stream_growth.png``): (a) rms(h_l)^2 of the Pre-Norm 1x stream
  against depth, measured (solid) and the fit rms(h_0)^2 + kappa (beta alpha^M)^2 l
  (dashed, per alpha); (b) rms(h_l)^2 - rms(h_0)^2 against (beta alpha^M)^2 l with
  the line of slope kappa (the mean over alpha). beta = 1, M = 2."""
  import pathlib
  fig, axes = common.plt.subplots(1, 2, figsize=(10, 3.8))
  ls = np.arange(L + 1)
  for i, a in enumerate((0.5, 1.0, 2.0)):
    y = ms[("pre", a)]
    axes[0].plot(ls, y, color=f"C{i}", label=f"alpha={a:g} measured")
    axes[0].plot(ls, y[0] + kappas[a] * a ** 4 * ls, "--", color=f"C{i}",
                 label=f"fit kappa={kappas[a]:.3f}")
    axes[1].plot(a ** 4 * ls, y - y[0], color=f"C{i}", label=f"alpha={a:g}")
  x = np.array([0.0, 16.0 * L])
  axes[1].plot(x, kappa * x, "k--", lw=0.8, label=f"slope kappa={kappa:.3f}")
  axes[0].set(xlabel="layer l", ylabel="rms(h_l)^2", yscale="log",
              title="Fig 11a: Pre-Norm stream growth")
  axes[1].set(xlabel="(beta alpha^M)^2 l", ylabel="rms(h_l)^2 - rms(h_0)^2", xscale="log",
              yscale="log", title="Fig 11b: one line of slope kappa")
  for ax in axes:
    ax.legend(fontsize=7)
  fig.tight_layout()
  pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
  save_figure(fig, pathlib.Path(out_dir) / "fig11_stream_growth.png", dpi=110)
  common.plt.close(fig)


def _sd(values) -> float:
  """Sample sd of the finite values (nan with fewer than two)."""
  x = np.asarray(values, float)
  x = x[np.isfinite(x)]
  return float(x.std(ddof=1)) if len(x) > 1 else float("nan")


def stream_mean_square(cfg: MLPConfig, alpha: float, seeds: int, inputs: int) -> np.ndarray:
  """``E[rms(h_l)^2]``, l = 0..L, per seed (rows) over Gaussian inputs (forward pass
  only): (seeds, L+1)."""

  @jax.jit
  def one(key):
    blocks, x = measure.seed_samples(cfg, key, inputs, alpha)
    _, hs = models.stack_forward(blocks, x, cfg)
    return jnp.concatenate([jnp.mean(x * x)[None], jnp.mean(hs * hs, axis=(1, 2))])

  return np.stack([np.asarray(one(k)) for k in jax.random.split(KEY, seeds)])


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  depths = np.array(s["depths"])
  L = int(depths.max())
  alphas = np.array(s["alphas"])
  p = measure.survival_rate("relu")
  results = {}
  for e in s["expansions"]:
    for pos in ("pre", "post"):
      if s["independent_depths"]:   # one network per depth, its own draws
        er_seed = np.zeros((len(alphas), s["seeds"], len(depths)))
        for j, depth in enumerate(depths):
          cfg = MLPConfig(depth=int(depth), width=s["width"], expansion=e, norm_position=pos)
          runs = [common.jacobian_samples(cfg, jax.random.fold_in(KEY, int(depth)), a, 1.0,
                                          num_seeds=s["seeds"], spectra_layers=(int(depth),))
                  for a in alphas]   # the rank at the network's last layer only
          er_seed[:, :, j] = [r["erank"].mean(axis=1)[:, -1] for r in runs]
      else:   # prefixes of one network of the largest depth
        cfg = MLPConfig(depth=L, width=s["width"], expansion=e, norm_position=pos)
        runs = [common.jacobian_samples(cfg, KEY, a, 1.0, num_seeds=s["seeds"]) for a in alphas]
        er_seed = np.array([r["erank"].mean(axis=1)[:, depths - 1] for r in runs])  # (A, S, D)
      er = er_seed.mean(axis=1)   # (A, depths): the seed-mean rank surface
      exps = {lvl: iso_rank_exponent(alphas, er, depths, lvl) for lvl in s["levels"]}
      # the same fit on each seed's own rank surface: the exponents' spread over seeds
      fits = {lvl: [iso_rank_exponent(alphas, er_seed[:, i], depths, lvl)
                    for i in range(er_seed.shape[1])] for lvl in s["levels"]}
      per_seed = {lvl: [f[0] for f in v] for lvl, v in fits.items()}
      no_crossing = {lvl: [[int(d) for d, c in zip(depths, f[1]) if not np.isfinite(c)]
                           for f in v] for lvl, v in fits.items()}
      # Fig 5a/b from the deepest network (the last one run: depths ascend)
      pick = {a: runs[int(np.argmin(np.abs(alphas - a)))] for a in (0.5, 1.0, 2.0)}
      results[(pos, e)] = {
          "erank": er, "exponents": {lvl: v[0] for lvl, v in exps.items()},
          "exponents_per_seed": per_seed, "no_crossing_depths_per_seed": no_crossing,
          "exponent_sd": {lvl: _sd(v) for lvl, v in per_seed.items()},
          "contours": {lvl: v[1] for lvl, v in exps.items()},
          "contours_per_seed": {lvl: [f[1] for f in v] for lvl, v in fits.items()},
          "stream_rms": {a: r["stream_rms"].mean(axis=(0, 1)) for a, r in pick.items()},
          "nominal_ratio": {a: r["branch_to_skip"].mean(axis=(0, 1)) / math.sqrt(p)
                            for a, r in pick.items()},
          "accumulated": pick[1.0]["accumulated_branch"].mean(axis=(0, 1)),
          "accumulated_uncorrelated": pick[1.0]["accumulated_uncorrelated"].mean(axis=(0, 1)),
          "accumulated_per_seed": pick[1.0]["accumulated_branch"].mean(axis=1),
          "uncorrelated_per_seed": pick[1.0]["accumulated_uncorrelated"].mean(axis=1),
          "nominal_ratio_per_seed": pick[1.0]["branch_to_skip"].mean(axis=1) / math.sqrt(p),
          "alpha_picked": {a: float(alphas[int(np.argmin(np.abs(alphas - a)))]) for a in pick},
      }

  # Fig 11: rms(h_l)^2 - rms(h_0)^2 = kappa (alpha^2)^2 l (pre-norm, 1x), by a forward
  # pass over many seeds and inputs (the per-sample cross terms make rms^2 fluctuate
  # by ~L/sqrt(2d) relative to its growth), fit through the origin per alpha.
  ms = {}
  for pos in ("pre", "output", "post"):
    cfg = MLPConfig(depth=L, width=s["width"], expansion=s["expansions"][0], norm_position=pos)
    for a in ((0.5, 1.0, 2.0) if pos == "pre" else (1.0,)):
      ms[(pos, a)] = stream_mean_square(cfg, a, s["stream_seeds"], s["stream_inputs"])
  kappas, kappa_seed = {}, {}
  ls = np.arange(L + 1)
  for a in (0.5, 1.0, 2.0):
    y = ms[("pre", a)] - ms[("pre", a)][:, :1]
    kappa_seed[a] = (y @ ls) / np.sum(ls * ls) / a ** 4
    kappas[a] = float(kappa_seed[a].mean())
  kappa = float(np.mean(list(kappas.values())))
  rms_L = {pos: np.sqrt(ms[(pos, 1.0)][:, -1]) for pos in ("pre", "output", "post")}
  ms = {k: v.mean(axis=0) for k, v in ms.items()}   # the figure's seed means

  r1 = lambda pos: results[(pos, s["expansions"][0])]
  # Fig 5d collapse: interpolate each depth's rank onto a common x = alpha^2 sqrt(L) grid.
  collapse = {}
  for pos in ("pre", "post"):
    er = r1(pos)["erank"]
    xgrid = np.geomspace(*FIG5D_X, 25)
    curves = []
    for j, depth in enumerate(depths):
      x = alphas ** 2 * math.sqrt(depth)
      inside = (xgrid >= x.min()) & (xgrid <= x.max())
      curves.append(np.where(inside, np.interp(np.log(xgrid), np.log(x), er[:, j]), np.nan))
    collapse[pos] = float(np.nanmax(np.nanmax(curves, 0) - np.nanmin(curves, 0)))
  window = f"x in [{FIG5D_X[0]:g}, {FIG5D_X[1]:g}]"
  grid_collapse = {(pos, which + tail): grid_spread(alphas, r1(pos)["erank"][:, cols],
                                                     depths[cols], window=w)
                   for pos in ("pre", "post")
                   for which, cols in (("on the grid", slice(None)),
                                       ("two deepest depths", slice(-2, None)))
                   for tail, w in (("", None), (f", {window}", FIG5D_X))}

  seeds = list(range(s["seeds"]))   # jacobian_samples(PRNGKey(5), num_seeds)
  stream_seeds = list(range(s["stream_seeds"]))   # split(PRNGKey(5), stream_seeds)
  note = "" if L == 384 else f"at L={L}"

  def j(item, v, sd=seeds, extra=""):
    if item not in CLAIMS:
      return None
    return measured(item, np.asarray(v, float).tolist(), seeds=sd,
                    note="; ".join(x for x in (note, extra) if x))

  summary = []
  for (pos, e), res in results.items():
    for lvl in s["levels"]:
      per = np.asarray(res["exponents_per_seed"][lvl], float)
      ok = np.isfinite(per)
      if not ok.any():   # no crossing at any seed: no number to judge
        continue
      missed = [d for v in res["no_crossing_depths_per_seed"][lvl] for d in v]
      gaps = ", ".join(f"L={d}: {missed.count(d)} seed(s)" for d in sorted(set(missed)))
      summary.append(j(f"{_T4}, {pos} {e:g}x, r*={lvl}", per[ok],
                       [sd for sd, k in zip(seeds, ok) if k],
                       f"fit on the seed-mean rank {res['exponents'][lvl]:.3f}; "
                       f"{int((~ok).sum())} seed(s) without a fit; depths without a "
                       f"crossing (left out of that seed's fit): {gaps or 'none'}"))
  post, pre = r1("post"), r1("pre")
  summary += [
      j("Fig 5b: accumulated branch / skip at L=384, post", post["accumulated_per_seed"][:, -1]),
      j("Fig 5b: accumulated branch / skip at L=384, pre", pre["accumulated_per_seed"][:, -1]),
      j("Fig 5b: post grows as sqrt(L)", [_loglog_slope(a, SLOPE_FROM)
                                         for a in post["accumulated_per_seed"]]),
      j("Fig 5b: pre flattens", [_loglog_slope(a, SLOPE_FROM) for a in pre["accumulated_per_seed"]]),
      j("Fig 5b: accumulated / uncorrelated at L=384, post",
        post["accumulated_per_seed"][:, -1] / post["uncorrelated_per_seed"][:, -1]),
      j("Fig 5b: accumulated / uncorrelated at L=384, pre",
        pre["accumulated_per_seed"][:, -1] / pre["uncorrelated_per_seed"][:, -1]),
      j("Fig 5a: nominal ratio r~ at l=1, pre", pre["nominal_ratio_per_seed"][:, 0]),
      j("Fig 5a: nominal ratio r~ at l=384, pre", pre["nominal_ratio_per_seed"][:, -1]),
      j("Fig 5a: nominal ratio r~ at l=384, post", post["nominal_ratio_per_seed"][:, -1]),
      *(j(f"Fig 11: kappa, alpha={a:g}", kappa_seed[a], stream_seeds) for a in (0.5, 1.0, 2.0)),
      *(j(f"App B.3: rms(h_384), {pos}", rms_L[pos], stream_seeds)
        for pos in ("pre", "output", "post")),
      *(j(f"Fig 5d: one curve of beta*alpha^M*sqrt(L), {pos}", collapse[pos], None)
        for pos in ("pre", "post")),
      *(j(f"Fig 5d: one curve of beta*alpha^M*sqrt(L), {pos}, {which}", v, None)
        for (pos, which), v in grid_collapse.items() if np.isfinite(v)),
  ]
  if tuple(int(d) for d in depths) == LOCAL_DEPTHS:
    for pos, e in LOCAL_RUNS:
      per_pair = np.array([local_slopes(c, depths) for c in
                           results[(pos, e)]["contours_per_seed"][LOCAL_LEVEL]])  # (S, pairs)
      for k, (a, b) in enumerate(zip(LOCAL_DEPTHS[:-1], LOCAL_DEPTHS[1:])):
        ok = np.isfinite(per_pair[:, k])
        if ok.any():
          summary.append(j(f"{_LOCAL}, {pos} {e:g}x, r*={LOCAL_LEVEL}, L={a}-{b}",
                           per_pair[ok, k], [sd for sd, keep in zip(seeds, ok) if keep],
                           f"{int((~ok).sum())} seed(s) without both contour points"))
  summary = [r for r in summary if r is not None]

  fig, axes = common.plt.subplots(1, 5, figsize=(21, 3.8))
  for pos, style in (("pre", "-"), ("post", "--")):
    res = r1(pos)
    for a in (0.5, 1.0, 2.0):
      axes[0].plot(res["stream_rms"][a], style, label=f"{pos} rms, alpha={res['alpha_picked'][a]}")
      axes[1].plot(res["nominal_ratio"][a], style, label=f"{pos}, alpha={res['alpha_picked'][a]}")
    axes[2].plot(res["accumulated"], style, label=f"{pos} measured")
    axes[2].plot(res["accumulated_uncorrelated"], ":", label=f"{pos} uncorrelated")
    for lvl in s["levels"]:
      axes[3].plot(depths, res["contours"][lvl], "o" + style, label=f"{pos} r*={lvl}")
    for j, depth in enumerate(depths):
      axes[4].plot(alphas ** 2 * math.sqrt(depth), res["erank"][:, j], style, label=f"{pos} L={depth}")
  axes[2].plot([L, L], [14.0, 2.4], "kx", ms=8, label="paper: 14x post, 2.4x pre at L=384")
  axes[0].set_yscale("log")
  axes[1].set_yscale("log")
  axes[3].set_xscale("log")
  axes[3].set_yscale("log")
  axes[4].set_xscale("log")
  for ax, t in zip(axes, ("(a) stream rms", "(a) nominal ratio r~_l", "(b) accumulated branch",
                          "(c) iso-rank contours beta*alpha^M", "(d) erank vs beta*alpha^M sqrt(L)")):
    ax.set_title(t)
    ax.legend(fontsize=5)
  _fig11(out_dir, ms, kappas, kappa, L)
  # what the figures plot (panels a, b and Fig 11 read the 1x networks) and the contours
  # per seed; the per-seed curves along depth are in the rows only (DATA_LIMIT)
  figure_keys = ("erank", "exponents", "exponents_per_seed", "exponent_sd", "contours",
                 "contours_per_seed",
                 "no_crossing_depths_per_seed")
  saved = {f"{pos}/{e:g}x": {k: v for k, v in res.items()
                             if k in figure_keys or e == s["expansions"][0]
                             and not k.endswith("_per_seed")}
           for (pos, e), res in results.items()}
  result = {"settings": s, "kappa": kappa, "kappa_by_alpha": kappas,
            "stream_mean_square": {f"{p}/alpha={a}": v for (p, a), v in ms.items()},
            "results": saved, "collapse_spread": collapse,
            "grid_spread": {f"{pos}/{w}": v for (pos, w), v in grid_collapse.items()},
            "measured": summary}
  return common.write(out_dir, NAME, result, fig)
