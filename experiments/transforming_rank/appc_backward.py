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

  rankjax reproduce transforming_rank --only appc
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import models
from rankjax.config import MLPConfig
from rankjax.measure import (backward_stream, cosine_matrix,
                             effective_rank_from_singular_values, seed_samples)
from rankjax.studies import Bound, Claim, claims, measured

NAME = "appc_backward"
SCALES = {
    "quick": dict(depth=512, width=64, seeds=3, inputs=256, classes=10, layer_every=64),
    "paper": dict(depth=512, width=256, seeds=3, inputs=512, classes=10, layer_every=32),
    "tiny": dict(depth=512, width=16, seeds=2, inputs=64, classes=10, layer_every=32),
}
CONFIGS = {
    "M=1 relu": dict(branch_matrices=1, activation="relu"),
    "M=2 relu": dict(branch_matrices=2, expansion=1.0, activation="relu"),
    "M=1 tanh": dict(branch_matrices=1, activation="tanh"),
}
DELTAS = ("random", "cross_entropy")
_BWD = "App C: the backward contributions are uncorrelated between layers"
# Which layers: App C's delta_l is "the gradient of the loss with respect to each layer's
# representation" (Sec 5: delta_{l-1} = delta_l + beta J_l^T delta_l), the block outputs
# h_1..h_L; delta_0 (the gradient at the network's input h_0) is no layer's representation.
_LAYERS = ("layers l = 1..L (sampled every layer_every): Sec 5 / App C's delta_l is 'the "
           "gradient of the loss with respect to each layer's representation'; delta_0, at "
           "the input h_0, is left out")
_LAYERS_POST = ("the layers were fixed from the text after a review reported that without "
                "delta_0 the values are 0.726 (tanh) / 0.906 (M=1 ReLU), the paper's numbers")
_RANK_WORDS = ("Under the random ... the ... matrix of gradients ... preserves its rank")
_COS_WORDS = ("In the three branch configurations (one matrix, two matrices, and a centered "
              "activation), the cosine similarity ... between the backward contributions of "
              "two layers averages ... over the layer pairs, and its root-mean-square is")
_CE_WORDS = ("lies in the row space of the ten-class head, so the gradient matrix is "
             "effectively rank ten before any layer acts on it")
_WHERE = "App C (backward)"
CLAIMS = claims([
    *(c for n in CONFIGS for c in (
        Claim(
            f"App C: {n}, backward cos mean", "off-diagonal mean of cos(n_l, n_l'), random "
            "delta_L", 0.00, common.rule(0.0), _BWD, where=_WHERE, quote=_COS_WORDS,
            family=3),
        Claim(
            f"App C: {n}, backward cos rms", "off-diagonal rms of cos(n_l, n_l'), random "
            "delta_L", 0.063, common.rule(0.063), _BWD + "; the random baseline 1/sqrt(d), "
            "d=256", where=_WHERE, quote=_COS_WORDS, family=3),
        Claim(
            f"App C: {n}, gradient rank kept", "min over layers l >= 1 of erank(delta_l)/d, "
            "random delta_L", 0.72, Bound(">=", every_seed=True),
            "App C: >= 0.72; " + _LAYERS, where=_WHERE, quote=_RANK_WORDS,
            post_hoc=_LAYERS_POST),
        Claim(
            f"App C: {n}, gradient rank kept, with delta_0", "min over layers l >= 0 of "
            "erank(delta_l)/d, random delta_L", 0.72, Bound(
                ">=", every_seed=True), "the former headline: its minimum includes "
            "delta_0, the gradient at the input, which the text's 'each layer's "
            "representation' leaves out", where=_WHERE, quote=_RANK_WORDS,
            kind="sensitivity"),
        Claim(
            f"App C: {n}, backward mean fraction", "max over layers of ||mean_x delta_l||^2 / "
            "mean_x ||delta_l||^2, random delta_L", 0.002, common.rule(0.002),
            "App C: ~0.002", where=_WHERE, quote="and grows no mean spike (mean fraction",
            family=3),
        Claim(
            f"App C: {n}, cross-entropy gradient rank at L", "erank(delta_L) at l = L, "
            "cross-entropy delta_L (directions)", 10.0, common.rule(10.0),
            "App C: 'effectively rank ten before any layer acts on it' is about delta_L "
            "itself; its exact rank is at most C - 1 = 9 by construction (the rows of "
            "softmax(z) - onehot(y) sum to zero over the ten classes)", where=_WHERE,
            quote=_CE_WORDS),
        Claim(
            f"App C: {n}, cross-entropy gradient rank", "min over layers l < L of "
            "erank(delta_l), cross-entropy delta_L (directions)", 10.0, common.rule(10.0),
            "not the text's layer: the paper's sentence is about delta_L, before any layer "
            "acts", where=_WHERE, quote=_CE_WORDS, kind="sensitivity",
            post_hoc="moved to the layers l < L on 2026-12-05, after the outcome at l = L "
            "was known"))),
    Claim(
        "App C: M=1 relu, gradient rank ~0.9", "min over layers l >= 1 of erank(delta_l)/d, "
        "random delta_L", 0.9, common.rule(0.9, fraction=True), "App C: ~0.9 for M=1 relu; "
        + _LAYERS, where=_WHERE, quote="for one-matrix ReLU", post_hoc=_LAYERS_POST),
    Claim(
        "App C: M=1 relu, forward cos(m_l, m_l')", "off-diagonal mean", 0.32,
        common.rule(0.32), "App C: c = 1/pi", where=_WHERE,
        quote="of the one-matrix ReLU branch align at"),
])


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
    blocks, x = seed_samples(cfg, k_w, s["inputs"])
    h_L = jax.vmap(lambda r: models.stack_forward(blocks, r, cfg)[0])(x)
    delta = output_gradient(kind, k_delta, h_L, s["classes"])
    out = backward_stream(blocks, x, delta, cfg, layers)
    return {
        "backward_cos": cosine_matrix(out["contribution_mean"]),
        "forward_cos": cosine_matrix(out["branch_mean"]),
        "erank": effective_rank_from_singular_values(out["singular_values"]) / cfg.width,
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
      "per_seed": {"backward_cos_mean": [b[0] for b in bwd], "backward_cos_rms": [b[1] for b in bwd],
                   "forward_cos_mean": [f[0] for f in fwd],
                   "erank_min": [float(np.min(p["erank"])) for p in per_seed],
                   "erank_min_below_L": [float(np.min(p["erank"][:-1])) for p in per_seed],
                   "erank_min_layers": [float(np.min(p["erank"][1:])) for p in per_seed],
                   "erank_L": [float(p["erank"][-1]) for p in per_seed],
                   "mean_fraction_max": [float(np.max(p["mean_fraction"])) for p in per_seed]},
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
  axes[0].axhline(0.72, ls=":", color="gray", label="paper: >= 0.72")
  axes[0].axhline(0.9, ls="--", color="gray", lw=0.7, label="paper: ~0.9 (M=1 relu)")
  axes[0].axhline(10 / d, ls="-.", color="gray", lw=0.7, label="paper: rank 10 (CE, l=L)")
  axes[0].set(xlabel="layer l", ylabel="erank(delta_l) / d",
              title="gradient stream rank (App C)", ylim=(0, 1.05))
  axes[1].set(xlabel="layer l", ylabel="||mean delta_l||^2 / mean ||delta_l||^2",
              title="backward mean fraction (dotted: forward at L)")
  axes[0].legend(fontsize=7)
  axes[1].legend(fontsize=7)
  fig.tight_layout()

  base = 1 / math.sqrt(d)
  seeds = list(range(s["seeds"]))   # split(key(11), seeds)
  rows = []
  for name in CONFIGS:
    rr, ce = res[name]["random"]["per_seed"], res[name]["cross_entropy"]["per_seed"]
    j = lambda item, v, note="": measured(f"App C: {name}, {item}",
        [float(x) for x in v], seeds=seeds, note=note)
    rows += [
        j("backward cos mean", rr["backward_cos_mean"]),
        j("backward cos rms", rr["backward_cos_rms"], f"1/sqrt(d) = {base:.3f} at d={d}"),
        j("gradient rank kept", rr["erank_min_layers"],
          f"layers {res[name]['random']['layers'][1]}..{res[name]['random']['layers'][-1]}"),
        j("gradient rank kept, with delta_0", rr["erank_min"]),
        j("backward mean fraction", rr["mean_fraction_max"],
          f"random-vector floor 1/n = {1 / s['inputs']:.4f}; forward at L: "
          f"{res[name]['random']['forward_mean_fraction_L']:.3f}"),
        j("cross-entropy gradient rank", np.asarray(ce["erank_min_below_L"]) * d,
          f"d={d}; layers {res[name]['cross_entropy']['layers'][:-1][0]}.."
          f"{res[name]['cross_entropy']['layers'][:-1][-1]}"),
        j("cross-entropy gradient rank at L", np.asarray(ce["erank_L"]) * d, f"d={d}"),
    ]
    if name == "M=1 relu":
      rows += [j("gradient rank ~0.9", rr["erank_min_layers"]),
               j("forward cos(m_l, m_l')", rr["forward_cos_mean"])]
  result = {"settings": s, "results": res, "measured": rows}
  return common.write(out_dir, NAME, result, fig)
