"""Fig 6, Fig 13, Table 5, Fig 16: the paper's values, the claims and the rows of
``fig6_trainability`` (kept apart so that module stays short).

The trained claims are predicates with App B.4's threshold ("still trains": best test
accuracy over the learning-rate sweep >= 0.4); Table 5's stable rates are judged to
half a grid step (the rates are half a decade apart). The abstract's "the
initialization rank predicts which networks train" is Spearman's rho between the init
rank and the best accuracy over every cell, with a percentile-bootstrap interval.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import common
from rankjax.studies import Abs, Bound, Claim, claims, measured

STABLE_ACCURACY = 0.4                                # App B.4's "still trains"
# Paper values (App B.4 Table 5, Fig 6, Fig 13, App C Fig 16).
PAPER_TABLE5 = {  # log10 max stable eta at L = 12, 24, 48, 96, 192, 384
    ("pre", None): (-2, -2, -2, -2, -2, -2),
    ("post", 0.5): (-2, -2, -2.5, -3, -3.5, -4.5),
    ("post", 1.0): (-2.5, -3, -3.5, -4, None, None),
    ("post", 2.0): (-2.5, -3.5, -4, None, None, None),
    ("post", 4.0): (-2, -3, -4, None, None, None),
}
PAPER_DEPTHS = (12, 24, 48, 96, 192, 384)


_TRAINS = f"trains: best test accuracy over the sweep >= {STABLE_ACCURACY} (App B.4)"
CLAIMS = claims([
    common.bound("Fig 6b: Pre-Norm trains across the grid", "min over (alpha, L) of the best "
                 "test accuracy over the lr sweep", ">=", STABLE_ACCURACY, _TRAINS),
    common.bound("Fig 13: Output-Norm trains across the grid", "min over (alpha, L) of the best "
                 "test accuracy over the lr sweep", ">=", STABLE_ACCURACY, _TRAINS),
    common.bound("Fig 6d: Post-Norm alpha=0.5 trains at every depth", "min over L of the best "
                 "test accuracy, alpha=0.5", ">=", STABLE_ACCURACY,
                 "Fig 6d: >= 0.50 at every depth on CIFAR-10; " + _TRAINS),
    common.bound("Fig 6d: Post-Norm alpha=1 fails at L=384", "best test accuracy, alpha=1, "
                 "L=384", "<", STABLE_ACCURACY, "Fig 6d: chance at L=384; " + _TRAINS),
    common.bound("Fig 6a: Pre-Norm init rank above 0.2", "min over (alpha, L) of "
                 "erank(dh_L/dh_0)/d at init", ">", 0.2, "Fig 6a: > 0.2 everywhere"),
    common.bound("Fig 13: Output-Norm init rank just below Pre-Norm", "mean over (alpha, L) of "
                 "erank/d(pre) - erank/d(output) at init", ">", 0.0,
                 "Fig 13: above collapse, just below pre"),
    *(common.bound(f"Fig 6c: Post-Norm init rank at alpha=4, L=384, {side}",
                   "erank(dh_L/dh_0)/d at init", op, v, "Sec 4 prints the range 1-2% where "
                   "the accuracy drops toward chance; each end is its own predicate (the "
                   "former row judged an invented midpoint 0.015)")
      for side, op, v in (("at least 1%", ">=", 0.01), ("at most 2%", "<=", 0.02))),
    common.bound("Fig 6: init rank predicts trainability", "lower end of the 95% bootstrap "
                 "interval of Spearman's rho between init erank/d and best accuracy over "
                 "every (placement, alpha, L) cell", ">", 0.0,
                 "abstract: the initialization rank predicts which networks train"),
    *(Claim(f"Table 5: Post-Norm alpha={a:g}, L={L}", "log10 of the largest "
            "lr with accuracy >= 0.4", v, Abs(0.25),
            "App B.4; half a grid step (lrs half a decade apart)")
      if v is not None else
      common.bound(f"Table 5: Post-Norm alpha={a:g}, L={L}", "best test accuracy over the "
                   "sweep (no lr reaches 0.4)", "<", STABLE_ACCURACY, "App B.4: '-'")
      for (pos, a), vals in PAPER_TABLE5.items() if pos == "post"
      for L, v in zip(PAPER_DEPTHS, vals)),
    *(Claim(f"Table 5: Pre-Norm, L={L}", "log10 of the largest lr with "
            "accuracy >= 0.4, worst over alpha", v, Abs(0.25),
            "App B.4; half a grid step (lrs half a decade apart)")
      for L, v in zip(PAPER_DEPTHS, PAPER_TABLE5[("pre", None)])),
    common.bound("Fig 16a: no norm, M=1 fails beyond L=50", "max over L > 50 of the best test "
                 "accuracy, M=1, alpha=1", "<", STABLE_ACCURACY, "App C: fails by about L=50"),
    common.bound("Fig 16a: no norm, M=2 fails beyond L=100", "max over L > 100 of the best "
                 "test accuracy, M=2, alpha=1", "<", STABLE_ACCURACY, "App C: fails by about L=100"),
    common.claim("Fig 16b: no-norm magnitude slope, M=1", "slope of log10 rms(h_l) in l at "
                 "init (decades per layer)", 0.17, "App C"),
    common.claim("Fig 16b: no-norm magnitude slope, M=2", "slope of log10 rms(h_l) in l at "
                 "init (decades per layer)", 0.087, "App C"),
    common.bound("Fig 16c: Pre-RMSNorm M=1 and M=2 within a point", "max over L of |best "
                 "accuracy M=1 - M=2|", "<=", 0.01, "App C: within a point at every depth"),
])
_ONE = ("one network per (cell, learning rate), as in the paper (Sec 4: 'each cell of the "
        "CIFAR heatmaps (Figure 6) trains one network per learning rate'): a statement about "
        "that one training draw, judged on it; how much a second network moves a cell is "
        "another issue's question")
WORDS = [
    ("Fig 6b|Fig 6a", "Fig 6", "the rank stays above ... and training succeeds across the "
     "entire grid"),
    ("Output-Norm trains", "Fig 13", "Output-Norm trains across the grid, like Pre-Norm."),
    ("Output-Norm init rank", "Fig 13", "The rank stays above collapse and the accuracy stays "
     "near"),
    ("alpha=0.5 trains", "Fig 6", "yet the best accuracy over the sweep stays at ... or above "
     "at every depth"),
    ("alpha=1 fails", "Fig 6", "reaching chance at depth 384"),
    ("Fig 6c", "Fig 6", "when the rank collapses all the way to ... effective rank over width, "
     "the CIFAR accuracy drops toward chance"),
    ("predicts trainability", "Fig 6", "predicts which networks train on CIFAR-10"),
    ("Table 5", "Table 5", "of the maximum stable Adam learning rate (the largest ... with "
     "CIFAR-10 test accuracy"),
    ("Fig 16a", "Fig 16a", "the single-matrix architecture fails to train by about depth 50 "
     "whereas the two-matrix architecture fails by about depth 100"),
    ("Fig 16b", "Fig 16b", "twice as fast for the single-matrix architecture ... decades per "
     "layer"),
    ("Fig 16c", "Fig 16c", "within a point at every depth up to 1000"),
]
CLAIMS = common.worded(CLAIMS, WORDS)
CLAIMS = {k: (common.dataclasses.replace(c, note="; ".join(x for x in (c.note, _ONE) if x))
              if ("accuracy" in c.quantity or "lr" in c.quantity or "Spearman" in c.quantity)
              else c) for k, c in CLAIMS.items()}


def max_stable_lr(lrs: Sequence[float], accuracy_T: Sequence[float],
                  threshold: float = STABLE_ACCURACY) -> float:
  """The largest learning rate whose accuracy is >= ``threshold`` (App B.4, Table 5).

  NaN when none reaches it (Table 5's dash). Rates need not be sorted; NaN
  accuracies count as failures.
  """
  lrs = np.asarray(lrs, float)
  acc = np.nan_to_num(np.asarray(accuracy_T, float), nan=-1.0)
  ok = acc >= threshold
  return float(lrs[ok].max()) if ok.any() else float("nan")


def spearman_bootstrap(x: Sequence[float], y: Sequence[float], draws: int = 2000,
                       seed: int = 0) -> tuple[float, float, float]:
  """Spearman's rank correlation of ``x`` and ``y`` and its 95% percentile-bootstrap
  interval (cells resampled with replacement; ``draws`` resamples)."""
  from scipy import stats
  x, y = np.asarray(x, float), np.asarray(y, float)
  ok = np.isfinite(x) & np.isfinite(y)
  x, y = x[ok], y[ok]
  rho = float(stats.spearmanr(x, y).statistic)
  rng = np.random.default_rng(seed)
  boots = []
  for _ in range(draws):
    i = rng.integers(0, len(x), len(x))
    if np.ptp(x[i]) > 0 and np.ptp(y[i]) > 0:
      boots.append(stats.spearmanr(x[i], y[i]).statistic)
  lo, hi = np.percentile(boots, [2.5, 97.5])
  return rho, float(lo), float(hi)


def measured_values(s: dict, ds: str, grid: dict, fig16: dict, spread: dict | None = None
                    ) -> list[dict]:
  """The claims' measured values (``rankjax.studies.measured``); on a set other than
  CIFAR-10 the note says so (the trained claims are then judged on that set by the same
  predicates)."""
  alphas, depths = list(s["alphas"]), list(s["depths"])
  where = f"trained on {ds}" + ("" if ds == "cifar10" else ", not CIFAR-10")
  seeds = f"{s['seeds']} network(s) per cell (Sec 4: one)"
  # several networks per (cell, lr) (quick_seeds3): a trained row has one value per
  # network (network k: the k-th draw of every cell), judged on the mean's interval
  nets = list(range(int(s["seeds"]))) if int(s["seeds"]) > 1 else None
  if nets:
    seeds += ("; a value per network (network k: each cell's k-th init and batch order), "
              "the rows judge their mean")
  lrs = list(s["lrs"])
  # (A, L, S): each network's best accuracy over the sweep and log10 largest stable lr
  best = {p: grid[p]["accuracy"].max(axis=2) for p in grid}
  log_msl = {p: np.log10(np.apply_along_axis(lambda acc_T: max_stable_lr(lrs, acc_T), 2,
                                             grid[p]["accuracy"])) for p in grid}
  rows = []

  def add(item, value, note="", untested=""):
    if item in CLAIMS:
      v = np.asarray(value, float).reshape(-1)
      rows.append(measured(item, float(v[0]) if nets is None or v.size == 1 else
                           [float(x) for x in v], seeds=nets if v.size > 1 else None,
                           untested=untested, note="; ".join(
          x for x in (note, where if "accuracy" in CLAIMS[item].quantity or "lr" in
                      CLAIMS[item].quantity else "") if x)))

  def best_at_depth(j):   # the best accuracy any network of depth depths[j] reached
    return max(float(np.nanmax(grid[p]["best_accuracy"][:, j])) for p in grid)

  ia = lambda a: alphas.index(a) if a in alphas else None
  jd = lambda L: depths.index(L) if L in depths else None
  if "pre" in grid:
    add("Fig 6b: Pre-Norm trains across the grid", best["pre"].min(axis=(0, 1)), seeds)
    add("Fig 6a: Pre-Norm init rank above 0.2", grid["pre"]["erank"].min(), f"d={s['rank_width']}")
  if "output" in grid:
    add("Fig 13: Output-Norm trains across the grid", best["output"].min(axis=(0, 1)), seeds)
    if "pre" in grid:
      add("Fig 13: Output-Norm init rank just below Pre-Norm",
          np.mean(grid["pre"]["erank"] - grid["output"]["erank"]), f"d={s['rank_width']}")
  if "post" in grid:
    g = grid["post"]
    if ia(0.5) is not None:
      add("Fig 6d: Post-Norm alpha=0.5 trains at every depth", best["post"][ia(0.5)].min(axis=0),
          seeds)
    if ia(1.0) is not None and jd(384) is not None:
      add("Fig 6d: Post-Norm alpha=1 fails at L=384", best["post"][ia(1.0), jd(384)], seeds)
    if ia(4.0) is not None and jd(384) is not None:
      for side in ("at least 1%", "at most 2%"):
        add(f"Fig 6c: Post-Norm init rank at alpha=4, L=384, {side}",
            g["erank"][ia(4.0), jd(384)], f"d={s['rank_width']}")
    for i, a in enumerate(alphas):
      for j, L in enumerate(depths):
        item = f"Table 5: Post-Norm alpha={a:g}, L={L}"
        if item not in CLAIMS:
          continue
        if isinstance(CLAIMS[item].rule, Bound):
          # a dash tests the placement only where the budget trains some network of the
          # same depth; else no lr could reach 0.4 whatever the init (the budget's dash)
          top = best_at_depth(j)
          add(item, best["post"][i, j], f"{seeds}; best of any network at L={L}: "
              f"{top:.3f}", untested="" if top >= STABLE_ACCURACY else (
                  f"no network of depth {L} reached {STABLE_ACCURACY} at this budget "
                  f"(best {top:.3f}): the dash is the budget's"))
        else:   # a stable lr the paper reports; none reached here: ours null (mismatch)
          msl = log_msl["post"][i, j]
          add(item, msl, seeds + ("" if np.isfinite(msl).all() else
                                  "; no lr reached 0.4" + (" in some network" if nets else "")))
  if "pre" in grid:
    low = log_msl["pre"].min(axis=0)   # (L, S); NaN when one alpha has none
    for j, L in enumerate(depths):
      add(f"Table 5: Pre-Norm, L={L}", low[j],
          seeds + ("" if np.isfinite(low[j]).all() else "; an alpha where no lr reached 0.4"))
  cells = [(grid[p]["erank"].ravel(), grid[p]["best_accuracy"].ravel()) for p in grid]
  if cells and sum(len(c[0]) for c in cells) >= 4:
    rho, lo, hi = spearman_bootstrap(np.concatenate([c[0] for c in cells]),
                                     np.concatenate([c[1] for c in cells]))
    gaps = [float(np.max(np.abs(np.asarray(v["first"]) - np.asarray(v["second"]))))
            for v in (spread or {}).values()]
    add("Fig 6: init rank predicts trainability", lo,
        f"rho {rho:.3f}, 95% bootstrap [{lo:.3f}, {hi:.3f}] over "
        f"{sum(len(c[0]) for c in cells)} cells; init ranks at d={s['rank_width']}"
        + (f"; a second network on {', '.join(spread)} moves a cell's best accuracy by "
           f"up to {max(gaps):.3f}" if gaps else ""))
  if fig16:
    d16 = np.asarray(s["fig16_depths"])
    # (depths, S): each network's best over the sweep (one network: the best_accuracy)
    acc = {k: np.asarray(v.get("best_accuracy_by_network", v["best_accuracy"]), float
                         ).reshape(len(d16), -1) for k, v in fig16.items()}
    if (d16 > 50).any():
      add("Fig 16a: no norm, M=1 fails beyond L=50", acc[(1, "none")][d16 > 50].max(axis=0),
          seeds)
    if (d16 > 100).any():
      add("Fig 16a: no norm, M=2 fails beyond L=100", acc[(2, "none")][d16 > 100].max(axis=0),
          seeds)
    add("Fig 16b: no-norm magnitude slope, M=1", fig16[(1, "none")]["slope"],
        f"L={s['magnitude_depth']}, d={s['rank_width']}")
    add("Fig 16b: no-norm magnitude slope, M=2", fig16[(2, "none")]["slope"],
        f"L={s['magnitude_depth']}, d={s['rank_width']}")
    add("Fig 16c: Pre-RMSNorm M=1 and M=2 within a point",
        np.abs(acc[(1, "pre")] - acc[(2, "pre")]).max(axis=0), seeds)
  return rows


