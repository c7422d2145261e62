"""App D.1 / D.3: rank J_f = rank(D W_up) = min(#surviving units, d), measured.

The branch Jacobian ``J_f = W_down D W_up`` (Eq. 25) with ``D = diag(sigma'(W_up x))``.
D.1: the mask can only lower rank, ``rank J_f <= #{i : sigma'((W_up x)_i) != 0}``;
for Gaussian ``W_up`` the surviving rows are in general position, so
``rank(D W_up) = min(#survivors, d)``. D.3: ``W_down`` (d x m, m >= d) is full rank and
independent of ``D W_up``, so the column space of ``D W_up`` meets the (m-d)-dimensional
null space of ``W_down`` only at 0 and ``rank J_f = rank(D W_up)``: the width threshold
of the branch Jacobian is the surviving submatrix's (m/d = 1/p).

Measured in float64 at initialization (Fig 9's convention: unit-variance W_up, unit-norm
x, so the pre-activations are standard Gaussian; W_down ~ N(0, 1/m)), for relu, abs,
gelu and silu at m/d in {1, 2, 4, 8} (and 0.5, where W_down is injective and equality
holds for a different reason). Ranks are numerical ranks: singular values above
``s_max * max(shape) * eps_float64`` (``numpy.linalg.matrix_rank``'s rule); the
``margin`` column is log10 of the ratio between the smallest singular value counted
and the tolerance, i.e. how unambiguous the count is (the zero singular values sit
at ~1e-16 s_max, below the tolerance).

  rankjax reproduce transforming_rank --only appd3
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import measure
from rankjax.studies import claims, measured

NAME = "appd3_rank_equality"
SCALES = {
    "quick": dict(width=128, seeds=6, ratios=(0.5, 1.0, 2.0, 4.0, 8.0),
                  activations=("relu", "abs", "gelu", "silu")),
    "paper": dict(width=512, seeds=40, ratios=(0.5, 1.0, 2.0, 4.0, 8.0),
                  activations=("relu", "abs", "gelu", "silu")),
    "tiny": dict(width=16, seeds=2, ratios=(0.5, 2.0, 8.0),
                 activations=("relu", "abs", "gelu", "silu")),
}
KEY = jax.random.PRNGKey(93)
# Pr[sigma'(z) != 0] for z ~ N(0, 1) (D.1): relu 1/2; abs and the smooth ones 1.
SURVIVAL = {"relu": 0.5, "abs": 1.0, "gelu": 1.0, "silu": 1.0}
_PRED = ("rank(J_f)/d minus D.1's prediction E[min(K, d)]/d, K ~ Binomial(m, p) survivors")
CLAIMS = claims([
    common.bound("App D.3: rank J_f = rank(D W_up)", "fraction of draws with equality (every "
                 "activation and m/d), per seed", ">=", 1.0, "App D.3: every draw; the "
                 "paper states an equality, 1.0 (every draw) is our encoding of it",
                 every_seed=True, ours=True),
    common.bound("App D.1: rank(D W_up) = min(#survivors, d)", "fraction of draws with "
                 "equality (every activation and m/d), per seed", ">=", 1.0,
                 "App D.1: general position; 1.0 (every draw) is our encoding of the "
                 "equality", every_seed=True, ours=True),
    *(common.claim(f"App D.1/D.3: relu, m/d={r:g}", _PRED, 0.0, "App D.1 with p = 1/2")
      for r in (0.5, 1.0, 2.0, 4.0, 8.0)),
    *(common.claim(f"App D.1/D.3: {a}, every m/d", "max over m/d of |" + _PRED + "|", 0.0,
                   "App D.1: every row survives (p = 1)") for a in ("abs", "gelu", "silu")),
])

WORDS = [
    ("rank J_f = rank", "App D.3", "The width threshold for the branch Jacobian is the same as "
     "for the surviving submatrix"),
    ("App D.1: rank\\(D W_up\\)", "App D.1", "is diagonal, so it can only lower rank"),
    ("App D.1/D.3", "App D.1", "At initialization the pre-activations are i.i.d. and "
     "mean-zero, so"),
]
CLAIMS = common.worded(CLAIMS, WORDS)


def predicted_rank(d: int, m: int, p: float) -> tuple[float, float]:
  """``(E[min(K, d)] / d, P(K >= d))`` for K ~ Binomial(m, p) surviving units: the rank
  of J_f that D.1 (``rank(D W_up) = min(K, d)``) and D.3 (``rank J_f = rank(D W_up)``)
  predict for Gaussian weights."""
  from scipy import stats
  k = np.arange(m + 1)
  pk = stats.binom.pmf(k, m, p)
  return float(np.sum(pk * np.minimum(k, d)) / d), float(np.sum(pk[k >= d]))


def numerical_rank(s_K: jax.Array, shape: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
  """``(rank, log10 margin)`` from descending singular values: the count above
  ``s_max * max(shape) * eps`` and log10 of (smallest counted sv / tolerance)."""
  tol = s_K[..., :1] * max(shape) * jnp.finfo(s_K.dtype).eps
  above = s_K > tol
  smallest = jnp.min(jnp.where(above, s_K, jnp.inf), axis=-1)
  return jnp.sum(above, axis=-1), jnp.log10(smallest / tol[..., 0])


def rank_sample(key: jax.Array, d: int, m: int, activation: str) -> dict:
  """One draw: #survivors, rank(D W_up), rank(J_f), their margins (float64 inside)."""
  ku, kd, kx = jax.random.split(key, 3)
  w_up = jax.random.normal(ku, (m, d), jnp.float64)
  w_down = jax.random.normal(kd, (d, m), jnp.float64) / jnp.sqrt(m)
  x = jax.random.normal(kx, (d,), jnp.float64)
  x = x / jnp.linalg.norm(x)
  dw, _ = measure.masked_up_projection(w_up, x, activation)
  # the library's one branch Jacobian takes the code's row layout (x @ W): transposes
  _, jf = measure.branch_jacobian({"w_up": w_up.T, "w_down": w_down.T}, x, activation)
  survivors = jnp.sum(measure.activation_derivative(activation, w_up @ x) != 0)
  r_dw, m_dw = numerical_rank(jnp.linalg.svd(dw, compute_uv=False), (m, d))
  r_j, m_j = numerical_rank(jnp.linalg.svd(jf, compute_uv=False), (d, d))
  return {"survivors": survivors, "rank_masked": r_dw, "rank_jacobian": r_j,
          "margin_masked": m_dw, "margin_jacobian": m_j}


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  d = s["width"]
  keys = jax.random.split(KEY, s["seeds"])
  res = {}
  with jax.enable_x64(True), common.single_blas_thread():
    for act in s["activations"]:
      for ratio in s["ratios"]:
        m = int(round(ratio * d))
        fn = jax.jit(jax.vmap(lambda k: rank_sample(k, d, m, act)))
        out = {k: np.asarray(v) for k, v in fn(keys).items()}
        bound = np.minimum(out["survivors"], d)
        res[(act, ratio)] = {
            **out, "m": m,
            "jacobian_equals_masked": float(np.mean(out["rank_jacobian"] == out["rank_masked"])),
            "masked_equals_bound": float(np.mean(out["rank_masked"] == bound)),
            "rank_over_d": float(np.mean(out["rank_jacobian"]) / d),
            "full_rank": float(np.mean(out["rank_jacobian"] == d)),
            "min_margin": float(min(out["margin_masked"].min(), out["margin_jacobian"].min())),
        }
  summary = _rows(res, s)
  fig = _figure(res, s)
  result = {"settings": s, "measured": summary,
            "results": {f"{a}/m_over_d={r:g}": v for (a, r), v in res.items()}}
  return common.write(out_dir, NAME, result, fig)


def _rows(res: dict, s: dict) -> list[dict]:
  d = s["width"]
  seeds = list(range(s["seeds"]))   # split(PRNGKey(93), seeds)[i]
  bound = lambda v: np.minimum(v["survivors"], d)
  eq_j = np.mean([v["rank_jacobian"] == v["rank_masked"] for v in res.values()], axis=0)
  eq_b = np.mean([v["rank_masked"] == bound(v) for v in res.values()], axis=0)
  margin = min(v["min_margin"] for v in res.values())
  rows = [measured("App D.3: rank J_f = rank(D W_up)",
              eq_j.tolist(), seeds=seeds, note=f"d={d}; smallest margin of a counted singular "
              f"value over the tolerance: 10^{margin:.1f}"),
          measured("App D.1: rank(D W_up) = min(#survivors, d)", eq_b.tolist(), seeds=seeds,
                   note=f"d={d}")]
  for act in s["activations"]:
    p = SURVIVAL[act]
    diff = {r: res[(act, r)]["rank_jacobian"] / d - predicted_rank(d, int(round(r * d)), p)[0]
            for r in s["ratios"]}
    if act == "relu":
      for r in s["ratios"]:
        item = f"App D.1/D.3: relu, m/d={r:g}"
        if item in CLAIMS:
          pred, full = predicted_rank(d, int(round(r * d)), p)
          rows.append(measured(item, diff[r].tolist(), seeds=seeds, note=(
              f"d={d}; predicted rank/d {pred:.3f}, full rank P(K >= d) {full:.2f}; measured "
              f"full-rank fraction {res[(act, r)]['full_rank']:.2f}")))
    elif f"App D.1/D.3: {act}, every m/d" in CLAIMS:
      worst = np.max([np.abs(v) for v in diff.values()], axis=0)
      rows.append(measured(f"App D.1/D.3: {act}, every m/d", worst.tolist(), seeds=seeds,
                           note=f"d={d}"))
  return rows


def _figure(res: dict, s: dict):
  fig, axes = common.plt.subplots(1, 2, figsize=(11, 4))
  d = s["width"]
  for i, act in enumerate(s["activations"]):
    r = np.array(s["ratios"])
    axes[0].plot(r, [res[(act, x)]["rank_over_d"] for x in r], "o-", color=f"C{i}", label=act)
    for x in r:
      v = res[(act, x)]
      axes[1].scatter(v["rank_masked"] / d, v["rank_jacobian"] / d, s=10, color=f"C{i}",
                      label=act if x == r[0] else None)
  grid = np.linspace(0.25, 8, 100)
  axes[0].plot(grid, np.minimum(0.5 * grid, 1), "k:", lw=0.8, label="min(m/(2d), 1) (relu)")
  axes[0].set(xscale="log", xlabel="m/d", ylabel="rank(J_f)/d", title="App D.3: rank of J_f")
  axes[0].minorticks_off()
  axes[0].set_xticks(list(s["ratios"]), [f"{x:g}" for x in s["ratios"]])
  axes[1].plot([0, 1], [0, 1], "k:", lw=0.8)
  axes[1].set(xlabel="rank(D W_up)/d", ylabel="rank(J_f)/d",
              title=f"rank J_f = rank(D W_up) (d={d}, {s['seeds']} seeds)")
  for ax in axes:
    ax.legend(fontsize=7)
  return fig
