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
``rankjax.measure.residual_networks.network_study`` with ``skip = lambda h``.

  python -m experiments.transforming_rank.appa2_skip_scale --scale quick --out runs/tr
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from experiments.transforming_rank import common
from rankjax.config import MLPConfig
from rankjax.measure import jacobians, residual_networks
from rankjax.models import blocks as blocks_lib

NAME = "appa2_skip_scale"
SCALES = {
    "quick": dict(depth=48, width=64, expansion=4.0, seeds=3,
                  lambdas=(0.9, 0.95, 1.0, 1.05, 1.1), betas=("1", "1/sqrt(L)", "1/L")),
    "paper": dict(depth=48, width=256, expansion=4.0, seeds=8,
                  lambdas=(0.9, 0.95, 1.0, 1.05, 1.1), betas=("1", "1/sqrt(L)", "1/L")),
}
KEY = jax.random.PRNGKey(12)
BETAS = {"1": lambda L: 1.0, "1/sqrt(L)": lambda L: 1.0 / math.sqrt(L), "1/L": lambda L: 1.0 / L}


def scaled_skip_study(cfg: MLPConfig, key: jax.Array, lam, beta) -> dict:
  """One draw of ``h_l = lam h_{l-1} + beta B(f(P(h_{l-1})))`` (Eq. 13): the fields of
  ``residual_networks.network_study`` (path sums with ``K_l = lam I``) plus
  ``jacobian_norm`` (L,) ``||dh_l/dh_0||_F / sqrt(d)`` and ``skip_signal_share``
  ``||lam^L h_0|| / ||h_L||``. ``lam`` and ``beta`` may be traced."""
  blocks, x = jacobians.seed_samples(cfg, key, 1)
  h0 = x[0]
  d = cfg.width
  eye = jnp.eye(d, dtype=h0.dtype)
  out = residual_networks.network_study(
      blocks, h0, lambda p, h: beta * blocks_lib.branch_out(p, h, cfg),
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
            "summary": summary}
  return common.write(out_dir, NAME, result, fig)


def _mean_sd(x, digits=3) -> tuple[str, str]:
  x = np.asarray(x, float)
  sd = x.std(ddof=1) if len(x) > 1 else float("nan")
  return f"{x.mean():.{digits}g}", f"{sd:.2g}"


def _rows(res: dict, s: dict, L: int, d: int) -> list[dict]:
  lams, betas = s["lambdas"], s["betas"]
  seeds = s["seeds"]
  worst = max(v["log_mu0_error"] for v in res.values())
  recon = max(v["reconstruction_error"] for v in res.values())
  rows = [common.row(
      f"App A.2: order-0 path mass mu_0 = lambda^L sqrt(d) for every draw and beta "
      f"(max |log mu_0 - L log lambda - log sqrt(d)| over lambda in {list(lams)}, beta in "
      f"{list(betas)}, {seeds} seeds)", "0 (weight- and beta-independent)",
      f"{worst:.1e}", status="match" if worst < 1e-3 else "mismatch", seeds=seeds,
      note=f"DP reconstruction vs the running product: max relative error {recon:.1e}")]
  b0 = betas[0]
  for lam in lams:
    v = res[(lam, b0)]
    share, share_sd = _mean_sd(v["skip_mass_share"])
    sig, sig_sd = _mean_sd(v["skip_signal_share"])
    jn, jn_sd = _mean_sd(v["log10_jacobian_norm_L"])
    rms, rms_sd = _mean_sd(v["rms_L"])
    er, er_sd = _mean_sd(v["erank_L"])
    rows.append(common.row(
        f"App A.2: lambda={lam:g}, beta={b0}, L={L}: lambda^L; skip share of the Jacobian "
        "path mass mu_0/sum mu_k; skip share of h_L; log10 ||dh_L/dh_0||_F/sqrt(d); "
        "rms(h_L); erank/d",
        f"skip path lambda^L = {lam ** L:.3g}: " + ("O(1) only at lambda = 1" if lam == 1 else
                                                     "explodes" if lam > 1 else "vanishes"),
        f"{lam ** L:.3g}; {share}; {sig}; {jn}; {rms}; {er}", status="qualitative", seeds=seeds,
        spread=f"sd {share_sd}; {sig_sd}; {jn_sd}; {rms_sd}; {er_sd}"))
  for lam in (min(lams), max(lams)):
    if lam == 1.0:
      continue
    shares = " / ".join(_mean_sd(res[(lam, b)]["skip_mass_share"])[0] for b in betas)
    norms = " / ".join(_mean_sd(res[(lam, b)]["log10_jacobian_norm_L"])[0] for b in betas)
    rows.append(common.row(
        f"App A.2: beta cannot correct lambda={lam:g}: skip share of the path mass, and "
        f"log10 ||dh_L/dh_0||_F/sqrt(d), at beta = {' / '.join(betas)}",
        f"the skip path stays lambda^L = {lam ** L:.3g} at every beta",
        f"{shares}; {norms}", status="qualitative", seeds=seeds))
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


if __name__ == "__main__":
  common.main(run, __doc__)
