"""Proposition D.2 of the Post-Norm collapse paper: one gradient step grows ||Y_k||.

Prop D.2 (App D.3): at exact collapse (``X_k = 1 x_k^T``, ``Y_k = 1 y_k^T``) one
gradient step of size ``eta`` on the attention output matrix ``W_O`` (resp. the FFN
output matrix ``W_2``) moves the residual sum to

    Y_1(eta) = Y_1 - eta U_1,  U_1 = H_1 H_1^T G_1,  H_1 = P X_1 W_V
    Y_2(eta) = Y_2 - eta U_2,  U_2 = R_s R_s^T G_2,  R_s = SiLU(X_2 W_1) * (X_2 W_3)

(``G_k = dL/dY_k``; a factor ``beta^2`` with a branch scale ``beta``) and, because the
RMSNorm gradient rows are orthogonal to the residual rows (``G_k Y_k^T = 0``),

    ||Y_k(eta)||_F^2 = ||Y_k||_F^2 + eta^2 ||U_k||_F^2,

so the norm grows for every ``eta > 0``. Everything hinges on the cross term
``<Y_k, U_k>``; we report ``cos(Y_k, U_k) = <Y_k, U_k> / (||Y_k|| ||U_k||)`` per layer
(the norm shrinks for ``eta < 2 cos ||Y_k|| / ||U_k||`` when ``cos > 0``).

Settings (the quick Post-Norm LM of ``collapse_post_quick.json``):

* ``exact_one_sequence``: one sequence of one repeated token, no positional encoding
  (exact collapse at every site, Lemma E.1), float64, ``norm_eps = 0``, random labels.
  ``U_k`` from the model (a forward-mode derivative of ``Y_k`` along the gradient
  step) is compared with the formula (``H_1 = X_1 W_V`` since ``P 1 = 1``; ``R_s`` from
  ``X_2``), and a real step on the parameters with ``eta ||U|| = 0.1 ||Y||`` is checked
  against the norm identity (every setting uses that step; at it the norm grows iff
  ``cos(Y_k, U_k) < 0.05``).
* ``exact_per_sequence_batch``: the same with 4 sequences of 4 different tokens. Each
  sequence is exactly collapsed but the batch is not: the step on ``W_O`` mixes the
  sequences (``U_b = H_b sum_b' H_b'^T G_b'``) and ``<Y_b, U_b>`` need not vanish.
  The proposition is about one sequence; this shows what a batch does.
* ``init_random_tokens``: at initialization with i.i.d. uniform tokens (not collapsed).
* ``trained_collapsed``: the final parameters of the collapse study's ``post_collapse``
  run on one training batch (16 sequences), float32 as trained. A plain gradient step at
  the run's learning rate moves ``Y_k`` by about 1e-11 of its norm there (the gradients
  have vanished), below float32 resolution, so the step is ``0.1 ||Y|| / ||U||`` as in
  the other settings and ``lr_step_rel`` records the learning rate's relative step (the
  run used AdamW, which Prop D.2 does not cover).

At paper / tiny scale the model is the paper's and the trained setting its collapsing run
(``paper_runs``). ``CLAIMS``: the three identities at exact collapse of one sequence,
to float64 rounding (``common.FLOAT64_ZERO``); the other settings are in the results file.

Run:  rankjax reproduce postnorm_collapse --only propd2
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import collapse_study, common, paper_runs
from rankjax.measure import batch_mean_token_similarity, cross_entropy
from rankjax.models import DecoderLM, intermediate_grads
from rankjax.studies import Bound, Claim, claims, measured

# sublayer k -> (module, output matrix, residual sum)
SITES = {1: ("attn", "w_o", "y1"), 2: ("ffn", "w_2", "y2")}


def _residual_sums(model, params, tokens) -> dict[str, jax.Array]:
  _, sites = model.apply({"params": params}, tokens, capture=True)
  return {"y1": sites["y1"], "y2": sites["y2"]}


def _layer_direction(g_params, sub: str, w: str, layer: int):
  """A params-shaped tangent: ``-dL/dW`` at ``layer`` of ``sub/w``, zero elsewhere."""
  zeros = jax.tree.map(jnp.zeros_like, g_params)
  g = g_params["layers"][sub][w]
  step = jnp.zeros_like(g).at[layer].set(-g[layer])
  return {**zeros, "layers": {**zeros["layers"], sub: {**zeros["layers"][sub], w: step}}}


def _formula_u(mcfg, params, acts, grads, k: int, layer: int) -> jax.Array:
  """``U_k`` of Prop D.2 from its formula, batch rows pooled (``(B*T, d)``); valid at
  exact collapse (``H_1 = X_1 W_V`` uses ``P 1 = 1``)."""
  lp = jax.tree.map(lambda a: a[layer], params["layers"])
  d = mcfg.d_model
  if k == 1:
    feat = acts["x1"][layer].reshape(-1, d) @ lp["attn"]["w_v"]
  else:
    x2 = acts["x2"][layer].reshape(-1, d)
    feat = jax.nn.silu(x2 @ lp["ffn"]["w_1"]) * (x2 @ lp["ffn"]["w_3"])
  g = grads[f"y{k}"][layer].reshape(-1, d)
  return mcfg.beta ** 2 * feat @ (feat.T @ g)


def norm_growth(mcfg, params, tokens, targets, lr: float | None = None,
                check_formula: bool = False) -> dict[str, Any]:
  """Per layer and sublayer: ``cos(Y_k, U_k)``, the norm change of one real step of
  size ``eta = 0.1 ||Y|| / ||U||`` against Prop D.2's ``eta^2 ||U||^2``, with ``lr``
  the relative size ``lr ||U|| / ||Y||`` of a plain step at that learning rate, and
  (``check_formula``) the formula's ``U`` against the model's."""
  model = DecoderLM(mcfg)
  _, g_params, grads, acts = jax.jit(lambda p: intermediate_grads(
      model, p, tokens, lambda logits: cross_entropy(logits, targets)))(params)
  sums = lambda p: _residual_sums(model, p, tokens)
  out: dict[str, Any] = {}
  for k, (sub, w, yname) in SITES.items():

    @jax.jit
    def one_layer(layer, sub=sub, w=w, yname=yname, k=k):
      direction = _layer_direction(g_params, sub, w, layer)
      y_now, tangent = jax.jvp(sums, (params,), (direction,))
      y, u = y_now[yname][layer], -tangent[yname][layer]  # Y(eta) = Y - eta U (linear in W)
      yy, uu = jnp.vdot(y, y), jnp.vdot(u, u)
      step = 0.1 * jnp.sqrt(yy / uu)
      y_eta = sums(jax.tree.map(lambda p, t: p + step * t, params, direction))[yname][layer]
      res = {"yy": yy, "uu": uu, "yu": jnp.vdot(y, u), "step": step,
             "y_eta_sq": jnp.vdot(y_eta, y_eta), "tsim_y": batch_mean_token_similarity(y)}
      if check_formula:
        uf = _formula_u(mcfg, params, acts, grads, k, layer).reshape(u.shape)
        res["formula_err"] = jnp.linalg.norm(uf - u) / jnp.linalg.norm(u)
      return res

    rows = []
    for layer in range(mcfg.num_layers):
      r = {n: float(v) for n, v in jax.device_get(one_layer(layer)).items()}
      yy, uu = r["yy"], r["uu"]
      row = {"layer": layer + 1, "cos_y_u": r["yu"] / np.sqrt(yy * uu), "eta": r["step"],
             "norm_sq_change_rel": (r["y_eta_sq"] - yy) / yy,
             "prop_d2_change_rel": r["step"] ** 2 * uu / yy, "tsim_y": r["tsim_y"]}
      if lr is not None:
        row["lr_step_rel"] = lr * float(np.sqrt(uu / yy))
      if check_formula:
        row["formula_u_rel_err"] = r["formula_err"]
      rows.append(row)
    out[f"k{k}"] = rows
  return out


def _summary(res: dict[str, Any]) -> dict[str, Any]:
  s = {}
  for key, rows in res.items():
    cos = np.array([r["cos_y_u"] for r in rows])
    change = np.array([r["norm_sq_change_rel"] for r in rows])
    pred = np.array([r["prop_d2_change_rel"] for r in rows])
    s[key] = {"max_abs_cos": float(np.max(np.abs(cos))), "median_abs_cos": float(np.median(
        np.abs(cos))), "frac_norm_grows": float(np.mean(change > 0)),
        "max_rel_err_vs_prop_d2": float(np.max(np.abs(change - pred) / pred)),
        "mean_tsim_y": float(np.mean([r["tsim_y"] for r in rows]))}
    if "lr_step_rel" in rows[0]:
      s[key]["max_lr_step_rel"] = float(max(r["lr_step_rel"] for r in rows))
    if "formula_u_rel_err" in rows[0]:
      s[key]["max_formula_u_rel_err"] = float(max(r["formula_u_rel_err"] for r in rows))
  return s


PAPER_SEQUENCES = 4     # paper / tiny: sequences of the trained batch (as init_random's 4)
SCALES: dict[str, dict[str, Any]] = {
    "quick": {"config": collapse_study.RUNS["post_collapse"][0], "trained": "post_collapse"},
    "paper": {"config": paper_runs.CONFIG, "trained": paper_runs.post_collapse(0),
              "sequences": PAPER_SEQUENCES},
    "tiny": {"config": paper_runs.CONFIG, "trained": paper_runs.post_collapse(0),
             "sequences": PAPER_SEQUENCES},
}
Q_ORTH = "Therefore each gradient row is orthogonal to the corresponding residual row"
Q_STEP = ("After one gradient step of size $\\eta$ on the attention output matrix "
          "$\\mathbf{W}_{O}$, the residual stream becomes")
Q_GROW = ("In particular, whenever $\\mathbf{U}_{1}\\neq 0$ or $\\mathbf{U}_{2}\\neq 0$, the "
          "corresponding pre-RMS residual norm grows strictly for every $\\eta>0$.")
BY_CONSTRUCTION = ("true by construction: RMSNorm's Jacobian projects out its input row, so "
                   "any model's gradient rows are orthogonal to the residual rows (and the "
                   "norm identity follows from it); shown, not counted")
CLAIMS = claims([common.ours_limit(c) for c in [
    Claim("Prop D.2: <Y_k, U_k> = 0 at exact collapse", "max over layers and k of "
          "|cos(Y_k, U_k)|, one repeated token, float64", common.FLOAT64_ZERO, Bound("<"),
          "App D.3: the RMSNorm gradient rows are orthogonal to the residual rows; zero = "
          "below 1e-10 in float64, ours", where="Prop D.2", quote=Q_ORTH, kind="identity"),
    Claim("Prop D.2: U_k = H H^T G at exact collapse", "max relative error of the formula's "
          "U_k against the model's", common.FLOAT64_ZERO, Bound("<"), "App D.3; zero = "
          "below 1e-10 in float64, ours", where="Prop D.2", quote=Q_STEP),
    Claim("Prop D.2: ||Y(eta)||^2 = ||Y||^2 + eta^2 ||U||^2", "max relative error of a real "
          "step's norm change against the identity", common.FLOAT64_ZERO, Bound("<"),
          "App D.3; zero = below 1e-10 in float64, ours", where="Prop D.2", quote=Q_GROW,
          kind="identity"),
]])


def exact_collapse(mcfg, batch_tokens: tuple[int, ...], seed: int = 0) -> dict[str, Any]:
  """Exact collapse per sequence: sequence ``b`` repeats token ``batch_tokens[b]``;
  float64, ``norm_eps = 0``, random labels, init parameters."""
  with jax.enable_x64(True):
    mcfg = dataclasses.replace(mcfg, param_dtype="float64", compute_dtype="float64",
                               norm_eps=0.0, pos_embedding="none")
    n = mcfg.max_seq_len
    tokens = jnp.asarray(np.repeat(np.asarray(batch_tokens)[:, None], n, 1), jnp.int32)
    targets = jnp.asarray(np.random.default_rng(seed).integers(0, mcfg.vocab_size,
                                                               tokens.shape), jnp.int32)
    params = DecoderLM(mcfg).init(jax.random.PRNGKey(seed), tokens)["params"]
    return norm_growth(mcfg, params, tokens, targets, check_formula=True)


def init_random(mcfg, batch: int = 4, seed: int = 0) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, mcfg.vocab_size, (batch, mcfg.max_seq_len)), jnp.int32)
  targets = jnp.asarray(rng.integers(0, mcfg.vocab_size, tokens.shape), jnp.int32)
  params = DecoderLM(mcfg).init(jax.random.PRNGKey(seed), tokens)["params"]
  return norm_growth(mcfg, params, tokens, targets)


def trained(out_dir: str, workdir: str | None = None, sequences: int | None = None
            ) -> dict[str, Any]:
  """The collapsed run's final parameters on its first training batch (its first
  ``sequences``; quick: the no-warmup collapse run unless ``workdir``)."""
  from rankjax.train import load_run, make_data_iterator, make_task
  r = load_run(workdir or collapse_study.train_run("post_collapse", out_dir))
  cfg = r.config
  batch = {k: np.asarray(v)[:sequences]
           for k, v in next(make_data_iterator(cfg, make_task(cfg))).items()}
  params = jax.tree.map(jnp.asarray, r.params)
  res = norm_growth(cfg.model, params, jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"]),
                    lr=cfg.learning_rate)
  return {"step": r.step, "learning_rate": cfg.learning_rate, "rows": res}


def run(out_dir: str, scale: str = "quick") -> dict[str, Any]:
  """Prop D.2 in the four settings of the module docstring; writes ``propd2.json``.
  Paper / tiny: the paper's model and its collapsing run (Post-Norm 8e-4, seed 0,
  ``paper_runs``), the trained setting on ``PAPER_SEQUENCES`` sequences."""
  start = time.time()
  workdir = sequences = None
  if scale in ("paper", "tiny"):
    name = paper_runs.post_collapse(0)
    mcfg, config = paper_runs.config(name, scale).model, paper_runs.CONFIG
    workdir, sequences = paper_runs.train(out_dir, name, scale), PAPER_SEQUENCES
  elif scale == "quick":
    config = collapse_study.RUNS["post_collapse"][0]
    mcfg = common.load_config(config).model
  else:
    raise ValueError(f"propd2 has the quick, paper and tiny scales, not {scale!r}")
  settings = {"exact_one_sequence": exact_collapse(mcfg, (7,)),
              "exact_per_sequence_batch": exact_collapse(mcfg, (7, 11, 42, 100)),
              "init_random_tokens": init_random(mcfg)}
  tr = trained(out_dir, workdir, sequences)
  settings["trained_collapsed"] = tr["rows"]
  ours = {name: _summary(res) for name, res in settings.items()}
  result = {"figure": "postnorm_collapse Prop D.2 (App D.3)", "scale": scale,
            "paper": {"claim": "at exact collapse <Y_k, U_k> = 0, so ||Y_k(eta)||^2 = "
                               "||Y_k||^2 + eta^2 ||U_k||^2 > ||Y_k||^2 for every eta > 0"},
            "settings": {"config": config,
                         "trained_step": tr["step"], "trained_lr": tr["learning_rate"],
                         "step": "eta = 0.1 ||Y_k|| / ||U_k|| per layer"},
            "ours": ours, "seconds": time.time() - start}
  common.write_json(out_dir, "propd2.json", {**result, "per_layer": settings})
  result["measured"] = measurements(result)
  return result


def measurements(res: dict[str, Any]) -> list[dict[str, Any]]:
  """``run``'s ``"measured"``: the three identities at exact collapse (max over k = 1, 2)."""
  e = res["ours"]["exact_one_sequence"]
  mx = lambda key: max(e["k1"][key], e["k2"][key])
  note = ("one init (an identity at float64 rounding); the off-assumption settings "
          "(batch, init, trained) are in the results file: the paper states nothing there")
  return [measured("Prop D.2: <Y_k, U_k> = 0 at exact collapse", mx("max_abs_cos"), note=note),
          measured("Prop D.2: U_k = H H^T G at exact collapse", mx("max_formula_u_rel_err"),
                   note=note),
          measured("Prop D.2: ||Y(eta)||^2 = ||Y||^2 + eta^2 ||U||^2",
                   mx("max_rel_err_vs_prop_d2"), note=note)]
