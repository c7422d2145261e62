"""App A.4: the branch-scale symmetry persists through training, with the rates rescaled.

Writing each branch matrix as ``W_i = alpha W̄_i``, positive homogeneity gives
``beta f(x; alpha W̄) = beta alpha^M f(x; W̄)`` (Eq. 16), so (alpha, beta) and
``(lambda alpha, beta / lambda^M)`` compute the same function. After the rescaling
each branch matrix is lambda times larger and its gradient lambda times smaller, so the
two networks follow the same trajectory (the rescaled one's branch matrices staying
exactly lambda times the other's) when each branch matrix's optimizer is rescaled:
``eta <- lambda^2 eta`` for SGD and ``eta <- lambda eta`` for Adam, whose update is
invariant to the gradient scale, with the rest of Adam's hyperparameters following (its
``epsilon`` divides the gradient scale: ``eps <- eps / lambda``). The paper adds that the
equivalence "holds exactly only in infinite precision".

We train pairs of residual-MLP classifiers (``rankjax.ResidualMLP`` with an input and
an output layer, two-matrix ReLU branch, Pre-Norm and Post-Norm RMSNorm without gain)
from the same draw: the base network at alpha = beta = 1 and its rescaling with the
branch matrices times lambda and beta = lambda^-M. The input and output layers are not
branch matrices and keep their optimizer. Both see the same batches. Each rescaled
network trains under

* ``symmetric``: the paper's rule (Adam: lambda eta and eps / lambda; SGD: lambda^2 eta);
* ``adam_eps_kept``: Adam with lambda eta but eps unchanged;
* ``unscaled``: the base network's eta (and eps) for every matrix;
* ``sgd_linear``: SGD with lambda eta (Adam's rule used for SGD);

and we report the largest relative gap over training in the loss and in the logits of
a fixed probe batch, and at the end in the branch matrices (``||W'/lambda - W|| /
||W||``). lambda = 2 is a power of two, for which every rescaling is exact in binary
floating point; lambda = 3 is not, so float32 rounding enters and the two trajectories
drift apart by a float-rounding amount (float64 shows the same at 1e-16).

The task is synthetic (the paper's Appendix states the symmetry for any data): Gaussian
inputs labeled by a random linear teacher, ``y = argmax(x T)``.

  rankjax reproduce transforming_rank --only appa4
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import common
from rankjax.config import MLPConfig
from rankjax.models import ResidualMLP
from rankjax.studies import claims, measured

NAME = "appa4_training_symmetry"
SCALES = {
    "quick": dict(width=32, depth=8, input_dim=32, classes=10, examples=2048, batch=64,
                  steps=300, record_every=20, probe=256, seeds=3, lambdas=(2.0, 3.0),
                  placements=("pre", "post"), dtypes=("float32", "float64"),
                  adam_lr=1e-3, adam_eps=1e-8, sgd_lr=0.05),
    "paper": dict(width=256, depth=48, input_dim=128, classes=10, examples=16384, batch=256,
                  steps=1000, record_every=50, probe=512, seeds=3, lambdas=(2.0, 3.0),
                  placements=("pre", "post"), dtypes=("float32", "float64"),
                  adam_lr=1e-3, adam_eps=1e-8, sgd_lr=0.05),
    "tiny": dict(width=8, depth=4, input_dim=8, classes=10, examples=256, batch=16,
                 steps=20, record_every=5, probe=32, seeds=2, lambdas=(2.0,),
                 placements=("pre", "post"), dtypes=("float32", "float64"),
                 adam_lr=1e-3, adam_eps=1e-8, sgd_lr=0.05),
}
KEY = jax.random.PRNGKey(44)
M = 2   # branch matrices (W_up, W_down)
RULES = ("symmetric", "adam_eps_kept", "unscaled", "sgd_linear")
RULE_OPTIMIZER = {"symmetric": ("adam", "sgd"), "adam_eps_kept": ("adam",),
                  "unscaled": ("adam", "sgd"), "sgd_linear": ("sgd",)}
_RATES = {"adam": "lambda eta, eps/lambda", "sgd": "lambda^2 eta"}
CLAIMS = claims([
    *(common.exact(f"App A.4: {pl}-norm, {kind}, rescaled rates keep the trajectory",
                   "max relative gap in loss, probe logits (over training) and branch matrices "
                   "(end), over lambda = 2 in every dtype and every lambda in float64",
                   "float64", f"App A.4 / Eq. 16: the same trajectory with {_RATES[kind]}")
      for pl in ("pre", "post") for kind in ("adam", "sgd")),
    *(common.bound(f"App A.4: {pl}-norm, other rates break the symmetry", "min over the "
                   "control rules (Adam lambda eta with eps kept, unscaled eta, SGD lambda "
                   "eta) of the max relative gap, float64, largest lambda", ">",
                   common.FLOAT32_EXACT, "App A.4: only the rescaled rates (eps included) "
                   "keep the symmetry; 'break' read as a gap above float32 rounding (our "
                   "limit)", every_seed=True, ours=True)
      for pl in ("pre", "post")),
])

WORDS = [
    ("rescaled rates keep", "App A.4", "The equivalence persists throughout training if the "
     "optimizer hyperparameters are rescaled accordingly for each matrix"),
    ("break the symmetry", "App A.4", "The rescaling must extend to other optimizer "
     "hyperparameters, including"),
]
CLAIMS = common.worded(CLAIMS, WORDS)


def branch_hyperparameters(kind: str, rule: str, lr: float, eps: float, lam: float
                           ) -> tuple[float, float]:
  """(eta, eps) of a branch matrix after ``alpha <- lambda alpha`` (App A.4).

  ``symmetric``: Adam ``(lambda eta, eps / lambda)``, SGD ``(lambda^2 eta, -)``;
  ``adam_eps_kept``: ``(lambda eta, eps)``; ``unscaled``: ``(eta, eps)``;
  ``sgd_linear``: SGD ``(lambda eta, -)``.
  """
  if rule not in RULES or kind not in RULE_OPTIMIZER[rule]:
    raise ValueError(f"rule {rule!r} with optimizer {kind!r}; rules: "
                     f"{ {r: k for r, k in RULE_OPTIMIZER.items()} }")
  if rule == "unscaled":
    return lr, eps
  if kind == "sgd":
    return (lam ** 2 if rule == "symmetric" else lam) * lr, eps
  return lam * lr, (eps / lam if rule == "symmetric" else eps)


def _optimizer(kind: str, branch_lr, branch_eps, other_lr, other_eps, params):
  """``optax.multi_transform``: the branch matrices (``params["blocks"]``) and the
  input/output layers each with their own (eta, eps); the rates may be traced."""
  make = (lambda lr, eps: optax.adam(lr, eps=eps)) if kind == "adam" else \
         (lambda lr, eps: optax.sgd(lr))
  labels = {k: jax.tree.map(lambda _: "branch" if k == "blocks" else "other", v)
            for k, v in params.items()}
  return optax.multi_transform({"branch": make(branch_lr, branch_eps),
                                "other": make(other_lr, other_eps)}, labels)


def make_task(key, s: dict, dtype) -> tuple:
  """Gaussian inputs, a random linear teacher's argmax labels, a probe batch."""
  kx, kt, kp = jax.random.split(key, 3)
  x = jax.random.normal(kx, (s["examples"], s["input_dim"]), dtype)
  teacher = jax.random.normal(kt, (s["input_dim"], s["classes"]), dtype)
  y = jnp.argmax(x @ teacher, axis=-1)
  probe = jax.random.normal(kp, (s["probe"], s["input_dim"]), dtype)
  return x, y, probe


@functools.partial(jax.jit, static_argnames=("cfg", "kind", "steps", "batch", "record_every"))
def train(cfg: MLPConfig, kind: str, params: dict, hyper, x, y, probe, key, *, steps: int,
          batch: int, record_every: int) -> dict:
  """``steps`` steps of ``kind`` (adam / sgd) with ``hyper = (branch eta, branch eps,
  other eta, other eps)`` (traced: one compile per config and optimizer) on batches
  drawn by ``key`` (the same for every run of a pair); per-step losses, probe logits
  every ``record_every`` steps, the final params."""
  model = ResidualMLP(cfg)
  tx = _optimizer(kind, *hyper, params)

  def loss_fn(p, xb, yb):
    logits = model.apply({"params": p}, xb)
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

  idx = jax.random.randint(key, (steps, batch), 0, x.shape[0])

  def step(carry, i_B):
    p, st = carry
    loss, g = jax.value_and_grad(loss_fn)(p, x[i_B], y[i_B])
    upd, st = tx.update(g, st, p)
    return (optax.apply_updates(p, upd), st), loss

  def chunk(carry, i_RxB):
    carry, losses = jax.lax.scan(step, carry, i_RxB)
    return carry, (losses, model.apply({"params": carry[0]}, probe))

  chunks = idx.reshape(steps // record_every, record_every, batch)
  (p, _), (losses, logits) = jax.lax.scan(chunk, (params, tx.init(params)), chunks)
  return {"loss": losses.reshape(-1), "logits": logits, "params": p}


def _rel(a, b) -> np.ndarray:
  """``||a - b|| / ||b||`` over the trailing axes (per record for logits)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  axes = tuple(range(1, a.ndim)) if a.ndim > 1 else None
  return np.sqrt(np.sum((a - b) ** 2, axis=axes)) / np.sqrt(np.sum(b ** 2, axis=axes))


def compare(base: dict, other: dict, lam: float) -> dict:
  """Gaps between a base run and a rescaled run (App A.4: zero in exact arithmetic)."""
  wb = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in
                       jax.tree.leaves(base["params"]["blocks"])])
  wo = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in
                       jax.tree.leaves(other["params"]["blocks"])]) / lam
  lb, lo = np.asarray(base["loss"], np.float64), np.asarray(other["loss"], np.float64)
  return {"loss_gap_max": float(np.max(np.abs(lo - lb) / lb)),
          "logit_gap": _rel(other["logits"], base["logits"]),
          "logit_gap_max": float(np.max(_rel(other["logits"], base["logits"]))),
          "weight_gap_final": float(np.linalg.norm(wo - wb) / np.linalg.norm(wb)),
          "bit_exact": bool(np.array_equal(lo, lb) and np.array_equal(
              np.asarray(other["logits"]), np.asarray(base["logits"])))}


def run_pairs(s: dict, placement: str, dtype: str, seed_key) -> dict:
  """Every (optimizer, rule, lambda) pair for one placement, dtype and draw."""
  cfg = MLPConfig(depth=s["depth"], width=s["width"], expansion=1.0, branch_matrices=M,
                  activation="relu", norm_position=placement, norm_op="rms",
                  input_dim=s["input_dim"], num_classes=s["classes"], param_dtype=dtype,
                  alpha=1.0, beta=1.0)
  k_init, k_task, k_batch = jax.random.split(seed_key, 3)
  x, y, probe = make_task(k_task, s, jnp.dtype(dtype))
  params = ResidualMLP(cfg).init(k_init, x[:1])["params"]
  hyper = {"adam": (s["adam_lr"], s["adam_eps"]), "sgd": (s["sgd_lr"], 0.0)}
  fit = lambda c, kind, p, h: train(c, kind, p, h, x, y, probe, k_batch, steps=s["steps"],
                                    batch=s["batch"], record_every=s["record_every"])
  out = {}
  for kind in ("adam", "sgd"):
    base = fit(cfg, kind, params, hyper[kind] + hyper[kind])
    out[(kind, "base")] = {"loss_first": float(base["loss"][0]),
                           "loss_last": float(np.mean(np.asarray(base["loss"][-20:])))}
    for lam in s["lambdas"]:
      cfg_l = dataclasses.replace(cfg, beta=lam ** -M)
      p_l = dict(params, blocks=jax.tree.map(lambda w: w * jnp.asarray(lam, w.dtype),
                                             params["blocks"]))
      for rule in RULES:
        if kind not in RULE_OPTIMIZER[rule]:
          continue
        h = branch_hyperparameters(kind, rule, *hyper[kind], lam) + hyper[kind]
        out[(kind, rule, lam)] = compare(base, fit(cfg_l, kind, p_l, h), lam)
  return out


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  s = common.settings(SCALES, scale, overrides)
  if s["steps"] % s["record_every"]:
    raise ValueError(f"steps={s['steps']} must be a multiple of record_every={s['record_every']}")
  keys = jax.random.split(KEY, s["seeds"])
  res, res_seed = {}, {}
  for dtype in s["dtypes"]:
    with jax.enable_x64(dtype == "float64"):
      for pl in s["placements"]:
        per_seed = [run_pairs(s, pl, dtype, k) for k in keys]
        for key in per_seed[0]:
          vals = [p[key] for p in per_seed]
          res_seed[(dtype, pl) + key] = vals
          res[(dtype, pl) + key] = {f: (np.max([v[f] for v in vals], axis=0)
                                        if f != "bit_exact" else all(v[f] for v in vals))
                                    for f in vals[0]}
  summary = _rows(res_seed, s)
  fig = _figure(res, s)
  result = {"settings": s, "measured": summary,
            "results": {"/".join(str(k) for k in key): v for key, v in res.items()}}
  return common.write(out_dir, NAME, result, fig)


def _gap(v: dict) -> float:
  """The largest relative gap of one pair: loss and probe logits over training, branch
  matrices at the end (0 when bit-exact)."""
  return 0.0 if v["bit_exact"] else float(max(np.max(v["loss_gap_max"]),
                                              np.max(v["logit_gap_max"]),
                                              np.max(v["weight_gap_final"])))


def _rows(res_seed: dict, s: dict) -> list[dict]:
  """Per placement and optimizer: the rescaled rates in the exactly representable cases
  (lambda = 2, a power of two, in every dtype; every lambda in float64); per placement:
  the control rules in float64. Values per seed (the max over the cases)."""
  rows = []
  seeds = list(range(s["seeds"]))   # split(PRNGKey(44), seeds)[i]
  exact_lams = [l for l in s["lambdas"] if math.log2(l).is_integer()]
  lam = max(s["lambdas"])
  for pl in s["placements"]:
    for kind in ("adam", "sgd"):
      cases = [(dt, l) for dt in s["dtypes"] for l in s["lambdas"]
               if l in exact_lams or dt == "float64"]
      per = np.max([[_gap(v) for v in res_seed[(dt, pl, kind, "symmetric", l)]]
                    for dt, l in cases], axis=0)
      base = res_seed.get((s["dtypes"][0], pl, kind, "base"))
      rows.append(measured(f"App A.4: {pl}-norm, {kind}, rescaled rates keep the trajectory",
          per.tolist(), seeds=seeds, note="cases " + ", ".join(f"{dt} lambda={l:g}" for dt, l in cases)
          + (f"; base {kind} loss {base[0]['loss_first']:.2f} -> {base[0]['loss_last']:.2f} "
             f"over {s['steps']} steps (seed 0)" if base else "")))
    if "float64" in s["dtypes"]:
      controls = [(kind, rule) for rule in RULES[1:] for kind in RULE_OPTIMIZER[rule]]
      per = np.min([[_gap(v) for v in res_seed[("float64", pl, k, r, lam)]] for k, r in controls],
                   axis=0)
      rows.append(measured(f"App A.4: {pl}-norm, other rates break the symmetry",
          per.tolist(), seeds=seeds, note=f"lambda={lam:g}"))
  return rows


def _figure(res: dict, s: dict):
  fig, axes = common.plt.subplots(1, len(s["placements"]), figsize=(6.5 * len(s["placements"]), 4),
                                  squeeze=False)
  steps = np.arange(1, s["steps"] // s["record_every"] + 1) * s["record_every"]
  lam = max(s["lambdas"])
  for ax, pl in zip(axes[0], s["placements"]):
    for i, (kind, rule) in enumerate([(k, r) for r in RULES for k in RULE_OPTIMIZER[r]]):
      for dtype, style in zip(s["dtypes"], ("-", ":")):
        gap = np.maximum(np.asarray(res[(dtype, pl, kind, rule, lam)]["logit_gap"]), 1e-18)
        ax.plot(steps, gap, style, color=f"C{i}", label=f"{kind} {rule} ({dtype})")
    ax.set(yscale="log", xlabel="step", ylabel="||z' - z|| / ||z|| (probe logits)",
           title=f"App A.4: {pl}-norm, lambda={lam:g} (1e-18 = identical)")
    ax.legend(fontsize=6)
  return fig
