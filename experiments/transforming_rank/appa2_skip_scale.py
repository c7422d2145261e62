"""App A.2: why the skip must be the identity under Pre-Norm (a scaled skip, measured).

A Pre-Norm residual MLP whose skip is scaled by a constant lambda,
``h_l = lambda h_{l-1} + beta f(P(h_{l-1}))``, has the input-output Jacobian
``prod_l (lambda I + beta J_l)`` (Eq. 13). Its order-0 path (the skip at every block)
is ``lambda^L I``: it passes through no weights, so its mass
``mu_0 = ||lambda^L I||_F = lambda^L sqrt(d)`` is fixed by lambda and L alone, and
beta cannot change it. From block l the skip reaches the output with
``lambda^(L-l)``, in the forward signal (``lambda^(L-l) h_l`` inside h_L) and in the
Jacobian alike. Any lambda != 1 makes it explode (lambda > 1) or vanish (lambda < 1)
exponentially in depth; only lambda = 1 keeps it O(1) (App A.2, after He et al. 2016b).

The paper states this as an argument, not a figure. We measure it on the Fig 3 network
(Pre-RMSNorm, two-matrix ReLU branch, 4x, L=48, alpha=1), lambda in {0.9, 0.95, 1,
1.05, 1.1} and beta in {1, 1/sqrt(L), 1/L}, one weight draw and one N(0, I) input per
seed shared by every (lambda, beta):

* ``log mu_0`` from the path-sum DP (Eq. 12 with K_l = lambda I) against
  ``L log lambda + log sqrt(d)``, which must hold for every draw and every beta;
* the skip share of the Jacobian's path mass, ``mu_0 / sum_k mu_k`` (Fig 3's profile at
  order 0), and of the forward signal, ``||lambda^L h_0|| / ||h_L||``;
* ``||dh_L/dh_0||_F / sqrt(d)``, rms(h_L) and erank(dh_L/dh_0)/d.

Block Jacobians, their running product and the path sums come from
``rankjax.measure.network_study`` with ``skip = lambda h``.

  rankjax reproduce transforming_rank --only appa2
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import measure, models
from rankjax.config import MLPConfig
from rankjax.studies import claims, measured

NAME = "appa2_skip_scale"
SCALES = {
    "quick": dict(depth=48, width=64, expansion=4.0, seeds=10,
                  lambdas=(0.9, 0.95, 1.0, 1.05, 1.1), betas=("1", "1/sqrt(L)", "1/L")),
    "paper": dict(depth=48, width=256, expansion=4.0, seeds=8,
                  lambdas=(0.9, 0.95, 1.0, 1.05, 1.1), betas=("1", "1/sqrt(L)", "1/L")),
    "tiny": dict(depth=48, width=16, expansion=4.0, seeds=2,
                 lambdas=(0.9, 0.95, 1.0, 1.05, 1.1), betas=("1", "1/sqrt(L)", "1/L")),
}
KEY = jax.random.PRNGKey(12)
_A2 = ("App A.2: any lambda != 1 makes the skip path lambda^L explode (lambda > 1) or "
       "vanish (lambda < 1) exponentially in depth, and beta cannot correct it")
CLAIMS = claims([
    common.bound("App A.2: lambda=1.1 explodes at every beta", "min over beta in {1, "
                 "1/sqrt(L), 1/L} of log10 ||dh_L/dh_0||_F/sqrt(d), L=48", ">", 0.0, _A2,
                 every_seed=True),
    common.bound("App A.2: lambda=0.9 vanishes at small beta", "log10 ||dh_L/dh_0||_F/sqrt(d) "
                 "at beta=1/L, L=48", "<", 0.0, _A2, every_seed=True),
])

WORDS = [
    ("App A.2", "App A.2", "makes the skip path explode ... or vanish ... and ... cannot correct "
     "it because the skip path carries no factor of"),
]
CLAIMS = common.worded(CLAIMS, WORDS)
BETAS = {"1": lambda L: 1.0, "1/sqrt(L)": lambda L: 1.0 / math.sqrt(L), "1/L": lambda L: 1.0 / L}


def scaled_skip_study(cfg: MLPConfig, key: jax.Array, lam, beta) -> dict:
  """One draw of ``h_l = lam h_{l-1} + beta B(f(P(h_{l-1})))`` (Eq. 13): the fields of
  ``rankjax.measure.network_study`` (path sums with ``K_l = lam I``) plus
  ``jacobian_norm`` (L,) ``||dh_l/dh_0||_F / sqrt(d)`` and ``skip_signal_share``
  ``||lam^L h_0|| / ||h_L||``. ``lam`` and ``beta`` may be traced."""
  blocks, x = measure.seed_samples(cfg, key, 1)
  h0 = x[0]
  d = cfg.width
  eye = jnp.eye(d, dtype=h0.dtype)
  out = measure.network_study(
      blocks, h0, lambda p, h: beta * models.branch_out(p, h, cfg),
      lambda p, h: lam * h, skip_jacobian=lambda p, h: lam * eye)
  ts = out.pop("input_output")
  h_L = out["stream_rms"][-1] * math.sqrt(d)   # ||h_L||
  out["jacobian_norm"] = jnp.linalg.norm(ts, axis=(-2, -1)) / math.sqrt(d)
  out["skip_signal_share"] = lam ** cfg.depth * jnp.linalg.norm(h0) / h_L
  return out


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  for b in s["betas"]:
    if b not in BETAS:
      raise ValueError(f"beta {b!r}; choose from {sorted(BETAS)}")
  L, d = s["depth"], s["width"]
  cfg = MLPConfig(depth=L, width=d, expansion=s["expansion"], branch_matrices=2,
                  activation="relu", norm_position="pre", norm_op="rms", alpha=1.0, beta=1.0)
  study = jax.jit(lambda k, lam, beta: scaled_skip_study(cfg, k, lam, beta))
  keys = jax.random.split(KEY, s["seeds"])
  res = {}
  with common.single_blas_thread():
    for lam in s["lambdas"]:
      for bname in s["betas"]:
        beta = BETAS[bname](L)
        per_seed = [jax.tree.map(np.asarray, study(k, lam, beta)) for k in keys]
        st = {k: np.stack([p[k] for p in per_seed]) for k in per_seed[0]}
        predicted = L * math.log(lam) + 0.5 * math.log(d)
        res[(lam, bname)] = {
            "log_mu0": st["order_log_mass"][:, 0], "log_mu0_predicted": predicted,
            "log_mu0_error": float(np.max(np.abs(st["order_log_mass"][:, 0] - predicted))),
            "skip_mass_share": st["order_profile"][:, 0],
            "mean_order": st["mean_order"],
            "skip_signal_share": st["skip_signal_share"],
            "log10_jacobian_norm_L": np.log10(st["jacobian_norm"][:, -1]),
            "jacobian_norm": st["jacobian_norm"].mean(0),
            "stream_rms": st["stream_rms"].mean(0),
            "rms_L": st["stream_rms"][:, -1],
            "erank": st["erank"].mean(0), "erank_L": st["erank"][:, -1],
            "reconstruction_error": float(np.max(st["reconstruction_error"])),
        }
  summary = _rows(res, s, L, d)
  fig = _figure(res, s, L)
  result = {"settings": s, "results": {f"lambda={lam:g}/beta={b}": v for (lam, b), v in res.items()},
            "measured": summary}
  return common.write(out_dir, NAME, result, fig)


def _rows(res: dict, s: dict, L: int, d: int) -> list[dict]:
  """The claims' measured values. The order-0 path mass mu_0 = lambda^L sqrt(d) is our DP's own
  arithmetic (kept in the data as ``log_mu0_error``, not a row)."""
  lams, betas = s["lambdas"], s["betas"]
  seeds = list(range(s["seeds"]))   # split(PRNGKey(12), seeds)[i]
  rows = []
  hi, lo = max(lams), min(lams)
  if hi > 1.0:
    norms = np.min([res[(hi, b)]["log10_jacobian_norm_L"] for b in betas], axis=0)
    rows.append(measured("App A.2: lambda=1.1 explodes at every beta",
        norms.tolist(), seeds=seeds, note=f"lambda={hi:g}; lambda^L = {hi ** L:.3g}"))
  if lo < 1.0 and "1/L" in betas:
    rows.append(measured("App A.2: lambda=0.9 vanishes at small beta",
        np.asarray(res[(lo, "1/L")]["log10_jacobian_norm_L"]).tolist(), seeds=seeds,
        note=f"lambda={lo:g}; lambda^L = {lo ** L:.3g}; at beta=1: "
             f"{np.mean(res[(lo, betas[0])]['log10_jacobian_norm_L']):.2f}"))
  return rows


def _figure(res: dict, s: dict, L: int):
  fig, axes = common.plt.subplots(1, 4, figsize=(18, 3.8))
  ls = np.arange(1, L + 1)
  b0 = s["betas"][0]
  for i, lam in enumerate(s["lambdas"]):
    v = res[(lam, b0)]
    col = f"C{i}"
    axes[0].plot(ls, v["jacobian_norm"], color=col, label=f"lambda={lam:g}")
    axes[0].plot(ls, lam ** ls, ":", color=col)
    axes[1].plot(np.arange(L + 1), v["stream_rms"], color=col, label=f"lambda={lam:g}")
    axes[2].plot(ls, v["erank"], color=col, label=f"lambda={lam:g}")
    for j, b in enumerate(s["betas"]):
      axes[3].bar(i + 0.27 * (j - 1), res[(lam, b)]["skip_mass_share"].mean(), width=0.25,
                  color=f"C{j}", label=f"beta={b}" if i == 0 else None)
  axes[0].set(yscale="log", xlabel="l", title=f"||dh_l/dh_0||_F/sqrt(d) (dotted: skip path lambda^l), beta={b0}")
  axes[1].set(yscale="log", xlabel="l", title="rms(h_l)")
  axes[2].set(xlabel="l", title="erank(dh_l/dh_0)/d")
  axes[3].set(xticks=range(len(s["lambdas"])), xticklabels=[f"{x:g}" for x in s["lambdas"]],
              yscale="log", xlabel="lambda", title=f"skip share mu_0 / sum mu_k at L={L}")
  for ax in axes:
    ax.legend(fontsize=7)
  fig.suptitle(f"App A.2: scaled skip h = lambda h + beta f(P(h)) (Pre-RMSNorm, ReLU 4x, "
               f"d={s['width']}, {s['seeds']} seeds)", fontsize=9)
  return fig
