"""The paper's small exact statements checked numerically on random draws.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability".
Each check draws random inputs per seed (``numpy.random.default_rng(seed)``, float64)
and reports the largest violation of the statement over the draws; the row asks it
to stay below a float64 rounding limit (``LIMIT``), or, for a first-order expansion,
below the stated truncation limit, in every seed:

* Lemma 2.3: ||A V||_{inf,rms} <= ||V||_{inf,rms} for row-stochastic A (rows softmax of
  Gaussian logits at scales 0.1 .. 10, so from near-uniform to near one-hot);
  violation = max ratio - 1.
* Lemma 2.4: ||LN(x)||_rms <= ||gamma||_inf + ||beta||_inf, LN with gain and bias
  (``norms.normalize(x, "layer", eps) * gamma + beta``, GPT-2's eps), x at scales 1e-3 .. 1e3; violation = max of
  the left side minus the right side.
* Remark 3.3: at a sign vector x with positive set S, x^T (Diag(p) - p p^T) x =
  4 p(S) (1 - p(S)), and theta(p) is the maximum of that quadratic over all sign
  vectors (a max-cut value); violation = max absolute difference (L = 10, all 2^10
  sign vectors; theta by ``sensitivity.theta_exact``).
* Remark B.1: TV(p_eps, p) = |eps| / 2 ||J x||_1 + o(|eps|), p_eps = softmax((u + eps
  x) / tau), J the autodiff Jacobian; violation = max relative difference at eps =
  1e-6, which must be below ``FIRST_ORDER_LIMIT`` (o(eps): the relative error is
  O(eps) plus float64 cancellation ~1e-16 / eps).
* Thm 4.5's example: the alternating-sign chain x_{k+1} = x_k + (-1)^k a x_k has
  end-to-end derivative (1 - a^2)^{(m - l) / 2} for an even number of steps;
  violation = max relative difference between ``jax.grad`` of the chain and the formula.
* Lemma A.2 (i)-(iii) on the autodiff Jacobian of LN (gain and bias): (i) J 1 = 0
  (violation max ||J 1||_2 / ||J||_2); (ii) ||J v|| <= ||gamma||_inf / sigma ||v|| for
  centered v (violation max ratio - 1); (iii) ||J y_hat|| <= ||gamma||_inf / sigma
  rho(y) ||y_hat||, rho = 1 - ||y_hat||^2 / d (violation max ratio - 1).

Each statement is one claim (``CLAIMS``, below): the largest violation per seed.

Run:  rankjax reproduce softmax_sensitivity --only lemma_checks
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rankjax.studies import Bound, Claim, claims, measured, runner

SCALES: dict[str, dict[str, Any]] = {
    # seeds fixed before any run (>= 10: one seed takes well under a second)
    "quick": dict(seeds=tuple(range(10)), draws=64),
    "paper": dict(seeds=tuple(range(10)), draws=64),   # no larger protocol in the paper
    "tiny": dict(seeds=(0, 1, 2), draws=8),            # the same checks in seconds (status tiny)
}
LIMIT = 1e-12               # float64 rounding allowance for an exact statement (ours)
FIRST_ORDER_LIMIT = 1e-4    # Remark B.1 at eps = 1e-6: o(eps) relative error (ours)
EPS_B1 = 1e-6
D, T, L_CUT = 16, 8, 10

_EXACT = "the paper: an exact statement; 1e-12 is our float64 rounding allowance"
CLAIMS = claims([
    Claim("Lemma 2.3: attention mixing is nonexpansive",
          "max over draws of ||A V||_inf,rms / ||V||_inf,rms - 1", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma 2.4: LayerNorm magnitude reset",
          "max over draws of ||LN(x)||_rms - (||gamma||_inf + ||beta||_inf)", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Remark 3.3: theta(p) is 4 x the max cut of the p_i p_j graph",
          "max |x^T (Diag(p) - p p^T) x - 4 p(S)(1 - p(S))| and |max_x x^T M x - theta|",
          1e-12, Bound("<=", every_seed=True), _EXACT),
    Claim("Remark B.1: TV(p_eps, p) = |eps| / 2 ||J x||_1 + o(|eps|)",
          "max relative difference at eps = 1e-6", 1e-4, Bound("<=", every_seed=True),
          "o(|eps|): the relative error is O(eps); the limit 1e-4 at eps = 1e-6 is ours"),
    Claim("Thm 4.5's example: alternating chain decays as (1 - a^2)^((m - l) / 2)",
          "max relative |d x_m / d x_l (autodiff) - (1 - a^2)^((m - l) / 2)|", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma A.2(i): J_LN(y) 1 = 0", "max ||J 1||_2 / ||J||_2 (autodiff J)", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma A.2(ii): ||J v|| <= ||gamma||_inf / sigma ||v|| on centered v",
          "max ratio - 1 (autodiff J)", 1e-12, Bound("<=", every_seed=True), _EXACT),
    Claim("Lemma A.2(iii): extra factor rho(y) along y_hat",
          "max ||J y_hat|| / (||gamma||_inf / sigma rho ||y_hat||) - 1 (autodiff J)", 1e-12,
          Bound("<=", every_seed=True), _EXACT),
])


LN_EPS = 1e-5    # GPT-2's layer_norm_epsilon


def _ln(x, gamma, beta):
  """LayerNorm with gain and bias: ``normalize(x, "layer", eps) * gamma + beta``."""
  from rankjax.models import norms
  return norms.normalize(x, "layer", LN_EPS) * gamma + beta


def lemma_2_3(rng, draws: int) -> float:
  """max ||A V||_{inf,rms} / ||V||_{inf,rms} - 1 (Lemma 2.3)."""
  worst = -np.inf
  for _ in range(draws):
    scale = 10.0 ** rng.uniform(-1, 1)
    a = np.asarray(jax.nn.softmax(scale * rng.standard_normal((T, T)), axis=-1))
    v = rng.standard_normal((T, D)) * 10.0 ** rng.uniform(-2, 2, (T, 1))
    norm = lambda z: np.max(np.linalg.norm(z, axis=-1)) / np.sqrt(D)
    worst = max(worst, norm(a @ v) / norm(v) - 1.0)
  return float(worst)


def lemma_2_4(rng, draws: int) -> float:
  """max ||LN(x)||_rms - (||gamma||_inf + ||beta||_inf) (Lemma 2.4)."""
  worst = -np.inf
  for _ in range(draws):
    x = rng.standard_normal(D) * 10.0 ** rng.uniform(-3, 3)
    gamma, beta = rng.standard_normal(D), rng.standard_normal(D)
    y = np.asarray(_ln(jnp.asarray(x), jnp.asarray(gamma), jnp.asarray(beta)))
    worst = max(worst, np.linalg.norm(y) / np.sqrt(D)
                - (np.abs(gamma).max() + np.abs(beta).max()))
  return float(worst)


def remark_3_3(rng, draws: int) -> float:
  """max |x^T M x - 4 p(S)(1 - p(S))| over sign vectors, and |max_x x^T M x - theta|."""
  from rankjax.measure import sensitivity as sens
  signs = np.array(list(itertools.product((-1.0, 1.0), repeat=L_CUT)))
  worst = 0.0
  for _ in range(draws):
    p = np.asarray(jax.nn.softmax(rng.standard_normal(L_CUT) * 10.0 ** rng.uniform(-1, 1)))
    m = np.diag(p) - np.outer(p, p)
    quad = np.einsum("si,ij,sj->s", signs, m, signs)
    ps = (signs > 0) @ p
    worst = max(worst, np.abs(quad - 4 * ps * (1 - ps)).max(),
                abs(quad.max() - float(sens.theta_exact(p[None])[0])))
  return float(worst)


def remark_b_1(rng, draws: int, tau: float = 1.0) -> float:
  """max |TV(p_eps, p) - eps/2 ||J x||_1| / (eps/2 ||J x||_1) at eps = EPS_B1."""
  soft = lambda u: jax.nn.softmax(u / tau)
  worst = 0.0
  for _ in range(draws):
    u = jnp.asarray(rng.standard_normal(L_CUT))
    x = jnp.asarray(rng.choice([-1.0, 1.0], L_CUT) * rng.uniform(0.1, 1.0, L_CUT))
    jx = np.asarray(jax.jacfwd(soft)(u) @ x)
    tv = 0.5 * np.abs(np.asarray(soft(u + EPS_B1 * x)) - np.asarray(soft(u))).sum()
    first = 0.5 * EPS_B1 * np.abs(jx).sum()
    worst = max(worst, abs(tv - first) / first)
  return float(worst)


def theorem_4_5_example(rng, draws: int) -> float:
  """max relative |d x_m / d x_l - (1 - a^2)^{(m-l)/2}| for the alternating chain."""
  def chain(x, a, n):
    for k in range(n):
      x = x + (-1.0) ** k * a * x
    return x
  worst = 0.0
  for _ in range(draws):
    a, n = rng.uniform(0.05, 0.95), 2 * int(rng.integers(1, 20))
    got = float(jax.grad(chain)(jnp.asarray(rng.standard_normal()), a, n))
    want = (1 - a ** 2) ** (n / 2)
    worst = max(worst, abs(got - want) / want)
  return float(worst)


def lemma_a_2(rng, draws: int) -> dict[str, float]:
  """Lemma A.2 (i)-(iii) on the autodiff Jacobian of LN with gain and bias."""
  out = {"i": 0.0, "ii": -np.inf, "iii": -np.inf}
  for _ in range(draws):
    y = rng.standard_normal(D) * 10.0 ** rng.uniform(-3, 2)
    gamma, beta = rng.standard_normal(D), rng.standard_normal(D)
    jac = np.asarray(jax.jacfwd(lambda z: _ln(z, jnp.asarray(gamma), jnp.asarray(beta)))(
        jnp.asarray(y)))
    sigma = np.sqrt(y.var() + LN_EPS)
    y_hat = (y - y.mean()) / sigma
    gain = np.abs(gamma).max() / sigma
    out["i"] = max(out["i"], np.linalg.norm(jac @ np.ones(D)) / np.linalg.norm(jac, 2))
    v = rng.standard_normal(D)
    v -= v.mean()
    out["ii"] = max(out["ii"], np.linalg.norm(jac @ v) / (gain * np.linalg.norm(v)) - 1)
    rho = 1 - np.dot(y_hat, y_hat) / D
    out["iii"] = max(out["iii"], np.linalg.norm(jac @ y_hat)
                     / (gain * rho * np.linalg.norm(y_hat)) - 1)
  return {k: float(v) for k, v in out.items()}


CHECKS = ("lemma_2_3", "lemma_2_4", "remark_3_3", "remark_b_1", "theorem_4_5_example",
          "lemma_a_2_i", "lemma_a_2_ii", "lemma_a_2_iii")


def measurements(r: dict[str, Any]) -> list[dict[str, Any]]:
  """Item 7's exact statements: the largest violation per seed, one per claim in
  ``CLAIMS``' order (``CHECKS``: the same order), from :func:`run`'s result."""
  n = r["settings"]["draws"]
  return [measured(item, r["per_seed"][key], seeds=r["seeds"], note=f"{n} draws per seed")
          for item, key in zip(CLAIMS, CHECKS)]


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Every check on every seed; writes ``lemma_checks.json`` under ``out_dir``; returns
  the results with their ``measured`` values (:func:`measurements`)."""
  cfg = SCALES[scale]
  start = time.time()
  per_seed: dict[str, list[float]] = {k: [] for k in CHECKS}
  with jax.enable_x64(True):
    for seed in cfg["seeds"]:
      rng = np.random.default_rng(seed)
      n = cfg["draws"]
      vals = dict(lemma_2_3=lemma_2_3(rng, n), lemma_2_4=lemma_2_4(rng, n),
                  remark_3_3=remark_3_3(rng, n), remark_b_1=remark_b_1(rng, n),
                  theorem_4_5_example=theorem_4_5_example(rng, n))
      a2 = lemma_a_2(rng, n)
      vals.update(lemma_a_2_i=a2["i"], lemma_a_2_ii=a2["ii"], lemma_a_2_iii=a2["iii"])
      for k in CHECKS:
        per_seed[k].append(vals[k])
  res = {"scale": scale, "seeds": list(cfg["seeds"]), "per_seed": per_seed,
         "settings": dict(seeds=list(cfg["seeds"]), draws=cfg["draws"], limit=LIMIT,
                          first_order_limit=FIRST_ORDER_LIMIT, eps_b1=EPS_B1, d=D, t=T,
                          l_cut=L_CUT),
         "seconds": time.time() - start}
  os.makedirs(out_dir, exist_ok=True)
  runner.write_json(out_dir, "lemma_checks.json", res)
  res["measured"] = measurements(res)
  return res

