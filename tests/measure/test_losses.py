"""Cross-entropy and the frequency loss (postnorm paper Def 3.7, Thm 3.8, Sec 4.3)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.measure import losses


def _entropy_np(labels: np.ndarray) -> float:
  """Independent reference: entropy (nats) of the histogram of ``labels``."""
  _, counts = np.unique(np.asarray(labels).ravel(), return_counts=True)
  p = counts / counts.sum()
  return float(-(p * np.log(p)).sum())


def _labels(shape, vocab, seed=0):
  rng = np.random.default_rng(seed)
  zipf = 1.0 / np.arange(1, vocab + 1)                   # skewed, like text
  return rng.choice(vocab, size=shape, p=zipf / zipf.sum())


def test_cross_entropy_matches_numpy_and_is_stable(x64):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)) * 3
  labels = rng.integers(0, 7, size=(2, 5))
  lp = logits - logits.max(-1, keepdims=True)
  lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
  ref = -np.take_along_axis(lp, labels[..., None], -1).mean()
  assert float(losses.cross_entropy(logits, labels)) == pytest.approx(ref, rel=1e-12)
  # Shift invariance and no overflow at huge logits, in float32 and bfloat16 inputs.
  big = (logits + 1e4).astype(np.float32)
  assert float(losses.cross_entropy(big, labels)) == pytest.approx(ref, rel=1e-3)
  ce_bf16 = losses.cross_entropy(jnp.asarray(logits, jnp.bfloat16), labels)
  assert ce_bf16.dtype == jnp.float32 and float(ce_bf16) == pytest.approx(ref, rel=3e-2)


def test_cross_entropy_mask(x64):
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 4, 6))
  labels = rng.integers(0, 6, size=(3, 4))
  mask = rng.integers(0, 2, size=(3, 4)).astype(float)
  mask[0, 0] = 1.0
  per_token = np.asarray(jax.nn.logsumexp(logits, -1)) - np.take_along_axis(
      logits, labels[..., None], -1)[..., 0]
  ref = (per_token * mask).sum() / mask.sum()
  assert float(losses.cross_entropy(logits, labels, mask)) == pytest.approx(ref, rel=1e-12)
  assert float(losses.cross_entropy(logits, labels, np.zeros((3, 4)))) == 0.0
  ce = jax.jit(losses.cross_entropy)(logits, labels, mask)
  assert float(ce) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("vocab_size", [None, 50])
def test_frequency_loss_is_label_entropy(x64, vocab_size):
  y = _labels((4, 64), 40)
  agg = float(losses.frequency_loss(y, "aggregate", vocab_size))
  per = float(losses.frequency_loss(y, "per_sequence", vocab_size))
  assert agg == pytest.approx(_entropy_np(y), rel=1e-12)
  assert per == pytest.approx(np.mean([_entropy_np(row) for row in y]), rel=1e-12)
  assert per < agg                                   # concavity of entropy (Sec 4.3)
  # One sequence: both modes agree with Def 3.7.
  assert float(losses.frequency_loss(y[0], "per_sequence", vocab_size)) == pytest.approx(
      float(losses.frequency_loss(y[0], "aggregate", vocab_size)), rel=1e-12)


def test_frequency_loss_special_cases_and_jit():
  assert float(losses.frequency_loss(np.full((3, 9), 5))) == 0.0    # one label: 0 nats
  y = np.arange(16).reshape(2, 8)                                     # all distinct
  assert float(losses.frequency_loss(y)) == pytest.approx(np.log(16), rel=1e-6)
  assert float(losses.frequency_loss(y, "per_sequence")) == pytest.approx(np.log(8), rel=1e-6)
  f = jax.jit(losses.frequency_loss, static_argnames=("mode", "vocab_size"))
  assert float(f(y, mode="per_sequence")) == pytest.approx(np.log(8), rel=1e-6)
  with pytest.raises(ValueError):
    losses.frequency_loss(y, "mean")
  counts = losses.label_counts(np.array([[0, 1, 1, 70]]), 5, "per_sequence")
  np.testing.assert_array_equal(np.asarray(counts), [[1, 2, 0, 0, 0]])


@pytest.mark.parametrize("mode", ["aggregate", "per_sequence"])
def test_frequency_logits_attain_frequency_loss(x64, mode):
  """Thm 3.8 / App E.1: predicting p_freq at every position gives CE = L_freq."""
  vocab = 30
  y = _labels((3, 50), vocab, seed=2)
  logits_V = losses.frequency_logits(y, vocab, mode)
  logits = (jnp.broadcast_to(logits_V, y.shape + (vocab,)) if mode == "aggregate"
            else jnp.broadcast_to(logits_V[:, None, :], y.shape + (vocab,)))
  ce = float(losses.cross_entropy(logits, y))
  assert np.isfinite(ce)
  assert ce == pytest.approx(float(losses.frequency_loss(y, mode)), rel=1e-12)
  # p_freq is the best shared distribution: any perturbation raises the loss (App E.1).
  rng = np.random.default_rng(3)
  finite = jnp.where(jnp.isfinite(logits), logits, -1e3)
  for _ in range(5):
    shifted = finite + 0.05 * rng.normal(size=(vocab,))
    assert float(losses.cross_entropy(shifted, y)) > ce


def test_collapsed_model_cannot_beat_frequency_loss(x64):
  """Thm 3.8(i) with epsilon = 0: identical hidden rows give CE >= L_freq."""
  rng = np.random.default_rng(4)
  y = _labels((64,), 20, seed=5)
  h = np.tile(rng.normal(size=(1, 8)), (64, 1))          # rank-one, t_sim = 1
  freq = float(losses.frequency_loss(y))
  for _ in range(20):
    w = rng.normal(size=(8, 20)) * rng.uniform(0.1, 5)
    assert float(losses.cross_entropy(h @ w, y)) >= freq - 1e-12


def test_the_one_token_nll_equals_optax(x64):
  """models.lm_head.token_nll (behind head_cross_entropy, cross_entropy and the training
  tasks' losses) against a peer library's per-token cross-entropy, in float64."""
  import optax

  from rankjax._src.models.lm_head import token_nll
  rng = np.random.default_rng(3)
  z, y = jnp.asarray(rng.normal(size=(4, 5, 11)) * 7.0), jnp.asarray(rng.integers(0, 11, (4, 5)))
  np.testing.assert_allclose(np.asarray(token_nll(z, y)),
                             np.asarray(optax.softmax_cross_entropy_with_integer_labels(z, y)),
                             rtol=1e-13, atol=1e-13)
