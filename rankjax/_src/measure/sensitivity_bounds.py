"""Block-inf/RMS geometry, MHA and per-layer Lipschitz bounds, LayerNorm products.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability"
(``papers/softmax_sensitivity.txt``), Sec 2.2 and Sec 4, App A and C. Companion of
``sensitivity.py`` (theta(p) and its certificates).

Weight shapes (bias-free projections, as the paper assumes):

* ``w_q``, ``w_k``, ``w_v``: ``(H, d, d_h)`` per head (a single head may be ``(d, d_h)``);
  head ``h`` computes ``Q_h = U w_q[h]`` etc.
* ``w_o``: ``(H * d_h, d)`` acting on the concatenation ``[O_1 | ... | O_H]``, or
  ``(H, d_h, d)`` (reshaped to the former).
* ``U``: ``(..., T, d)`` tokens by features; attention is
  ``A_h = softmax(Q_h K_h^T / (tau sqrt(d_h)))``, optionally causal.

Norms: ``||X||_{inf,rms} = max_i ||x_i||_2 / sqrt(d)`` (Def 2.2) and
``||Z||_{inf,2} = max_i ||z_i||_2``; ``||W||_2`` is the spectral norm.
"""
from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp

from rankjax._src.measure import sensitivity
from rankjax._src.models import norms
from rankjax._src.models.attention import causal_probabilities
from rankjax._src.numerics import as_float

Array = jax.Array
ThetaMode = Literal["exact", "bracket", "one"]
NormOp = Literal["layer", "rms"]


def block_inf_rms_norm(x_TxD: Array) -> Array:
  """Def 2.2: ``||X||_{inf,rms} = max_i ||x_i||_2 / sqrt(d)``; ``(..., T, d) -> (...)``."""
  x = as_float(x_TxD)
  return jnp.max(jnp.linalg.norm(x, axis=-1), axis=-1) / math.sqrt(x.shape[-1])


def inf_2_norm(z_TxK: Array) -> Array:
  """Sec 2.2: unnormalized row norm ``||Z||_{inf,2} = max_i ||z_i||_2``."""
  return jnp.max(jnp.linalg.norm(as_float(z_TxK), axis=-1), axis=-1)


def spectral_norm(w: Array) -> Array:
  """``||W||_2`` of the last two axes, batched over leading axes."""
  return jnp.linalg.norm(as_float(w), ord=2, axis=(-2, -1))


def _heads(w: Array) -> Array:
  w = as_float(w)
  return w[None] if w.ndim == 2 else w


def _w_out(w_o: Array) -> Array:
  w_o = as_float(w_o)
  return w_o.reshape(-1, w_o.shape[-1]) if w_o.ndim == 3 else w_o


def mha_attention_probs(u_TxD: Array, w_q: Array, w_k: Array, tau: float = 1.0,
                        causal: bool = False) -> Array:
  """``A_h = softmax(Q_h K_h^T / (tau sqrt(d_h)))`` (Sec 4.1); ``(..., H, T, T)``: the
  heads' projections of ``u`` through the library's one einsum attention
  (``models.attention.causal_probabilities``)."""
  u = as_float(u_TxD)
  w_q, w_k = _heads(w_q), _heads(w_k)
  q = jnp.einsum("...td,hdk->...thk", u, w_q)
  k = jnp.einsum("...td,hdk->...thk", u, w_k)
  return causal_probabilities(q, k, tau, causal=causal)


def _theta_tilde(probs: Array, theta: ThetaMode) -> Array:
  """``max_i theta(A_h[i, :])`` per head, or an upper bound of it (``(..., H)``)."""
  if theta == "exact":
    return jnp.max(jnp.asarray(sensitivity.theta_exact(probs)), axis=-1)
  if theta == "bracket":
    return jnp.max(sensitivity.theta_bracket(probs)[1], axis=-1)
  if theta == "one":
    return jnp.ones(probs.shape[:-2], probs.dtype)
  raise ValueError(f"theta {theta!r} is not allowed; choose 'exact', 'bracket' or 'one'")


def mha_local_bound(u_TxD: Array, w_q: Array, w_k: Array, w_v: Array, w_o: Array,
                    tau: float = 1.0, causal: bool = False,
                    theta: ThetaMode = "exact") -> dict[str, Array]:
  """Thm 4.1: bound on ``Lambda_MHA(U) = ||D MHA(U)||_{inf,rms -> inf,rms}``.

      Lambda <= ||W^O||_2 sum_h ( ||W_h^V||_2 + theta_h(U) / tau * Phi_h ),
      Phi_h = 2 B_U^2 / sqrt(d_h) ||W_h^Q||_2 ||W_h^K||_2 ||W_h^V||_2,
      B_U = ||U||_{inf,rms} sqrt(d),  theta_h(U) = max_i theta(A_h(U)[i, :]).

  With ``causal=True`` theta is taken on each row's support (Sec 4.1, "For a fixed
  causal or other fixed mask"), which the zero entries do automatically.

  Args:
    u_TxD: ``(..., T, d)`` MHA input.
    w_q, w_k, w_v, w_o: see the module docstring.
    theta: ``"exact"`` (``theta_exact``; host code for ``T > 16``, and rows with more
      than 44 nonzero atoms and ``p_max < 1/2`` are refused), ``"bracket"``
      (the upper end of ``theta_bracket``, jit-able, still a valid bound) or
      ``"one"`` (``theta <= 1``).
  Returns:
    dict with ``bound`` ``(...)``, ``value_term`` ``(H,)``, ``attention_term``
    ``(..., H)`` (``theta_h / tau * Phi_h``), ``theta_tilde`` and ``phi`` ``(..., H)``,
    ``b_bar`` ``(...)``.
  """
  probs, b_bar, phi, nv, no = _mha_parts(u_TxD, w_q, w_k, w_v, w_o, tau, causal)
  theta_tilde = _theta_tilde(probs, theta)
  attention = theta_tilde / tau * phi
  bound = no * jnp.sum(nv + attention, axis=-1)
  return dict(bound=bound, value_term=nv, attention_term=attention,
              theta_tilde=theta_tilde, phi=phi, b_bar=b_bar)


@jax.jit
def _mha_parts(u_TxD, w_q, w_k, w_v, w_o, tau, causal):
  u = as_float(u_TxD)
  wq, wk, wv, wo = _heads(w_q), _heads(w_k), _heads(w_v), _w_out(w_o)
  b_bar = inf_2_norm(u)
  nq, nk, nv, no = spectral_norm(wq), spectral_norm(wk), spectral_norm(wv), spectral_norm(wo)
  phi = 2.0 * b_bar[..., None] ** 2 / math.sqrt(wq.shape[-1]) * nq * nk * nv
  return mha_attention_probs(u, wq, wk, tau, causal), b_bar, phi, nv, no


@jax.jit
def mha_lipschitz_bound(w_q: Array, w_k: Array, w_v: Array, w_o: Array, B: float,
                        tau: float = 1.0) -> Array:
  """Cor 4.2: ``Lip(MHA; {||U||_{inf,rms} <= B}) <= L_MHA^(B)`` with

      L_MHA^(B) = ||W^O||_2 sum_h ( ||W_h^V||_2
                  + 2 d B^2 / (tau sqrt(d_h)) ||W_h^Q||_2 ||W_h^K||_2 ||W_h^V||_2 ).
  """
  wq, wk, wv, wo = _heads(w_q), _heads(w_k), _heads(w_v), _w_out(w_o)
  d, d_h = wq.shape[-2], wq.shape[-1]
  nv = spectral_norm(wv)
  attention = 2.0 * d * B ** 2 / (tau * math.sqrt(d_h)) * spectral_norm(wq) * spectral_norm(wk) * nv
  return spectral_norm(wo) * jnp.sum(nv + attention, axis=-1)


def layernorm_constants(gamma_JxD: Array, beta_JxD: Array | None,
                        eps) -> tuple[Array, Array]:
  """Sec 4.2: ``B_LN = max_j (||gamma_j||_inf + ||beta_j||_inf)`` (Lemma 2.4) and
  ``L_LN = max_j ||gamma_j||_inf / sqrt(eps_j)`` (Lemma A.1), over the LayerNorm
  modules ``j`` (rows of ``gamma_JxD``; ``beta=None`` means no bias; ``eps`` is a
  scalar or ``(J,)``)."""
  g = jnp.max(jnp.abs(as_float(gamma_JxD)), axis=-1)
  b = 0.0 if beta_JxD is None else jnp.max(jnp.abs(as_float(beta_JxD)), axis=-1)
  return jnp.max(g + b), jnp.max(g / jnp.sqrt(as_float(eps)))


def gelu_lipschitz() -> float:
  """Max slope of exact GELU ``x Phi(x)``: at ``x = sqrt(2)``, ``Phi + sqrt(2) phi``
  (about 1.1289); the paper's models use GELU (App D.1)."""
  return 0.5 * (1.0 + math.erf(1.0)) + math.sqrt(2.0) * math.exp(-1.0) / math.sqrt(2.0 * math.pi)


def ffn_lipschitz_bound(w1_DxF: Array, w2_FxD: Array, act_lipschitz: float = 1.0) -> Array:
  """App C.2: ``L_FFN <= ||W_2||_2 Lip(sigma) ||W_1||_2`` for ``W_2 sigma(W_1 x + b_1) + b_2``."""
  return spectral_norm(w2_FxD) * act_lipschitz * spectral_norm(w1_DxF)


def pre_ln_layer_bound(l_mha, l_ffn, l_ln):
  """Thm 4.3: ``L_layer^pre <= (1 + L_LN L_MHA^(B_LN)) (1 + L_LN L_FFN)``."""
  return (1.0 + l_ln * l_mha) * (1.0 + l_ln * l_ffn)


def post_ln_layer_bound(l_mha, l_ffn, l_ln):
  """Thm 4.4 (layers ``l >= 1``): ``L_layer^post <= L_LN^2 (1 + L_MHA^(B_LN)) (1 + L_FFN)``."""
  return l_ln ** 2 * (1.0 + l_mha) * (1.0 + l_ffn)


@functools.partial(jax.jit, static_argnames=("placement", "act_lipschitz"))
def layer_lipschitz_bound(placement: Literal["pre", "post"], *, w_q: Array, w_k: Array,
                          w_v: Array, w_o: Array, w1: Array, w2: Array,
                          ln_gamma_JxD: Array, ln_beta_JxD: Array | None, ln_eps,
                          tau: float = 1.0,
                          act_lipschitz: float | None = None) -> dict[str, Array]:
  """Thm 4.3 (``"pre"``) or Thm 4.4 (``"post"``) from a layer's weights.

  ``B_LN``, ``L_LN`` come from the LayerNorm modules given (``layernorm_constants``),
  ``L_MHA^(B_LN)`` from Cor 4.2, ``L_FFN`` from App C.2 with ``act_lipschitz``
  (default: GELU's, ``gelu_lipschitz()``). Returns all the constants and ``bound``.
  """
  b_ln, l_ln = layernorm_constants(ln_gamma_JxD, ln_beta_JxD, ln_eps)
  l_mha = mha_lipschitz_bound(w_q, w_k, w_v, w_o, b_ln, tau)
  act = gelu_lipschitz() if act_lipschitz is None else act_lipschitz
  l_ffn = ffn_lipschitz_bound(w1, w2, act)
  if placement == "pre":
    bound = pre_ln_layer_bound(l_mha, l_ffn, l_ln)
  elif placement == "post":
    bound = post_ln_layer_bound(l_mha, l_ffn, l_ln)
  else:
    raise ValueError(f"placement {placement!r} is not allowed; choose 'pre' or 'post'")
  return dict(bound=bound, b_ln=b_ln, l_ln=l_ln, l_mha=l_mha, l_ffn=l_ffn)


# ------------------------------------------------------------- LayerNorm products


def _centering(op: NormOp) -> float:
  """1 for LayerNorm (mean subtraction), 0 for RMSNorm; traced, so both share a compile."""
  if op not in ("layer", "rms"):
    raise ValueError(f"op {op!r} is not allowed; choose 'layer' or 'rms'")
  return 1.0 if op == "layer" else 0.0


def _norm_stats(y: Array, eps, center) -> tuple[Array, Array]:
  """``(y_hat, sigma)``: ``sigma = sqrt(var + eps)`` (layer) or ``sqrt(mean y^2 + eps)``
  (rms) and ``y_hat = (y - mu) / sigma`` (``mu = 0`` for rms), over the last axis."""
  y = y - center * jnp.mean(y, axis=-1, keepdims=True)
  sigma = jnp.sqrt(jnp.mean(y ** 2, axis=-1, keepdims=True) + eps)
  return y / sigma, sigma


def layernorm_jacobian(y_D: Array, gamma_D: Array, eps: float,
                       op: NormOp = "layer") -> Array:
  """Lemma A.1: ``J_LN(y) = Diag(gamma) / sigma(y) (P - y_hat y_hat^T / d)``,
  ``P = I - 1 1^T / d`` (``P = I`` for ``op="rms"``); ``(..., d) -> (..., d, d)``.
  The library's one norm Jacobian (``rankjax._src.models.norms.jacobian_left``) applied to
  the identity, per vector."""
  _centering(op)
  y = as_float(y_D)
  gamma = jnp.broadcast_to(as_float(gamma_D), y.shape)
  eye = jnp.eye(y.shape[-1], dtype=y.dtype)
  fn = lambda y1, g1: norms.jacobian_left(eye, y1, op, eps, g1)
  flat = jax.vmap(fn)(y.reshape(-1, y.shape[-1]), gamma.reshape(-1, y.shape[-1]))
  return flat.reshape(*y.shape, y.shape[-1])


def _ln_apply(v_TxD: Array, y_TxD: Array, gamma_D: Array, eps, op: str,
              transpose: bool) -> Array:
  """``J v`` (or ``J^T v``) per token, ``J = J_LN(y_i)`` (Lemma A.1), through the one
  norm Jacobian (``norms.jacobian_left`` / ``jacobian_right``) in O(d) per token."""
  if transpose:       # J^T v = (v^T J)^T, and v^T Diag(g) J_op is jacobian_right's M Diag(g) J
    fn = lambda v, y: norms.jacobian_right(v[None, :], y, op, eps, gamma_D)[0]
  else:
    fn = lambda v, y: norms.jacobian_left(v[:, None], y, op, eps, gamma_D)[:, 0]
  return jax.vmap(fn)(v_TxD, y_TxD)


def layernorm_only_product(y_KxTxD: Array, gamma_KxD: Array, eps,
                           op: NormOp = "layer", power_iters: int = 30,
                           key: Array | None = None) -> dict[str, Array]:
  """The LayerNorm-only term of the Post-LN expansion and Cor A.3's bounds.

  For per-layer LayerNorm inputs ``Y_k`` (``y_KxTxD[k]``, the ``Y_k = X_k + MHA(X_k)``
  of Thm 4.6; more batch axes can be merged into ``T``), with
  ``a_{k,i} = ||gamma_k||_inf / sigma_k(y_{k,i})``:

      ||prod_k J_LN,k(Y_k)||_2 <= max_i prod_k a_{k,i} <= prod_k max_i a_{k,i}.

  Products are ordered with later layers on the left (Sec 4.3) and kept in log
  form. The left side is measured per token by power iteration on ``M^T M`` with the
  structured matvecs (``O(K d)`` per token; the estimate approaches the norm from
  below). jit-able (``op`` and ``power_iters`` static).

  Args:
    y_KxTxD: LayerNorm inputs of layers ``k = 0..K-1``.
    gamma_KxD: gains; ``eps``: scalar or ``(K,)``; ``op``: ``"layer"`` or ``"rms"``.
  Returns:
    dict: ``a_KxT``; ``worst_token_factor_K`` (``max_i a_{k,i}``, the quantity whose
    staying ``<= 1 - eta`` gives geometric contraction); ``log_bound_token``
    (``log max_i prod_k a``); ``log_bound_layer`` (``sum_k log max_i a``);
    ``log_norm_T`` and ``log_norm`` (``log ||prod_k J||_2`` per token, max over
    tokens).
  """
  key = jax.random.PRNGKey(0) if key is None else key
  _centering(op)
  return _ln_product(y_KxTxD, gamma_KxD, eps, op, key, power_iters)


@functools.partial(jax.jit, static_argnames=("op", "power_iters"))
def _ln_product(y_KxTxD, gamma_KxD, eps, op, key, power_iters):
  center = _centering(op)
  y = as_float(y_KxTxD)
  K, T, d = y.shape
  gamma = as_float(gamma_KxD)
  eps_K = jnp.broadcast_to(as_float(eps), (K,))
  y_hat, sigma = _norm_stats(y, eps_K[:, None, None], center)
  g_inf_K = jnp.max(jnp.abs(gamma), axis=-1)
  a_KxT = g_inf_K[:, None] / sigma[..., 0]
  log_a = jnp.log(a_KxT)
  layers = (y, gamma, eps_K)

  def chain(v_TxD, transpose):
    def step(carry, layer):
      v, log_n = carry
      y_TxD, gamma_D, eps_k = layer
      v = _ln_apply(v, y_TxD, gamma_D, eps_k, op, transpose)
      n = jnp.linalg.norm(v, axis=-1, keepdims=True)
      return (v / n, log_n + jnp.log(n[:, 0])), None
    xs = jax.tree.map(lambda x: x[::-1], layers) if transpose else layers
    (v, log_n), _ = jax.lax.scan(step, (v_TxD, jnp.zeros((T,), y.dtype)), xs)
    return v, log_n

  v = jax.random.normal(key, (T, d), y.dtype)
  v = v - center * jnp.mean(v, axis=-1, keepdims=True)
  v = v / jnp.linalg.norm(v, axis=-1, keepdims=True)

  def power(v, _):
    w, _ = chain(v, transpose=False)
    v, _ = chain(w, transpose=True)
    return v, None

  v, _ = jax.lax.scan(power, v, None, length=power_iters)
  _, log_norm_T = chain(v, transpose=False)
  return dict(a_KxT=a_KxT, worst_token_factor_K=jnp.max(a_KxT, axis=-1),
              log_bound_token=jnp.max(jnp.sum(log_a, axis=0)),
              log_bound_layer=jnp.sum(jnp.max(log_a, axis=-1)),
              log_norm_T=log_norm_T, log_norm=jnp.max(log_norm_T))



# ------------------------------------------------- measured (inf,rms) operator norms


def inf_rms_operator_norm_bracket(jac_TxDxTxD, iters: int = 30, restarts: int = 2,
                                  seed: int = 0) -> tuple[float, float]:
  """``(lower, upper)`` of ``||J||_{inf,rms -> inf,rms}`` for a Jacobian ``(T, d, T, d)``
  (output token, feature, input token, feature); the left side of Thm 4.1 measured.

  With ``||X||_{inf,rms} = max_i ||x_i||_2 / sqrt(d)`` (Def 2.2) the norm is
  ``max_i sup_{||h_j||_2 <= sqrt(d)} ||sum_j J_ij h_j||_2 / sqrt(d)``, the maximum of a
  convex function over a product of balls. ``upper = max_i sum_j ||J_ij||_2`` (triangle
  inequality; spectral norms of the ``d x d`` blocks). ``lower``: the value of feasible
  inputs, per output row ``i`` an ascent ``g -> h_j = sqrt(d) J_ij^T g / ||J_ij^T g||
  -> g = sum_j J_ij h_j`` from ``restarts`` Gaussian starts (it never decreases
  ``||g||``), plus random sign-free Gaussian probes; host numpy, float64.
  """
  import numpy as np
  jac = np.asarray(jac_TxDxTxD, np.float64)
  if jac.ndim != 4 or jac.shape[1] != jac.shape[3]:
    raise ValueError(f"expected a (T, d, T', d) Jacobian, got shape {jac.shape}")
  T, d = jac.shape[:2]
  rng = np.random.default_rng(seed)
  upper = float(np.max(np.sum(np.linalg.norm(jac.transpose(0, 2, 1, 3), ord=2, axis=(-2, -1)),
                              axis=-1)))
  best = 0.0
  for _ in range(8):
    h = rng.standard_normal((T, d))
    h *= math.sqrt(d) / np.linalg.norm(h, axis=-1, keepdims=True)
    best = max(best, float(np.linalg.norm(np.einsum("adsk,sk->ad", jac, h), axis=-1).max()))
  for i in range(T):
    for _ in range(restarts):
      g = rng.standard_normal(d)
      for _ in range(iters):
        jt = np.einsum("dsk,d->sk", jac[i], g / max(np.linalg.norm(g), 1e-300))
        h = math.sqrt(d) * jt / np.maximum(np.linalg.norm(jt, axis=-1, keepdims=True), 1e-300)
        g = np.einsum("dsk,sk->d", jac[i], h)
      best = max(best, float(np.linalg.norm(g)))
  return best / math.sqrt(d), upper
