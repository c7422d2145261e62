"""Table 3 (App B.2): products of rank-one projections do not collapse the rank.

erank(prod_l (I - x_l x_l^T))/d where x_l is a random walk on the unit sphere with
step angle eps: x_{l+1} = cos(eps) x_l + sin(eps) u_l, u_l a uniformly random unit
vector orthogonal to x_l (our reading of "independent random walk of step angle eps").
d=256, 10 seeds, L in {48, 96, 192, 384} (prefixes of one walk of length 384). Cheap
enough to run at the paper's size at both scales.

The step is an open setting: the paper names the parameter ("an independent random walk
of step angle eps", App B.2) but not the step. Two readings, each an experiment row of
the open item Table 3: the geodesic step above (its angle is exactly eps), and the
renormalized Gaussian step x_{l+1} = (x_l + eps g_l / sqrt(d)) / ||.||, g_l standard
normal (its angle is about arctan(eps): 0.54 rad at eps = 0.6), with the same seeds. The
renormalized reading was declared after a review reported that it reproduces the
paper's eps = 0.6 row (said in its rows). Quick scale runs d = 64, a proxy of the paper's
d = 256 (the paper-scale rows are the paper's computation; quick no longer repeats it).

  rankjax reproduce transforming_rank --only table3
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import measure
from rankjax.studies import Claim, claims, measured

NAME = "table3_projections"
SCALES = {
    "quick": dict(width=64, seeds=10, depths=(48, 96, 192, 384), eps=(0.01, 0.15, 0.30, 0.60)),
    "paper": dict(width=256, seeds=10, depths=(48, 96, 192, 384), eps=(0.01, 0.15, 0.30, 0.60)),
    "tiny": dict(width=16, seeds=2, depths=(48, 96, 192, 384), eps=(0.01, 0.15, 0.30, 0.60)),
}
PAPER = {0.01: (0.996, 0.996, 0.996, 0.996), 0.15: (0.996, 0.996, 0.996, 0.996),
         0.30: (0.996, 0.996, 0.995, 0.995), 0.60: (0.994, 0.992, 0.988, 0.980)}
PAPER_DEPTHS = (48, 96, 192, 384)
STEPS = ("geodesic", "renormalized")   # the walk's step: ours, and the sensitivity rows'
RENORMALIZED = "Table 3, renormalized step"
READING = {"geodesic": "geodesic step (angle exactly eps)",
           "renormalized": "renormalized Gaussian step (angle about arctan eps)"}
_WORDS = ("a product of ... rank-one projections along an independent random walk of step "
          "angle")
_OPEN = ("open setting: App B.2 names the walk's 'step angle' but not the step; each "
         "reading is an experiment row, the item is open where they disagree")


def _item(step: str, e: float, L: int) -> str:
  return f"{'Table 3' if step == 'geodesic' else RENORMALIZED}: eps={e}, L={L}"


CLAIMS = claims(
    Claim(
        _item(step, e, L), "erank(prod_l (I - x_l x_l^T))/d"
        + ("" if step == "geodesic" else ", x_{l+1} = (x_l + eps g / sqrt(d)) / ||.||"),
        v, common.rule(v, fraction=True), _OPEN, where="Table 3", quote=_WORDS,
        reading=READING[step],
        post_hoc="" if step == "geodesic" else "declared after a review reported that this "
        "reading reproduces the paper's eps = 0.6 row")
    for step in STEPS for e, vals in PAPER.items() for L, v in zip(PAPER_DEPTHS, vals))


def projection_walk_erank(key: jax.Array, eps: float, d: int, depth: int,
                          report: tuple[int, ...], step_kind: str = "geodesic") -> jax.Array:
  """erank/d of the running product of ``I - x_l x_l^T`` at the ``report`` depths; the
  walk's ``step_kind`` is one of :data:`STEPS`."""
  k0, k1 = jax.random.split(key)
  x0 = jax.random.normal(k0, (d,))
  x0 = x0 / jnp.linalg.norm(x0)
  noise = jax.random.normal(k1, (depth, d))

  def step(carry, g):
    x, prod = carry
    prod = prod - jnp.outer(x, x @ prod)          # (I - x x^T) @ prod
    if step_kind == "renormalized":
      y = x + eps * g / np.sqrt(d)
      return (y / jnp.linalg.norm(y), prod), prod
    u = g - (g @ x) * x
    u = u / jnp.linalg.norm(u)
    return (jnp.cos(eps) * x + jnp.sin(eps) * u, prod), prod

  _, prods = jax.lax.scan(step, (x0, jnp.eye(d)), noise)
  idx = np.asarray(report) - 1
  return measure.effective_rank(prods[idx]) / d


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  table, per_seed, sensitivity = {}, {}, {}
  fn = jax.jit(projection_walk_erank, static_argnums=(2, 3, 4, 5))
  with common.single_blas_thread():
    for kind in STEPS:
      for e in s["eps"]:
        vals = np.asarray([np.asarray(fn(k, e, s["width"], max(s["depths"]),
                                         tuple(s["depths"]), kind))
                           for k in jax.random.split(jax.random.PRNGKey(6), s["seeds"])])
        (per_seed if kind == "geodesic" else sensitivity)[e] = vals
      if kind == "geodesic":
        table = {e: np.mean(v, axis=0) for e, v in per_seed.items()}
  seeds = list(range(s["seeds"]))   # split(PRNGKey(6), seeds)[i]
  summary = [measured(_item(kind, e, L), vals[e][:, j].tolist(), seeds=seeds)
             for kind, vals in zip(STEPS, (per_seed, sensitivity))
             for e in s["eps"] for j, L in enumerate(s["depths"])
             if _item(kind, e, L) in CLAIMS]
  fig, ax = common.plt.subplots(figsize=(5, 3.5))
  for e in s["eps"]:
    line, = ax.plot(s["depths"], table[e], "o-", label=f"eps={e} (geodesic)")
    ax.plot(s["depths"], np.mean(sensitivity[e], axis=0), "s--", color=line.get_color(),
            label=f"eps={e} (renormalized)")
    ax.plot(PAPER_DEPTHS, PAPER[e], "x", color=line.get_color(), ms=8)
  ax.set_xlabel("L")
  ax.set_ylabel("erank / d (x: the paper's Table 3)")
  ax.legend(fontsize=6)
  result = {"settings": s, "table": {str(e): v for e, v in table.items()},
            "per_seed": {str(e): v for e, v in per_seed.items()},
            "per_seed_renormalized_step": {str(e): v for e, v in sensitivity.items()},
            "measured": summary}
  return common.write(out_dir, NAME, result, fig)
