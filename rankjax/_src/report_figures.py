"""The figures of a run report (``rankjax report``): one PNG each, from what is saved.

Each ``fig_*`` takes ``{name: rankjax.load_run(...)}`` (or a tour's ``jacobians.json``)
and an output folder and returns ``(png path, caption)``, or None when nothing it
draws was recorded; a caption describes only what is drawn. Layers are numbered from
0 (the first layer), as ``load_run``'s columns and TensorBoard's ``layer_00`` tags;
layer axes have integer ticks. ``DRAWN`` names the diagnostics series each figure of
its own draws; ``fig_recorded`` draws the other recorded ones (``shown_in``).
"""

from __future__ import annotations

import pathlib

import numpy as np

from rankjax._src import plotting
from rankjax._src import report_story as story

PLACEMENT_COLORS = {"pre": "tab:blue", "post": "tab:red", "output": "tab:green",
                    "none": "tab:gray", "peri": "tab:purple"}
# Diagnostics series -> the figure (PNG name) of its own that draws it.
DRAWN = {"basic/tsim_y2": "token_similarity", "basic/grad_norm": "grad_profile",
         "postnorm/freq_loss": "loss", "postnorm/contraction_2": "contraction",
         "postnorm/rms_factor_mean_2": "contraction", "attention/layers": "attention",
         **{f"attention/{k}_{p}": "attention" for k in ("theta_cert", "entropy_norm")
            for p in ("p5", "p50", "p95")}}
MAX_PANELS = 16     # fig_recorded draws at most this many series (the table has all)


def series(run, key: str):
  """(steps, values) of a saved diagnostics series, or None when absent."""
  if key not in run.diagnostics:
    return None
  return np.asarray(run.diagnostic_steps), np.asarray(run.diagnostics[key], dtype=float)


def layers_of(run, key: str) -> np.ndarray | None:
  """The layers the columns of series ``key`` measure, where its diagnostic measures
  some layers only and says which (its ``layers`` series: the attention diagnostic's
  e.g. 0, 2, 3 of 4); None where column i is layer i (or no layer at all)."""
  diagnostic, _, name = key.partition("/")
  layers = np.asarray(run.diagnostics.get(f"{diagnostic}/layers", 0.0))
  if name == "layers" or not np.issubdtype(layers.dtype, np.integer):
    return None
  at = layers.reshape(len(run.diagnostic_steps), -1)[-1]
  return at if np.shape(run.diagnostics[key])[1:] == at.shape else None


def label(name: str, run) -> str:
  """``name (Post-Norm)``: the placement the run's task declares, or the name alone."""
  placement = story.placement_of(run.config)
  return name if placement is None else f"{name} ({story.placement_name(placement)})"


def _color(run) -> str | None:
  return PLACEMENT_COLORS.get(story.placement_of(run.config))


def _integer_ticks(axis) -> None:
  from matplotlib.ticker import MaxNLocator
  axis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, out: pathlib.Path, name: str, tight: bool = True) -> pathlib.Path:
  plt = plotting.pyplot()
  path = out / f"{name}.png"
  plotting.plain_ticks(fig)
  if tight:
    fig.tight_layout()
  with path.open("wb") as f:  # an etils.epath path: local or gs://
    fig.savefig(f, dpi=100, format="png")
  plt.close(fig)
  return path


def fig_loss(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  freq = []
  for name, run in runs.items():
    rows = [r for r in run.history if r.get("kind", "train") == "train" and "loss" in r]
    if rows:
      ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], color=_color(run),
              label=label(name, run))
    s = series(run, "postnorm/freq_loss")
    if s is not None:
      freq.append(float(np.mean(s[1])))
  caption = "Training loss per update"
  if freq:
    ax.axhline(np.mean(freq), color="k", ls="--", label="frequency loss (Def 3.7)")
    caption += "; the dashed line is the frequency loss, where a collapsed network settles."
  elif any(r.config.model.kind == "transformer" for r in runs.values()):
    caption += " (the frequency loss was not recorded: the postnorm diagnostic)."
  else:
    caption += "."
  ax.margins(y=0.08)                    # the frequency-loss line clear of the frame
  ax.set(xlabel="update", ylabel="training loss (nats per target)", title="Loss")
  ax.legend(fontsize=8)
  return _save(fig, out, "loss"), caption


def _edges(steps: np.ndarray) -> np.ndarray:
  """Cell edges around each diagnostics update (midpoints; half a gap at the ends, none
  before update 0)."""
  steps = np.asarray(steps, float)
  if len(steps) == 1:
    return np.array([steps[0] - 0.5, steps[0] + 0.5])
  mid = (steps[1:] + steps[:-1]) / 2
  return np.concatenate([[max(2 * steps[0] - mid[0], 0.0)], mid, [2 * steps[-1] - mid[-1]]])


def fig_similarity(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r, series(r, "basic/tsim_y2")) for n, r in runs.items()]
  items = [i for i in items if i[2] is not None]
  if not items:
    return None
  fig, axes = plt.subplots(1, len(items), figsize=(5 * len(items), 3.8), squeeze=False,
                           layout="constrained")
  for ax, (name, run, (steps, sim)) in zip(axes[0], items):
    im = ax.pcolormesh(_edges(steps), np.arange(sim.shape[1] + 1) - 0.5, sim.T, vmin=0,
                       vmax=1, cmap="magma")
    ax.set(xlabel="update", ylabel="layer l (0 = first)",
           title=f"token similarity of Y_2^l\n{label(name, run)}")
    _integer_ticks(ax.yaxis)
  fig.colorbar(im, ax=axes[0].tolist(), shrink=0.9)
  return _save(fig, out, "token_similarity", tight=False), (
      "Token similarity (postnorm Def 2.1) of each layer's residual sum at each "
      "diagnostics update: a cell at 1 means that layer's tokens have collapsed onto one "
      "direction.")


def fig_grad_profile(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r, series(r, "basic/grad_norm")) for n, r in runs.items()]
  items = [i for i in items if i[2] is not None]
  if not items:
    return None
  fig, axes = plt.subplots(1, len(items), figsize=(5 * len(items), 3.8), squeeze=False)
  for ax, (name, run, (steps, g)) in zip(axes[0], items):
    picks = sorted(set(np.linspace(0, len(steps) - 1, min(5, len(steps))).astype(int)))
    for i in picks:
      ax.semilogy(np.arange(g.shape[1]), np.maximum(g[i], 1e-30), marker="o", markersize=3,
                  label=f"update {steps[i]}")
    ax.set(xlabel="layer l (0 = first)", ylabel="parameter-gradient norm",
           title=f"gradient norm per layer\n{label(name, run)}")
    _integer_ticks(ax.xaxis)
    ax.legend(fontsize=7)
  return _save(fig, out, "grad_profile"), (
      "Each layer's parameter-gradient norm at a few diagnostics updates; after a "
      "Post-Norm collapse the early layers' gradients fall by orders of magnitude "
      "(postnorm Sec 4.2).")


def fig_contraction(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r, series(r, "postnorm/contraction_2"), series(r, "postnorm/rms_factor_mean_2"))
           for n, r in runs.items()]
  items = [i for i in items if i[2] is not None and i[3] is not None]
  if not items:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  for name, run, (steps, c), (_, r) in items:
    shown = {0: ":", c.shape[1] // 2: "--", c.shape[1] - 1: "-"}   # a layer drawn once
    for layer, ls in sorted(shown.items()):
      axes[0].semilogy(steps, c[:, layer], ls=ls, color=_color(run),
                       label=f"{name} layer {layer}")
      axes[1].semilogy(steps, r[:, layer], ls=ls, color=_color(run))
  axes[0].axhline(1.0, color="k", lw=0.8)
  axes[0].set(xlabel="update", ylabel="c = alpha max|g| max_i sqrt(d)/||y_i||",
              title="FFN contraction bound c_2^l")
  axes[1].set(xlabel="update", ylabel="sqrt(d)/||y_2^l||", title="RMSNorm factor")
  axes[0].legend(fontsize=7)
  return _save(fig, out, "contraction"), (
      "Thm 3.6 / Prop D.1 at the first, middle and last layer (dotted, dashed, solid): "
      "below the line the bound c (largest row factor, learned gain) is < 1 and the "
      "backward signal contracts; the RMSNorm factor (token mean) falls as the residual "
      "norm grows.")


def fig_attention(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r) for n, r in runs.items() if "attention/theta_cert_p50" in r.diagnostics]
  if not items:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  for name, run in items:
    steps = run.diagnostic_steps
    layers = run.diagnostics.get("attention/layers")
    layer = int(np.ravel(layers)[-1]) if layers is not None else None
    for ax, key, title in ((axes[0], "theta_cert", "greedy-prefix certificate theta_cert"),
                           (axes[1], "entropy_norm", "normalized entropy")):
      mid = np.asarray(run.diagnostics[f"attention/{key}_p50"])[:, -1]
      lo = np.asarray(run.diagnostics.get(f"attention/{key}_p5", mid[:, None]))
      hi = np.asarray(run.diagnostics.get(f"attention/{key}_p95", mid[:, None]))
      ax.plot(steps, mid, color=_color(run), label=f"{name} median")
      ax.fill_between(steps, lo[:, -1], hi[:, -1], color=_color(run), alpha=0.2)
      where = "last layer" if layer is None else f"layer {layer}"
      ax.set(xlabel="update", ylabel=title, title=f"{title} ({where}, 5-95%)")
  axes[0].legend(fontsize=7)
  return _save(fig, out, "attention"), (
      "Attention rows of the last layer: their greedy-prefix certificate of theta "
      "(softmax paper Thm 3.2, App D.2) and normalized entropy, median and 5-95% band. "
      "The paper (Sec 5, Fig 3) finds that as attention sharpens the entropy falls while "
      "the median certificate stays near one (>= 0.995 at every layer and checkpoint); "
      "only the lower tail of the certificate drops (5th percentile down to 0.26).")


def undrawn(runs: dict) -> list[str]:
  """Recorded series no figure of its own draws: first those of diagnostics with no
  such figure at all (a plug-in's), then the rest; sorted within each."""
  keys = sorted({k for run in runs.values() for k in run.diagnostics} - DRAWN.keys())
  own = {k.split("/")[0] for k in DRAWN}
  return sorted(keys, key=lambda k: k.split("/")[0] in own)


def shown_in(runs: dict) -> dict[str, str | None]:
  """Every recorded series -> the PNG name that draws it (None: the table only)."""
  drawable = [k for k in undrawn(runs)     # a line per update: scalars and vectors
               if all(np.ndim(r.diagnostics[k]) <= 2 for r in runs.values()
                      if k in r.diagnostics)]
  generic = dict.fromkeys(drawable[:MAX_PANELS], "diagnostics")
  return {k: DRAWN.get(k, generic.get(k)) for run in runs.values() for k in run.diagnostics}


def fig_recorded(runs: dict, out: pathlib.Path):
  """The recorded diagnostics that no figure of their own draws, against the update."""
  plt = plotting.pyplot()
  keys = [k for k, png in shown_in(runs).items() if png == "diagnostics"]
  if not keys:
    return None
  cols = min(len(keys), 4)
  rows = -(-len(keys) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
  cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, key in zip(axes.flat, sorted(keys)):
    for i, (name, run) in enumerate(runs.items()):
      s = series(run, key)
      if s is None:
        continue
      steps, v = s
      color = _color(run) or cycle[i % len(cycle)]
      if v.ndim == 1:
        ax.plot(steps, v, color=color, label=name)
        continue
      shown = {0: ":", v.shape[1] // 2: "--", v.shape[1] - 1: "-"}   # a column drawn once
      at = layers_of(run, key)
      for col, ls in sorted(shown.items()):
        which = f"[{col}]" if at is None else f"layer {at[col]}"
        ax.plot(steps, v[:, col], ls=ls, color=color, label=f"{name} {which}")
    ax.set(xlabel="update", title=key)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=6)
  for ax in axes.flat[len(keys):]:
    ax.set_visible(False)
  return _save(fig, out, "diagnostics"), (
      "Recorded diagnostics that no figure above draws, against the update: a scalar as "
      "one line, a per-layer (or other vector) series at its first, middle and last "
      "column (dotted, dashed, solid; [i] is column i, layer i of a per-layer series, "
      "layers from 0; a diagnostic that measures some layers only, the attention one, "
      "names the layer each column measures). The table lists every recorded series "
      "with its last values.")


def fig_jacobian(jac: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  for position, study in jac["studies"].items():
    erank = np.asarray(study["erank"])
    axes[0].plot(np.arange(1, len(erank) + 1), erank, color=PLACEMENT_COLORS.get(position),
                 label=position)
    profile = np.asarray(study["order_profile"], dtype=float)
    if not np.all(np.isnan(profile)):
      axes[1].semilogy(np.arange(len(profile)), np.maximum(profile, 1e-300),
                       color=PLACEMENT_COLORS.get(position), label=position)
  axes[0].set(xlabel="depth l (blocks from h_0 to h_l)", ylabel="erank(dh_l/dh_0) / d",
              ylim=(0, 1.02), title="Jacobian effective rank (Transforming Rank Fig 4a)")
  axes[1].set(xlabel="path order k", ylabel="share of mass mu_k",
              title="Path-order profile at the full depth (Fig 3b)")
  for ax in axes:
    _integer_ticks(ax.xaxis)
    ax.legend(fontsize=8)
  return _save(fig, out, "jacobian"), (
      "Residual MLPs at initialization, by norm placement: the effective rank of the "
      "Jacobian from the input to each depth, and the share of the full-depth Jacobian's "
      "mass carried by paths through k branches.")


RUN_FIGURES = (fig_loss, fig_similarity, fig_grad_profile, fig_contraction, fig_attention,
               fig_recorded)
