"""Effective and stable rank of Jacobians from Jacobian-vector products (no d x d matrix).

For a Jacobian J (d_out x d) known only through ``J v`` (``jax.jvp``/``jax.linearize``)
and ``J^T u`` (``jax.linear_transpose``), the Gram operator ``A = J^T J`` has
eigenvalues ``lambda_k = sigma_k^2``. The rank measures of "Transforming Rank" are
spectral sums of A:

  stable rank (Sec 2)       st(J) = ||J||_F^2 / ||J||_2^2 = tr(A) / lambda_max(A);
  effective rank (Eq. 3)    erank(J) = exp(H(p)),  p_k = sigma_k / S,  S = sum_k sigma_k,
                            H(p) = ln S - (1/S) sum_k sigma_k ln sigma_k, so
                            erank = S exp(-T / S),  S = tr(A^{1/2}),
                            T = tr(f(A)), f(lambda) = (1/2) sqrt(lambda) ln lambda.

Traces ``tr f(A)`` come from stochastic Lanczos quadrature (SLQ; Ubaru, Chen & Saad,
SIAM J. Matrix Anal. Appl. 38(4), 2017): for Rademacher probes z (``||z||^2 = d``),
``z^T f(A) z ~= d sum_j tau_j f(theta_j)`` with ``theta_j`` the Ritz values of
``num_steps`` Lanczos steps from ``z / sqrt(d)`` and ``tau_j`` the squared first
components of their eigenvectors (Gauss quadrature of the spectral measure); the mean
over probes is Hutchinson's estimator. ``lambda_max`` is the largest Ritz value over
probes (a lower bound that converges from below). ``tr(A)`` uses the same quadrature
(exact per probe: ``z^T A z``). Lanczos keeps full reorthogonalization, so memory is
``num_probes * num_steps * d`` numbers; each step is one JVP and one VJP.

The errors against the exact engine (``jacobians.sample_measurements``, one seed,
Pre-Norm ReLU MLPs; tests/measure/test_matrix_free.py): erank / stable rank of
dh_L/dh_0 within 0.5% / 2.0% at L=8, d=256; within 1.4% / 1.0% at layers 1, 24, 48 of
L=48, d=256; within 0.4% / 1.5% at L=48, d=512. Near-full-rank block Jacobians come to
about 1.5%; the tests hold every estimate to 4 of its reported standard errors.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from rankjax._src import fast_paths
from rankjax._src.config import MLPConfig
from rankjax._src.measure import engine, jacobians
from rankjax._src.measure import precision as precision_lib
from rankjax._src.models import blocks as blocks_lib

Array = jax.Array

DEFAULT_NUM_PROBES = 16
DEFAULT_NUM_STEPS = 48


class RankEstimate(NamedTuple):
  """Matrix-free spectral estimates of one Jacobian (fields are scalars or batched).

  effective_rank: erank(J) (Eq. 3), not divided by d.
  stable_rank: ||J||_F^2 / ||J||_2^2.
  frobenius_sq: ||J||_F^2 (Hutchinson over the probes).
  spectral_sq: ||J||_2^2 (largest Ritz value).
  nuclear: sum_k sigma_k.
  effective_rank_stderr: standard error of erank over probes (delta method on S, T).
  stable_rank_stderr: standard error of the stable rank over probes (lambda_max taken
    as exact: it converges far faster than the traces).
  """

  effective_rank: Array
  stable_rank: Array
  frobenius_sq: Array
  spectral_sq: Array
  nuclear: Array
  effective_rank_stderr: Array
  stable_rank_stderr: Array


def gram_operator(fn: Callable[[Array], Array], x: Array) -> Callable[[Array], Array]:
  """``v -> J^T J v`` for ``J = d fn / dx`` at x (``jax.linearize`` + transpose)."""
  _, jvp = jax.linearize(fn, x)
  vjp = jax.linear_transpose(jvp, x)
  return lambda v: vjp(jvp(v))[0]


def lanczos(apply_a: Callable[[Array], Array], q0: Array, num_steps: int
            ) -> tuple[Array, Array, Array]:
  """``num_steps`` Lanczos steps on the symmetric operator ``apply_a`` from unit ``q0``,
  with full reorthogonalization. Returns the tridiagonal's diagonal ``(k,)``, its
  off-diagonal ``(k,)`` (the last entry is the residual norm beta_k) and the Lanczos
  basis ``(k+1, d)``. After a breakdown (an invariant subspace reached) the
  remaining steps are zero and decoupled (their Ritz values carry zero weight)."""
  d = q0.shape[-1]
  basis = jnp.zeros((num_steps + 1, d), q0.dtype).at[0].set(q0)
  tiny = jnp.finfo(q0.dtype).eps * 10

  def step(j, carry):
    basis, alphas, betas, scale = carry
    q = basis[j]
    w = apply_a(q)
    alpha = jnp.vdot(q, w)
    w = w - basis.T @ (basis @ w)        # full reorthogonalization, twice (Kahan)
    w = w - basis.T @ (basis @ w)
    beta = jnp.linalg.norm(w)
    scale = jnp.maximum(scale, jnp.abs(alpha))
    ok = beta > tiny * jnp.maximum(scale, 1e-30)
    q_next = jnp.where(ok, w / jnp.where(ok, beta, 1.0), 0.0)
    alive = jnp.linalg.norm(q) > 0
    basis = basis.at[j + 1].set(jnp.where(alive, q_next, 0.0))
    return (basis, alphas.at[j].set(jnp.where(alive, alpha, 0.0)),
            betas.at[j].set(jnp.where(alive & ok, beta, 0.0)), scale)

  init = (basis, jnp.zeros((num_steps,), q0.dtype), jnp.zeros((num_steps,), q0.dtype),
          jnp.zeros((), q0.dtype))
  basis, alphas, betas, _ = jax.lax.fori_loop(0, num_steps, step, init)
  return alphas, betas, basis


def _tridiagonal_eigh(alphas: Array, betas: Array) -> tuple[Array, Array]:
  b = betas[:-1]
  return fast_paths.eigh(jnp.diag(alphas) + jnp.diag(b, 1) + jnp.diag(b, -1))


def _quadrature(alphas: Array, betas: Array) -> tuple[Array, Array]:
  """Gauss nodes (Ritz values) and weights of the tridiagonal (Golub-Welsch)."""
  theta, vecs = _tridiagonal_eigh(alphas, betas)
  return theta, jnp.square(vecs[0])


def converged_ritz_pairs(apply_a, q0: Array, num_steps: int, tol: float
                         ) -> tuple[Array, Array]:
  """Ritz values ``(k,)`` and vectors ``(k, d)`` of a Lanczos run, zeroed where the
  residual ``beta_k |u_k|`` exceeds ``tol * theta_max`` (not converged)."""
  alphas, betas, basis = lanczos(apply_a, q0, num_steps)
  theta, vecs = _tridiagonal_eigh(alphas, betas)
  residual = jnp.abs(betas[-1] * vecs[-1])
  ok = (residual <= tol * jnp.max(jnp.abs(theta))) & (theta > 0)
  # orthonormal to rounding (the basis is fully reorthogonalized)
  return jnp.where(ok, theta, 0.0), (vecs.T @ basis[:-1]) * ok[:, None]


@precision_lib.measured
def rank_estimates(apply_a: Callable[[Array], Array], d: int, key: Array, *,
                   num_probes: int = DEFAULT_NUM_PROBES, num_steps: int = DEFAULT_NUM_STEPS,
                   deflation_steps: int | None = None, tol: float = 1e-4,
                   dtype=jnp.float32) -> RankEstimate:
  """Effective and stable rank of J from its Gram operator ``apply_a = v -> J^T J v``
  (module docstring: SLQ for tr(A^{1/2}), tr(f(A)) and tr(A); Lanczos for lambda_max).

  Deflation (variance reduction): a first Lanczos run of ``deflation_steps`` (default
  ``2 * num_steps``) finds the converged top eigenpairs ``(theta_i, q_i)`` of A (residual
  below ``tol * theta_max``); their part of each trace, ``sum_i f(theta_i)``, is taken
  exactly, and SLQ runs on the deflated operator ``P A P``, ``P = I - Q Q^T`` (exact
  for an invariant Q, since f(0) = 0 for the three f used). A collapsed Jacobian has a
  few large singular values that dominate Hutchinson's variance; deflating them
  removes most of it. ``num_steps`` is capped at d.
  """
  num_steps = int(min(num_steps, d))
  defl = int(min(2 * num_steps if deflation_steps is None else deflation_steps, d))
  k_defl, k_probe = jax.random.split(key)
  if defl > 0:
    start = jax.random.normal(k_defl, (d,), dtype)
    theta_q, q = converged_ritz_pairs(apply_a, start / jnp.linalg.norm(start), defl, tol)
    project = lambda v: v - q.T @ (q @ v)
    op = lambda v: project(apply_a(project(v)))
  else:
    theta_q = jnp.zeros((1,), dtype)
    op = apply_a
  lam_q = jnp.maximum(theta_q, 0.0)
  sq_q = jnp.sqrt(lam_q)
  f_q = 0.5 * jax.scipy.special.xlogy(sq_q, lam_q)     # 0 ln 0 = 0
  z = jax.random.rademacher(k_probe, (num_probes, d), dtype)
  if defl > 0:
    z = jax.vmap(project)(z)       # probes of the deflated space (still unbiased there)
  norms = jnp.linalg.norm(z, axis=-1)
  q0 = z / jnp.where(norms > 0, norms, 1.0)[:, None]
  alphas, betas, _ = jax.vmap(lambda q: lanczos(op, q, num_steps))(q0)
  theta, tau = jax.vmap(_quadrature)(alphas, betas)
  lam = jnp.maximum(theta, 0.0)                          # A is PSD; clip rounding
  sqrt_lam = jnp.sqrt(lam)
  log_lam = jnp.log(jnp.where(lam > 0, lam, 1.0))
  w = jnp.square(norms)[:, None] * tau                   # z^T f(A) z = ||z||^2 sum tau f
  s_p = jnp.sum(sq_q) + jnp.sum(w * sqrt_lam, axis=-1)   # per-probe tr(A^{1/2})
  t_p = jnp.sum(f_q) + jnp.sum(w * 0.5 * sqrt_lam * log_lam, axis=-1)
  fro_p = jnp.sum(lam_q) + jnp.sum(w * lam, axis=-1)
  s, t, fro = jnp.mean(s_p), jnp.mean(t_p), jnp.mean(fro_p)
  spectral = jnp.maximum(jnp.max(lam), jnp.max(lam_q))
  erank = s * jnp.exp(-t / s)
  # delta method: d erank = erank (dS (1/S + T/S^2) - dT / S)
  g_p = erank * ((s_p - s) * (1.0 / s + t / s ** 2) - (t_p - t) / s)
  n = num_probes * max(num_probes - 1, 1)
  stderr = jnp.sqrt(jnp.sum(jnp.square(g_p)) / n)
  st_stderr = jnp.sqrt(jnp.sum(jnp.square(fro_p - fro)) / n) / spectral
  return RankEstimate(erank, fro / spectral, fro, spectral, s, stderr, st_stderr)


@precision_lib.measured
def function_rank_estimates(fn: Callable[[Array], Array], x: Array, key: Array,
                            **kwargs) -> RankEstimate:
  """``rank_estimates`` of ``J = d fn / dx`` at x (any function R^d -> R^d_out)."""
  return rank_estimates(gram_operator(fn, x), x.shape[-1], key, dtype=x.dtype, **kwargs)


@precision_lib.measured
def network_rank_estimates(blocks: dict, h0_D: Array, cfg: MLPConfig, key: Array,
                           layers: tuple[int, ...] | None = None, **kwargs) -> RankEstimate:
  """Estimates for dh_l/dh_0 of a residual MLP at ``layers`` (static, 1..L; default
  ``(L,)``), stacked over layers: ``matrix_free_ranks`` of the MLP's block
  (``jacobians.mlp_block``). No d x d matrix is formed: each Lanczos step costs one JVP
  and one VJP of the first l blocks."""
  if cfg.skip_every not in (0, 1):
    raise ValueError("network_rank_estimates needs skip_every in {0, 1}; "
                     f"got {cfg.skip_every}")
  return matrix_free_ranks(jacobians.mlp_block(cfg),
                                  (blocks, blocks_lib.skip_flags(cfg)), h0_D, key, layers,
                                  **kwargs)


@precision_lib.measured
def block_rank_estimates(blocks: dict, h0_D: Array, cfg: MLPConfig, key: Array,
                         **kwargs) -> RankEstimate:
  """Estimates for every block Jacobian dh_l/dh_{l-1} (skip + branch, Eq. 18) along the
  forward pass from ``h0_D``, ``(L,)`` fields, by a ``lax.scan`` over depth (identity
  skip at every block: ``skip_every = 1``)."""
  if cfg.skip_every != 1:
    raise ValueError(f"block_rank_estimates needs skip_every=1; got {cfg.skip_every}")
  block = jacobians.mlp_block(cfg)
  flags = blocks_lib.skip_flags(cfg)
  keys = jax.random.split(key, cfg.depth)

  def step(h, xs):
    params, closes, k = xs
    fn = lambda x: engine.block_output(block, (params, closes), x)
    est = function_rank_estimates(fn, h, k, **kwargs)
    return fn(h), est

  _, est = jax.lax.scan(step, h0_D, (blocks, flags, keys))
  return est


@precision_lib.measured
def matrix_free_ranks(block: engine.JacobianBlock, params, h0_D: Array, key: Array,
                      layers: tuple[int, ...] | None = None, **kwargs):
  """``RankEstimate`` of dh_l/dh_0 at ``layers`` (static, 1..L; default
  ``(L,)``), stacked over layers (``BlockJacobianMethod.MATRIX_FREE``): each Lanczos step
  is one JVP and one VJP of the first l blocks; no d x d matrix is formed. ``kwargs``:
  ``rank_estimates``'."""
  depth = jax.tree.leaves(params)[0].shape[0]
  layers = (depth,) if layers is None else tuple(layers)
  if not layers or min(layers) < 1 or max(layers) > depth:
    raise ValueError(f"layers must lie in [1, {depth}], got {layers}")
  out = []
  for i, l in enumerate(layers):
    prefix = jax.tree.map(lambda a, l=l: a[:l], params)
    fn = lambda h, prefix=prefix: engine.forward(block, prefix, h)[-1]
    out.append(function_rank_estimates(fn, h0_D, jax.random.fold_in(key, i),
                                                   **kwargs))
  return jax.tree.map(lambda *xs: jnp.stack(xs), *out)
