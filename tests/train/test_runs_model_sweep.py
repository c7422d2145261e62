"""Model scalars swept in one program (``rankjax._src.train.runs``; ``--sweep model.beta=...``).

The model fields marked ``run_field(per_run=True)`` (MLP alpha and beta; transformer
beta and tau) may differ between the runs of one program. References are
single runs (``loop.train``) of the same configs, which read the values as Python
floats: a run of the program follows its single run up to the order of float32
reductions (``jax.vmap``), the tolerance of ``tests/train/test_runs.py`` (relative 1e-5
on every logged loss); its parameters at init are its single run's bit for bit (each
run is initialized from its own concrete config). The LM and CLI tests are slow-marked
(CI's slow stage); the default suite keeps the parsing, grouping, the MLP equivalence
and the refusals.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from rankjax._src import config as config_lib
from rankjax import load_run
from rankjax._src.errors import UserError
from rankjax._src.models import blocks
from rankjax._src.train import loop as loop_lib
from rankjax._src.train import runs
from rankjax._src.train.tasks import make_task
from tests.train.conftest import tiny_lm, tiny_mlp
from tests.train.test_runs import RTOL, losses

QUIET = dict(total_steps=3, checkpoint_every=3, diag_every=0, eval_every=0, log_every=1)


def _model(cfg, **kw):
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **kw))


def test_model_scalars_parse_expand_and_group():
  mlp, lm = tiny_mlp(**QUIET), tiny_lm(**QUIET)
  assert runs.parse_sweep(["model.alpha=0.5,2", "model.beta=1,2"], mlp) == {
      "model.alpha": ["0.5", "2"], "model.beta": ["1", "2"]}
  assert {"model.beta", "model.tau"} <= set(runs.sweepable(lm))
  assert "model.init_scale" in runs.sweepable(lm)     # init only
  # a field that changes a shape, or that the model branches on (prefix_avg_removal,
  # the dropout rates) or reads as a static number (norm_eps, rope), is not per-run;
  # alpha is the MLP's, not the LM's
  for cfg, bad in ((lm, "model.alpha=1,2"), (lm, "model.prefix_avg_removal=0,0.1"),
                   (lm, "model.norm_eps=1e-6,1e-5"),
                   (lm, "model.dropout_rate=0,0.1"), (lm, "model.num_layers=1,2"),
                   (mlp, "model.width=8,16"), (mlp, "model.skip_every=0,1")):
    with pytest.raises(UserError, match="--sweep model"):
      runs.parse_sweep([bad], cfg)
  out = runs.expand(mlp, "/w", [0, 1], {"model.beta": ["0.5", "2"]})
  assert list(out) == ["/w/model.beta_0.5/seed_0", "/w/model.beta_0.5/seed_1",
                       "/w/model.beta_2/seed_0", "/w/model.beta_2/seed_1"]
  assert [(c.model.beta, c.seed) for c in out.values()] == [(0.5, 0), (0.5, 1), (2.0, 0),
                                                            (2.0, 1)]
  # step_shape sees model.<field>: swept scalars group, a width or a branch does not
  cfgs = {"a": mlp, "b": _model(mlp, alpha=2.0), "c": _model(mlp, beta=0.5, alpha=0.5),
          "d": _model(mlp, width=8), "e": dataclasses.replace(_model(mlp, beta=3.0), seed=4)}
  assert runs.group(cfgs) == [["a", "b", "c", "e"], ["d"]]
  lms = {"a": lm, "b": _model(lm, beta=0.5, tau=2.0),
         "c": _model(lm, prefix_avg_removal=0.5)}
  assert runs.group(lms) == [["a", "b"], ["c"]]
  assert config_lib.step_shape(mlp) != config_lib.step_shape(lm)


def test_swept_alpha_and_beta_follow_their_single_runs(tmp_path):
  """Two MLP runs (alpha 1 / 2, beta 1 / 0.5, seeds 0 / 1) in one program: parameters
  at init bit-equal to each single run's, losses within RTOL of each single run's."""
  base = tiny_mlp(**QUIET)
  cfgs = {str(tmp_path / "g" / "a"): base,
          str(tmp_path / "g" / "b"): dataclasses.replace(_model(base, alpha=2.0, beta=0.5),
                                                         seed=1)}
  program = runs.build_program(list(cfgs.values()), loop_lib.build_for_run(base), ())
  assert sorted(program.swept) == ["model.alpha", "model.beta"]
  state = program.init()
  results = runs.train_runs(cfgs)
  assert [(r.status, r.step) for r in results.values()] == [("completed", 3)] * 2
  for i, (workdir, cfg) in enumerate(cfgs.items()):
    single = jax.device_get(loop_lib.build_for_run(cfg).init().params)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(program.take(state, i).params),
                 single)
    loop_lib.train(cfg, tmp_path / f"single{i}")
    np.testing.assert_allclose(losses(workdir), losses(tmp_path / f"single{i}"), rtol=RTOL)
  a, b = (losses(w) for w in cfgs)
  assert not np.allclose(a, b)


@pytest.mark.slow   # the default suite's heaviest (6-15 s): CI runs it in the slow stage
def test_swept_init_scale_gives_each_run_its_single_runs_init():
  """An LM program sweeping init_scale (x1, x4; postnorm Fig 1's variance scales) and
  init_scale_to's matrices: each run's parameters at init are its single run's, bit for
  bit (the step, which rebuilds the initializers with the traced value: the slow LM
  test below)."""
  base = tiny_lm(**QUIET)
  for to in ("all", "value_ffn"):
    one = _model(base, init_scale_to=to)
    cfgs = [one, _model(one, init_scale=4.0)]
    program = runs.build_program(cfgs, loop_lib.build_for_run(one), ())
    assert sorted(program.swept) == ["model.init_scale"]
    state = program.init()
    for i, cfg in enumerate(cfgs):
      single = jax.device_get(loop_lib.build_for_run(cfg).init().params)
      jax.tree.map(np.testing.assert_array_equal,
                   jax.device_get(program.take(state, i).params), single)


@pytest.mark.slow
def test_swept_beta_and_tau_of_an_lm_follow_their_single_runs(tmp_path):
  """Two LM runs (beta 1 / 0.5, tau 1 / 2, init_scale 1 / 2; dropout on) in one program
  follow their single runs."""
  base = tiny_lm(**QUIET)
  cfgs = {str(tmp_path / "a"): base,
          str(tmp_path / "b"): _model(base, beta=0.5, tau=2.0, init_scale=2.0)}
  results = runs.train_runs(cfgs)
  assert [(r.status, r.step) for r in results.values()] == [("completed", 3)] * 2
  for i, (workdir, cfg) in enumerate(cfgs.items()):
    loop_lib.train(cfg, tmp_path / f"single{i}")
    np.testing.assert_allclose(losses(workdir), losses(tmp_path / f"single{i}"), rtol=RTOL)
  a, b = (losses(w) for w in cfgs)
  assert not np.allclose(a, b)


def test_a_tau_sweep_under_a_fixed_scale_kernel_is_refused():
  long = dataclasses.replace(_model(tiny_lm(**QUIET), max_seq_len=128), seq_len=128)
  lm = _kernels(long, attention_impl="splash")     # splash: T a multiple of 128
  with pytest.raises(UserError, match="model.tau: the splash attention kernel takes a fixed "
                     "scale; set model.kernels.attention_impl=xla"):
    runs._check_model_sweep(lm, make_task(lm), ["tau"])
  runs._check_model_sweep(lm, make_task(lm), ["beta"])           # beta: any kernel
  xla = _kernels(lm, attention_impl="xla")
  runs._check_model_sweep(xla, make_task(xla), ["tau"])


def _kernels(cfg, **knobs):
  return _model(cfg, kernels=dataclasses.replace(cfg.model.kernels, **knobs))


def test_a_swept_scalar_the_model_branches_on_is_refused_in_one_line(tmp_path, monkeypatch):
  """A model that branches on a swept value in Python cannot take it traced: the
  program refuses with one line naming the field (a single run still trains)."""
  original = blocks.residual_sublayer

  def branching(h, branch, norm, beta, *args, **kw):
    if beta != 1.0:                     # a Python branch on the value
      h = h + 0.0
    return original(h, branch, norm, beta, *args, **kw)

  monkeypatch.setattr(blocks, "residual_sublayer", branching)
  base = tiny_mlp(**QUIET)
  cfgs = {str(tmp_path / "a"): base, str(tmp_path / "b"): _model(base, beta=0.5)}
  with pytest.raises(UserError, match=r"^--sweep model.beta: the model branches on a swept value") as e:
    runs.train_runs(cfgs)
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_cli_sweeps_a_model_scalar_in_one_program(tmp_path, capsys):
  """``rankjax train --sweep model.beta=0.5,2``: one program, a folder per point, each
  run's config holding its value; a field the model branches on is refused in one line
  (exit 2, nothing written)."""
  from rankjax._src import cli
  config = tmp_path / "c.json"
  tiny_mlp(**{**QUIET, "total_steps": 2, "checkpoint_every": 2}).to_json(config)
  argv = ["train", "--config", str(config), "--workdir", str(tmp_path / "w")]
  assert cli.main(argv + ["--sweep", "model.beta=0.5,2"]) == 0
  assert "2 runs as one program" in capsys.readouterr().out
  assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["model.beta_0.5",
                                                                "model.beta_2"]
  assert [load_run(tmp_path / "w" / f"model.beta_{b}").config.model.beta
          for b in ("0.5", "2")] == [0.5, 2.0]
  bad = ["train", "--config", str(config), "--workdir", str(tmp_path / "x"),
         "--sweep", "model.width=8,16"]
  assert cli.main(bad) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "--sweep model.width" in err
  assert not (tmp_path / "x").exists()


def test_a_traced_beta_keeps_the_branch_dtype_as_a_python_float_does():
  """Under a 16-bit compute dtype a Python float beta is weakly typed (the sum stays
  bf16); a per-run beta (a float32 array) is cast to the branch's dtype, so the
  sublayer's outputs have the single run's dtype and, here, its bits."""
  import jax.numpy as jnp
  h = jnp.linspace(-2.0, 2.0, 16, dtype=jnp.bfloat16).reshape(2, 8)
  branch, norm = (lambda x: x * 3.1), (lambda loc, x: x)
  want = blocks.residual_sublayer(h, branch, norm, 0.3)
  got = jax.jit(lambda b: blocks.residual_sublayer(h, branch, norm, b))(np.float32(0.3))
  for w, g in zip(want, got):
    assert g.dtype == w.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
