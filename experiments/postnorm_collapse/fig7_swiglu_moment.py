"""Figure 7 of the Post-Norm collapse paper: the pairwise SwiGLU moment m(rho).

The paper (App C.4, Fig 7) evaluates ``m(rho) = E[SiLU(u) SiLU(v)]``,
``(u, v) ~ N(0, sigma_W1^2 d [[1, rho], [rho, 1]])`` under the standard
initialization (``sigma_W1^2 d = 1/3``) and reports: m is approximately linear and
increasing on [0, 1], ``rho m(rho)`` is increasing, ``m(0) ~ 0.006``,
``m(1) ~ 0.100``; hence ``Delta_FFN < 0`` and ``|Delta_FFN| <= xi m(1) ~ 0.011``
(Thm 3.4 remark).

We compute m by Gauss-Hermite quadrature (``rankjax.measure.swiglu_moment``),
check it against Monte Carlo, and plot

  (a) m(rho) with Monte Carlo points,   (b) rho m(rho)   [the paper's Figure 7]
  (c) Delta_attn(s = 1/9) and Delta_FFN(xi = 1/9) against t for n = 2048
      [not in the paper's Fig 7: the comparison its Thm 3.4 remark makes in words].

Run:  rankjax reproduce postnorm_collapse --only fig7
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import measure, studies
from rankjax.studies import Abs, Bound, Claim, Qualitative, Rel, claims, measured

SCALES: dict[str, dict[str, Any]] = {
    # grid points on [0, 1], quadrature nodes per axis, Monte Carlo rho values and
    # samples per value; n and widths of panel (c) are the paper's (Sec 4).
    "quick": dict(grid=101, num_nodes=48, mc_rhos=6, mc_samples=200_000, n=2048),
    "paper": dict(grid=1001, num_nodes=96, mc_rhos=11, mc_samples=4_000_000, n=2048),
    "tiny": dict(grid=21, num_nodes=16, mc_rhos=3, mc_samples=20_000, n=2048),
}
Q7 = ("We can see that $m(\\rho)$ is approximately linear and increasing on "
      "$\\rho\\in[0,1]$, and $\\rho m(\\rho)$ is also increasing on $\\rho\\in[0,1]$.")
Q7_NUM = ("Numerically, $m(0)\\approx 0.006$ and $m(1)\\approx 0.100$ under current variance "
          "setting")
CLOSED = ("a closed form: quadrature of the paper's integral at its stated variances, "
          "deterministic (the paper's arithmetic, not a measurement)")
WORST_NOTE = ("the worst case over a dense grid: t in [1/n, 1) (2001 points), s in "
              "[1e-4, 1e4], xi in [1e-3, 1e2], n = 2048")
WORST_ITEMS = (("Thm 3.2: Delta_attn > 0, worst case", "min_delta_attn"),
               ("Thm 3.2: f_1 largest at t = (n-1)/(2n)", "f1_argmax_minus_paper"),
               ("Thm 3.4: Delta_FFN < 0, worst case", "max_delta_ffn_open_interval"),
               ("Thm 3.4: |Delta_FFN| <= xi m(1), worst case", "max_abs_delta_ffn_over_xi_m1"))
Q32 = ("so $\\Delta_{\\mathrm{attn}}(s,t_{1})>0$: the one-step attention contribution is "
       "positive")
Q32_MAX = ("The factor $f_{1}(t_{1})$ is a quadratic function of $t_{1}$ and is maximized at "
           "$t_{1}=(n-1)/(2n)\\approx 1/2$.")
Q34 = ("Therefore $m(\\rho(t_{2}))-m(1)<0$ for $t_{2}\\in[1/n,1)$ and "
       "$\\Delta_{\\mathrm{FFN}}(\\xi,t_{2})<0$, so SwiGLU contributes a damping effect on "
       "similarity.")
Q34_BOUND = "We can upper-bound the magnitude of similarity change by"
CLOSED_WORST = ("a closed form checked at its worst case over its inputs (the remark's "
                "sign / bound), shown, not counted")
CLAIMS = claims(common.words([
    Claim("Thm 3.2: Delta_attn > 0, worst case", "min over (s, t) of Delta_attn(s, t), "
          "n = 2048", 0.0, Bound(">"), ""),
    Claim("Thm 3.2: f_1 largest at t = (n-1)/(2n)", "argmax of f_1 on a 200001-point grid "
          "minus (n-1)/(2n)", None, Bound("<=", limit=1e-5),
          "within the grid's step (5e-6), ours"),
    Claim("Thm 3.4: Delta_FFN < 0, worst case", "max over (xi, t in (1/n, 1)) of "
          "Delta_FFN(xi, t), n = 2048", 0.0, Bound("<"), ""),
    Claim("Thm 3.4: |Delta_FFN| <= xi m(1), worst case", "max over (xi, t) of |Delta_FFN| / "
          "(xi m(1))", None, Bound("<=", limit=1.0), "the bound's ratio; 1 is the "
          "bound itself"),
    Claim("Fig 7: m(0)", "m(0) (Gauss-Hermite quadrature)", 0.006, Abs(0.0005),
          "App C.4 prints ~0.006; half its last digit"),
    Claim("Fig 7: m(1)", "m(1)", 0.100, Rel(0.05), "App C.4 prints ~0.100"),
    Claim("Fig 7: xi m(1), xi = 1/9", "xi m(1)", 0.011, Abs(0.0005),
          "App C.4 prints ~0.011; half its last digit; m(1) / 9"),
    Claim("Fig 7: m increasing on [0, 1]", "min over the grid of m(rho_i+1) - m(rho_i)",
          0.0, Bound(">"), "App C.4: m is increasing"),
    Claim("Fig 7: rho m(rho) increasing on [0, 1]", "min over the grid of the step of "
          "rho m(rho)", 0.0, Bound(">"), "App C.4: rho m(rho) is increasing"),
    Claim("Fig 7: m approximately linear", "R^2 of a linear fit of m on [0, 1]",
          None, Qualitative(
              "'approximately linear' has no number: our fig7.png shows m with its chord "
              "m(0) -> m(1) and the paper's two printed values; R^2 is shown, not judged"),
          "App C.4: approximately linear"),
], [("Thm 3.2: Delta", {"where": "Thm 3.2", "quote": Q32, "kind": "identity",
                        "note": CLOSED_WORST}),
    ("Thm 3.2: f_1", {"where": "Thm 3.2", "quote": Q32_MAX, "kind": "identity",
                      "note": CLOSED_WORST}),
    ("Thm 3.4: Delta_FFN <", {"where": "Thm 3.4", "quote": Q34, "kind": "identity",
                              "note": CLOSED_WORST}),
    ("Thm 3.4: \\|", {"where": "Thm 3.4", "quote": Q34_BOUND, "kind": "identity",
                      "note": CLOSED_WORST}),
    ("m\\(0\\)$|: m\\(1\\)$", {"where": "Fig 7", "quote": Q7_NUM, "kind": "identity",
                               "note": CLOSED}),
    ("xi m\\(1\\)", {"where": "Fig 7", "quote": "In the conventional setting $\\xi=1/9$ and "
                     "$m(1)\\approx 0.10$. Thus $\\xi m(1)$ is about $0.011$, so the damping "
                     "effect is small.", "kind": "identity", "note": CLOSED}),
    ("Fig 7: ", {"where": "Fig 7", "quote": Q7, "kind": "identity", "note": CLOSED})]))


def _monte_carlo(rho: np.ndarray, num: int, var_u: float, seed: int = 0):
  """Direct Monte Carlo of m(rho), in chunks; returns (mean, standard error)."""
  chunk = 200_000
  sums = np.zeros(len(rho))
  sq = np.zeros(len(rho))

  @jax.jit
  def moments(key, rho_R):
    z1, z2 = jax.random.normal(key, (2, chunk))
    u = jnp.sqrt(var_u) * z1
    v = jnp.sqrt(var_u) * (rho_R[:, None] * z1 + jnp.sqrt(1 - rho_R[:, None] ** 2) * z2)
    vals = jax.nn.silu(u) * jax.nn.silu(v)
    return jnp.sum(vals, axis=1), jnp.sum(vals * vals, axis=1)

  key = jax.random.PRNGKey(seed)
  done = 0
  while done < num:
    key, sub = jax.random.split(key)
    s1, s2 = moments(sub, jnp.asarray(rho, jnp.float32))
    sums += np.asarray(s1, np.float64)
    sq += np.asarray(s2, np.float64)
    done += chunk
  mean = sums / done
  var = sq / done - mean**2
  return mean, np.sqrt(var / done)


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Computes Figure 7's curves and checks, writes ``fig7.json`` and ``fig7.png``."""
  cfg = SCALES[scale]
  os.makedirs(out_dir, exist_ok=True)
  start = time.time()
  var_u = measure.STANDARD_SWIGLU_VAR_U
  with jax.enable_x64(True):
    rho = np.linspace(0.0, 1.0, cfg["grid"])
    m = np.asarray(measure.swiglu_moment(rho, var_u, num_nodes=cfg["num_nodes"]))
    m_ref = np.asarray(measure.swiglu_moment(rho, var_u, num_nodes=2 * cfg["num_nodes"]))
    m0, m1 = float(m[0]), float(m[-1])
    chord = m0 + (m1 - m0) * rho
    slope, intercept = np.polyfit(rho, m, 1)
    resid = m - (slope * rho + intercept)
    r2 = 1.0 - np.sum(resid**2) / np.sum((m - m.mean()) ** 2)
    n = cfg["n"]
    xi = float(measure.swiglu_xi(512, 1536))
    s = float(measure.amount_of_attention_postnorm(512, measure.folded_attention_variance(512)))
    t = np.linspace(1.0 / n, 1.0, 400)
    d_attn = np.asarray(measure.delta_attn(s, t, n))
    d_ffn = np.asarray(measure.delta_ffn(xi, t, n, var_u, num_nodes=cfg["num_nodes"]))
    worst = worst_cases(n, var_u, cfg["num_nodes"])

  mc_rho = np.linspace(0.0, 1.0, cfg["mc_rhos"])
  mc_mean, mc_se = _monte_carlo(mc_rho, cfg["mc_samples"], var_u)
  with jax.enable_x64(True):
    gh_at_mc = np.asarray(measure.swiglu_moment(mc_rho, var_u, num_nodes=cfg["num_nodes"]))
  z = (mc_mean - gh_at_mc) / mc_se

  result: dict[str, Any] = {
      "figure": "postnorm_collapse Fig 7",
      "scale": scale,
      "settings": {**cfg, "var_u": var_u, "xi": xi, "s": s},
      "paper": {"m0": 0.006, "m1": 0.100, "xi_m1": 0.011,
                "claims": ["m increasing on [0,1]", "m approximately linear",
                           "rho*m(rho) increasing on [0,1]"]},
      "ours": {
          "m0": m0, "m1": m1, "xi_m1": xi * m1,
          "m_half": float(np.interp(0.5, rho, m)),
          "m_increasing": bool(np.all(np.diff(m) > 0)),
          "rho_m_increasing": bool(np.all(np.diff(rho * m) > 0)),
          "min_step_m": float(np.min(np.diff(m))),            # > 0: m increasing on the grid
          "min_step_rho_m": float(np.min(np.diff(rho * m))),
          "linear_fit": {"slope": float(slope), "intercept": float(intercept),
                         "r2": float(r2)},
          "max_dev_from_chord_rel": float(np.max(np.abs(m - chord)) / (m1 - m0)),
          "quadrature_change_when_nodes_doubled": float(np.max(np.abs(m - m_ref))),
          "monte_carlo": {"rho": mc_rho.tolist(), "mean": mc_mean.tolist(),
                          "se": mc_se.tolist(), "quadrature": gh_at_mc.tolist(),
                          "max_abs_z": float(np.max(np.abs(z)))},
          "n": n,
          "max_delta_attn": float(d_attn.max()),
          "t_at_max_delta_attn": float(t[np.argmax(d_attn)]),
          "min_delta_ffn": float(d_ffn.min()),
          "t_at_min_delta_ffn": float(t[np.argmin(d_ffn)]),
          "delta_ffn_all_negative_on_open_interval": bool(np.all(d_ffn[1:-1] < 0)),
          "worst_case": worst,
      },
      "curves": {"rho": rho[:: max(1, len(rho) // 101)].tolist(),
                 "m": m[:: max(1, len(rho) // 101)].tolist()},
      "seconds": None,
  }

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
  ax[0].plot(rho, m, label="Gauss-Hermite")
  ax[0].errorbar(mc_rho, mc_mean, yerr=3 * mc_se, fmt="o", ms=3, label="Monte Carlo (±3 SE)")
  ax[0].plot(rho, chord, ":", color="gray", label="chord m(0)→m(1)")
  ax[0].plot([0.0, 1.0], [0.006, 0.100], "r*", ms=9, label="paper: m(0)≈0.006, m(1)≈0.100")
  ax[0].set(xlabel=r"$\rho$", ylabel=r"$m(\rho)$",
            title=r"(a) $m(\rho)$, $\sigma_{W_1}^2 d = 1/3$")
  ax[0].legend(fontsize=8)
  ax[1].plot(rho, rho * m)
  ax[1].set(xlabel=r"$\rho$", ylabel=r"$\rho\, m(\rho)$", title=r"(b) $\rho\, m(\rho)$")
  ax[2].plot(t, d_attn, label=r"$\Delta_{attn}(s=1/9)$ (Thm 3.2)")
  ax[2].plot(t, d_ffn, label=r"$\Delta_{FFN}(\xi=1/9)$ (Thm 3.4)")
  ax[2].axhline(0, color="gray", lw=0.5)
  ax[2].set(xlabel=r"$t$", ylabel="one-step change",
            title=f"(c) n={n} [extra, not in paper Fig 7]")
  ax[2].legend(fontsize=8)
  fig.tight_layout()
  studies.save_figure(fig, os.path.join(out_dir, "fig7.png"), dpi=130)
  plt.close(fig)

  result["seconds"] = time.time() - start
  common.write_json(out_dir, "fig7.json", result)
  result["measured"] = measurements(result)
  return result


WORST_S = np.logspace(-4, 4, 81)     # amounts of attention s searched
WORST_XI = np.logspace(-3, 2, 51)    # xi searched


def worst_cases(n: int, var_u: float, num_nodes: int) -> dict[str, float]:
  """The remarks of Thms 3.2 and 3.4 at their worst case over a dense grid of their
  inputs (t in [1/n, 1): 2001 points, log-spaced near 1/n and linear, s and xi over eight
  and five decades): min Delta_attn (> 0), the argmax of f_1 against (n-1)/(2n), max
  Delta_FFN (< 0 on (1/n, 1)), max |Delta_FFN| / (xi m(1)) (<= 1)."""
  t = np.unique(np.concatenate([1.0 / n + np.logspace(-12, 0, 1001) * (1 - 1.0 / n),
                                np.linspace(1.0 / n, 1.0, 1001)]))
  t = t[(t >= 1.0 / n) & (t < 1.0)]
  with jax.enable_x64(True):
    d_attn = np.asarray(measure.delta_attn(WORST_S[:, None], t[None, :], n))
    tt = np.linspace(1.0 / n, 1.0, 200_001)
    f1 = np.asarray(measure.f1(tt, n))
    m_one = float(measure.swiglu_moment(1.0, var_u, num_nodes))
    inner = t[t > 1.0 / n]
    d_ffn = np.stack([np.asarray(measure.delta_ffn(x, inner, n, var_u, num_nodes))
                      for x in WORST_XI])
  bound = np.max(np.abs(d_ffn) / (WORST_XI[:, None] * m_one))
  return {"min_delta_attn": float(d_attn.min()),
          "f1_argmax_minus_paper": float(tt[np.argmax(f1)] - (n - 1) / (2 * n)),
          "f1_grid_step": float(tt[1] - tt[0]),
          "max_delta_ffn_open_interval": float(d_ffn.max()),
          "max_abs_delta_ffn_over_xi_m1": float(bound)}


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: the value of each claim of ``CLAIMS`` (deterministic)."""
  o = res["ours"]
  note = "deterministic (quadrature); Monte Carlo agreement is in the results file"
  return [measured("Fig 7: m(0)", o["m0"], note=note),
          measured("Fig 7: m(1)", o["m1"], note=note),
          measured("Fig 7: xi m(1), xi = 1/9", o["xi_m1"], note=note),
          measured("Fig 7: m increasing on [0, 1]", o["min_step_m"]),
          measured("Fig 7: rho m(rho) increasing on [0, 1]", o["min_step_rho_m"]),
          measured("Fig 7: m approximately linear", o["linear_fit"]["r2"])] + [
          measured(item, o["worst_case"][key], note=WORST_NOTE)
          for item, key in WORST_ITEMS if "worst_case" in o]
