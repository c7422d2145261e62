"""Token similarity (postnorm paper Def 2.1) and the prefix-average matrix C_n."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.measure import similarity as sim


def _numpy_tsim(x_NxD: np.ndarray) -> float:
  """Independent reference: ||Pi X||_F^2 / ||X||_F^2 with an explicit Pi matrix."""
  n = x_NxD.shape[0]
  pi = np.full((n, n), 1.0 / n)
  return float(np.sum((pi @ x_NxD) ** 2) / np.sum(x_NxD**2))


def test_identical_rows_give_one(x64):
  row = np.random.default_rng(0).normal(size=(7,))
  x = np.tile(row, (5, 1))
  assert float(sim.token_similarity(x)) == pytest.approx(1.0, abs=1e-14)


def test_rows_summing_to_zero_give_zero(x64):
  x = np.random.default_rng(1).normal(size=(6, 9))
  x = x - x.mean(axis=0, keepdims=True)
  assert abs(float(sim.token_similarity(x))) < 1e-14


@pytest.mark.parametrize("n,d", [(4, 4), (8, 32)])
def test_orthogonal_equal_norm_rows_give_one_over_n(x64, n, d):
  q, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(d, n)))
  x = 3.0 * q.T                                        # n orthogonal rows, norm 3
  assert float(sim.token_similarity(x)) == pytest.approx(1.0 / n, rel=1e-12)


def test_permutation_and_scale_invariance(x64):
  rng = np.random.default_rng(3)
  x = rng.normal(size=(10, 6)) + 0.5
  t = float(sim.token_similarity(x))
  assert t == pytest.approx(_numpy_tsim(x), rel=1e-12)
  assert float(sim.token_similarity(x[rng.permutation(10)])) == pytest.approx(t, rel=1e-12)
  assert float(sim.token_similarity(-123.4 * x)) == pytest.approx(t, rel=1e-12)


def test_batched_jit_and_float32():
  x = np.random.default_rng(4).normal(size=(2, 3, 5, 4)).astype(np.float32)
  t = jax.jit(sim.token_similarity)(x)
  assert t.shape == (2, 3) and t.dtype == jnp.float32
  ref = np.array([[_numpy_tsim(x[i, j].astype(np.float64)) for j in range(3)] for i in range(2)])
  np.testing.assert_allclose(np.asarray(t), ref, rtol=1e-5)


def test_zero_matrix_is_zero_with_finite_gradient():
  assert float(sim.token_similarity(jnp.zeros((3, 4)))) == 0.0
  g = jax.grad(lambda x: sim.token_similarity(x))(jnp.zeros((3, 4)))
  assert bool(jnp.all(jnp.isfinite(g)))


def test_prefix_average_matrix(x64):
  n = 6
  c = np.asarray(sim.prefix_average_matrix(n, jnp.float64))
  ref = np.array([[1.0 / i if i >= j else 0.0 for j in range(1, n + 1)]
                  for i in range(1, n + 1)])
  np.testing.assert_allclose(c, ref, rtol=0, atol=0)
  np.testing.assert_allclose(c.sum(axis=1), 1.0, rtol=1e-15)
  # App C.2 identities: ||C_n||_F^2 = H_n, ||Pi C_n||_F^2 = 2 - H_n / n.
  h = sum(1.0 / k for k in range(1, n + 1))
  assert np.sum(c**2) == pytest.approx(h, rel=1e-14)
  assert np.sum((np.full((n, n), 1.0 / n) @ c) ** 2) == pytest.approx(2 - h / n, rel=1e-14)


def test_batch_mean_and_by_name():
  rng = np.random.default_rng(5)
  x_LxBxNxD = rng.normal(size=(3, 4, 5, 6)).astype(np.float32)
  per = np.array([[_numpy_tsim(x_LxBxNxD[l, b].astype(np.float64)) for b in range(4)]
                  for l in range(3)])
  got = sim.batch_mean_token_similarity(x_LxBxNxD)
  np.testing.assert_allclose(np.asarray(got), per.mean(axis=1), rtol=1e-5)
  got0 = sim.batch_mean_token_similarity(np.moveaxis(x_LxBxNxD, 1, 0), batch_axis=0)
  np.testing.assert_allclose(np.asarray(got0), per.mean(axis=1), rtol=1e-5)
  with pytest.raises(ValueError):
    sim.batch_mean_token_similarity(x_LxBxNxD, batch_axis=-2)

  tree = {"layers": {"x1": (x_LxBxNxD,), "logits": np.zeros((4, 5))}, "y1": x_LxBxNxD}
  out = sim.similarity_by_name(tree)
  assert set(out) == {"layers", "y1"} and set(out["layers"]) == {"x1"}
  np.testing.assert_allclose(np.asarray(out["layers"]["x1"][0]), per.mean(axis=1), rtol=1e-5)
  only = sim.similarity_by_name(tree, names=("x1",))
  assert set(only) == {"layers"} and set(only["layers"]) == {"x1"}
  assert sim.similarity_by_name({"probs": x_LxBxNxD}, names=("x1",)) == {}
