"""App C "No backward analogue": the backward residual stream grows no mean spike.

The gradient stream delta_{l-1} = delta_l + beta J_l^T delta_l of a Pre-RMSNorm
residual MLP at initialization (d=256, L=512, n=512, 3 seeds at paper scale), from
two choices of delta_L: a random Gaussian vector per input, and the exact gradient of
a softmax cross-entropy loss with a random ten-class head and random labels. For a
one-matrix ReLU branch, a two-matrix ReLU branch (both d x d, as in Fig 7) and a
one-matrix tanh branch (a centered activation), we measure the per-layer backward
contributions n_l = mean_x[beta J_l^T delta_l] and their pairwise cosines (mean and
root-mean-square over layer pairs, against the random baseline 1/sqrt(d)), the
effective rank of the n x d gradient matrix delta_l, and the mean fraction
||mean_x delta_l||^2 / mean_x ||delta_l||^2, next to the forward branch means m_l
(cos(m_l, m_l') -> c = 1/pi for ReLU, Eq. in App C) and the forward mean fraction.

  python -m experiments.transforming_rank.appc_backward --scale quick --out runs/tr
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from experiments.transforming_rank import common
from rankjax.config import MLPConfig
from rankjax.measure import jacobians, representations, spectra
from rankjax.models import blocks as blocks_lib

NAME = "appc_backward"
SCALES = {
    "quick": dict(depth=512, width=64, seeds=2, inputs=256, classes=10, layer_every=64),
    "paper": dict(depth=512, width=256, seeds=3, inputs=512, classes=10, layer_every=32),
}
CONFIGS = {
    "M=1 relu": dict(branch_matrices=1, activation="relu"),
    "M=2 relu": dict(branch_matrices=2, expansion=1.0, activation="relu"),
    "M=1 tanh": dict(branch_matrices=1, activation="tanh"),
}
DELTAS = ("random", "cross_entropy")


def output_gradient(kind: str, key: jax.Array, h_NxD: jax.Array, classes: int) -> jax.Array:
  """delta_L: a Gaussian row per input, or dCE/dh_L for a random head and labels."""
  n, d = h_NxD.shape
  k_head, k_labels = jax.random.split(key)
  if kind == "random":
    return jax.random.normal(key, (n, d), h_NxD.dtype)
  head = jax.random.normal(k_head, (d, classes), h_NxD.dtype) / math.sqrt(d)
  labels = jax.random.randint(k_labels, (n,), 0, classes)

  def loss(h):
    logits = h @ head
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

  return jax.grad(loss)(h_NxD)


def pair_stats(c_LxL: np.ndarray) -> tuple[float, float]:
  """Mean and root-mean-square of the off-diagonal entries of a cosine matrix."""
  off = c_LxL[~np.eye(len(c_LxL), dtype=bool)]
  return float(np.mean(off)), float(np.sqrt(np.mean(off ** 2)))


def measure(cfg: MLPConfig, key: jax.Array, kind: str, s: dict) -> dict:
  layers = tuple(range(0, cfg.depth + 1, s["layer_every"]))

  @jax.jit
  def one(k):
    k_w, k_delta = jax.random.split(k)
    blocks, x = jacobians.seed_samples(cfg, k_w, s["inputs"])
    h_L = jax.vmap(lambda r: blocks_lib.stack_forward(blocks, r, cfg)[0])(x)
    delta = output_gradient(kind, k_delta, h_L, s["classes"])
    out = representations.backward_stream(blocks, x, delta, cfg, layers)
    return {
        "backward_cos": representations.cosine_matrix(out["contribution_mean"]),
        "forward_cos": representations.cosine_matrix(out["branch_mean"]),
        "erank": spectra.effective_rank_from_singular_values(out["singular_values"]) / cfg.width,
        "mean_fraction": out["mean_fraction"],
        "forward_mean_fraction": out["forward_mean_fraction"],
    }

  per_seed = [jax.tree.map(np.asarray, one(k)) for k in jax.random.split(key, s["seeds"])]
  bwd = [pair_stats(p["backward_cos"]) for p in per_seed]
  fwd = [pair_stats(p["forward_cos"]) for p in per_seed]
  mean = lambda name: np.mean([p[name] for p in per_seed], axis=0)
  return {
      "layers": list(layers),
      "backward_cos_mean": float(np.mean([b[0] for b in bwd])),
      "backward_cos_rms": float(np.sqrt(np.mean([b[1] ** 2 for b in bwd]))),
      "forward_cos_mean": float(np.mean([f[0] for f in fwd])),
      "erank": mean("erank"), "erank_min": float(np.min(mean("erank"))),
      "mean_fraction": mean("mean_fraction"),
      "mean_fraction_max": float(np.max(mean("mean_fraction"))),
      "forward_mean_fraction_L": float(mean("forward_mean_fraction")[-1]),
  }


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  d = s["width"]
  res = {}
  with common.single_blas_thread():
    for name, kw in CONFIGS.items():
      cfg = MLPConfig(depth=s["depth"], width=d, norm_position="pre", **kw)
      res[name] = {kind: measure(cfg, jax.random.key(11), kind, s) for kind in DELTAS}

  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  for name, r in res.items():
    for kind, ls in zip(DELTAS, ("-", "--")):
      axes[0].plot(r[kind]["layers"], r[kind]["erank"], ls, label=f"{name}, {kind} delta_L")
    axes[1].semilogy(np.arange(s["depth"] + 1), r["random"]["mean_fraction"],
                     label=f"{name}: backward")
    axes[1].axhline(r["random"]["forward_mean_fraction_L"], ls=":", color="gray")
  axes[0].set(xlabel="layer l", ylabel="erank(delta_l) / d",
              title="gradient stream rank (App C)", ylim=(0, 1.05))
  axes[1].set(xlabel="layer l", ylabel="||mean delta_l||^2 / mean ||delta_l||^2",
              title="backward mean fraction (dotted: forward at L)")
  axes[0].legend(fontsize=7)
  axes[1].legend(fontsize=7)
  fig.tight_layout()

  base = 1 / math.sqrt(d)
  r = common.row
  rows = []
  for name in CONFIGS:
    rr = res[name]["random"]
    rows.append(r(f"{name}: cos(n_l, n_l') mean / rms over layer pairs", "0.00 / 0.063",
                  f"{rr['backward_cos_mean']:+.3f} / {rr['backward_cos_rms']:.3f}",
                  f"1/sqrt(d) = {base:.3f} at d={d}"))
    rows.append(r(f"{name}: erank(delta_l)/d, min over layers (random delta_L)",
                  ">= 0.72 (~0.9 for M=1 relu)", common.fmt(rr["erank_min"])))
    rows.append(r(f"{name}: backward mean fraction, max over layers", "~0.002",
                  common.fmt(rr["mean_fraction_max"], 4),
                  f"random-vector floor 1/n = {1 / s['inputs']:.4f}; forward at L: "
                  f"{rr['forward_mean_fraction_L']:.3f}"))
    ce = res[name]["cross_entropy"]
    rows.append(r(f"{name}: erank(delta_l)/d, cross-entropy delta_L, min", "~rank 10 / d",
                  common.fmt(ce["erank_min"]), f"10/d = {10 / d:.3f}"))
  rows.append(r("M=1 relu: forward cos(m_l, m_l') mean", "0.32 (c = 1/pi)",
                common.fmt(res["M=1 relu"]["random"]["forward_cos_mean"])))
  result = {"settings": s, "results": res, "summary": rows}
  return common.write(out_dir, NAME, result, fig)


if __name__ == "__main__":
  common.main(run, __doc__.splitlines()[0])
