"""Shared helpers for the Transforming Rank experiment scripts.

Every script exposes ``run(out_dir, scale="quick"|"paper", **overrides) -> dict`` and
writes ``<name>.json`` and ``<name>.png`` into ``out_dir``. The returned dict has a
``summary`` list of rows (``row``: item, paper, ours, status, seeds, spread, note) that
``experiments.runner`` collects into ``summary.json`` and ``summary.md``. Settings come from the script's ``SCALES`` table; any
keyword argument overrides one setting.
"""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from typing import Any, Callable

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy/scipy load BLAS

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401

import jax  # noqa: E402

from experiments import runner  # noqa: E402
from rankjax import plotting  # noqa: E402
from rankjax.config import MLPConfig  # noqa: E402
from rankjax.measure import jacobians  # noqa: E402
from rankjax.measure.host_svd import single_blas_thread  # noqa: E402,F401


def settings(scales: dict[str, dict], scale: str, overrides: dict[str, Any]) -> dict:
  if scale not in scales:
    raise ValueError(f"scale={scale!r}; choose one of {sorted(scales)}")
  out = dict(scales[scale])
  unknown = sorted(set(overrides) - set(out))
  if unknown:
    raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(out)}")
  out.update(overrides)
  out["scale"] = scale
  return out


to_jsonable = runner.to_jsonable


def write(out_dir: str | pathlib.Path, name: str, result: dict, fig=None) -> dict:
  out = pathlib.Path(out_dir)
  runner.write_json(out, name, result)
  if fig is not None:
    fig.tight_layout()
    plotting.save_figure(fig, out / f"{name}.png", dpi=110)
    plt.close(fig)
  return result


def row(item: str, paper: Any, ours: Any, note: str = "", *, status: str | None = None,
        seeds: int | None = None, spread: Any = None) -> dict:
  """A summary row (``experiments.runner.row``); ``status=None``: automatic."""
  return runner.row(item, paper, ours, status, seeds=seeds, spread=spread, note=note)


def fmt(x: float, digits: int = 3) -> str:
  return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def jacobian_samples(cfg: MLPConfig, key: jax.Array, alpha: float, beta: float, *,
                     num_seeds: int = 1, num_inputs: int = 1, path_sums: bool = False,
                     num_chunks: int | None = None, reference: str = "product") -> dict:
  """Per-sample study arrays (leading (seeds, inputs) axes) as numpy.

  Compiled once per shape-determining config (alpha and beta are traced).
  """
  base = dataclasses.replace(cfg, alpha=1.0)
  if reference == "product":   # the network reference reads cfg.beta (static)
    base = dataclasses.replace(base, beta=1.0)
  else:
    base = dataclasses.replace(base, beta=beta)
  fn = jacobians.make_study_fn(base, num_inputs, num_seeds, path_sums=path_sums,
                               num_chunks=num_chunks, reference=reference)
  with single_blas_thread():
    out = fn(key, alpha, beta)
    return {k: np.asarray(v) for k, v in out.items()}


def main(run: Callable[..., dict], description: str) -> None:
  """A script's command line (``runner.script_main``): ``--out``, ``--scale``."""
  runner.script_main(run, description, default_out="runs/transforming_rank")
