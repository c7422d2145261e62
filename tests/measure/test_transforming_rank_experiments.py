"""The Transforming Rank experiment scripts parse their settings and run end to end."""
import dataclasses
import importlib
import math
import json

import numpy as np
import pytest

from experiments.transforming_rank import reproduce
from rankjax._src import reproduce as cli

STUDY = cli.study("transforming_rank")   # loaded by rankjax._src.studies.finder (package set)


@pytest.mark.parametrize("name", sorted(reproduce.EXPERIMENTS))
def test_every_experiment_has_a_run(name):
  # its SCALES table: tests/experiments/test_tr_tiny.py
  module = STUDY.module(name)   # declares CLAIMS and SCALES, defines run
  assert module is importlib.import_module(
      f"experiments.transforming_rank.{reproduce.EXPERIMENTS[name]}")
  assert callable(module.run)


def test_resolve_aliases():
  assert STUDY.resolve("fig10,table4") == ["fig4", "fig5"]
  assert STUDY.resolve(["fig14"]) == ["fig7"]
  assert STUDY.resolve("fig8c,table5,appc") == ["fig12", "fig6", "appc"]
  with pytest.raises(ValueError, match="unknown experiment"):
    STUDY.resolve("fig99")


def test_every_experiment_declares_its_claims():
  """Every experiment passes the claims it declares at import to the runner; the rules
  are the study's one policy (common.rule) or a predicate."""
  from rankjax._src.studies import evidence
  from experiments.transforming_rank import common
  for name in STUDY.experiments:
    claims = STUDY.claims(name)
    assert claims, name
    for item, c in claims.items():
      assert isinstance(c, evidence.Claim) and c.item == item, (name, item)
      if isinstance(c.rule, (evidence.Abs, evidence.Rel, evidence.OneMinus)):
        assert c.paper is not None and not isinstance(c.paper, str), (name, item)
  # the policy: decided by the paper's number and the kind of quantity
  assert common.rule(0.009) == evidence.Abs(0.005)
  assert common.rule(0.980, fraction=True) == evidence.OneMinus(0.25)
  assert common.rule(1.0, fraction=True) == evidence.Abs(0.005)
  assert common.rule(1.0) == common.rule(0.46) == evidence.Rel(0.05)


def _committed_rows() -> list[dict]:
  from rankjax._src.studies import results
  folder = results.committed_dir("transforming_rank", "quick")
  return [r for doc in results.load(folder).values() for r in doc["rows"]]


def test_committed_quick_results_cover_every_experiment():
  """Every experiment with a quick path has a committed results file whose rows are
  its declared claims."""
  from rankjax._src.studies import evidence, results
  docs = results.load(results.committed_dir("transforming_rank", "quick"))
  quick = {n for n in STUDY.experiments if "quick" in STUDY.scales_of(n)}
  assert quick <= set(docs), sorted(quick - set(docs))
  for name, doc in docs.items():
    claims = STUDY.claims(name)
    for r in doc["rows"]:
      c = claims[r["item"]]
      assert r["paper"] == c.paper and r["rule"] == c.rule.describe(), (name, r["item"])
      if r["status"] in (*evidence.JUDGED, "proxy"):
        assert evidence.recheck(r) == r["status"], (name, r["item"])
  rows = _committed_rows()


@pytest.mark.slow   # 5 s; the committed rows' claims are checked fast above, the
# experiments rerun by the slow --check test
def test_small_runs_make_claim_rows(tmp_path):
  """Table 3, Table 1 and Fig 2 end to end at a small size: every row one number judged
  by its declared claim; the closed forms at any size; Fig 2's exact symmetry."""
  from rankjax._src.studies import runner
  from experiments.transforming_rank import fig2_branch_scale, table1_coherence, table3_projections
  res = table3_projections.run(str(tmp_path), width=16, depths=(8, 48), seeds=3, eps=(0.6,))
  assert (tmp_path / "table3_projections.png").is_file()
  saved = json.loads((tmp_path / "table3_projections.json").read_text())
  assert 0.5 < saved["table"]["0.6"][0] <= 1.0 and len(saved["per_seed"]["0.6"]) == 3
  exp = runner.Experiment("table3_projections", setting={"quick": runner.PAPER_SETTING})
  rows = [runner._complete("table3", r, "quick", exp)
          for r in runner.judged("table3", table3_projections.CLAIMS, res)]
  assert [r["item"] for r in rows] == [                       # L=8 is not in the paper
      "Table 3: eps=0.6, L=48", "Table 3, renormalized step: eps=0.6, L=48"]
  assert all(r["n"] == 3 and len(r["per_seed"]) == 3 and r["status"] == "mismatch"
             for r in rows)   # d = 16 loses 1/16 of the rank per direction: far from 0.994
  t1 = table1_coherence.run(str(tmp_path), width=16, inputs=64, seeds=2, sweep_seeds=2,
                            n_sweep=(64,))
  by = {r["item"]: r for r in runner.judged("table1", table1_coherence.CLAIMS, t1)}
  for act in ("abs", "relu", "gelu", "silu", "tanh"):
    assert by[f"Table 1 {act}: c"]["status"] == "match"        # quadrature, any size
    assert 1.0 <= by[f"Table 1 {act}: st"]["ours"] < 16
  assert "Table 1 tanh: 1/c" not in by and set(t1["n_dependence"]["tanh"]) == {"64"}
  f2 = fig2_branch_scale.run(str(tmp_path), "quick", depth=4, width=8, seeds=3,
                             alpha_exponents=(-2, -1, 0), beta_exponents=(-1, 0))
  spread = {r["item"]: r for r in runner.judged("fig2", fig2_branch_scale.CLAIMS, f2)}
  for pos in ("pre", "post"):
    r = spread[f"Fig 2b/d: {pos}, equal beta*alpha^2 coincide"]
    assert r["status"] == "match" and max(r["per_seed"]) < 1e-5


def test_fig5b_loglog_slope_and_per_seed_sd():
  from experiments.transforming_rank import fig5_depth_law as f5
  ls = np.arange(1, 385)
  assert f5._loglog_slope(3.0 * np.sqrt(ls), 48) == pytest.approx(0.5, abs=1e-12)
  assert f5._loglog_slope(np.log1p(ls), 48) < 0.5               # a flattening curve
  assert f5._sd([-0.48, -0.63, float("nan")]) == pytest.approx(np.std([-0.48, -0.63], ddof=1))
  assert np.isnan(f5._sd([-0.5]))



def test_fig5_contour_fit_on_synthetic_ranks():
  """Table 4's fit (App B.3) on a synthetic rank surface erank = g(alpha^2 sqrt(L)) with
  g decreasing: the contour alpha^2 ~ L^(-1/2) gives s = -1/2; a surface with
  erank = g(alpha^2 L) gives -1; a depth whose rank never falls below r* has no contour
  point (nan), is left out of the fit, and the fit of the others is unchanged."""
  from experiments.transforming_rank import fig5_depth_law as f5
  alphas = 2.0 ** (np.arange(-48, 13) / 8)
  depths = np.array([48, 96, 192, 384])
  g = lambda x: 1.0 / (1.0 + x)
  surface = g(alphas[:, None] ** 2 * np.sqrt(depths)[None, :])
  s, contour = f5.iso_rank_exponent(alphas, surface, depths, 0.5)
  assert s == pytest.approx(-0.5, abs=0.01) and np.all(np.isfinite(contour))
  s1, _ = f5.iso_rank_exponent(alphas, g(alphas[:, None] ** 2 * depths[None, :]), depths, 0.5)
  assert s1 == pytest.approx(-1.0, abs=0.01)
  flat = surface.copy()
  flat[:, 0] = 0.9                         # depth 48 never crosses r* = 0.5
  s2, contour2 = f5.iso_rank_exponent(alphas, flat, depths, 0.5)
  assert np.isnan(contour2[0]) and np.all(np.isfinite(contour2[1:]))
  assert s2 == pytest.approx(-0.5, abs=0.01)
  assert np.isnan(f5.iso_rank_exponent(alphas, np.full_like(surface, 0.9), depths, 0.5)[0])


def test_fig5_local_slopes_and_grid_spread_on_synthetic_ranks():
  """The two Fig 5 diagnostics on surfaces whose answer is known: a contour c = 3 L^-1/2
  has slope -1/2 between every two depths, c = L^-1 bending to L^-1/2 shows the bend,
  and a missing point gives nan; on the alpha grid 2^(i/4) with depths doubling, a rank
  that is a function of alpha^2 sqrt(L) alone has no spread at the shared x (no
  interpolation: float rounding only), one of alpha^2 L does, a window keeps only the x
  inside it, and a grid that shares no x across depths gives nan."""
  from experiments.transforming_rank import fig5_depth_law as f5
  depths = np.array([48, 96, 192, 384])
  assert f5.local_slopes(3.0 / np.sqrt(depths), depths) == pytest.approx([-0.5] * 3)
  bent = np.array([1 / 48, 1 / 96, 1 / 96 / np.sqrt(2), 1 / 192])
  assert f5.local_slopes(bent, depths) == pytest.approx([-1.0, -0.5, -0.5])
  assert np.isnan(f5.local_slopes([1.0, np.nan, 0.5, 0.4], depths)[:2]).all()
  alphas = 2.0 ** (np.arange(-14, 5) / 4)
  g = lambda x: 1.0 / (1.0 + x)
  sqrt_law = g(alphas[:, None] ** 2 * np.sqrt(depths)[None, :])
  assert f5.grid_spread(alphas, sqrt_law, depths) < 1e-12
  linear_law = g(alphas[:, None] ** 2 * depths[None, :] / 48)
  # L at alpha_i and 2L at alpha_{i-1} share x = alpha^2 sqrt(L); their ranks
  # g(alpha_i^2 L/48) and g(alpha_{i-1}^2 2L/48) differ, and the spread is at least that
  a2 = alphas ** 2
  pairs = [np.abs(g(a2[1:] * L / 48) - g(a2[:-1] * 2 * L / 48)) for L in depths[:-1]]
  assert f5.grid_spread(alphas, linear_law, depths) >= max(float(p.max()) for p in pairs) - 1e-12
  assert f5.grid_spread(alphas, linear_law, depths) > 0.05
  x = alphas[:, None] ** 2 * np.sqrt(depths)[None, :]
  off_window = np.where((x >= 0.1) & (x <= 10), g(x), g(x) * depths / 384)  # depth-dependent outside
  assert f5.grid_spread(alphas, off_window, depths) > 0.05
  assert f5.grid_spread(alphas, off_window, depths, window=(0.1, 10)) < 1e-12
  coarse = 2.0 ** (np.arange(-9, 5) / 2)   # alpha^2 steps by 2: doubling L moves x half a step
  two = depths[:2]
  assert np.isnan(f5.grid_spread(coarse, g(coarse[:, None] ** 2 * np.sqrt(two)), two))


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



def test_appa2_skip_path_is_lambda_to_the_L(tmp_path):
  """App A.2 (Eq. 13): the order-0 path of prod (lambda I + beta J_l) is lambda^L I for
  every draw and beta; at beta = 1/L and lambda > 1 the skip path carries nearly all
  of the Jacobian; lambda = 1 keeps the skip path at 1."""
  from rankjax._src.studies import runner
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
  rows = {r["item"]: r for r in runner.judged("appa2", a2.CLAIMS, res)}
  assert rows["App A.2: lambda=1.1 explodes at every beta"]["status"] == "match"   # lambda=1.25
  assert rows["App A.2: lambda=0.9 vanishes at small beta"]["status"] == "match"   # lambda=0.8
  with pytest.raises(ValueError, match="beta"):
    a2.run(str(tmp_path), betas=("2",))



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
  from rankjax._src.config import MLPConfig
  from rankjax._src.models.mlp import ResidualMLP
  s = dict(examples=64, input_dim=4, classes=3, probe=8)
  with jax.enable_x64(True):
    cfg = MLPConfig(depth=2, width=4, expansion=1.0, input_dim=4, num_classes=3,
                    param_dtype="float64")
    x, y, probe = a4.make_task(jax.random.PRNGKey(0), s, jnp.float64)
    params = jax.jit(ResidualMLP(cfg).init)(jax.random.PRNGKey(1), x[:1])["params"]
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


def test_table3_walk_steps_agree_at_eps_zero_and_differ_after():
  """Both readings of Table 3's step (geodesic, renormalized Gaussian) leave x fixed at
  eps = 0 (one projection, erank of I - x x^T), and part ways for eps > 0."""
  import jax
  import numpy as np
  from experiments.transforming_rank import table3_projections as t3
  key = jax.random.PRNGKey(0)
  still = [np.asarray(t3.projection_walk_erank(key, 0.0, 16, 8, (8,), kind))
           for kind in t3.STEPS]
  np.testing.assert_allclose(still[0], still[1], rtol=1e-6)
  moving = [np.asarray(t3.projection_walk_erank(key, 0.6, 16, 8, (8,), kind))
            for kind in t3.STEPS]
  assert abs(float(moving[0][0] - moving[1][0])) > 1e-4
  assert {c.item.split(":")[0] for c in t3.CLAIMS.values()} == {"Table 3", t3.RENORMALIZED}
  assert {c.reading for c in t3.CLAIMS.values()} == set(t3.READING.values())   # open item
