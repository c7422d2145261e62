"""Helpers shared by the Post-Norm collapse experiments: the judging policy's constants,
init-time captures, runs, plots.

How a row is judged is the one policy of EXPECTED.md ("How rows are judged"), written
here as the constants below (decided from the paper's wording and printed precision,
not from our outcomes); each experiment's ``CLAIMS`` use them:

- a number the paper prints, below 0.1 in size: ``Abs`` of half a unit of its last
  printed digit (Fig 7's m(0) ~ 0.006: 5e-4; Fig 9's 2.7%: 5e-4); otherwise ``Rel(0.05)``
  (Fig 7's m(1) ~ 0.100);
- "tracked (well) by Theorem X": the layer sum of the measured change over the
  theorem's within 25% of 1 (``Rel(TRACKS)``);
- "much smaller": at most a tenth (``MUCH_SMALLER``, an order of magnitude);
- "small" (a relative deviation): below 5% (``SMALL``; the paper calls Fig 9's <= 2.7% close);
- "approximately linear": R^2 of the linear fit >= 0.99 (``LINEAR_R2``);
- "most": a share above one half; "positive"/"negative"/"increasing": the sign;
- "stays near the frequency loss": (loss - L_freq) / L_freq within 5% of 0 (``NEAR``,
  the 5% of the collapse alarm in ``rankjax.train.diagnostics_postnorm``);
- "collapsed" last layer: t_sim >= 0.99 (``ONSET_SIM``);
- "early-layer gradients vanish" / "orders of magnitude smaller": ||g_1|| / ||g_L|| <
  1e-2 (``GRAD_COLLAPSE_RATIO``); a drop "by orders of magnitude": a factor >= 100
  (``ORDERS``, two orders); later layers "change much less": a factor < 10 (``MUCH_LESS``).
  Factors that span orders of magnitude across seeds are judged on their log10
  (``log10``: the interval of the seeds' mean log, i.e. of their geometric mean; an
  arithmetic mean of 127, 3e5 and 90 would be carried by one seed; chosen
  after the quick outcomes were known);
- "stays below 2.5": the maximum of alpha_k^l over the run and layers, < 2.5
  (``ALPHA_PAPER_MAX``);
- "most curves cross below 1": the share of (update, layer) entries with c < 1 in the
  30 updates after the transition > 1/2 (c the bound of Thm 3.6 / Prop D.1);
- an exact identity or a zero gradient in float64: below 1e-10 (``FLOAT64_ZERO``).

Several seeds are judged on their mean's 95% interval (``rankjax.studies.evidence``).
"""
from __future__ import annotations

import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rankjax.studies import runner

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = pathlib.Path(__file__).resolve().parent / "configs"

# the judging policy (module docstring; EXPECTED.md, "How rows are judged")
TRACKS = 0.25
MUCH_SMALLER = 0.1
SMALL = 0.05
LINEAR_R2 = 0.99
NEAR = 0.05
ORDERS = 100.0
MUCH_LESS = 10.0
FLOAT64_ZERO = 1e-10
ONSET_SIM = 0.99
GRAD_COLLAPSE_RATIO = 1e-2   # ||g_1|| / ||g_L|| below this = early-layer gradients vanished
ALPHA_PAPER_MAX = 2.5    # Sec 4.2: "the contribution factor stays below 2.5"
AFTER_OUTCOME = ("chosen after the outcome (issue 25 item 5); the preregistered protocol's "
                 "row is the headline")


def log10(x: Any) -> float:
  """log10 of a positive number (NaN otherwise: a missing or non-positive factor)."""
  v = num(x)
  return math.log10(v) if v > 0 else math.nan


def num(x: Any) -> float:
  """``x`` as a float; None (a value the results file could not hold) as NaN."""
  return float("nan") if x is None else float(x)


def scale_note(res: dict[str, Any]) -> str:
  """The note of an init-time row: its scale, width, length and depth."""
  s = res.get("settings", {})
  return (f"{res.get('scale')} scale: d={s.get('d_model')}, n={s.get('seq_len')}, "
          f"{s.get('num_layers')} layers")


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
  _, sites = model.apply({"params": params}, tokens_BxT, capture=True)
  if model.cfg.norm_position == "post":
    sites["h"] = sites["x1"]
  else:
    emb = params["embed"]["embedding"][tokens_BxT]
    sites["h"] = jnp.concatenate([emb[None], sites["y2"][:-1]], axis=0)
  return sites


def load_config(name: str, overrides: list[str] | None = None):
  """A TrainConfig from ``configs/<name>.json`` with ``key=value`` overrides."""
  from rankjax import config as config_lib
  from rankjax.config import TrainConfig
  cfg = config_lib.from_json(TrainConfig, CONFIGS / f"{name}.json")
  return config_lib.override(cfg, overrides or [])


def mean_np(x) -> np.ndarray:
  return np.asarray(jax.device_get(x), np.float64)
