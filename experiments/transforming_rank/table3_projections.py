"""Table 3 (App B.2): products of rank-one projections do not collapse the rank.

erank(prod_l (I - x_l x_l^T))/d where x_l is a random walk on the unit sphere with
step angle eps: x_{l+1} = cos(eps) x_l + sin(eps) u_l, u_l a uniformly random unit
vector orthogonal to x_l (our reading of "independent random walk of step angle eps").
d=256, 10 seeds, L in {48, 96, 192, 384} (prefixes of one walk of length 384). Cheap
enough to run at the paper's size at both scales.

  python -m experiments.transforming_rank.table3_projections --scale quick --out runs/tr
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments.transforming_rank import common
from rankjax.measure import spectra

NAME = "table3_projections"
SCALES = {
    "quick": dict(width=256, seeds=10, depths=(48, 96, 192, 384), eps=(0.01, 0.15, 0.30, 0.60)),
    "paper": dict(width=256, seeds=10, depths=(48, 96, 192, 384), eps=(0.01, 0.15, 0.30, 0.60)),
    "tiny": dict(width=16, seeds=2, depths=(48, 96, 192, 384), eps=(0.01, 0.15, 0.30, 0.60)),
}
PAPER = {0.01: (0.996, 0.996, 0.996, 0.996), 0.15: (0.996, 0.996, 0.996, 0.996),
         0.30: (0.996, 0.996, 0.995, 0.995), 0.60: (0.994, 0.992, 0.988, 0.980)}
PAPER_DEPTHS = (48, 96, 192, 384)
CLAIMS = common.evidence.claims(
    common.frac(f"Table 3: eps={e}, L={L}", "erank(prod_l (I - x_l x_l^T))/d, d=256", v)
    for e, vals in PAPER.items() for L, v in zip(PAPER_DEPTHS, vals))


def projection_walk_erank(key: jax.Array, eps: float, d: int, depth: int,
                          report: tuple[int, ...]) -> jax.Array:
  """erank/d of the running product of ``I - x_l x_l^T`` at the ``report`` depths."""
  k0, k1 = jax.random.split(key)
  x0 = jax.random.normal(k0, (d,))
  x0 = x0 / jnp.linalg.norm(x0)
  noise = jax.random.normal(k1, (depth, d))

  def step(carry, g):
    x, prod = carry
    prod = prod - jnp.outer(x, x @ prod)          # (I - x x^T) @ prod
    u = g - (g @ x) * x
    u = u / jnp.linalg.norm(u)
    return (jnp.cos(eps) * x + jnp.sin(eps) * u, prod), prod

  _, prods = jax.lax.scan(step, (x0, jnp.eye(d)), noise)
  idx = np.asarray(report) - 1
  return spectra.effective_rank(prods[idx]) / d


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  table, per_seed = {}, {}
  fn = jax.jit(projection_walk_erank, static_argnums=(2, 3, 4))
  with common.single_blas_thread():
    for e in s["eps"]:
      vals = [np.asarray(fn(k, e, s["width"], max(s["depths"]), tuple(s["depths"])))
              for k in jax.random.split(jax.random.PRNGKey(6), s["seeds"])]
      per_seed[e] = np.asarray(vals)
      table[e] = np.mean(vals, axis=0)
  seeds = list(range(s["seeds"]))   # split(PRNGKey(6), seeds)[i]
  summary = [CLAIMS[f"Table 3: eps={e}, L={L}"].judge(per_seed[e][:, j].tolist(), seeds=seeds)
             for e in s["eps"] for j, L in enumerate(s["depths"])
             if f"Table 3: eps={e}, L={L}" in CLAIMS]
  fig, ax = common.plt.subplots(figsize=(5, 3.5))
  for e in s["eps"]:
    ax.plot(s["depths"], table[e], "o-", label=f"eps={e}")
  ax.set_xlabel("L")
  ax.set_ylabel("erank / d")
  ax.legend()
  result = {"settings": s, "table": {str(e): v for e, v in table.items()},
            "per_seed": {str(e): v for e, v in per_seed.items()}, "summary": summary}
  return common.write(out_dir, NAME, result, fig)


if __name__ == "__main__":
  common.main(run, __doc__)
