"""Fig 8a, 8b (Sec 6, App D.8): branch-Jacobian effective rank against the expansion ratio.

erank(J_f)/d of the normalization-free branch core J_f = W_down D W_up (Eq. 9) at a
random input, W_up ~ N(0, 1/d) (m x d), W_down ~ N(0, 1/m), the input at unit rms so
the pre-activations are standard Gaussian; d=256, 40 seeds; ReLU, GELU, SiLU, abs.
(a) against m/d; (b) against gamma = p m/d, with the Gaussian-product reference curve
(erank(W_down W_up)/d with gamma d hidden units, 20 seeds, gamma <= 10). Fig 8c
(pretrained GPT-2 coherence) is not part of this script.

  rankjax reproduce transforming_rank --only fig8
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax import measure
from rankjax.studies import claims, measured

NAME = "fig8_width_expansion"
ACTS = ("relu", "gelu", "silu", "abs")
SCALES = {
    "quick": dict(width=64, seeds=6, product_seeds=6,
                  ratios=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 20.0)),
    "paper": dict(width=256, seeds=40, product_seeds=20,
                  ratios=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 20.0)),
    "tiny": dict(width=16, seeds=2, product_seeds=2,
                 ratios=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 20.0)),
}

CLAIMS = claims([
    *(common.bound(f"Fig 8a: {a} above relu at m/d = 1", f"erank(J_f)/d({a}) - erank(J_f)/d(relu) "
                   "at m/d = 1", ">", 0.0, "Fig 8a: gelu, silu above relu at small m/d")
      for a in ("gelu", "silu")),
    common.bound("Fig 8a: abs fastest at m/d = 1", "erank(J_f)/d(abs) - max over relu, gelu, "
                 "silu at m/d = 1", ">", 0.0, "Fig 8a: abs rises fastest"),
    common.bound("Fig 8a: rank rises with m/d", "smallest over activations of erank(J_f)/d at "
                 "the largest m/d minus at the smallest", ">", 0.0, "Fig 8a"),
    *(common.bound(f"Fig 8b: {a} on the Gaussian-product curve", "max over m/d of |erank - "
                   "Gaussian product| at gamma = p m/d, in units of its standard error", "<",
                   3.0, "Fig 8b: relu and abs lie on the curve; the paper prints no "
                   "tolerance: 3 s.e. on the largest deviation over m/d is our limit",
                   ours=True)
      for a in ("relu", "abs")),
    # "approaches the curve from above", in the s.e. units of the relu/abs rows (chosen
    # after the raw gaps, 0.0006 at paper, were known): never below it beyond noise, and
    # clearly above it at the smallest m/d
    *(common.bound(f"Fig 8b: {a} never below the curve", "min over m/d of (erank - Gaussian "
                   "product at gamma = E[sigma'^2] m/d) in units of its standard error", ">",
                   -3.0, "Fig 8b: smooth activations approach the curve from above; "
                   "-3 s.e. is our limit", ours=True)
      for a in ("gelu", "silu")),
    *(common.bound(f"Fig 8b: {a} above the curve at the smallest m/d", "(erank - Gaussian "
                   "product at gamma = E[sigma'^2] m/d) in units of its standard error, at the "
                   "smallest m/d inside the curve's range", ">", 3.0,
                   "Fig 8b: smooth activations approach the curve from above; 3 s.e. is our "
                   "limit", ours=True)
      for a in ("gelu", "silu")),
    common.frac("App D.8: Gaussian-product curve at gamma = 10", "erank(W_down W_up)/d, "
                "10 d hidden units", 0.80, "App D.8: ~0.80"),
])

_8B = {"post_hoc": "the s.e. units were chosen after the raw gaps (0.0006 at paper scale) "
       "were known"}
WORDS = [
    ("above relu at m/d = 1", "Fig 8a", "GELU and SiLU reach a higher effective rank than ReLU "
     "at small expansion ratios despite their smaller"),
    ("abs fastest", "Fig 8a", "for ReLU, GELU, SiLU, and abs, fastest for abs"),
    ("rank rises with m/d", "Fig 8a", "The effective rank of the branch Jacobian increases "
     "with the expansion ratio"),
    ("on the Gaussian-product curve", "Fig 8b", "fall on the effective-rank curve of a product "
     "of two Gaussian matrices, while GELU and SiLU"),
    ("Fig 8b", "Fig 8b", "approach it from above", _8B),
    ("App D.8", "App D.8", "The curve rises with ... and reaches ... over the plotted range"),
]
CLAIMS = common.worded(CLAIMS, WORDS)


def _bucket(m: int) -> int:
  return 1 << (m - 1).bit_length()


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _branch_erank(key: jax.Array, act_index: jax.Array, m: jax.Array, seeds: int, m_pad: int,
                  d: int):
  """Mean erank(J_f)/d over seeds with m of the m_pad hidden rows active.

  m and the activation are traced, so one compilation serves every m in a power-of-two
  bucket and every activation.
  """

  def one(k):
    k1, k2, k3 = jax.random.split(k, 3)
    w_up = jax.random.normal(k1, (m_pad, d)) / jnp.sqrt(d)
    w_down = jax.random.normal(k2, (d, m_pad)) / jnp.sqrt(m.astype(jnp.float32))
    x = jax.random.normal(k3, (d,))
    x = x / jnp.sqrt(jnp.mean(x * x))
    pre = w_up @ x
    dsig = jax.lax.switch(act_index, [
        lambda z, a=a: measure.activation_derivative(a, z) for a in ACTS], pre)
    dsig = jnp.where(jnp.arange(m_pad) < m, dsig, 0.0)
    jf = w_down @ (dsig[:, None] * w_up)
    return measure.effective_rank(jf) / d

  return jax.vmap(one)(jax.random.split(key, seeds))


def branch_erank(key: jax.Array, activation: str, d: int, m: int, seeds: int) -> np.ndarray:
  """erank(J_f)/d (Eq. 9) of each of ``seeds`` draws at hidden width m."""
  return np.asarray(_branch_erank(key, jnp.int32(ACTS.index(activation)), jnp.int32(m), seeds,
                            _bucket(m), d))


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _product_erank(key: jax.Array, n: jax.Array, seeds: int, n_pad: int, d: int):

  def one(k):
    k1, k2 = jax.random.split(k)
    mask = (jnp.arange(n_pad) < n)[:, None]
    w_up = jnp.where(mask, jax.random.normal(k1, (n_pad, d)), 0.0)
    w_down = jax.random.normal(k2, (d, n_pad))
    return measure.effective_rank(w_down @ w_up) / d

  return jax.vmap(one)(jax.random.split(key, seeds))


def product_erank(key: jax.Array, gamma: float, d: int, seeds: int) -> np.ndarray:
  """The Gaussian-product curve (App D.8, as the private engine's
  ``gaussian_product_effective_rank``) with the hidden width padded to a power-of-two
  bucket to share compilations."""
  n = max(1, int(round(gamma * d)))
  return np.asarray(_product_erank(key, jnp.int32(n), seeds, _bucket(n), d))


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  d = s["width"]
  key = jax.random.PRNGKey(11)
  per, prod_per = {}, {}
  with common.single_blas_thread():
    for a in ACTS:
      per[a] = [branch_erank(jax.random.fold_in(key, i), a, d, max(1, int(round(r * d))),
                             s["seeds"]) for i, r in enumerate(s["ratios"])]
    p = {a: measure.survival_rate(a) for a in ACTS}
    gammas = sorted({round(p[a] * r, 4) for a in ("relu", "abs") for r in s["ratios"]
                     if p[a] * r <= 10} | {10.0})
    prod_per = {g: product_erank(jax.random.fold_in(key, 1000 + i), g, d, s["product_seeds"])
                for i, g in enumerate(gammas)}
  curves = {a: [float(v.mean()) for v in per[a]] for a in ACTS}
  se = {a: [float(v.std(ddof=1) / np.sqrt(len(v))) for v in per[a]] for a in ACTS}
  product = {g: float(v.mean()) for g, v in prod_per.items()}
  product_se = {g: float(v.std(ddof=1) / np.sqrt(len(v))) for g, v in prod_per.items()}

  def gap_z(a):   # max |erank - Gaussian product| / its s.e. at the same gamma = p m/d
    out = [abs(e - product[round(p[a] * r, 4)]) / np.hypot(sa, product_se[round(p[a] * r, 4)])
           for r, e, sa in zip(s["ratios"], curves[a], se[a]) if round(p[a] * r, 4) in product]
    return float(max(out))

  def above(a):   # (erank - GP) / s.e. at each m/d inside the curve's range, GP and its
    gs = np.array(sorted(product))               # s.e. interpolated linearly in gamma
    gp = np.array([product[g] for g in gs])
    gse = np.array([product_se[g] for g in gs])
    return [(e - np.interp(p[a] * r, gs, gp)) / np.hypot(sa, np.interp(p[a] * r, gs, gse))
            for r, e, sa in zip(s["ratios"], curves[a], se[a]) if gs[0] <= p[a] * r <= gs[-1]]

  idx1 = s["ratios"].index(1.0)
  seeds = list(range(s["seeds"]))   # vmap over split(fold_in(PRNGKey(11), i), seeds)
  at1 = {a: per[a][idx1] for a in ACTS}
  summary = [
      *(measured(f"Fig 8a: {a} above relu at m/d = 1", (at1[a] - at1["relu"]).tolist(), seeds=seeds)
        for a in ("gelu", "silu")),
      measured("Fig 8a: abs fastest at m/d = 1",
          (at1["abs"] - np.max([at1[a] for a in ("relu", "gelu", "silu")], axis=0)).tolist(),
          seeds=seeds),
      measured("Fig 8a: rank rises with m/d",
          min(curves[a][-1] - curves[a][0] for a in ACTS),
          note=f"m/d {s['ratios'][0]:g} -> {s['ratios'][-1]:g}"),
      *(measured(f"Fig 8b: {a} on the Gaussian-product curve", gap_z(a)) for a in ("relu", "abs")),
      *(measured(f"Fig 8b: {a} never below the curve", float(min(above(a))),
                 note="z per m/d " + ", ".join(f"{z:.3g}" for z in above(a)))
        for a in ("gelu", "silu")),
      *(measured(f"Fig 8b: {a} above the curve at the smallest m/d", float(above(a)[0]))
        for a in ("gelu", "silu")),
      measured("App D.8: Gaussian-product curve at gamma = 10",
          prod_per[10.0].tolist(), seeds=list(range(s["product_seeds"]))),
  ]
  fig, axes = common.plt.subplots(1, 2, figsize=(10, 3.8))
  for a in ACTS:
    axes[0].plot(s["ratios"], curves[a], "o-", ms=3, label=a)
    axes[1].plot(np.array(s["ratios"]) * p[a], curves[a], "o-", ms=3, label=f"{a} (p={p[a]:.2f})")
  axes[1].plot(list(product), list(product.values()), "k--", label="Gaussian product")
  axes[0].set_xlabel("m/d")
  axes[1].set_xlabel("gamma = p m/d")
  axes[1].set_xlim(0, 10.5)
  for ax in axes:
    ax.set_ylabel("erank(J_f)/d")
    ax.legend(fontsize=7)
  result = {"settings": s, "curves": curves, "survival": p,
            "curves_se": se,
            "gaussian_product": {str(g): v for g, v in product.items()},
            "gaussian_product_se": {str(g): v for g, v in product_se.items()}, "measured": summary}
  return common.write(out_dir, NAME, result, fig)
