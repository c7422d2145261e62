"""The Transforming Rank experiment scripts parse their settings and run end to end."""
import dataclasses
import importlib
import math
import json

import numpy as np
import pytest

from experiments.transforming_rank import reproduce


@pytest.mark.parametrize("name", sorted(reproduce.EXPERIMENTS))
def test_every_experiment_has_quick_and_paper_settings(name):
  module = importlib.import_module(f"experiments.transforming_rank.{reproduce.EXPERIMENTS[name]}")
  assert callable(module.run)
  assert set(module.SCALES) == {"quick", "paper"}
  assert set(module.SCALES["quick"]) == set(module.SCALES["paper"])


def test_resolve_aliases():
  assert reproduce.resolve("fig10,table4") == ["fig4", "fig5"]
  assert reproduce.resolve(["fig14"]) == ["fig7"]
  assert reproduce.resolve("fig8c,table5,appc") == ["fig12", "fig6", "appc"]
  with pytest.raises(ValueError, match="unknown experiment"):
    reproduce.resolve("fig99")


def test_small_experiment_and_summary(tmp_path):
  from experiments.transforming_rank import table3_projections
  res = table3_projections.run(str(tmp_path), width=16, depths=(4, 8), seeds=1, eps=(0.1,))
  assert (tmp_path / "table3_projections.png").is_file()
  saved = json.loads((tmp_path / "table3_projections.json").read_text())
  assert 0.5 < saved["table"]["0.1"][0] <= 1.0 and res["summary"]
  # Table 1 small (the paper-size run is the slow test below): the coherences are
  # closed forms at any size (EXPECTED.md digits), the stable ranks finite and >= 1
  from experiments.transforming_rank import table1_coherence
  t1 = table1_coherence.run(str(tmp_path), width=16, inputs=64, seeds=2, n_sweep=(64,))
  for act, c in {"abs": 0.637, "relu": 0.318, "gelu": 0.187, "silu": 0.120, "tanh": 0.0}.items():
    assert t1["table"][act]["coherence"] == pytest.approx(c, abs=5e-4)
    assert 1.0 <= t1["table"][act]["measured_stable_rank"] < 16
  assert set(t1["n_dependence"]["tanh"]) == {"64"}


@pytest.mark.slow   # Table 1 at its paper size (d = 256, n = 1024, 3 seeds) through run_all
def test_run_all_summary_and_table1_pins_expected(tmp_path):
  out = reproduce.run_all(str(tmp_path / "all"), "quick", only="table1")
  assert out["failed"] == [] and "error" not in out["results"]["table1"]
  text = (tmp_path / "all" / "summary.md").read_text()
  assert "| table1 | Table 1 relu" in text
  rows = json.loads((tmp_path / "all" / "summary.json").read_text())
  status = {r["item"].split(":")[0]: r["status"] for r in rows if "c / 1/c" in r["item"]}
  assert status["Table 1 relu"] == "match" and status["Table 1 tanh"] == "mismatch"  # EXPECTED.md
  # EXPECTED.md's Table 1 numbers (d=256, n=1024, 3 seeds), to their stated digits
  table = out["results"]["table1"]["table"]
  for act, (c, st) in {"abs": (0.637, 1.56), "relu": (0.318, 3.11), "gelu": (0.187, 5.21),
                       "silu": (0.120, 7.99), "tanh": (0.0, 57.12)}.items():
    assert table[act]["coherence"] == pytest.approx(c, abs=5e-4)
    assert table[act]["measured_stable_rank"] == pytest.approx(st, abs=0.006)
  n_dep = out["results"]["table1"]["n_dependence"]
  assert [round(n_dep["tanh"][n]["mean"], 1) for n in ("512", "1024")] == [49.5, 57.1]


def _ours(result, item_start):
  """The numbers of the summary row whose item starts with ``item_start``."""
  row = next(r for r in result["summary"] if r["item"].startswith(item_start))
  return [float(x) for x in row["ours"].replace(",", " ").replace("/", " ").split()
          if x.replace(".", "", 1).replace("-", "", 1).replace("e", "", 1).isdigit()]


@pytest.mark.slow   # the small run of Table 3 stays fast (test_small_experiment_and_summary)
def test_table3_quick_pins_expected(tmp_path):
  """EXPECTED.md, Table 3 (quick = paper size here, ~4 s), to its 3 stated digits."""
  from experiments.transforming_rank import table3_projections
  res = table3_projections.run(str(tmp_path), "quick")
  for eps, want in (("0.01", [0.996] * 4), ("0.3", [0.996, 0.996, 0.995, 0.995]),
                    ("0.6", [0.993, 0.990, 0.984, 0.972])):
    np.testing.assert_allclose(_ours(res, f"Table 3: eps={eps},")[-4:], want, atol=5e-4)


def test_table6_and_fig2_small_runs(tmp_path):
  """Table 6 and Fig 2 end to end at a small size (the pins below run with -m slow): a
  row per width, eranks in (0, 1], and the exact beta*alpha^2 symmetry of Fig 2."""
  from experiments.transforming_rank import fig2_branch_scale, table6_width
  t6 = table6_width.run(str(tmp_path), "quick", widths=(16,), layers=(4, 8), seeds=1,
                        min_inputs=32)
  assert (tmp_path / "table6_width.png").is_file()
  erank = _ours(t6, "Table 6: d=16")
  assert len(erank) == 2 and all(0 < v <= 1 for v in erank)
  f2 = fig2_branch_scale.run(str(tmp_path), "quick", depth=6, width=16,
                             alpha_exponents=(0, 2), beta_exponents=(-2, 0))
  assert (tmp_path / "fig2_branch_scale.png").is_file()
  assert all(0 < v <= 1 for v in _ours(f2, "Fig 2: erank_L/d"))
  spreads = f2["max_spread_at_equal_ratio"]     # the beta*alpha^2 symmetry, float32 rounding
  assert set(spreads) == {"pre", "post"} and max(spreads.values()) < 1e-5


@pytest.mark.slow
def test_table6_and_fig2_quick_pin_expected(tmp_path):
  """EXPECTED.md, Table 6 (d = 128 equals the paper's row) and Fig 2 (~15 s together)."""
  from experiments.transforming_rank import fig2_branch_scale, table6_width
  t6 = table6_width.run(str(tmp_path), "quick")
  np.testing.assert_allclose(_ours(t6, "Table 6: d=128")[-5:], [0.216, 0.097, 0.044, 0.023, 0.015],
                             atol=5e-4)
  np.testing.assert_allclose(_ours(t6, "Table 6: d=64")[-5:], [0.210, 0.104, 0.055, 0.034, 0.024],
                             atol=5e-4)
  f2 = fig2_branch_scale.run(str(tmp_path), "quick")
  np.testing.assert_allclose(_ours(f2, "Fig 2: erank_L/d"), [0.465, 0.103], atol=5e-4)
  assert max(_ours(f2, "Fig 2b/d")) < 1e-5      # the beta*alpha^2 symmetry, float32 rounding


@pytest.mark.slow
def test_fig15_quick_pins_expected(tmp_path):
  """EXPECTED.md, Fig 15 at quick width (d = 64; ~15 s)."""
  from experiments.transforming_rank import fig15_output_norm
  res = fig15_output_norm.run(str(tmp_path), "quick")
  np.testing.assert_allclose(_ours(res, "Fig 15a"), [0.024, 0.087], atol=5e-4)
  np.testing.assert_allclose(_ours(res, "Fig 15b"), [0.024, 0.023, 0.767, 0.768], atol=5e-4)


def test_fig5b_loglog_slope_and_per_seed_sd():
  from experiments.transforming_rank import fig5_depth_law as f5
  ls = np.arange(1, 385)
  assert f5._loglog_slope(3.0 * np.sqrt(ls), 48) == pytest.approx(0.5, abs=1e-12)
  assert f5._loglog_slope(np.log1p(ls), 48) < 0.5               # a flattening curve
  assert f5._sd([-0.48, -0.63, float("nan")]) == pytest.approx(np.std([-0.48, -0.63], ddof=1))
  assert np.isnan(f5._sd([-0.5]))



def test_fig14_panels_drawn_and_separation_means(tmp_path):
  """Fig 14 (a, b, c) is its own figure; the near/far pair means read the right pairs."""
  from experiments.transforming_rank import fig7_mean_spike as f7
  c = np.array([[1.0, 0.3, 0.1], [0.3, 1.0, 0.5], [0.1, 0.5, 1.0]])
  near, far = f7.separation_means(c, [8, 16, 264], near=8, far=256)
  assert near == pytest.approx(0.3) and far == pytest.approx(0.1)
  assert np.isnan(f7.separation_means(c, [8, 16, 24], near=8, far=256)[1])
  layers = tuple(range(8, 65, 8))
  res = {n: {"pairwise": np.eye(len(layers)), "pairwise_offdiag_mean": 0.0}
         for n in f7.FIG14_PANELS}
  f7._fig14(str(tmp_path), res, layers, dict(width=16, depth=64, inputs_align=32, seeds=1,
                                             layer_every=8))
  assert (tmp_path / "fig14_pairwise_cosines.png").stat().st_size > 10_000


@pytest.mark.slow
def test_fig7_fig14_quick_pins_expected(tmp_path):
  """EXPECTED.md, Fig 7 / Fig 14 at quick scale (d=64, 2 seeds, n=1024; ~35 s)."""
  from experiments.transforming_rank import fig7_mean_spike as f7
  res = f7.run(str(tmp_path), "quick")
  assert (tmp_path / "fig14_pairwise_cosines.png").is_file()
  np.testing.assert_allclose(_ours(res, "Fig 14: pairwise"), [0.324, 0.004, 0.000], atol=5e-4)
  np.testing.assert_allclose(_ours(res, "Fig 14a/b"), [0.325, 0.325, 0.004, 0.007], atol=5e-4)
  np.testing.assert_allclose(_ours(res, "Fig 7a"), [0.325, 0.004, 0.002], atol=5e-4)
  np.testing.assert_allclose(_ours(res, "Fig 7b"), [1.00, 0.56], atol=5e-3)
  np.testing.assert_allclose(_ours(res, "Fig 7d"), [0.024, 0.531, 0.601], atol=5e-4)


def test_appa2_skip_path_is_lambda_to_the_L(tmp_path):
  """App A.2 (Eq. 13): the order-0 path of prod (lambda I + beta J_l) is lambda^L I for
  every draw and beta; at beta = 1/L and lambda > 1 the skip path carries nearly all
  of the Jacobian; lambda = 1 keeps the skip path at 1."""
  from experiments.transforming_rank import appa2_skip_scale as a2
  res = a2.run(str(tmp_path), width=16, depth=12, seeds=2, lambdas=(0.8, 1.0, 1.25),
               betas=("1", "1/L"))
  assert (tmp_path / "appa2_skip_scale.png").is_file()
  r = res["results"]
  for key, v in r.items():
    assert v["log_mu0_error"] < 1e-4, key
    assert v["reconstruction_error"] < 1e-4, key
  # the order-0 mass alone at beta = 1/L: ||dh_L/dh_0|| -> lambda^L (not beta-correctable)
  np.testing.assert_allclose(10 ** r["lambda=1.25/beta=1/L"]["log10_jacobian_norm_L"],
                             1.25 ** 12, rtol=0.15)
  assert np.all(r["lambda=0.8/beta=1"]["skip_mass_share"]
                < r["lambda=1/beta=1"]["skip_mass_share"])
  assert res["summary"][0]["status"] == "match"
  with pytest.raises(ValueError, match="beta"):
    a2.run(str(tmp_path), betas=("2",))


@pytest.mark.slow
def test_appa2_quick_pins_expected(tmp_path):
  """EXPECTED.md, App A.2 at quick scale (d=64, 3 seeds; ~15-20 s)."""
  from experiments.transforming_rank import appa2_skip_scale as a2
  res = a2.run(str(tmp_path), "quick")
  rows = {r["item"].split(",")[0]: r for r in res["summary"]}
  assert float(res["summary"][0]["ours"]) < 1e-5
  share = [float(rows[f"App A.2: lambda={l}"]["ours"].split(";")[1]) for l in
           ("0.9", "0.95", "1", "1.05", "1.1")]
  np.testing.assert_allclose(share, [0.00101, 0.0101, 0.0642, 0.165, 0.247], rtol=5e-3)
  jn = [float(rows[f"App A.2: lambda={l}"]["ours"].split(";")[3]) for l in ("0.9", "1", "1.1")]
  np.testing.assert_allclose(jn, [0.301, 0.747, 2.28], atol=5e-3)
  r = res["results"]
  assert float(np.mean(r["lambda=1.1/beta=1/L"]["log10_jacobian_norm_L"])) == pytest.approx(
      math.log10(1.1 ** 48), abs=0.02)


def test_appa4_rate_rules():
  """App A.4's rescaling rules for a branch matrix after alpha <- lambda alpha."""
  from experiments.transforming_rank import appa4_training_symmetry as a4
  assert a4.branch_hyperparameters("adam", "symmetric", 1e-3, 1e-8, 3.0) == pytest.approx((3e-3, 1e-8 / 3))
  assert a4.branch_hyperparameters("sgd", "symmetric", 0.1, 0.0, 3.0)[0] == pytest.approx(0.9)
  assert a4.branch_hyperparameters("sgd", "sgd_linear", 0.1, 0.0, 3.0)[0] == pytest.approx(0.3)
  with pytest.raises(ValueError, match="rule"):
    a4.branch_hyperparameters("sgd", "adam_eps_kept", 0.1, 0.0, 3.0)
  with pytest.raises(ValueError, match="multiple"):
    a4.run("unused", steps=30, record_every=20)


@pytest.mark.slow
def test_appa4_rescaled_rates_keep_the_trajectory():
  """App A.4: (alpha, beta) -> (3 alpha, beta / 9) with Adam (3 eta, eps / 3) trains
  along the same trajectory (float64: to rounding); the unscaled rate does not (~10 s
  idle: three compiles)."""
  import jax
  import jax.numpy as jnp
  from experiments.transforming_rank import appa4_training_symmetry as a4
  from rankjax.config import MLPConfig
  from rankjax.models.mlp import ResidualMLP
  s = dict(examples=64, input_dim=4, classes=3, probe=8)
  with jax.enable_x64(True):
    cfg = MLPConfig(depth=2, width=4, expansion=1.0, input_dim=4, num_classes=3,
                    param_dtype="float64")
    x, y, probe = a4.make_task(jax.random.PRNGKey(0), s, jnp.float64)
    params = ResidualMLP(cfg).init(jax.random.PRNGKey(1), x[:1])["params"]
    lam = 3.0
    p_l = dict(params, blocks=jax.tree.map(lambda w: lam * w, params["blocks"]))
    cfg_l = dataclasses.replace(cfg, beta=lam ** -2)
    fit = lambda c, p, h: a4.train(c, "adam", p, h, x, y, probe, jax.random.PRNGKey(2),
                                   steps=20, batch=8, record_every=10)
    base = fit(cfg, params, (0.01, 1e-8, 0.01, 1e-8))
    same = a4.compare(base, fit(cfg_l, p_l, a4.branch_hyperparameters("adam", "symmetric", 0.01, 1e-8, lam)
                                + (0.01, 1e-8)), lam)
    off = a4.compare(base, fit(cfg_l, p_l, (0.01, 1e-8, 0.01, 1e-8)), lam)
  assert same["loss_gap_max"] < 1e-12 and same["weight_gap_final"] < 1e-12
  assert off["weight_gap_final"] > 1e-3


def test_appd3_rank_equality_and_binomial_prediction():
  """App D.1 / D.3: rank J_f = rank(D W_up) = min(#survivors, d) on relu draws; the
  predicted rank of Binomial(m, 1/2) survivors against its closed form at m = 2d."""
  import jax
  import jax.numpy as jnp
  from experiments.transforming_rank import appd3_rank_equality as d3
  d = 16
  e_rank, p_full = d3.predicted_rank(d, 2 * d, 0.5)
  assert p_full == pytest.approx(0.5 + 0.5 * math.comb(2 * d, d) / 4 ** d, abs=1e-12)
  assert d3.predicted_rank(d, d // 2, 1.0) == pytest.approx((0.5, 0.0))
  with jax.enable_x64(True):
    s = jnp.array([3.0, 1.0, 1e-3, 1e-17])
    rank, margin = d3.numerical_rank(s, (4, 4))
    assert int(rank) == 3 and float(margin) == pytest.approx(np.log10(1e-3 / (3 * 4 * 2.0 ** -52)))
    out = jax.vmap(lambda k: d3.rank_sample(k, d, 2 * d, "relu"))(
        jax.random.split(jax.random.PRNGKey(0), 4))
  out = {k: np.asarray(v) for k, v in out.items()}
  np.testing.assert_array_equal(out["rank_jacobian"], out["rank_masked"])
  np.testing.assert_array_equal(out["rank_masked"], np.minimum(out["survivors"], d))
  assert out["margin_jacobian"].min() > 3       # the counted singular values are clear
