"""The softmax study's trained-checkpoint bounds (Thm 4.1 / Cor 4.2 / Cor A.3): the
measured (inf,rms) operator norm against closed forms, the per-head split of the model's
attention weights, and the bound ordering on a small random LM."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.softmax_sensitivity import prepost_training as pt
from experiments.softmax_sensitivity import trained_bounds as tb
from rankjax._src.measure import sensitivity_bounds as sb
from rankjax._src.models.transformer import DecoderLM


def test_inf_rms_norm_bracket_closed_forms():
  rng = np.random.default_rng(0)
  T, d = 3, 4
  a = rng.standard_normal((d, d))
  # block diagonal with the same block: the norm is ||A||_2, both ends reach it
  jac = np.einsum("ij,ab->iajb", np.eye(T), a)
  lo, hi = sb.inf_rms_operator_norm_bracket(jac)
  np.testing.assert_allclose([lo, hi], np.linalg.norm(a, 2), rtol=1e-9)
  # rank-one blocks J_0j = c_j u v^T on one output row: norm = ||u|| ||v|| sum |c_j|
  u, v, c = rng.standard_normal(d), rng.standard_normal(d), np.array([0.5, -2.0, 1.0])
  jac = np.zeros((T, d, T, d))
  jac[0] = np.einsum("j,a,b->ajb", c, u, v)
  want = np.linalg.norm(u) * np.linalg.norm(v) * np.abs(c).sum()
  lo, hi = sb.inf_rms_operator_norm_bracket(jac)
  np.testing.assert_allclose([lo, hi], want, rtol=1e-9)
  # in general lower <= upper, and the lower end is a feasible value
  lo, hi = sb.inf_rms_operator_norm_bracket(rng.standard_normal((T, d, T, d)))
  assert 0 < lo <= hi
  with pytest.raises(ValueError, match="Jacobian"):
    sb.inf_rms_operator_norm_bracket(np.zeros((3, 4, 12)))


def _small_post_lm():
  cfg = pt.make_config("quick", "post", 42)
  return dataclasses.replace(cfg.model, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                             max_seq_len=24, dropout_rate=0.0, attn_dropout_rate=0.0)


@pytest.mark.slow   # the trained-bounds pipeline end to end on a small LM (~13 s idle)
def test_split_heads_reproduces_the_model_attention_and_bounds_order(monkeypatch):
  mcfg = _small_post_lm()
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 257, (2, 24)), jnp.int32)
  params = DecoderLM(mcfg).init(jax.random.PRNGKey(0), tokens)["params"]
  caps, probs = tb._captures(DecoderLM(mcfg), params, tokens)
  monkeypatch.setattr(tb, "T", 8)
  rows = tb.layer_bounds(mcfg, params, caps["x1"])
  assert len(rows) == mcfg.num_layers * tb.SEQS
  for r in rows:
    assert r["split_vs_model_rel_err"] < 1e-5
    assert r["measured_lower"] <= r["measured_upper"] * (1 + 1e-6)
    assert r["measured_lower"] <= r["thm41_bound"]          # Thm 4.1
    assert r["thm41_bound"] <= r["cor42_bound"] * (1 + 1e-6)  # Cor 4.2 (theta <= 1)
    assert len(r["theta_tilde_per_head"]) == mcfg.num_heads
  # Cor A.3 against its definition a_{k,i} = ||gamma_k||_inf / sigma_k(y_{k,i})
  a3 = tb.cor_a3(mcfg, params, caps["y1"], caps["y2"])
  y = np.asarray(caps["y1"][0], np.float64).reshape(-1, mcfg.d_model)
  sigma = np.sqrt(y.var(-1) + mcfg.norm_eps)
  g = np.abs(np.asarray(params["layers"]["norm_attn_r"]["scale"][0])).max()
  np.testing.assert_allclose(a3["worst_token_factor"][0], (g / sigma).max(), rtol=1e-4)
  assert a3["log_norm_measured"] <= a3["log_bound_token"] + 1e-4 <= a3["log_bound_layer"] + 2e-4
  # per-row records: the paper's greedy certificate never above our balance one, both
  # <= 1, and rows with p_max >= 1/2 get the exact 4 p_max (1 - p_max) (Cor 3.4(3))
  monkeypatch.setattr(tb, "ROWS", 8)
  recs = tb.row_records(probs, jax.random.PRNGKey(0))
  assert len(recs) == 8 * mcfg.num_layers and all(r["t"] >= 16 for r in recs)
  for r in recs:
    assert r["theta_cert_greedy"] <= r["theta_cert_balance"] + 1e-6 <= 1 + 2e-6
    if r["p_max"] >= 0.5:
      assert r["theta_cert_greedy"] == pytest.approx(4 * r["p_max"] * (1 - r["p_max"]), abs=1e-5)


def test_trained_bounds_rows_are_predicates_per_seed():
  from rankjax._src import reproduce
  from rankjax._src.studies import runner
  study = reproduce.study("softmax_sensitivity")
  claims = study.claims("trained_bounds")

  def one(ratio, log_gap):
    summ = {"max_lower_over_thm41": ratio, "max_upper_over_thm41": ratio * 1.05,
            "thm41_over_measured_median": 9.3}
    a3 = {"frac_modules_worst_below_1": 0.8, "log_norm_measured": -3.6 + log_gap,
          "log_bound_token": -3.6}
    return {"pre": {"step": 200, "summary": summ},
            "post": {"step": 200, "summary": summ, "cor_a3": a3}}

  res = {"seeds": [42, 123, 456], "per_seed": {"42": one(0.1, -0.01), "123": one(0.2, -0.02),
                                               "456": one(0.3, -0.03)}}
  rows = runner.judged("trained_bounds", claims, {"measured": tb.measurements(res)})
  assert [r["status"] for r in rows] == ["match", "match", "match"]
  assert rows[0]["per_seed"] == pytest.approx([0.1, 0.2, 0.3]) and rows[0]["seeds"] == [42, 123, 456]
  res["per_seed"]["123"] = one(1.2, 0.01)          # one seed above the bound: every seed fails
  again = runner.judged("trained_bounds", claims, {"measured": tb.measurements(res)})
  assert [r["status"] for r in again] == ["mismatch"] * 3
  assert "trained_bounds" in study.experiments
  assert study.module("trained_bounds") is tb
