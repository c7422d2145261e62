"""sensitivity_bounds.mha_attention_probs (softmax paper Sec 4.1's A_h) against numpy."""
import jax
import numpy as np
import pytest

from rankjax._src.measure.sensitivity_bounds import mha_attention_probs


def _numpy_probs(u, w_q, w_k, tau, causal):
  q, k = np.einsum("td,hdk->htk", u, w_q), np.einsum("td,hdk->htk", u, w_k)
  s = np.einsum("htk,hsk->hts", q, k) / (tau * np.sqrt(w_q.shape[-1]))
  if causal:
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
  e = np.exp(s - s.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
def test_probs_equal_the_formula_in_float64(causal, x64):
  rng = np.random.default_rng(0)
  u, w_q, w_k = rng.normal(size=(5, 6)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 3))
  got = np.asarray(mha_attention_probs(u, w_q, w_k, 1.3, causal=causal))
  np.testing.assert_allclose(got, _numpy_probs(u, w_q, w_k, 1.3, causal), rtol=1e-12,
                             atol=1e-15)
  traced = jax.jit(lambda c: mha_attention_probs(u, w_q, w_k, 1.3, causal=c))(causal)
  np.testing.assert_allclose(np.asarray(traced), got, rtol=1e-12, atol=1e-15)
