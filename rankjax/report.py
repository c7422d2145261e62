"""Figures from saved measurements (matplotlib, Agg backend; no display needed).

Each function takes plain dicts/arrays as saved in JSON and writes one PNG.
"""

from __future__ import annotations

import pathlib
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_jacobian_study(study: Mapping[str, Sequence[float]], path: str | pathlib.Path,
                        title: str = "") -> pathlib.Path:
  """Three panels of a ``JacobianStudy.to_dict()``: erank/d and stable rank/d of
  dh_l/dh_0 against depth (Transforming Rank Eq. 3, Fig 1), the per-order path mass
  mu_k of dh_L/dh_0 (Fig 3a, log scale), and the stream RMS (Fig 5a)."""
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  erank = np.asarray(study["erank"])
  layers = np.arange(1, len(erank) + 1)
  axes[0].plot(layers, erank, label="effective rank / d")
  axes[0].plot(layers, np.asarray(study["stable_rank"]), label="stable rank / d")
  axes[0].set(xlabel="layer l", ylabel="rank of dh_l/dh_0 / d", ylim=(0, 1.05))
  axes[0].legend()
  log_mass = np.asarray(study["order_log_mass"], dtype=float)
  if np.all(np.isnan(log_mass)):
    axes[1].text(0.5, 0.5, "path sums not computed", ha="center", transform=axes[1].transAxes)
  else:
    axes[1].semilogy(np.arange(len(log_mass)), np.exp(log_mass - np.nanmax(log_mass)))
  axes[1].set(xlabel="path order k", ylabel="mu_k / max_k mu_k")
  rms = np.asarray(study["stream_rms"])
  axes[2].plot(np.arange(len(rms)), rms)
  axes[2].set(xlabel="layer l", ylabel="rms(h_l)")
  if rms.max() / max(rms.min(), 1e-30) > 100:
    axes[2].set_yscale("log")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  path = pathlib.Path(path)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
