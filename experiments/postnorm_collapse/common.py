"""Helpers shared by the Post-Norm collapse scripts: init-time captures, runs, plots."""
from __future__ import annotations

import pathlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rankjax.studies import runner

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = pathlib.Path(__file__).resolve().parent / "configs"


def main(run: Callable[[str, str], dict], doc: str, default_out: str,
         scales: Sequence[str] = ("quick",),
         show: Callable[[dict], Any] = lambda result: result) -> None:
  """A script's command line (``runner.script_main``): ``--out`` and ``--scale``;
  prints ``show(result)``."""
  ordered = list(dict.fromkeys(["quick", *sorted(scales)]).keys() & set(scales))
  ordered.sort(key=lambda x: (x != "quick", x))      # --scale defaults to quick
  runner.script_main(run, doc, default_out=default_out, scales=ordered, show=show)


def pyplot():
  """matplotlib.pyplot on the Agg backend."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


write_json = runner.write_json


def init_sites(model, params, tokens_BxT) -> dict[str, jax.Array]:
  """X_k^l, Y_k^l (L, B, T, d) and the stream entering each layer (L, B, T, d).

  The stream ``h^l`` is what the layer's skip connection carries: ``x1`` for
  Post-Norm, the un-normalized residual for Pre-Norm (embeddings at l = 1, then the
  previous layer's ``y2``).
  """
  _, state = model.apply({"params": params}, tokens_BxT, capture=True,
                         mutable=["intermediates"])
  inter = state["intermediates"]["layers"]
  sites = {k: inter[k][0] for k in ("x1", "y1", "x2", "y2")}
  if model.cfg.norm_position == "post":
    sites["h"] = sites["x1"]
  else:
    emb = params["embed"]["embedding"][tokens_BxT]
    sites["h"] = jnp.concatenate([emb[None], sites["y2"][:-1]], axis=0)
  return sites


def import_sibling(name: str):
  """Imports ``experiments.postnorm_collapse.<name>`` (run scripts with ``python -m``)."""
  import importlib
  return importlib.import_module(f"experiments.postnorm_collapse.{name}")


def load_config(name: str, overrides: list[str] | None = None):
  """A TrainConfig from ``configs/<name>.json`` with ``key=value`` overrides."""
  from rankjax import config as config_lib
  from rankjax.config import TrainConfig
  cfg = config_lib.from_json(TrainConfig, CONFIGS / f"{name}.json")
  return config_lib.override(cfg, overrides or [])


def mean_np(x) -> np.ndarray:
  return np.asarray(jax.device_get(x), np.float64)
