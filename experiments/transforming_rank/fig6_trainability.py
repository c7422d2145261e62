"""Fig 6, Fig 13, Table 5 and Fig 16: trainability over init scale alpha and depth L.

Residual MLPs with an input layer (D -> d), L two-matrix ReLU blocks (both d x d,
beta=1) and an output layer (d -> 10), trained with Adam on flattened images over a
learning-rate sweep (App B.4: eta from 3e-5 to 1e-2, half-decade steps), one network
per learning rate (Sec 4):

  Fig 6   (a,c) erank(dh_L/dh_0)/d at init and (b,d) the best test accuracy over the
          sweep, on the (alpha, L) grid, for Pre-Norm (a,b) and Post-Norm (c,d).
  Fig 13  the same two heatmaps for Output-Norm (App B.5).
  Table 5 log10 of the maximum stable learning rate: the largest eta whose test
          accuracy is >= 0.4 (chance 0.1); "-" when no eta reaches it (App B.4).
  Fig 16  M=1 (``sigma(W h)``) vs M=2 ReLU branches, alpha=1, no norm and Pre-RMSNorm:
          (a, c) best accuracy over the sweep against depth (5000 steps, batch 256, the
          two largest rates dropped at L >= 500; App C), (b) the init residual
          magnitude log10 rms(h_l) (without a norm: accumulated over a per-layer
          renormalization, exact for ReLU) and its slope in decades per layer (0.17
          vs 0.087 without a norm).

Data: paper scale reads CIFAR-10 through tfds and never falls back (``rankjax
reproduce --scale paper`` stops before running when it is not prepared). Quick scale
takes CIFAR-10 when prepared, else the offline set that
``rankjax.data.image_source`` picks (Fashion-MNIST, then sklearn digits,
with a warning); tiny scale trains on sklearn digits (always available). The set used
is in the result (``dataset``), every summary row and the figure titles.

All runs of one (placement, M, depth) cell, i.e. every (alpha, eta, seed), train in
one jitted program: ``sweep_trainer`` vmaps a pure-JAX Adam loop (``optax.adam``,
``lax.scan`` over steps) over the runs, with the data held in memory as arrays and
the forward pass of ``rankjax.ResidualMLP.apply``.

Quick scale (width 16, 200 steps, a data subset) takes ~400 s of CPU time; paper scale
(width 256, batch 256, 5000 steps, full data) is an accelerator job (see EXPECTED.md).

  rankjax reproduce transforming_rank --only fig6
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import common
from .fig6_rows import (  # noqa: F401 (the study's claims)
    CLAIMS, PAPER_DEPTHS, PAPER_TABLE5, STABLE_ACCURACY, max_stable_lr, measured_values)
from rankjax import measure, models
from rankjax.config import MLPConfig
from rankjax.data import image_source
from rankjax.models import ResidualMLP
from rankjax.studies import user_setting

NAME = "fig6_trainability"
PAPER_LRS = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)   # App B.4 / App C: six values
SCALES = {
    # Coarse grid over the paper's ranges: width 256 -> 16, batch 256 -> 32, 8192
    # training images, 200 steps (App B.4 does not state Fig 6's steps; App C: 5000).
    # fig16_depths=() skips Fig 16; L=128 tests "M=2 fails beyond L=100" just past 100
    # (added after a review: before, only L=1000, where the forward
    # overflows, was beyond 100). norm_eps: inside the trained networks' RMSNorms
    # (eps=0 gives 0/0 on a branch whose ReLUs are all off, which Output-Norm meets at
    # small width); the init ranks use the theory's eps=0.
    "quick": dict(width=16, batch=32, steps=200, train_examples=8192, test_examples=2000,
                  alphas=(0.5, 1.0, 2.0, 4.0), depths=(12, 48, 192, 384),
                  placements=("pre", "post", "output"), lrs=PAPER_LRS, seeds=1,
                  spread_cells=(("post", 48), ("pre", 192)),
                  rank_width=256, fig16_depths=(12, 48, 96, 128, 1000), fig16_steps=200,
                  fig16_large_lr_max_depth=384, magnitude_depth=200, magnitude_inputs=256,
                  norm_eps=1e-6, dataset=None, data_dir=None),
    "paper": dict(width=256, batch=256, steps=5000, train_examples=0, test_examples=0,
                  alphas=(0.5, 1.0, 2.0, 4.0), depths=(12, 24, 48, 96, 192, 384),
                  placements=("pre", "post", "output"), lrs=PAPER_LRS, seeds=1,
                  spread_cells=(("post", 48), ("pre", 192)),
                  rank_width=256, fig16_depths=(10, 20, 50, 100, 200, 500, 1000),
                  fig16_steps=5000, fig16_large_lr_max_depth=200, magnitude_depth=1000,
                  magnitude_inputs=256, norm_eps=1e-6, dataset="cifar10", data_dir=None),
    "tiny": dict(width=8, batch=16, steps=100, train_examples=512, test_examples=256,
                 alphas=(0.5, 1.0, 2.0, 4.0), depths=(12, 24),
                 placements=("pre", "post", "output"), lrs=PAPER_LRS, seeds=1,
                 spread_cells=(("post", 12), ("pre", 24)),
                 rank_width=16, fig16_depths=(10, 200), fig16_steps=100,
                 fig16_large_lr_max_depth=100, magnitude_depth=100, magnitude_inputs=64,
                 norm_eps=1e-6, dataset="digits", data_dir=None),
}
# quick_seeds3 (issue 53 item 4): quick's grid with three networks per (cell, lr), fixed
# before its runs; network 0 is quick's own draw (EXPECTED.md, "Quick-seeds3 scale")
SCALES["quick_seeds3"] = {**SCALES["quick"], "seeds": 3}
KEY = jax.random.PRNGKey(6)
SEED_STRIDE = 100_000   # network s of a cell draws seed0 + SEED_STRIDE * s (run_cell)


@dataclasses.dataclass(frozen=True)
class ImageArrays:
  """A whole image set in memory: flattened normalized images and int labels."""

  name: str
  x_train_NxD: np.ndarray | jax.Array
  y_train_N: np.ndarray | jax.Array
  x_test_MxD: np.ndarray | jax.Array
  y_test_M: np.ndarray | jax.Array
  num_classes: int

  def on_device(self) -> ImageArrays:
    """The same arrays placed on the default device once (not on every call)."""
    moved = {f: jax.device_put(getattr(self, f))
             for f in ("x_train_NxD", "y_train_N", "x_test_MxD", "y_test_M")}
    return dataclasses.replace(self, **moved)


def load_arrays(dataset: str | None, data_dir: str | None, train_examples: int = 0,
                test_examples: int = 0, seed: int = 0) -> ImageArrays:
  """The train and test splits as arrays (a random subset when ``*_examples > 0``)."""
  rng = np.random.default_rng(seed)
  out = {}
  name, classes = None, 10
  for split, limit in (("train", train_examples), ("test", test_examples)):
    src = image_source(dataset, split, data_dir=data_dir)
    name, classes = src.name, src.num_classes
    n = len(src.examples)
    index = np.sort(rng.permutation(n)[:limit]) if 0 < limit < n else np.arange(n)
    if hasattr(src.examples, "take"):
      batch = src.examples.take(index)
    else:   # tfds records: one at a time
      rows = [src.examples[int(i)] for i in index]
      batch = {k: np.stack([r[k] for r in rows]) for k in ("inputs", "targets")}
    out[split] = (np.asarray(batch["inputs"], np.float32),
                  np.asarray(batch["targets"], np.int32))
  return ImageArrays(name, *out["train"], *out["test"], classes)


def init_unit_params(cfg: MLPConfig, seed: int) -> dict:
  """``ResidualMLP(cfg)`` parameters at the paper's init (Sec 2) with alpha = 1, drawn
  on the host (numpy), so the jitted trainer contains no random-number kernels.

  Same layout and distributions as ``ResidualMLP(cfg).init`` (not the same values):
  w_in, w_out and the block matrices N(0, 1/fan_in), gains 1. ``scale_blocks`` then
  gives the block matrices N(0, alpha^2/fan_in).
  """
  rng = np.random.default_rng(seed)
  dtype = np.dtype(cfg.param_dtype)

  def normal(shape):
    return (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[-2])).astype(dtype)

  stacked = {name: normal((cfg.depth, *shape))
             for name, shape in sorted(models.matrix_shapes(cfg).items())}
  for name in models.gain_names(cfg):
    stacked[name] = np.ones((cfg.depth, cfg.width), dtype)
  params = {"blocks": stacked}
  if cfg.input_dim is not None:
    params["w_in"] = normal((cfg.input_dim, cfg.width))
  if cfg.num_classes is not None:
    params["w_out"] = normal((cfg.width, cfg.num_classes))
  return params


def scale_blocks(params: dict, alpha: jax.Array | float) -> dict:
  """Multiplies the block matrices (not the gains, not w_in/w_out) by alpha."""
  blocks = {k: (v if k.endswith("_scale") else alpha * v) for k, v in params["blocks"].items()}
  return {**params, "blocks": blocks}


def batch_order(seed: int, steps: int, batch: int, num_examples: int) -> np.ndarray:
  """(steps, batch) example indices: consecutive shuffled epochs (host numpy)."""
  rng = np.random.default_rng(seed + 10_000)
  epochs = -(-steps * batch // num_examples)
  order = np.concatenate([rng.permutation(num_examples) for _ in range(epochs)])
  return order[:steps * batch].reshape(steps, batch).astype(np.int32)


def loss_fn(model: ResidualMLP, params: dict, x_BxD: jax.Array, y_B: jax.Array) -> jax.Array:
  logits_BxC = model.apply({"params": params}, x_BxD)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxC, y_B).mean()


def accuracy(model: ResidualMLP, params: dict, x_MxD: jax.Array, y_M: jax.Array,
             chunk: int = 1000) -> jax.Array:
  """Test accuracy; a prediction from non-finite logits counts as wrong."""
  m = x_MxD.shape[0]
  chunk = min(chunk, m)
  pad = (-m) % chunk
  x = jnp.pad(x_MxD, ((0, pad), (0, 0))).reshape(-1, chunk, x_MxD.shape[1])
  y = jnp.pad(y_M, (0, pad), constant_values=-1).reshape(-1, chunk)

  def one(xy):
    logits = model.apply({"params": params}, xy[0])
    ok = jnp.all(jnp.isfinite(logits), axis=-1) & (jnp.argmax(logits, -1) == xy[1])
    return jnp.sum(ok)

  return jnp.sum(jax.lax.map(one, (x, y))) / m


def train_one(cfg: MLPConfig, alpha: jax.Array, lr: jax.Array, unit_params: dict,
              order_SxB: jax.Array, x_train_NxD: jax.Array, y_train_N: jax.Array,
              x_test_MxD: jax.Array, y_test_M: jax.Array) -> dict:
  """One Adam run (``optax.adam(lr)``: constant rate, no clipping, no weight decay).

  Starts from ``scale_blocks(unit_params, alpha)`` and takes one update per row of
  ``order_SxB`` (the batch's example indices). Returns ``accuracy`` (test accuracy
  after the last update), ``losses`` (S,) (the training loss of every update, before
  it), ``loss`` (their mean over the last 10% of updates) and ``finite`` (all
  parameters finite at the end).
  """
  model = ResidualMLP(cfg)
  params = scale_blocks(unit_params, alpha)
  opt = optax.adam(lr)
  grad_fn = jax.value_and_grad(functools.partial(loss_fn, model))

  def step(carry, idx_B):
    params, opt_state = carry
    loss, grads = grad_fn(params, x_train_NxD[idx_B], y_train_N[idx_B])
    updates, opt_state = opt.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), order_SxB)
  tail = max(1, order_SxB.shape[0] // 10)
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
  return {"accuracy": accuracy(model, params, x_test_MxD, y_test_M),
          "losses": losses, "loss": jnp.mean(losses[-tail:]), "finite": finite}


@functools.lru_cache(maxsize=None)
def sweep_trainer(cfg: MLPConfig) -> Callable[..., dict]:
  """A jitted ``fn(alpha_R, lr_R, unit_params, order_SxB, x_train, y_train, x_test,
  y_test) -> {name: (R,)}``: ``train_one`` for R runs at once (vmap over alpha, lr).

  The initial draw, the batch order and the data are shared by the R runs; alpha and
  lr are traced, so one compilation serves a whole (alpha, lr) sweep of a cell.
  """
  one = functools.partial(train_one, cfg)
  # XLA:CPU at optimization level 1 compiles this program ~2x faster than the default
  # and runs it no slower (measured on 2 cores); other backends keep their defaults.
  options = {"xla_backend_optimization_level": 1} if jax.default_backend() == "cpu" else None
  return jax.jit(jax.vmap(one, in_axes=(0, 0) + (None,) * 6), compiler_options=options)


def run_cell(cfg: MLPConfig, data: ImageArrays, alphas: Sequence[float], lrs: Sequence[float],
             seeds: int, steps: int, batch: int, seed0: int = 0) -> dict:
  """Trains every (alpha, lr, seed) of one cell; arrays (A, T, S) (``losses``: (A, T, S, steps)).

  Seed s draws one unit-scale init and one batch order, shared by every alpha and
  learning rate; all (alpha, lr) of a seed run in one call. Network 0 draws seed
  ``seed0`` (the one-network scales' draw); network s > 0 draws ``seed0 + SEED_STRIDE *
  s``, apart from every other cell's draws.
  """
  a_n, t_n = len(alphas), len(lrs)
  ai, ti = np.meshgrid(np.arange(a_n), np.arange(t_n), indexing="ij")
  dtype = np.dtype(cfg.param_dtype)
  alpha_R = jnp.asarray(np.asarray(alphas, dtype)[ai.reshape(-1)])
  lr_R = jnp.asarray(np.asarray(lrs, dtype)[ti.reshape(-1)])
  fn = sweep_trainer(cfg)
  outs = []
  for s in range(seeds):
    unit = init_unit_params(cfg, seed0 + SEED_STRIDE * s)
    order = batch_order(seed0 + SEED_STRIDE * s, steps, batch, len(data.y_train_N))
    outs.append(jax.device_get(fn(alpha_R, lr_R, unit, order, data.x_train_NxD,
                                  data.y_train_N, data.x_test_MxD, data.y_test_M)))
  # (A, T, S) per metric; the loss curves are (A, T, S, steps).
  return {k: np.stack([np.asarray(o[k]).reshape(a_n, t_n, *np.shape(o[k])[1:]) for o in outs], 2)
          for k in outs[0]}


def init_rank(width: int, depth: int, placement: str, alphas: Sequence[float],
              depths: Sequence[int], key: jax.Array) -> np.ndarray:
  """(A, len(depths)) erank(dh_L/dh_0)/d at init (Fig 6a,c; one weight draw, as Sec 4).

  The prefixes of one ``depth``-layer network; the spectra are taken at ``depths`` only.
  """
  cfg = MLPConfig(depth=depth, width=width, expansion=1.0, norm_position=placement)
  layers = tuple(int(l) for l in depths)
  return np.array([common.jacobian_samples(cfg, key, a, 1.0, spectra_layers=layers)
                   ["erank"].mean(axis=(0, 1)) for a in alphas])


def init_magnitude(cfg: MLPConfig, key: jax.Array, num_inputs: int) -> np.ndarray:
  """(L+1,) log10 rms(h_l) at init over ``num_inputs`` inputs h_0 ~ N(0, I_d) (Fig 16b).

  Without norms the stream is divided by its rms after each block and the logs are
  accumulated (App C): the network is positively homogeneous for ReLU, so this is
  the unnormalized stream's log10 rms without overflow. With a norm the network is
  not homogeneous in h, and the stream (which then grows slowly) is measured as is.
  """
  blocks, x = measure.seed_samples(cfg, key, num_inputs)
  flags = models.skip_flags(cfg)
  renormalize = all(op == "none" for op in cfg.norm_ops)

  def step(carry, xs):
    h, acc = carry
    params, closes = xs
    h = models.block_fn(params, h, h, closes, cfg)
    log_rms = jnp.log10(jnp.sqrt(jnp.mean(h * h)))
    if renormalize:
      return (h / 10.0 ** log_rms, acc + log_rms), acc + log_rms
    return (h, log_rms), log_rms

  log_rms0 = jnp.log10(jnp.sqrt(jnp.mean(x * x)))
  _, accs = jax.jit(lambda b, x0: jax.lax.scan(step, (x0, log_rms0), (b, flags)))(blocks, x)
  return np.concatenate([[float(log_rms0)], np.asarray(accs)])


def fig6_grid(s: dict, data: ImageArrays) -> dict:
  """Fig 6 / Fig 13 / Table 5: per placement, (A, L[, T, S]) arrays over the grid."""
  alphas, depths, lrs = list(s["alphas"]), list(s["depths"]), list(s["lrs"])
  grid = {}
  for pos in s["placements"]:
    acc = np.zeros((len(alphas), len(depths), len(lrs), s["seeds"]))
    loss = np.zeros_like(acc)
    for j, depth in enumerate(depths):   # one compiled program per depth
      cfg = MLPConfig(depth=depth, width=s["width"], expansion=1.0, norm_position=pos,
                      norm_eps=s["norm_eps"], input_dim=data.x_train_NxD.shape[1],
                      num_classes=data.num_classes)
      cell = run_cell(cfg, data, alphas, lrs, s["seeds"], s["steps"], s["batch"], seed0=j)
      acc[:, j], loss[:, j] = cell["accuracy"], cell["loss"]
    acc_AxLxT = acc.mean(axis=-1)   # mean over seeds
    grid[pos] = {
        "accuracy": acc, "loss": loss, "best_accuracy": acc_AxLxT.max(axis=-1),
        "best_lr": np.asarray(lrs)[acc_AxLxT.argmax(axis=-1)],
        "max_stable_lr": np.array([[max_stable_lr(lrs, acc_AxLxT[i, j])
                                    for j in range(len(depths))] for i in range(len(alphas))]),
        "erank": init_rank(s["rank_width"], max(depths), pos, alphas, depths, KEY),
    }
  # a second network (another init draw and batch order) on a few (placement, L) cells:
  # the spread of one cell's best accuracy between two networks
  spread = {}
  for pos, depth in s["spread_cells"]:
    if pos not in grid or depth not in depths:
      continue
    j = depths.index(depth)
    cfg = MLPConfig(depth=depth, width=s["width"], expansion=1.0, norm_position=pos,
                    norm_eps=s["norm_eps"], input_dim=data.x_train_NxD.shape[1],
                    num_classes=data.num_classes)
    cell = run_cell(cfg, data, alphas, lrs, 1, s["steps"], s["batch"], seed0=1000 + j)
    second = cell["accuracy"][..., 0].max(axis=-1)   # (A,) best over the sweep
    spread[f"{pos}/L={depth}"] = {"alphas": alphas, "first": grid[pos]["best_accuracy"][:, j],
                                  "second": second}
  grid["_spread"] = spread
  return grid


def fig16_depth(s: dict, data: ImageArrays) -> dict:
  """Fig 16: M in {1, 2} x {no norm, Pre-RMSNorm} at alpha = 1 against depth (App C)."""
  lrs = sorted(s["lrs"])
  out = {}
  for m in (1, 2):
    for pos in ("none", "pre"):
      best, per_lr, by_net = [], [], []
      for j, depth in enumerate(s["fig16_depths"]):
        # App C: the two largest rates are left out at the largest depths.
        use = lrs if depth <= s["fig16_large_lr_max_depth"] else lrs[:-2]
        cfg = MLPConfig(depth=depth, width=s["width"], expansion=1.0, branch_matrices=m,
                        norm_position=pos, norm_eps=s["norm_eps"],
                        input_dim=data.x_train_NxD.shape[1], num_classes=data.num_classes)
        cell = run_cell(cfg, data, [1.0], use, s["seeds"], s["fig16_steps"], s["batch"],
                        seed0=100 + j)
        acc_T = cell["accuracy"].mean(axis=-1)[0]
        best.append(float(acc_T.max()))
        per_lr.append({f"{lr:g}": float(v) for lr, v in zip(use, acc_T)})
        by_net.append([float(v) for v in cell["accuracy"][0].max(axis=0)])   # (S,)
      mag_cfg = MLPConfig(depth=s["magnitude_depth"], width=s["rank_width"], expansion=1.0,
                          branch_matrices=m, norm_position=pos)
      mag = init_magnitude(mag_cfg, KEY, s["magnitude_inputs"])
      out[(m, pos)] = {"best_accuracy": best, "accuracy_by_lr": per_lr, "log10_rms": mag,
                       "slope": float(np.polyfit(np.arange(len(mag)), mag, 1)[0])}
      if s["seeds"] > 1:   # each network's best over the sweep, (depths, S)
        out[(m, pos)]["best_accuracy_by_network"] = by_net
  return out


def figure(s: dict, ds: str, chance: float, grid: dict, fig16: dict):
  alphas, depths, lrs = list(s["alphas"]), list(s["depths"]), list(s["lrs"])
  plt = common.plt
  rows = len(grid) + (1 if fig16 else 0)
  fig, axes = plt.subplots(rows, 3, figsize=(14, 3.4 * rows), squeeze=False)
  panels = (("erank", f"init erank(dh_L/dh_0)/d, d={s['rank_width']}", 0, 1),
            ("best_accuracy", f"best test accuracy over the Adam lr sweep [{ds}]", chance, 1),
            ("max_stable_lr", f"log10 max stable lr (acc >= {STABLE_ACCURACY}) [{ds}]",
             math.log10(min(lrs)), math.log10(max(lrs))))
  for r, pos in enumerate(grid):
    for c, (key, title, vmin, vmax) in enumerate(panels):
      val = np.log10(grid[pos][key]) if key == "max_stable_lr" else grid[pos][key]
      ax = axes[r, c]
      ax.set_facecolor("silver")   # NaN cells (no stable rate: Table 5's dash)
      im = ax.imshow(val, origin="lower", aspect="auto", vmin=vmin, vmax=vmax, cmap="viridis")
      for i in range(len(alphas)):
        for j in range(len(depths)):
          ax.text(j, i, "-" if np.isnan(val[i, j]) else f"{val[i, j]:.2f}", ha="center",
                  va="center", fontsize=7, color="w")
      ax.set_xticks(range(len(depths)), [str(d) for d in depths])
      ax.set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
      ax.set_xlabel("depth L")
      ax.set_ylabel("alpha")
      ax.set_title(f"{pos}-norm: {title}", fontsize=8)
      fig.colorbar(im, ax=ax)
  if fig16:
    ax_a, ax_b, ax_c = axes[-1]
    d16 = s["fig16_depths"]
    for m in (1, 2):
      ax_a.plot(d16, fig16[(m, "none")]["best_accuracy"], "o-", label=f"M={m}, no norm")
      ax_c.plot(d16, fig16[(m, "pre")]["best_accuracy"], "o-", label=f"M={m}, Pre-RMSNorm")
      ax_b.plot(fig16[(m, "none")]["log10_rms"],
                label=f"M={m}, no norm ({fig16[(m, 'none')]['slope']:.3f}/layer)")
      ax_b.plot(fig16[(m, "pre")]["log10_rms"], "--", label=f"M={m}, Pre-RMSNorm")
    for ax, t in ((ax_a, f"Fig 16a: no norm [{ds}]"), (ax_c, f"Fig 16c: Pre-RMSNorm [{ds}]")):
      ax.axhline(chance, color="gray", ls=":")
      ax.set_xscale("log")
      ax.set_ylim(0, 1)
      ax.set_xlabel("depth L")
      ax.set_ylabel("best test accuracy")
      ax.set_title(t, fontsize=8)
      ax.legend(fontsize=7)
    ax_b.set_title(f"Fig 16b: init log10 rms(h_l), d={s['rank_width']}", fontsize=8)
    ax_b.set_xlabel("layer l")
    ax_b.legend(fontsize=7)
  fig.suptitle(f"Transforming Rank Fig 6/13/16, Table 5: trained on {ds} "
               f"({s['scale']} scale, width {s['width']})")
  return fig


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  wall0, cpu0 = time.time(), time.process_time()
  data = load_arrays(s["dataset"], s["data_dir"] or user_setting("data_dir"),
                     s["train_examples"],
                     s["test_examples"]).on_device()
  chance = 1.0 / data.num_classes
  grid = fig6_grid(s, data)
  spread = grid.pop("_spread")
  fig16 = fig16_depth(s, data) if s["fig16_depths"] else {}
  ds = data.name
  result = {
      "settings": s, "dataset": ds, "input_dim": data.x_train_NxD.shape[1],
      "train_examples": len(data.y_train_N), "test_examples": len(data.y_test_M),
      "grid": grid, "fig16": {f"M={m}/{pos}": v for (m, pos), v in fig16.items()},
      "wall_seconds": time.time() - wall0, "cpu_seconds": time.process_time() - cpu0,
      "second_network": spread,
      "measured": measured_values(s, ds, grid, fig16, spread),
  }
  return common.write(out_dir, NAME, result, figure(s, ds, chance, grid, fig16))
