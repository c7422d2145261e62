"""Fig 9, Fig 17, App D.3 and D.7: the masked up-projection follows Marchenko-Pastur.

Gram eigenvalues of G = (D W_up)^T (D W_up)/n_eff with W_up unit-variance Gaussian
(m x d), D = diag(sigma'(W_up x)) at a unit-norm x (so the pre-activations are standard
Gaussian), n_eff = sum sigma'^2, gamma = n_eff/d; d=512, 40 seeds, m/d in {2, 4, 8},
ReLU, GELU, SiLU, abs (Fig 9 omits SiLU, Fig 17 has all four). Compared with the MP law
at the measured gamma (edges (1 -+ 1/sqrt(gamma))^2, atom 1-gamma below threshold) by the
Kolmogorov distance of the eigenvalue CDFs. App D.7: ReLU at gamma = 2..16 (m/d = 4..32),
smallest Gram eigenvalue of the submatrix vs sigma_min(J_f)^2 of the branch Jacobian with
1/fan-in weights, and erank(J_f)/d.

  python -m experiments.transforming_rank.fig9_marchenko_pastur --scale quick --out runs/tr
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments.transforming_rank import common
from rankjax.measure import jacobians, representations, spectra

NAME = "fig9_marchenko_pastur"
ACTS = ("relu", "gelu", "silu", "abs")
SCALES = {
    "quick": dict(width=128, seeds=6, ratios=(2, 4, 8), d7_ratios=(4, 8, 16, 32)),
    "paper": dict(width=512, seeds=40, ratios=(2, 4, 8), d7_ratios=(4, 8, 16, 32)),
}


def _gram(key, activation, d, m, seeds):
  def one(k):
    k1, k2 = jax.random.split(k)
    w = jax.random.normal(k1, (m, d))
    x = jax.random.normal(k2, (d,))
    return representations.masked_gram_eigenvalues(w, x / jnp.linalg.norm(x), activation)
  return jax.jit(jax.vmap(one))(jax.random.split(key, seeds))


def mp_cdf(x: np.ndarray, gamma: float) -> np.ndarray:
  lo, hi = (float(v) for v in spectra.marchenko_pastur_edges(gamma))
  grid = np.linspace(lo, hi, 20001)
  dens = np.asarray(spectra.marchenko_pastur_density(jnp.asarray(grid), gamma))
  cum = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
  atom = float(spectra.marchenko_pastur_atom(gamma))
  return atom * (x >= 0) + np.interp(x, grid, cum, left=0.0, right=cum[-1])


def kolmogorov(eigs: np.ndarray, gamma: float) -> float:
  x = np.sort(eigs.ravel())
  emp = np.arange(1, len(x) + 1) / len(x)
  return float(np.max(np.abs(emp - mp_cdf(x, gamma))))


def _d7(key, d, m, seeds):
  def one(k):
    k1, k2, k3 = jax.random.split(k, 3)
    w = jax.random.normal(k1, (m, d))
    x = jax.random.normal(k2, (d,))
    x = x / jnp.linalg.norm(x)
    eig, gamma = representations.masked_gram_eigenvalues(w, x, "relu")
    w_down = jax.random.normal(k3, (d, m)) / jnp.sqrt(m)
    _, jf = jacobians.branch_jacobian({"w_up": (w / jnp.sqrt(d)).T, "w_down": w_down.T},
                                      x * jnp.sqrt(d), "relu")
    return (eig[0], gamma, representations.smallest_gram_eigenvalue(jf),
            spectra.effective_rank(jf) / d)
  return [np.asarray(v) for v in jax.jit(jax.vmap(one))(jax.random.split(key, seeds))]


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  d = s["width"]
  key = jax.random.PRNGKey(12)
  res, hists = {}, {}
  with common.single_blas_thread():
    for i, a in enumerate(ACTS):
      for j, r in enumerate(s["ratios"]):
        eig, gamma = (np.asarray(v) for v in _gram(jax.random.fold_in(key, 10 * i + j), a, d,
                                                   r * d, s["seeds"]))
        g = float(gamma.mean())
        lo, hi = (float(v) for v in spectra.marchenko_pastur_edges(g))
        res[(a, r)] = {"gamma": g, "lambda_min": float(eig[:, 0].mean()),
                       "lambda_max": float(eig[:, -1].mean()), "edge_lo": lo, "edge_hi": hi,
                       "kolmogorov": kolmogorov(eig, g)}
        hists[(a, r)] = eig.ravel()
    d7 = {r: _d7(jax.random.fold_in(key, 500 + r), d, r * d, s["seeds"]) for r in s["d7_ratios"]}
  d7_summary = {r: {"gamma": float(v[1].mean()), "submatrix_min_eig": float(v[0].mean()),
                    "jf_min_eig": float(np.exp(np.mean(np.log(v[2])))), "jf_erank": float(v[3].mean())}
                for r, v in d7.items()}

  summary = []
  for a in ACTS:
    summary.append(common.row(
        f"Fig 9/17 {a}: m/d={'/'.join(map(str, s['ratios']))}: lambda_min (MP edge); KS dist",
        "exact for relu, abs; approximate for gelu, silu",
        "; ".join(f"{res[(a, r)]['lambda_min']:.3f} ({res[(a, r)]['edge_lo']:.3f}) "
                  f"KS {res[(a, r)]['kolmogorov']:.3f}" for r in s["ratios"])))
  summary.append(common.row("App D.3: MP condition number at gamma = 2 / 4", "5.8 / 3.0",
                            f"{float(spectra.marchenko_pastur_condition_number(2.0)):.2f} / "
                            f"{float(spectra.marchenko_pastur_condition_number(4.0)):.2f}"))
  summary.append(common.row(
      "App D.7 relu: submatrix smallest Gram eig at gamma = " +
      "/".join(f"{v['gamma']:.0f}" for v in d7_summary.values()),
      "0.09 ... 0.57 (gamma 2 -> 16, d=512)",
      " / ".join(f"{v['submatrix_min_eig']:.3f}" for v in d7_summary.values())))
  summary.append(common.row(
      "App D.7 relu: sigma_min(J_f)^2 (geometric mean)", "~1e-6 at d=512 (~1/d^2 scale)",
      " / ".join(f"{v['jf_min_eig']:.1e}" for v in d7_summary.values()) + f" at d={d}"))
  summary.append(common.row("App D.7 relu: erank(J_f)/d", "improves with width",
                            " / ".join(f"{v['jf_erank']:.3f}" for v in d7_summary.values())))

  fig, axes = common.plt.subplots(len(ACTS), len(s["ratios"]), figsize=(12, 10))
  for i, a in enumerate(ACTS):
    for j, r in enumerate(s["ratios"]):
      ax = axes[i, j]
      info = res[(a, r)]
      ax.hist(hists[(a, r)], bins=60, density=True, alpha=0.5)
      xs = np.linspace(1e-4, info["edge_hi"] * 1.1, 400)
      ax.plot(xs, np.asarray(spectra.marchenko_pastur_density(jnp.asarray(xs), info["gamma"])),
              "-" if a in ("relu", "abs") else "--")
      ax.axvline(info["edge_lo"], ls=":", color="k")
      ax.axvline(info["edge_hi"], ls=":", color="k")
      ax.set_title(f"{a}, m/d={r}, gamma={info['gamma']:.2f}", fontsize=8)
  result = {"settings": s, "spectra": {f"{a}/{r}": v for (a, r), v in res.items()},
            "d7": {str(r): v for r, v in d7_summary.items()}, "summary": summary}
  return common.write(out_dir, NAME, result, fig)


if __name__ == "__main__":
  common.main(run, __doc__)
