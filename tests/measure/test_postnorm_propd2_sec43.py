"""Post-Norm collapse Prop D.2 (residual-norm growth at exact collapse) and Sec 4.3's
aggregate vs per-sequence frequency loss: the identity on a small float64 LM, its
failure off the assumption, the Sec 4.3 comparison on a synthetic run, and the
summary rows' statuses."""
import dataclasses
import types

import numpy as np
import pytest

from experiments.postnorm_collapse import common, reproduce
from experiments.postnorm_collapse import propd2_norm_growth as pd
from experiments.postnorm_collapse import sec43_frequency_reference as s43


def _small_lm():
  mcfg = common.load_config("collapse_post_quick").model
  return dataclasses.replace(mcfg, num_layers=2, d_model=16, num_heads=2, d_ff=24,
                             max_seq_len=8, vocab_size=32)


@pytest.mark.slow   # a model at exact collapse (~6 s); the Sec 4.3 pieces stay fast
def test_prop_d2_identity_at_exact_collapse_of_one_sequence():
  s = pd._summary(pd.exact_collapse(_small_lm(), (5,)))
  for k in ("k1", "k2"):
    assert s[k]["mean_tsim_y"] == pytest.approx(1.0, abs=1e-12)
    # <Y, U> = 0, U = H H^T G (independent formula vs a jvp through the model), and
    # a real parameter step: ||Y(eta)||^2 - ||Y||^2 = eta^2 ||U||^2
    assert s[k]["max_abs_cos"] < 1e-12
    assert s[k]["max_formula_u_rel_err"] < 1e-12
    assert s[k]["max_rel_err_vs_prop_d2"] < 1e-9
    assert s[k]["frac_norm_grows"] == 1.0


@pytest.mark.slow
def test_prop_d2_cross_term_is_not_zero_when_the_batch_mixes_sequences():
  # each sequence collapsed, the batch not: the formula for U still holds (P 1 = 1 per
  # sequence) but the step on W_O / W_2 mixes sequences and <Y, U> != 0
  s = pd._summary(pd.exact_collapse(_small_lm(), (5, 9, 17)))
  for k in ("k1", "k2"):
    assert s[k]["max_formula_u_rel_err"] < 1e-12
    assert s[k]["max_abs_cos"] > 1e-6
    assert s[k]["max_rel_err_vs_prop_d2"] > 1e-5


def _fake_run(loss, last_tsim, diag_steps, logged=None):
  """A run's history; ``logged``: (aggregate, per-sequence) label_frequency metrics."""
  hist = [{"step": i + 1, "loss": x} for i, x in enumerate(loss)]
  if logged is not None:
    for h, a, p in zip(hist, *logged):
      h.update(label_freq_aggregate=a, label_freq_per_sequence=p)
  cfg = types.SimpleNamespace(label_frequency=logged is not None)
  return types.SimpleNamespace(history=hist, config=cfg, diagnostic_steps=np.asarray(diag_steps),
                               diagnostics={"postnorm/last_tsim": np.asarray(last_tsim)})


def test_sec43_compare_picks_the_reference_the_loss_meets(monkeypatch):
  agg = np.array([3.0, 3.1, 3.2, 3.3, 3.4, 3.5])
  per = agg - 0.4
  loss = np.array([5.0, 4.0, *agg[2:]])       # sits on the batch aggregate from update 3
  run = _fake_run(loss, [0.2, 0.995, 0.999], [1, 3, 5])       # onset at update 3
  import rankjax._src.train.run_reader as rr
  monkeypatch.setattr(rr, "load_run", lambda wd: run)
  monkeypatch.setattr(s43, "batch_references", lambda cfg, n: {
      "aggregate_batch": agg[:n], "per_sequence_batch": per[:n]})
  out = s43.compare("fake", stream_freq=3.25)
  assert out["onset_step"] == 3 and out["updates_after_onset"] == 4
  assert out["closest"] == "aggregate_batch"
  assert out["aggregate_batch"]["mean_abs_gap"] == pytest.approx(0.0)
  assert out["per_sequence_batch"]["mean_gap"] == pytest.approx(0.4)
  assert out["aggregate_stream"]["mean_gap"] == pytest.approx(np.mean(agg[2:]) - 3.25)
  # no sustained collapse: no comparison
  monkeypatch.setattr(rr, "load_run", lambda wd: _fake_run(loss, [0.2, 0.995, 0.5], [1, 3, 5]))
  assert s43.compare("fake", 3.25) == {"onset_step": None, "updates_after_onset": 0}
  # a run that logged its labels' frequency losses (label_frequency): read, not replayed
  monkeypatch.setattr(rr, "load_run", lambda wd: _fake_run(loss, [0.2, 0.995, 0.999], [1, 3, 5],
                                                           logged=(agg, per)))
  monkeypatch.setattr(s43, "batch_references", lambda cfg, n: pytest.fail("replayed"))
  assert s43.compare("fake", stream_freq=3.25) == out


def test_sec43_per_sequence_reference_is_below_the_aggregate():
  cfg = common.load_config("collapse_post_quick", ["batch_size=4"])
  refs = s43.batch_references(cfg, 2)
  assert refs["aggregate_batch"].shape == (2,)
  assert np.all(refs["per_sequence_batch"] < refs["aggregate_batch"])    # concavity


def test_propd2_and_sec43_are_training_experiments():
  assert {"propd2", "sec43"} <= set(reproduce.PAPER_TRAINING)
