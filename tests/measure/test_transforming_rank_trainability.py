"""The trainability experiment (Transforming Rank Fig 6, 13, 16, Table 5): the vmapped
Adam trainer, the maximum-stable-learning-rate rule (App B.4) and a smoke run."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.transforming_rank import fig6_trainability as f6
from experiments.transforming_rank import reproduce
from rankjax._src.config import MLPConfig
from rankjax._src.data import images
from rankjax._src.measure import jacobians
from rankjax._src.models.mlp import ResidualMLP


def _toy_data(n: int, m: int, dim: int, classes: int, dtype) -> f6.ImageArrays:
  rng = np.random.default_rng(0)
  return f6.ImageArrays("toy", rng.standard_normal((n, dim)).astype(dtype),
                        rng.integers(0, classes, n).astype(np.int32),
                        rng.standard_normal((m, dim)).astype(dtype),
                        rng.integers(0, classes, m).astype(np.int32), classes)


def test_unit_params_match_the_model_layout():
  cfg = MLPConfig(depth=3, width=8, expansion=1.0, input_dim=12, num_classes=5)
  model_shapes = jax.eval_shape(ResidualMLP(cfg).init, jax.random.PRNGKey(0),
                                jnp.zeros((2, 12)))["params"]
  ours = f6.init_unit_params(cfg, 0)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), model_shapes) == jax.tree.map(
      lambda a: (a.shape, jnp.dtype(a.dtype)), ours)
  scaled = f6.scale_blocks(ours, 3.0)
  np.testing.assert_array_equal(scaled["blocks"]["w_up"], 3.0 * ours["blocks"]["w_up"])
  np.testing.assert_array_equal(scaled["w_in"], ours["w_in"])


def test_vmapped_sweep_equals_a_plain_optax_loop(x64):
  """One (alpha, lr) of the vmapped sweep == an unvmapped optax.adam loop, in float64."""
  cfg = MLPConfig(depth=3, width=8, expansion=1.0, norm_position="post",
                  input_dim=12, num_classes=4, param_dtype="float64")
  data = _toy_data(64, 40, 12, 4, np.float64)
  alphas, lrs, steps, batch = (0.5, 2.0), (1e-3, 3e-2), 12, 16
  cell = f6.run_cell(cfg, data, alphas, lrs, seeds=1, steps=steps, batch=batch, seed0=7)
  assert cell["accuracy"].shape == (2, 2, 1) and cell["losses"].shape == (2, 2, 1, steps)

  i, t = 1, 1   # alpha = 2, lr = 3e-2
  model = ResidualMLP(cfg)
  params = f6.scale_blocks(jax.tree.map(jnp.asarray, f6.init_unit_params(cfg, 7)), alphas[i])
  opt = optax.adam(lrs[t])
  opt_state = opt.init(params)
  order = f6.batch_order(7, steps, batch, 64)
  losses = []

  @jax.jit
  def step(params, opt_state, x, y):
    def loss_of(p):
      logits = model.apply({"params": p}, x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_of)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  for idx in order:   # a plain Python loop, one jitted update at a time
    params, opt_state, loss = step(params, opt_state, data.x_train_NxD[idx],
                                   data.y_train_N[idx])
    losses.append(float(loss))
  logits = model.apply({"params": params}, data.x_test_MxD)
  acc = float(np.mean(np.argmax(np.asarray(logits), -1) == data.y_test_M))

  np.testing.assert_allclose(cell["losses"][i, t, 0], losses, rtol=1e-10, atol=1e-12)
  assert cell["accuracy"][i, t, 0] == pytest.approx(acc, abs=1e-12)
  assert bool(cell["finite"][i, t, 0])
  assert losses[-1] < losses[0]


def test_max_stable_lr_rule():
  """App B.4: the largest eta with accuracy >= 0.4; NaN (Table 5's dash) when none."""
  lrs = f6.PAPER_LRS   # 3e-5 ... 1e-2
  assert f6.max_stable_lr(lrs, [0.5, 0.6, 0.7, 0.72, 0.71, 0.70]) == 1e-2
  assert f6.max_stable_lr(lrs, [0.5, 0.6, 0.7, 0.4, 0.2, 0.1]) == 1e-3   # 0.4 counts
  # not monotone in eta, and a diverged (NaN) run: the largest passing rate wins
  assert f6.max_stable_lr(lrs, [0.1, 0.5, 0.3, 0.2, 0.41, float("nan")]) == 3e-3
  assert math.isnan(f6.max_stable_lr(lrs, [0.1, 0.2, 0.39, 0.1, 0.1, 0.1]))
  # order of the sweep does not matter
  assert f6.max_stable_lr(lrs[::-1], [0.1, 0.1, 0.5, 0.6, 0.7, 0.7]) == 1e-3
  assert f6.max_stable_lr((1e-3, 1e-2), (0.9, 0.35), threshold=0.3) == 1e-2


def test_init_rank_is_the_full_study_at_the_grid_depths():
  """Fig 6a,c's init ranks, spectra taken at the grid's depths only, are the every-layer
  study's erank/d at those layers of the same network (an independent call)."""
  key, alphas, depths = jax.random.key(5), (0.5, 2.0), (2, 6)
  got = f6.init_rank(8, 6, "pre", alphas, depths, key)
  cfg = MLPConfig(depth=6, width=8, expansion=1.0, norm_position="pre")
  full = np.array([jacobians.make_study_fn(cfg)(key, a, 1.0)["erank"].mean(axis=(0, 1))
                   for a in alphas])
  assert got.shape == (2, 2) and np.all((got > 0) & (got <= 1))
  np.testing.assert_allclose(got, full[:, [1, 5]], rtol=1e-5)


def test_registered_with_aliases():
  assert reproduce.STUDY.resolve("fig13,fig16,table5") == ["fig6"]
  assert reproduce.EXPERIMENTS["fig6"] == f6.NAME


@pytest.mark.slow   # the experiment end to end (~5 s); its sweep is fast above
def test_smoke_run_writes_figure_and_names_the_data_set(tmp_path):
  res = f6.run(str(tmp_path), width=8, batch=16, steps=3, train_examples=64,
               test_examples=32, alphas=(1.0,), depths=(2,), placements=("post",),
               lrs=(1e-3, 1e-2), rank_width=8, fig16_depths=())
  assert (tmp_path / f"{f6.NAME}.png").is_file()
  saved = json.loads((tmp_path / f"{f6.NAME}.json").read_text())
  assert saved["dataset"] == res["dataset"] in images.IMAGE_SETS
  assert saved["train_examples"] == 64 and saved["test_examples"] == 32
  grid = saved["grid"]["post"]
  assert np.shape(grid["best_accuracy"]) == (1, 1) and np.shape(grid["erank"]) == (1, 1)
  assert 0.0 <= grid["best_accuracy"][0][0] <= 1.0
  # no cell of the paper's grid (depth 2 only): no claim is judged; the set used is in
  # the result (above) and in the note of every accuracy row of a grid that has them
  assert res["measured"] == []


def _synthetic_grid(acc_AxLxTxS: np.ndarray) -> dict:
  """A fig6_grid-shaped result of the given accuracies (init ranks made up)."""
  a, l = acc_AxLxTxS.shape[:2]
  mean = acc_AxLxTxS.mean(axis=-1)
  return {p: {"accuracy": acc_AxLxTxS, "best_accuracy": mean.max(axis=-1),
              "max_stable_lr": np.array([[f6.max_stable_lr(f6.PAPER_LRS, mean[i, j])
                                          for j in range(l)] for i in range(a)]),
              "erank": np.linspace(0.01, 0.5, a * l).reshape(a, l)}
          for p in ("pre", "post")}


def test_rows_have_one_value_per_network_when_a_cell_has_several():
  """quick_seeds3 (issue 53 item 4): each trained row has a value per network (that
  network's best over the sweep, its own stable rate), judged on their mean; with one
  network the rows are the one-network values (no seeds)."""
  s = {**f6.SCALES["quick"], "seeds": 3, "depths": (12, 384), "alphas": (0.5, 1.0)}
  rng = np.random.default_rng(0)
  acc = rng.uniform(0.0, 1.0, (2, 2, len(f6.PAPER_LRS), 3))
  acc[1, 1] = 0.1                      # alpha=1, L=384 fails in every network
  acc[0, :, :, 2] = 0.2                # network 2 fails everywhere at alpha=0.5
  rows = {r["item"]: r for r in f6.measured_values(s, "digits", _synthetic_grid(acc), {})}
  half = rows["Fig 6d: Post-Norm alpha=0.5 trains at every depth"]
  assert half["seeds"] == [0, 1, 2]
  np.testing.assert_allclose(half["values"], acc[0].max(axis=1).min(axis=0))
  assert half["values"][2] == 0.2
  fails = rows["Fig 6d: Post-Norm alpha=1 fails at L=384"]
  assert fails["values"] == [0.1, 0.1, 0.1]
  t5 = rows["Table 5: Post-Norm alpha=0.5, L=12"]
  assert len(t5["values"]) == 3 and np.isnan(t5["values"][2])   # network 2: no stable lr
  for k in range(2):
    assert t5["values"][k] == math.log10(f6.max_stable_lr(f6.PAPER_LRS, acc[0, 0, :, k]))
  one = {**s, "seeds": 1}
  rows1 = {r["item"]: r for r in f6.measured_values(one, "digits", _synthetic_grid(acc[..., :1]),
                                                    {})}
  assert rows1["Fig 6d: Post-Norm alpha=0.5 trains at every depth"]["seeds"] is None
  assert rows1["Fig 6d: Post-Norm alpha=0.5 trains at every depth"]["values"] == \
      float(acc[0, :, :, 0].max(axis=1).min())
  assert f6.SCALES["quick_seeds3"] == {**f6.SCALES["quick"], "seeds": 3}
