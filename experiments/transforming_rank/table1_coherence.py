"""Table 1 (Sec 5): coherence constants c = E[sigma]^2/E[sigma^2] and the spike bound 1/c.

c by half-range Gauss-Hermite quadrature (``rankjax.measure.coherence_constant``), and the
measured post-activation stable rank st(sigma(W h)) at initialization: n probe inputs
h ~ N(0, I_d) normalized to unit rms (the Pre-Norm branch input), W ~ N(0, 1/d),
d = 256, 10 seeds (the n sweep: 3). The paper does not state n for Table 1 ("d=256, mean
over 3 seeds"), and a centered activation's stable rank depends on it (no spike: st
grows with n/d), so Table 1's stable ranks are an open item with two readings, each an
experiment row: n = 1024 (the paper's Table 6 rule n = max(1024, 2d)) and n = 512 (the
paper's Fig 7 "rank and spectrum panels ... use n=512"); the n = 512 rows were declared
after the n sweep's outcome was known (said in the rows). ``n_sweep`` measures abs /
relu / tanh at several n (tanh: ~49 at n = 512, ~57 at 1024; the paper's 50.66 lies
between). c, 1/c and p are closed forms (quadrature): identity rows, shown, not counted.
Quick scale runs d = 64, a proxy of the paper's d = 256 (the paper-scale rows are the
paper's computation; quick no longer repeats it).

  rankjax reproduce transforming_rank --only table1
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import measure
from rankjax.studies import Claim, claims, measured

NAME = "table1_coherence"
SCALES = {
    "quick": dict(width=64, inputs=1024, seeds=10, sweep_seeds=3,
                  n_sweep=(256, 512, 1024, 2048, 4096), sensitivity_inputs=512),
    "paper": dict(width=256, inputs=1024, seeds=10, sweep_seeds=3,
                  n_sweep=(256, 512, 1024, 2048, 4096), sensitivity_inputs=512),
    "tiny": dict(width=32, inputs=128, seeds=2, sweep_seeds=2, n_sweep=(32, 64, 128),
                 sensitivity_inputs=64),
}
PAPER = {"abs": (0.637, 1.57, 1.56), "relu": (0.318, 3.14, 3.09), "gelu": (0.187, 5.35, 5.16),
         "silu": (0.120, 8.33, 7.86), "tanh": (0.0, float("inf"), 50.66)}
SURVIVAL = {"gelu": 0.46, "silu": 0.38}   # Sec 6 / App D.4: p = E[sigma'^2]
N512 = "Table 1, n=512:"
_READ_1024 = "n = 1024 probe inputs (Table 6's n = max(1024, 2d))"
_READ_512 = "n = 512 probe inputs (Fig 7's rank and spectrum panels)"
_OPEN = ("open setting: Table 1 does not state n, and a centered activation's st grows with "
         "n; each reading is an experiment row, the item is open where they disagree")
_ST_WORDS = ("the measured post-activation stable rank ... at initialization ... matches ... "
             "to within")
_C_WORDS = ("(standard Gaussian pre-activation) determines the per-layer stable-rank bound")
_CLOSED = "a closed form (quadrature), true by construction: shown, not counted"
CLAIMS = claims(
    [Claim(f"Table 1 {a}: c", "coherence E[sigma]^2/E[sigma^2] (quadrature)",
           c, common.rule(c), _CLOSED, where="Table 1", quote=_C_WORDS,
           kind="identity")
     for a, (c, _, _) in PAPER.items()]
    + [Claim(f"Table 1 {a}: 1/c", "spike bound 1/c (quadrature)", sb,
             common.rule(sb), _CLOSED, where="Table 1", quote=_C_WORDS,
             kind="identity")
       for a, (_, sb, _) in PAPER.items() if sb != float("inf")]
    + [Claim(f"Table 1 {a}: st", "measured st(sigma(W h)), n=1024", st,
             common.rule(st), _OPEN, where="Table 1", quote=_ST_WORDS,
             reading=_READ_1024)
       for a, (_, _, st) in PAPER.items()]
    + [Claim(f"App D.4: p, {a}", "E[sigma'(z)^2], z ~ N(0,1) (quadrature)", p,
             common.rule(p), _CLOSED, where="App D.4",
             quote="so the effective survival rate is the mean squared "
             "derivative", kind="identity")
       for a, p in SURVIVAL.items()]
    + [Claim(f"{N512} {a}: st", "measured st(sigma(W h)), n=512", st,
             common.rule(st), _OPEN, where="Table 1", quote=_ST_WORDS,
             reading=_READ_512, post_hoc="declared after the n sweep's "
             "outcome was known (tanh: ~49 at n = 512, ~57 at n = 1024)")
       for a, (_, _, st) in PAPER.items()])


def measured_stable_rank(key: jax.Array, activation: str, d: int, n: int) -> float:
  k_w, k_h = jax.random.split(key)
  w = jax.random.normal(k_w, (d, d)) / jnp.sqrt(d)
  h = jax.random.normal(k_h, (n, d))
  h = h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True))
  return float(measure.stable_rank(measure.post_activation(w, h, activation)))


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  table = {}
  with common.single_blas_thread():
    for act in PAPER:
      mom = measure.activation_moments(act)
      st = [measured_stable_rank(k, act, s["width"], s["inputs"])
            for k in jax.random.split(jax.random.PRNGKey(8), s["seeds"])]
      # a centered activation's bound 1/c is infinite: null in the results file
      st_other = [measured_stable_rank(k, act, s["width"], s["sensitivity_inputs"])
                  for k in jax.random.split(jax.random.PRNGKey(8), s["seeds"])]
      table[act] = {"coherence": mom.coherence,
                    "per_seed_stable_rank_sensitivity_inputs": st_other,
                    "spike_bound": mom.spike_bound if np.isfinite(mom.spike_bound) else None,
                    "measured_stable_rank": float(np.mean(st)), "per_seed_stable_rank": st,
                    "survival": mom.survival, "kappa": mom.kappa}
    sweep = {act: {n: [measured_stable_rank(k, act, s["width"], n)
                       for k in jax.random.split(jax.random.PRNGKey(8), s["sweep_seeds"])]
                   for n in s["n_sweep"]} for act in ("abs", "relu", "tanh")}
  n_dependence = {act: {str(n): {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1))
                                 if len(v) > 1 else 0.0} for n, v in per_n.items()}
                  for act, per_n in sweep.items()}
  seeds = list(range(s["seeds"]))   # split(PRNGKey(8), seeds)[i]
  summary = []
  for act, (_, sb, _) in PAPER.items():
    t = table[act]
    summary.append(measured(f"Table 1 {act}: c", t["coherence"]))
    if sb != float("inf"):
      summary.append(measured(f"Table 1 {act}: 1/c", t["spike_bound"]))
  for act in PAPER:
    summary.append(measured(f"Table 1 {act}: st", table[act]["per_seed_stable_rank"],
                            seeds=seeds, note=f"d={s['width']}, n={s['inputs']}"))
  for act in SURVIVAL:
    summary.append(measured(f"App D.4: p, {act}", table[act]["survival"]))
  for act in PAPER:
    summary.append(measured(f"{N512} {act}: st",
        table[act]["per_seed_stable_rank_sensitivity_inputs"], seeds=seeds,
        note=f"d={s['width']}, n={s['sensitivity_inputs']}"))
  fig, ax = common.plt.subplots(figsize=(5, 3.5))
  acts = [a for a in PAPER if a != "tanh"]
  ax.plot([table[a]["spike_bound"] for a in acts], [table[a]["measured_stable_rank"] for a in acts],
          "o")
  for a in acts:
    ax.annotate(a, (table[a]["spike_bound"], table[a]["measured_stable_rank"]))
  ax.plot([table[a]["spike_bound"] for a in acts], [PAPER[a][2] for a in acts], "x",
          color="red", label="paper's measured st (Table 1)")
  ax.legend(fontsize=7)
  ax.plot([1, 9], [1, 9], "k--", lw=0.8)
  ax.set_xlabel("bound 1/c")
  ax.set_ylabel("measured stable rank")
  result = {"settings": s, "table": table, "n_dependence": n_dependence, "measured": summary}
  return common.write(out_dir, NAME, result, fig)
