"""Sec 4 bounds on trained checkpoints: Thm 4.1 / Cor 4.2 vs measured MHA Jacobian
norms, Cor A.3's Post-LN contraction condition, per-row (certificate, p_max) records.

Paper: "Exact Attention Sensitivity and the Geometry of Transformer Stability".
For the final parameters of the Pre-LN and Post-LN runs of ``prepost_training`` at the
same scale (seeds 42, 123, 456; the runs in ``out_dir/runs``, the folder both experiments
share: trained there, or here when missing), on the first ``SEQS`` sequences of one
training batch, first ``T`` tokens (the attention is causal, so the first ``T`` outputs
are those of the full sequence), per layer:

* the MHA input ``U`` is the captured sublayer input ``X_1`` (``LN(h)`` in Pre-LN,
  the stream ``h`` in Post-LN); the model's ``(d, d)`` projections are split per head
  (``w_q[:, h d_h:(h+1) d_h]``, the model's reshape order; ``W^O`` acts on the head
  concatenation), and the split MHA is checked against the model's attention module;
* measured ``Lambda_MHA(U) = ||D MHA(U)||_{inf,rms -> inf,rms}`` from the autodiff
  Jacobian, bracketed (``rankjax.measure.inf_rms_operator_norm_bracket``: feasible
  inputs below, the block row-sum above);
* Thm 4.1's local bound with exact ``theta`` on each causal row (``mha_local_bound``),
  and Cor 4.2's ``L_MHA^(B)`` at ``B = ||U||_{inf,rms}`` (Cor 4.2 holds on the whole
  ball, so it is >= Thm 4.1's bound with theta <= 1);
* for Post-LN, Cor A.3: ``a_{k,i} = ||gamma_k||_inf / sigma_k(y_{k,i})`` over the 2L
  in-block LayerNorms (inputs ``Y_1``, ``Y_2`` of every layer, all tokens of the batch),
  the worst-token factor ``max_i a_{k,i}`` per module (the condition is that it stays
  ``<= 1 - eta``), the bound ``log max_i prod_k a_{k,i}`` and the measured
  ``log ||prod_k J_LN,k||_2`` (``layernorm_only_product``);
* per-row records at every layer: ``attention_statistics`` rows (greedy-prefix
  certificate, the paper's) with ``p_max``, entropy and the balance certificate (ours)
  of the same rows, saved to ``rows_<run>.json``.

Scales (``SCALES``): quick, quick_sharpen, quick_seeds8 (its 8 seeds), paper
(``RANKJAX_FINEWEB``, accelerators) and tiny, the runs of
``prepost_training.run_configs`` at that scale. Its claims
(``CLAIMS``: Thm 4.1 per placement and Lemma A.2(iv) / Cor A.3, per seed) are declared
below.

Run:  rankjax reproduce softmax_sensitivity --only prepost_training,trained_bounds
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rankjax import studies
from rankjax.studies import Bound, Claim, claims, measured
from . import prepost_training as pt
from .policy import fmt

SEEDS = (42, 123, 456)   # the prepost_training seeds (at least 3 per trained result)
SEQS = 2     # sequences per layer for the Jacobian
T = 32       # tokens per sequence for the Jacobian
ROWS = 256   # attention rows per layer for the records
# the scales whose prepost_training checkpoints it reads, at their seeds (quick_paper_lr
# and quick_deep: none, CPU cost)
SCALES: dict[str, dict[str, Any]] = {
    scale: dict(seeds=pt.scale_seeds(scale), seqs=SEQS, tokens=T, rows_per_layer=ROWS)
    for scale in ("quick", "quick_sharpen", "quick_seeds8", "paper", "tiny")}

Q_THM41 = (r"\Lambda_{\MHA}(U)\leq\|W^{O}\|_{2}\sum_{h=1}^{H}\left(\|W_{h}^{V}\|_{2}+"
           r"\frac{\tilde{\theta}_{h}(U)}{\tau}\Phi_{h}\right)")
Q_COR_A3 = (r"the LayerNorm-only term satisfies $\|\prod_{k=\ell}^{m-1}\mathcal{J}_{\LN,k}(Y_{k})"
            r"\|_{2}\leq\max_{i}\prod_{k}a_{k,i}$")
CLAIMS = claims([
    Claim(f"Thm 4.1 on the trained {arch} checkpoints",
          "max over layers and sequences of measured ||D MHA(U)|| (lower end) / bound", 1.0,
          Bound("<=", every_seed=True), "a theorem: measured <= bound on any weights, i.e. "
          "the ratio <= 1 (the theorem's inequality, not a number of ours); the inputs are the "
          "trained checkpoints' own, not a worst-case search over U", where="Thm 4.1",
          quote=Q_THM41)
    for arch in ("Pre-LN", "Post-LN")] + [
    Claim("Lemma A.2(iv) / Cor A.3 on the trained Post-LN LayerNorms",
          "log ||prod_k J_LN,k||_2 measured - log of the token bound", 0.0,
          Bound("<=", every_seed=True), "over the 2N in-block LayerNorms, all tokens; the "
          "inequality as a log difference <= 0", where="Cor A.3", quote=Q_COR_A3)])


def split_heads(w_attn: dict[str, Any], heads: int):
  """The model's ``(d, d)`` projections as Sec 4.1's per-head ``(H, d, d_h)`` and
  ``W^O`` ``(H d_h, d)`` (columns ``h d_h .. (h+1) d_h - 1`` of ``w_q`` are head ``h``,
  as ``reshape(b, t, heads, d_h)`` in ``rankjax.models.CausalSelfAttention``)."""
  def per_head(w):
    d = w.shape[0]
    return jnp.asarray(w).reshape(d, heads, d // heads).transpose(1, 0, 2)
  return (per_head(w_attn["w_q"]), per_head(w_attn["w_k"]), per_head(w_attn["w_v"]),
          jnp.asarray(w_attn["w_o"]))


def split_mha(u_TxD, wq, wk, wv, wo):
  """Causal MHA from per-head weights (Sec 4.1), tau = 1: ``[A_h U W_h^V]_h W^O``."""
  from rankjax.measure import mha_attention_probs
  probs = mha_attention_probs(u_TxD, wq, wk, 1.0, causal=True)
  out = jnp.einsum("hts,sd,hdk->thk", probs, u_TxD, wv)
  return out.reshape(u_TxD.shape[0], -1) @ wo


def _captures(model, params, tokens):
  (_, sites), state = model.apply({"params": params}, tokens, capture=True,
                                  capture_probs=True, mutable=["intermediates"])
  probs = state["intermediates"]["layers"]["attn"]["attn_probs"][0]
  return {k: sites[k] for k in ("x1", "y1", "y2")}, probs


def layer_bounds(mcfg, params, x1_LxBxTxD) -> list[dict[str, Any]]:
  """Thm 4.1 / Cor 4.2 against the measured Jacobian norm, per layer and sequence."""
  from rankjax import measure
  from rankjax.models import CausalSelfAttention
  attn = CausalSelfAttention(mcfg)
  out = []
  for layer in range(mcfg.num_layers):
    w = jax.tree.map(lambda a: a[layer], params["layers"]["attn"])
    wq, wk, wv, wo = split_heads(w, mcfg.num_heads)
    for b in range(SEQS):
      u = jnp.asarray(x1_LxBxTxD[layer, b, :T], jnp.float32)
      model_out = attn.apply({"params": w}, u[None])[0]
      split_err = float(jnp.max(jnp.abs(split_mha(u, wq, wk, wv, wo) - model_out))
                        / jnp.max(jnp.abs(model_out)))
      jac = jax.jacfwd(lambda x: split_mha(x, wq, wk, wv, wo))(u)
      lower, upper = measure.inf_rms_operator_norm_bracket(jac)
      loc = measure.mha_local_bound(u, wq, wk, wv, wo, causal=True, theta="exact")
      B = float(measure.block_inf_rms_norm(u))
      cor = float(measure.mha_lipschitz_bound(wq, wk, wv, wo, B))
      out.append({"layer": layer, "seq": b, "measured_lower": lower, "measured_upper": upper,
                  "thm41_bound": float(loc["bound"]), "cor42_bound": cor,
                  "thm41_over_measured": float(loc["bound"]) / lower,
                  "theta_tilde_per_head": [float(x) for x in loc["theta_tilde"]],
                  "value_term_share": float(jnp.sum(loc["value_term"]) / jnp.sum(
                      loc["value_term"] + loc["attention_term"])),
                  "block_inf_rms_U": B, "split_vs_model_rel_err": split_err})
  return out


def cor_a3(mcfg, params, y1_LxBxTxD, y2_LxBxTxD) -> dict[str, Any]:
  """Cor A.3 on the Post-LN in-block LayerNorms, every token of the batch."""
  from rankjax.measure import layernorm_only_product
  L, B, Tn, d = y1_LxBxTxD.shape
  y = jnp.stack([y1_LxBxTxD, y2_LxBxTxD], 1).reshape(2 * L, B * Tn, d)
  g = jnp.stack([params["layers"]["norm_attn_r"]["scale"],
                 params["layers"]["norm_ffn_r"]["scale"]], 1).reshape(2 * L, d)
  r = layernorm_only_product(y, g, mcfg.norm_eps, "layer")
  worst = np.asarray(r["worst_token_factor_K"], np.float64)
  return {"worst_token_factor": worst.tolist(),
          "frac_modules_worst_below_1": float(np.mean(worst < 1.0)),
          "max_worst_token_factor": float(worst.max()),
          "log_bound_token": float(r["log_bound_token"]),
          "log_bound_layer": float(r["log_bound_layer"]),
          "log_norm_measured": float(r["log_norm"]),
          "median_a": float(np.median(np.asarray(r["a_KxT"])))}


def row_records(probs_LxBxHxTxT, key) -> list[dict[str, Any]]:
  """Per layer: sampled causal rows with (greedy certificate, p_max, entropy) as in
  Sec 5 and our balance certificate of the same rows."""
  from rankjax import measure
  recs = []
  for layer in range(probs_LxBxHxTxT.shape[0]):
    p = probs_LxBxHxTxT[layer]
    st = measure.attention_statistics(p, jax.random.fold_in(key, layer), num_rows=ROWS)
    r = jax.device_get(st["rows"])
    rows = p[r["b"], r["h"], r["t"]]
    rows = jnp.where(jnp.arange(p.shape[-1])[None] <= r["t"][:, None], rows, 0.0)
    bal = jax.device_get(measure.theta_certificate(rows / rows.sum(-1, keepdims=True), "balance"))
    recs += [{"layer": layer, "b": int(r["b"][i]), "h": int(r["h"][i]), "t": int(r["t"][i]),
              "theta_cert_greedy": float(r["theta_cert"][i]), "p_max": float(r["p_max"][i]),
              "entropy_norm": float(r["entropy_norm"][i]),
              "theta_cert_balance": float(bal[i])} for i in range(len(r["t"]))]
  return recs


def analyze_run(workdir: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  from rankjax.models import DecoderLM
  from rankjax.train import load_run, make_data_iterator, make_task
  r = load_run(workdir)
  cfg = r.config
  params = jax.tree.map(jnp.asarray, r.params)
  batch = next(make_data_iterator(cfg, make_task(cfg)))
  tokens = jnp.asarray(batch["inputs"]).reshape(-1, cfg.seq_len)[:8]
  caps, probs = _captures(DecoderLM(cfg.model), params, tokens)
  lb = layer_bounds(cfg.model, params, caps["x1"])
  res: dict[str, Any] = {"step": r.step, "layers": lb}
  ratios = np.array([x["thm41_over_measured"] for x in lb])
  res["summary"] = {
      "measured_lower_le_thm41": bool(all(x["measured_lower"] <= x["thm41_bound"] for x in lb)),
      "measured_upper_le_thm41": bool(all(x["measured_upper"] <= x["thm41_bound"] for x in lb)),
      "max_lower_over_thm41": float(max(x["measured_lower"] / x["thm41_bound"] for x in lb)),
      "max_upper_over_thm41": float(max(x["measured_upper"] / x["thm41_bound"] for x in lb)),
      "cor42_ge_thm41": bool(all(x["cor42_bound"] >= x["thm41_bound"] * (1 - 1e-6)
                                 for x in lb)),
      "thm41_over_measured_median": float(np.median(ratios)),
      "thm41_over_measured_range": [float(ratios.min()), float(ratios.max())],
      "cor42_over_thm41_median": float(np.median([x["cor42_bound"] / x["thm41_bound"]
                                                  for x in lb])),
      "theta_tilde_range": [float(min(min(x["theta_tilde_per_head"]) for x in lb)),
                            float(max(max(x["theta_tilde_per_head"]) for x in lb))],
      "value_term_share_median": float(np.median([x["value_term_share"] for x in lb])),
      "max_split_vs_model_rel_err": float(max(x["split_vs_model_rel_err"] for x in lb))}
  if cfg.model.norm_position == "post":
    res["cor_a3"] = cor_a3(cfg.model, params, caps["y1"], caps["y2"])
  recs = row_records(probs, jax.random.PRNGKey(0))
  res["rows_summary"] = {"num_rows": len(recs), "frac_p_max_ge_half": float(np.mean(
      [x["p_max"] >= 0.5 for x in recs])), "median_theta_cert_greedy": float(np.median(
      [x["theta_cert_greedy"] for x in recs]))}
  return res, recs


def measurements(r: dict[str, Any]) -> list[dict[str, Any]]:
  """Thm 4.1 against the measured MHA Jacobian and Lemma A.2(iv) on the Post-LN
  LayerNorms, per trained seed (:func:`run`'s result)."""
  seeds = list(r["seeds"])
  per = [r["per_seed"][str(s)] for s in seeds]
  out = []
  for arch, name in (("pre", "Pre-LN"), ("post", "Post-LN")):
    s = [p[arch]["summary"] for p in per]
    out.append(measured(
        f"Thm 4.1 on the trained {name} checkpoints",
        [x["max_lower_over_thm41"] for x in s], seeds=seeds,
        note=f"update {per[0][arch]['step']}; upper end of the bracket / bound, per seed: "
             f"{fmt([x['max_upper_over_thm41'] for x in s])}; bound / measured median "
             f"{fmt([x['thm41_over_measured_median'] for x in s])}"))
  a3 = [p["post"]["cor_a3"] for p in per]
  out.append(measured(
      "Lemma A.2(iv) / Cor A.3 on the trained Post-LN LayerNorms",
      [a["log_norm_measured"] - a["log_bound_token"] for a in a3], seeds=seeds,
      note=f"share of modules with max_i a_k,i < 1: "
           f"{fmt([a['frac_modules_worst_below_1'] for a in a3])}"))
  return out


def run(out_dir: str, scale: str = "quick", seeds: tuple[int, ...] | None = None
        ) -> dict[str, Any]:
  """Both placements at each of ``seeds`` (the scale's, ``SCALES``, when None), the
  ``prepost_training`` runs of ``scale`` in
  ``out_dir/runs`` (trained when missing); writes ``trained_bounds.json`` and the row
  records into ``out_dir``; returns the results with their ``measured`` values
  (:func:`measurements`)."""
  if scale not in SCALES:
    raise ValueError(f"scale {scale!r}: trained_bounds runs at {', '.join(SCALES)} (it reads "
                     "the prepost_training checkpoints of that scale)")
  seeds = tuple(seeds or SCALES[scale]["seeds"])
  start = time.time()
  pt.use_compile_cache(os.path.join(out_dir, "jax_cache"))
  trained = pt.train_runs(out_dir, scale, seeds)        # reuses finished runs
  per_seed: dict[str, dict[str, Any]] = {}
  for seed in seeds:
    per_seed[str(seed)] = {}
    for arch in pt.ARCHS:
      res, recs = analyze_run(trained[f"{arch}_s{seed}"][1])
      studies.write_json(out_dir, f"rows_{arch}_s{seed}.json", {"rows": recs})
      per_seed[str(seed)][arch] = res
  result = {"figure": "softmax_sensitivity Thm 4.1 / Cor 4.2 / Cor A.3 on trained checkpoints",
            "scale": scale, "seeds": list(seeds),
            "settings": {"seeds": list(seeds), "seqs": SEQS, "tokens": T,
                         "rows_per_layer": ROWS, "runs": os.path.join(out_dir, "runs")},
            "per_seed": per_seed, "seconds": time.time() - start}
  studies.write_json(out_dir, "trained_bounds.json", result)
  result["measured"] = measurements(result)
  return result

