"""Block Jacobians, path sums and the Jacobian study (Transforming Rank, Sec 2-4, App A-B)."""
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankjax._src.config import MLPConfig
from rankjax._src.measure import jacobians, paths, representations, spectra
from rankjax._src.models import blocks as blocks_lib
from rankjax._src.models.mlp import ResidualMLP


pytestmark = pytest.mark.usefixtures("single_blas_thread")


BLOCK_CONFIGS = [
    dict(norm_position="pre"),
    dict(norm_position="post"),
    dict(norm_position="peri", norm_op="layer", norm_gain=True, norm_eps=1e-3),
    dict(norm_position="pre", r_norm="detached_rms", b_norm="mean", activation="gelu"),
    dict(norm_position="pre", skip_every=3, activation="swiglu"),
    dict(norm_position="post", skip_every=0, branch_matrices=1, activation="tanh"),
]
# fast: a Pre-Norm block, a gained LayerNorm, and no skip with one tanh branch matrix
# (Post-Norm); the other configurations run with -m slow
_FAST_BLOCK_CONFIGS = (0, 2, 5)


@pytest.mark.parametrize("kw", [kw if i in _FAST_BLOCK_CONFIGS else
                                pytest.param(kw, marks=pytest.mark.slow)
                                for i, kw in enumerate(BLOCK_CONFIGS)],
                         ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_block_jacobians_match_network_jacfwd(x64, kw):
  d = 8
  cfg = MLPConfig(depth=4, width=d, expansion=2.0, param_dtype="float64", **kw)
  model = ResidualMLP(cfg)
  x0 = jax.random.normal(jax.random.PRNGKey(1), (d,), jnp.float64)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), x0[None])
  blocks = variables["params"]["blocks"]
  if cfg.norm_gain:   # move the gains off one so their Jacobian factor is exercised
    blocks = {k: (v * (1.0 + 0.3 * jax.random.normal(jax.random.PRNGKey(2), v.shape, v.dtype))
                  if k.endswith("scale") else v) for k, v in blocks.items()}
    variables = {"params": {**variables["params"], "blocks": blocks}}

  @jax.jit
  def compute(variables, x0):
    blocks = variables["params"]["blocks"]
    ref = jax.jacfwd(lambda x: model.apply(variables, x[None])[0])(x0)
    _, inter = model.apply(variables, x0[None], capture=True, mutable="intermediates")
    bj = jacobians.block_jacobians(blocks, x0, cfg)
    by_jacfwd = jacobians.block_jacobians(blocks, x0, cfg, method="jacfwd")
    p_2 = jax.tree.map(lambda v: v[2], blocks)
    jac_2 = jax.jacfwd(lambda h: blocks_lib.block_fn(p_2, h, h, True, cfg))(bj.stream[2])
    return (ref, inter["intermediates"]["stream"][0][:, 0], bj,
            jacobians.input_output_jacobians(bj, cfg), by_jacfwd, jac_2)

  ref, stream, bj, ts, by_jacfwd, jac_2 = compute(variables, x0)
  np.testing.assert_allclose(np.asarray(ts[-1]), np.asarray(ref), atol=1e-12 * np.abs(ref).max())
  np.testing.assert_allclose(np.asarray(bj.stream[1:]), np.asarray(stream), atol=1e-12)
  for a, b in zip(bj[:3], by_jacfwd[:3]):
    if a is None:
      assert b is None
    else:
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-12)
  if cfg.skip_every == 1:   # each block: K_l + B_l is the Jacobian of block_fn
    k_2 = np.eye(d) if bj.skip is None else np.asarray(bj.skip[2])
    np.testing.assert_allclose(k_2 + np.asarray(bj.branch[2]), np.asarray(jac_2), atol=1e-12)


def _brute_force_orders(k_LxDxD, b_LxDxD):
  num, d, _ = b_LxDxD.shape
  sums = np.zeros((num + 1, d, d))
  for choice in itertools.product([0, 1], repeat=num):
    prod = np.eye(d)
    for l, c in enumerate(choice):
      prod = (b_LxDxD[l] if c else k_LxDxD[l]) @ prod
    sums[sum(choice)] += prod
  return sums


@pytest.mark.parametrize("num_chunks", [   # fast: one chunk and several; the rest slow
    1, 3, pytest.param(paths.LARGE_NUM_CHUNKS, marks=pytest.mark.slow),
    pytest.param(None, marks=pytest.mark.slow)])
def test_path_sums_equal_brute_force_subset_sums(x64, num_chunks):
  num, d, beta = 8, 6, 0.7
  rng = np.random.default_rng(0)
  j = rng.standard_normal((num, d, d)) / np.sqrt(d)
  k = np.eye(d) + 0.3 * rng.standard_normal((num, d, d)) / np.sqrt(d)
  b = rng.standard_normal((num, d, d)) / np.sqrt(d)

  ps = jax.jit(lambda j: paths.path_sums(j, beta, num_chunks=num_chunks))(jnp.asarray(j))
  ref = _brute_force_orders(np.broadcast_to(np.eye(d), j.shape), beta * j)
  mu = np.linalg.norm(ref, axis=(-2, -1))
  np.testing.assert_allclose(np.exp(np.asarray(ps.log_norm)), mu, rtol=1e-12)
  np.testing.assert_allclose(np.exp(np.asarray(ps.log_norm))[:, None, None] * np.asarray(ps.unit),
                             ref, atol=1e-12 * mu.max())
  np.testing.assert_allclose(np.linalg.norm(np.asarray(ps.unit), axis=(-2, -1)), 1.0, rtol=1e-12)

  ps_kb = jax.jit(lambda k, b: paths.path_sums(k, b, num_chunks=num_chunks))(
      jnp.asarray(k), jnp.asarray(b))
  ref_kb = _brute_force_orders(k, b)
  np.testing.assert_allclose(np.exp(np.asarray(ps_kb.log_norm)),
                             np.linalg.norm(ref_kb, axis=(-2, -1)), rtol=1e-12)
  np.testing.assert_allclose(np.asarray(paths.reconstruct(ps_kb)), ref_kb.sum(0), atol=1e-12)


def test_path_sums_span_hundreds_of_decades(x64):
  num, d = 48, 5
  j = jax.random.normal(jax.random.PRNGKey(0), (num, d, d), jnp.float64)
  fn = jax.jit(lambda j, beta: paths.path_sums(j, beta, num_chunks=1))
  base = fn(j, 1.0)
  tiny = fn(j, 1e-12)
  ks = np.arange(num + 1)
  assert np.all(np.isfinite(np.asarray(tiny.log_norm)))
  np.testing.assert_allclose(np.asarray(tiny.log_norm),
                             np.asarray(base.log_norm) + ks * np.log(1e-12), rtol=1e-12)
  assert np.asarray(tiny.log_norm)[-1] < -500 * np.log(10)  # beta^48 ~ 1e-576
  # float32: the same masses without overflow or underflow
  tiny32 = fn(j.astype(jnp.float32), jnp.float32(1e-12))
  np.testing.assert_allclose(np.asarray(tiny32.log_norm), np.asarray(tiny.log_norm), rtol=1e-4)


def test_order_statistics(x64):
  log_norm = jnp.log(jnp.asarray([1.0, 2.0, 1.0, 0.0]))
  ps = paths.PathSums(log_norm, jnp.zeros((4, 2, 2)))
  np.testing.assert_allclose(np.asarray(paths.order_profile(ps)), [0.25, 0.5, 0.25, 0.0])
  np.testing.assert_allclose(float(paths.mean_order(ps)), 1.0)
  g = jnp.stack([jnp.eye(3), -jnp.eye(3)])
  acc, unc = paths.accumulated_branch(g)
  np.testing.assert_allclose(np.asarray(acc), [1.0, 0.0], atol=1e-15)
  np.testing.assert_allclose(np.asarray(unc), [1.0, np.sqrt(2.0)])


@pytest.mark.parametrize("dtype,tol,position", [
    ("float64", 1e-12, "pre"), ("float32", 1e-4, "post"),
    pytest.param("float64", 1e-12, "post", marks=pytest.mark.slow),
    pytest.param("float32", 1e-4, "pre", marks=pytest.mark.slow)])
def test_path_sum_reconstruction_at_depth_48(request, position, dtype, tol):
  """App A.1: sum_k S_k against autodiff of the whole network, L=48, d=64."""
  if dtype == "float64":
    request.getfixturevalue("x64")
  cfg = MLPConfig(depth=48, width=64, norm_position=position, param_dtype=dtype)
  blocks = jacobians.init_blocks(cfg, jax.random.PRNGKey(0))
  h0 = jax.random.normal(jax.random.PRNGKey(1), (64,), jnp.dtype(dtype))

  @jax.jit
  def errors(blocks, h0):
    bj = jacobians.block_jacobians(blocks, h0, cfg)
    ps = paths.path_sums(bj.skip, bj.branch, num_chunks=2)
    return (paths.reconstruction_error(ps, jacobians.network_jacobian(blocks, h0, cfg)),
            paths.mean_order(ps))

  err, mean_k = errors(blocks, h0)
  assert err.dtype == jnp.dtype(dtype)
  assert float(err) < tol, float(err)
  assert 1.0 < float(mean_k) < 48.0


def test_study_fields_and_alpha_beta_symmetry():
  """Sec 3 / App A.4: with ReLU, (alpha, beta) enter only through beta * alpha^M."""
  cfg = MLPConfig(depth=6, width=8, expansion=2.0)
  study = lambda cfg, **kw: jacobians.mlp_jacobian_study(
      cfg, jax.random.PRNGKey(0), num_inputs=2, num_seeds=2, num_chunks=1, **kw)
  st = study(cfg)
  assert st.erank.shape == st.stable_rank.shape == st.branch_to_skip.shape == (6,)
  assert st.order_log_mass.shape == st.stream_rms.shape == (7,)
  assert np.all((np.asarray(st.erank) > 0) & (np.asarray(st.erank) <= 1))
  np.testing.assert_allclose(float(jnp.sum(st.order_profile)), 1.0, rtol=1e-5)
  assert float(st.reconstruction_error) < 1e-5
  json.dumps(st.to_dict())

  _, samples = study(cfg, return_samples=True)

  @jax.jit
  def direct(key):
    blocks, h0 = jacobians.seed_samples(cfg, key, 2, cfg.alpha)
    ts = jacobians.input_output_jacobians(jacobians.block_jacobians(blocks, h0[1], cfg), cfg)
    return spectra.effective_rank(ts[-1]) / 8

  key1 = jax.random.split(jax.random.PRNGKey(0), 2)[1]
  np.testing.assert_allclose(float(samples["erank"][1, 1, -1]), float(direct(key1)), rtol=1e-5)

  st2 = study(dataclasses.replace(cfg, alpha=2.0, beta=0.25))   # same beta * alpha^2
  np.testing.assert_allclose(np.asarray(st2.erank), np.asarray(st.erank), rtol=2e-5)
  np.testing.assert_allclose(float(st2.mean_order), float(st.mean_order), rtol=2e-5)
  np.testing.assert_allclose(np.asarray(st2.branch_to_skip), np.asarray(st.branch_to_skip),
                             rtol=2e-5)


def test_study_network_reference_uses_the_config_beta(x64):
  """reference="network" differentiates the model with cfg.beta; the DP must match it."""
  cfg = MLPConfig(depth=6, width=8, alpha=1.7, beta=0.3, norm_position="post",
                  param_dtype="float64")
  st = jacobians.mlp_jacobian_study(cfg, jax.random.PRNGKey(0), num_seeds=2,
                                    reference="network", num_chunks=1)
  assert float(st.reconstruction_error) < 1e-12


def test_representation_trace_matches_model(x64):
  cfg = MLPConfig(depth=4, width=6, branch_matrices=1, param_dtype="float64")
  model = ResidualMLP(cfg)
  x = jax.random.normal(jax.random.PRNGKey(0), (9, 6), jnp.float64)
  variables = jax.jit(model.init)(jax.random.PRNGKey(1), x)

  @jax.jit   # one program: the model's captured stream and the traced representations
  def compute(variables, x):
    _, inter = model.apply(variables, x, capture=True, mutable="intermediates")
    return (inter["intermediates"]["stream"][0],
            representations.trace_representations(variables["params"]["blocks"], x, cfg,
                                                  [0, 2, 4]))

  stream, tr = compute(variables, x)
  np.testing.assert_allclose(np.asarray(tr.stream_mean[1:]), np.asarray(stream.mean(1)), atol=1e-12)
  np.testing.assert_allclose(np.asarray(tr.branch_mean),
                             np.asarray(jnp.diff(jnp.concatenate([x[None], stream]), axis=0).mean(1)),
                             atol=1e-12)
  np.testing.assert_allclose(np.asarray(tr.singular_values[1]),
                             np.linalg.svd(np.asarray(stream[1]), compute_uv=False), atol=1e-12)


@pytest.mark.parametrize("kw", [dict(branch_matrices=1), dict(norm_position="output",
                                                                activation="tanh")])
def test_backward_stream_matches_autodiff_of_the_network(x64, kw):
  """delta_0 = (dh_L/dh_0)^T delta_L per input; the layer contributions telescope."""
  cfg = MLPConfig(depth=5, width=6, param_dtype="float64", **kw)
  model = ResidualMLP(cfg)
  x = jax.random.normal(jax.random.PRNGKey(0), (7, 6), jnp.float64)
  blocks = jax.jit(model.init)(jax.random.PRNGKey(1), x)["params"]["blocks"]
  delta_L = jax.random.normal(jax.random.PRNGKey(2), (7, 6), jnp.float64)

  @jax.jit   # one program: the library's backward stream and the autodiff reference
  def compute(blocks, x, delta_L):
    out = representations.backward_stream(blocks, x, delta_L, cfg, [0, 3, 5])
    net = lambda r: blocks_lib.stack_forward(blocks, r, cfg)[0]
    delta_0 = jax.vmap(lambda r, g: jax.vjp(net, r)[1](g)[0])(x, delta_L)
    return out, delta_0, blocks_lib.stack_forward(blocks, x, cfg)[1]

  out, delta_0, hs = compute(blocks, x, delta_L)
  np.testing.assert_allclose(out["stream_mean"][0], delta_0.mean(0), atol=1e-12)
  np.testing.assert_allclose(out["stream_mean"][-1], delta_L.mean(0), atol=1e-12)
  np.testing.assert_allclose(out["contribution_mean"].sum(0),
                             delta_0.mean(0) - delta_L.mean(0), atol=1e-12)
  np.testing.assert_allclose(out["singular_values"][0],
                             np.linalg.svd(np.asarray(delta_0), compute_uv=False), atol=1e-12)
  frac = np.sum(delta_0.mean(0) ** 2) / np.mean(np.sum(delta_0 ** 2, -1))
  np.testing.assert_allclose(out["mean_fraction"][0], frac, rtol=1e-12)
  np.testing.assert_allclose(out["branch_mean"][0], (hs[0] - x).mean(0), atol=1e-12)
  with pytest.raises(ValueError, match="identity skip"):
    representations.backward_stream(blocks, x, delta_L, MLPConfig(depth=5, width=6,
                                    norm_position="post"), [0])


def test_masked_gram_abs_is_full_gram(x64):
  w = jax.random.normal(jax.random.PRNGKey(0), (24, 6), jnp.float64)
  x = jnp.ones(6) / jnp.sqrt(6.0)
  eig, gamma = representations.masked_gram_eigenvalues(w, x, "abs")
  np.testing.assert_allclose(np.asarray(eig), np.linalg.eigvalsh(np.asarray(w.T @ w) / 24),
                             rtol=1e-12)
  assert float(gamma) == 4.0
  _, jf = jacobians.branch_jacobian({"w_up": w.T, "w_down": w}, x, "relu")   # W_up = w
  mask = np.asarray(w @ x) > 0
  np.testing.assert_allclose(np.asarray(jf), np.asarray(w.T)[:, mask] @ np.asarray(w)[mask],
                             atol=1e-12)


SHARDED_CHILD = textwrap.dedent("""
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import json
    import numpy as np
    from rankjax._src.config import MLPConfig
    from rankjax._src import fast_paths
    from rankjax._src.measure import jacobians
    fast_paths.MIN_THREADED_WORK = 0   # the threaded host SVDs run on every device's shard
    assert len(jax.devices()) == 8, jax.devices()
    cfg = MLPConfig(depth=6, width=8, expansion=2.0, norm_position="post")
    key = jax.random.PRNGKey(3)
    many, samples = jacobians.mlp_jacobian_study(cfg, key, num_inputs=2, num_seeds=8,
                                                 num_chunks=1, return_samples=True)
    one = jacobians.mlp_jacobian_study(cfg, key, num_inputs=2, num_seeds=8, num_chunks=1,
                                       devices=jax.devices()[:1])
    out = {"num_shards": len(samples["erank"].sharding.device_set),
           "max_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                           for a, b in zip(jax.tree.leaves(many), jax.tree.leaves(one)))}
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.slow   # a fresh process with 8 host devices (~7 s idle)
def test_study_sharded_over_8_host_devices_equals_single_device():
  env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
  proc = subprocess.run([sys.executable, "-c", SHARDED_CHILD], capture_output=True, text=True,
                        env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")][-1]
  out = json.loads(line[len("RESULT"):])
  assert out["num_shards"] == 8
  assert out["max_diff"] < 1e-5, out


def test_study_options_refuse_what_they_would_ignore():
  """Every StudyOptions field is used or refused (none silently ignored)."""
  from rankjax._src.measure.jacobians import StudyOptions
  grouped = MLPConfig(depth=4, width=8, skip_every=2)
  with pytest.raises(ValueError, match="skip_every"):
    jacobians.mlp_jacobian_study(grouped, jax.random.key(0), path_sums=True)
  with pytest.raises(ValueError, match="need path sums"):
    StudyOptions(path_sums=False, num_chunks=2)
  with pytest.raises(ValueError, match="need path sums"):
    jacobians.make_study_fn(grouped, num_chunks=2)
  with pytest.raises(ValueError, match="matrix_free"):
    StudyOptions(method="matrix_free")
  with pytest.raises(ValueError, match="num_seeds"):
    StudyOptions(num_seeds=0)
  with pytest.raises(TypeError):
    jacobians.mlp_jacobian_study(grouped, jax.random.key(0), num_paths=3)
  fn = jacobians.make_study_fn(MLPConfig(depth=2, width=4, beta=0.5), reference="network")
  with pytest.raises(ValueError, match="cfg.beta=0.5"):
    fn(jax.random.key(0), 1.0, 1.0)
  assert StudyOptions(method=jacobians.BlockJacobianMethod.JACFWD).method == "jacfwd"
  assert StudyOptions().with_paths(grouped) is False


def test_spectra_layers_measure_the_listed_layers_of_the_full_study(x64):
  """``spectra_layers`` gives the every-layer study's ranks at the listed layers, in
  their order, from one decomposition each, and leaves every other field unchanged;
  layers outside 1..L are refused with the depth named."""
  cfg = MLPConfig(depth=6, width=8, norm_position="post", param_dtype="float64")
  key = jax.random.key(3)
  full = jacobians.make_study_fn(cfg, num_seeds=2)(key, 0.7, 1.0)
  some = jacobians.make_study_fn(cfg, num_seeds=2, spectra_layers=(6, 2))(key, 0.7, 1.0)
  for name in ("erank", "stable_rank"):
    assert some[name].shape == full[name].shape[:-1] + (2,)
    np.testing.assert_allclose(some[name], full[name][..., [5, 1]], rtol=1e-12)
  for name in set(full) - {"erank", "stable_rank"}:
    np.testing.assert_array_equal(some[name], full[name])
  for bad in ((0,), (7,), ()):
    with pytest.raises(ValueError, match=r"spectra_layers must be layers in \[1, 6\]"):
      jacobians.make_study_fn(cfg, spectra_layers=bad)
