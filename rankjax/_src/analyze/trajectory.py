"""Measures against training step (or across checkpoints): how collapse develops.

``rankjax analyze RUN --steps all`` (or several checkpoint folders) analyzes each
checkpoint on the same token sequences and collects, per checkpoint, the per-layer
numbers (layer 0 = the first block) that show a collapse forming: token similarity of
each layer's output (postnorm Def 2.1; the embeddings' apart), the whole block's
Jacobian erank / d at the first position (TR Eq. 3), alpha_1 and alpha_2 (postnorm
Def 3.5), Thm 3.6's c_1, and the loss. Pure functions of the ``analysis.json`` dicts,
plus the figure.
"""
from __future__ import annotations

import pathlib

import numpy as np

SERIES = {
    "token_similarity": lambda l: l.get("token_similarity", {}).get("mean"),
    "mean_spike": lambda l: l.get("mean_spike"),
    "alpha_1": lambda l: l.get("gradients", {}).get("alpha_1"),
    "alpha_2": lambda l: l.get("gradients", {}).get("alpha_2"),
    "contraction_1": lambda l: l.get("gradients", {}).get("contraction_1"),
    "grad_norm": lambda l: l.get("gradients", {}).get("grad_norm"),
}


def run_steps(workdir: str) -> list[int]:
  """The saved checkpoint steps of a rankjax run, ascending."""
  from rankjax._src.train import checkpoint as ckpt_lib
  from rankjax._src import storage
  directory = ckpt_lib.checkpoint_dir(storage.as_path(workdir, "workdir"))
  if not directory.is_dir():
    raise FileNotFoundError(f"{workdir} holds no checkpoints ({directory} is missing)")
  steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
  if not steps:
    raise FileNotFoundError(f"{workdir} holds no checkpoint yet")
  return steps


def _block_erank_over_d(r: dict) -> list[float | None]:
  pos = next(iter(r["through_depth"]))
  d = r["model"]["d_model"]
  ranks = [l.get("jacobian", {}).get(pos, {}).get("block", {}).get("erank") for l in r["layers"]]
  return [None if e is None else e / d for e in ranks]


def collect(results: list[tuple[str, int | None, dict]]) -> dict:
  """``{"labels", "steps", <series>: [checkpoint][layer], "block_erank_over_d", "loss",
  "embeddings": {<series>: [checkpoint]}}`` from ``(label, step or None, analysis
  dict)`` in order, layer 0 the first block; a series nothing measured is left out."""
  out: dict = {"labels": [lab for lab, _, _ in results], "steps": [s for _, s, _ in results]}
  for name, get in SERIES.items():
    rows = [[get(l) for l in r["layers"]] for _, _, r in results]
    if any(v is not None for row in rows for v in row):
      out[name] = rows
  if all("through_depth" in r for _, _, r in results):
    out["block_erank_over_d"] = [_block_erank_over_d(r) for _, _, r in results]
  if all("loss" in r for _, _, r in results):
    out["loss"] = [r["loss"] for _, _, r in results]
  if all("embeddings" in r for _, _, r in results):
    emb = [r["embeddings"] for _, _, r in results]
    out["embeddings"] = {"token_similarity": [e["token_similarity"]["mean"] for e in emb],
                         "mean_spike": [e["mean_spike"] for e in emb]}
  return out


def figure(traj: dict, path: pathlib.Path) -> None:
  """One panel per series: each layer's value against the step (or checkpoint index),
  colored by layer (0 = the first block); the embeddings' token similarity dashed."""
  from rankjax._src import plotting
  plt = plotting.pyplot()
  names = [n for n in ("token_similarity", "block_erank_over_d", "alpha_1", "alpha_2", "loss")
           if n in traj]
  x = traj["steps"] if all(s is not None for s in traj["steps"]) else \
      list(range(len(traj["labels"])))
  fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False)
  for ax, name in zip(axes[0], names):
    if name == "loss":
      ax.plot(x, traj["loss"], marker="o")
    else:
      values = np.array([[np.nan if v is None else v for v in row] for row in traj[name]])
      cmap = plt.get_cmap("viridis")
      last = values.shape[1] - 1
      for l in range(values.shape[1]):
        if np.isfinite(values[:, l]).any():
          label = {0: "layer 0 (first block)", last: f"layer {last} (last)"}.get(l)
          ax.plot(x, values[:, l], color=cmap(l / max(last, 1)), label=label)
      if name == "token_similarity" and "embeddings" in traj:
        ax.plot(x, traj["embeddings"]["token_similarity"], color="gray", ls="--",
                label="embeddings")
      ax.legend(fontsize=7)
    ax.set(xlabel="step" if x is traj["steps"] else "checkpoint",
           title=name.replace("_over_d", " / d"))
    ax.xaxis.get_major_locator().set_params(integer=True)
  fig.tight_layout()
  plotting.save_figure(fig, path)
  plt.close(fig)
