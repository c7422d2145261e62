"""Shared helpers for the Transforming Rank experiments.

Every experiment module declares ``CLAIMS`` and ``SCALES`` at import and exposes
``run(out_dir, scale="quick"|"paper"|"tiny", **overrides) -> dict``, which writes
``<name>.json`` and ``<name>.png`` into ``out_dir``. The returned dict has a
``measured`` list (``rankjax.studies.measured``: the value(s) measured for one of the
claims the module declares, ``CLAIMS``); ``rankjax.studies.run_study`` judges each by its
claim and collects the rows into ``summary.json`` and ``summary.md``
(``rankjax reproduce transforming_rank``). Settings come from the module's ``SCALES``
table; any keyword argument overrides one setting.

The study's one tolerance policy (EXPECTED.md, "How rows are judged") is :func:`rule`:
it is decided from the paper's printed number and the kind of quantity, never from
our outcomes.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Any

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy/scipy load BLAS

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401

import jax  # noqa: E402

from rankjax import measure, studies  # noqa: E402
from rankjax.config import MLPConfig  # noqa: E402
from rankjax.measure import single_blas_thread  # noqa: E402,F401
from rankjax.studies import Abs, Bound, Claim, OneMinus, Qualitative, Rel, Rule  # noqa: E402


SCALE_NAMES = ("quick", "paper", "tiny")   # the keys of every experiment's SCALES table


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



def write(out_dir: str | pathlib.Path, name: str, result: dict, fig=None) -> dict:
  out = pathlib.Path(out_dir)
  studies.write_json(out, name, result)
  if fig is not None:
    fig.tight_layout()
    studies.save_figure(fig, out / f"{name}.png", dpi=110)
    plt.close(fig)
  return result


NEAR_ZERO = 0.1       # |paper| below this: an absolute band
ABS_FLOOR = 0.005     # ... of half a unit in the second decimal (0.5% of d for erank/d)
NEAR_ONE = 0.9        # paper in [0.9, 1]: relative on 1 - x
ONE_MINUS_RTOL = 0.25
RTOL = 0.05           # elsewhere: 5% relative
FLOAT32_EXACT = 1e-5  # an identity exact in real arithmetic, checked in float32
FLOAT64_EXACT = 1e-12  # ... in float64


def rule(paper: float, fraction: bool = False) -> Rule:
  """The study's tolerance policy for a number the paper prints: ``Abs(0.005)`` near 0
  (|paper| < 0.1) and for a fraction printed as exactly 1 (half a unit of "1.00");
  ``OneMinus(0.25)`` for a fraction (erank/d, a share in [0, 1]) near 1 (0.9 <= paper
  < 1); ``Rel(0.05)`` elsewhere (a ratio of 1 is "elsewhere"); several seeds are judged
  on their mean's 95% interval (``rankjax.studies``), the band never widened."""
  if abs(paper) < NEAR_ZERO or (fraction and paper == 1.0):
    return Abs(ABS_FLOOR)
  if fraction and NEAR_ONE <= paper < 1.0:
    return OneMinus(ONE_MINUS_RTOL)
  return Rel(RTOL)


def claim(item: str, quantity: str, paper: float, note: str = "",
          fraction: bool = False) -> Claim:
  """A claim on a number the paper prints, judged by :func:`rule`."""
  return Claim(item, quantity, paper, rule(paper, fraction), note)


def frac(item: str, quantity: str, paper: float, note: str = "") -> Claim:
  """A claim on a fraction in [0, 1] (erank/d, a share), judged by :func:`rule`."""
  return claim(item, quantity, paper, note, fraction=True)


def exact(item: str, quantity: str, dtype: str = "float32", note: str = "") -> Claim:
  """An identity exact in real arithmetic: ``ours < FLOAT32_EXACT`` (or float64's); the
  threshold is ours (rounding), so the row's ``limit``, never its ``paper``."""
  limit = FLOAT32_EXACT if dtype == "float32" else FLOAT64_EXACT
  return Claim(item, quantity, None, Bound("<", limit=limit), note)


def bound(item: str, quantity: str, op: str, limit: float, note: str = "",
          every_seed: bool = False, ours: bool = False) -> Claim:
  """A worded claim as the predicate ``ours <op> limit``: ``limit`` is the paper's
  number, or (``ours=True``) a threshold of ours (the row's ``limit``; ``paper`` empty)."""
  if ours:
    return Claim(item, quantity, None, Bound(op, every_seed, limit=limit), note)
  return Claim(item, quantity, limit, Bound(op, every_seed), note)


def qualitative(item: str, quantity: str, reason: str, note: str = "") -> Claim:
  """A claim with no number the paper prints ("coincide", "indistinguishable"), shown
  with its measured value and figure, not judged: ``reason`` says why no band is
  derived."""
  return Claim(item, quantity, None, Qualitative(reason), note)


def worded(claims: dict, words: list) -> dict:
  """``claims`` with the paper's words: ``words`` is a list of ``(pattern, where, quote)``
  or ``(pattern, where, quote, fields)``; the first pattern found (``re.search``) in a
  claim's item gives its ``where`` and ``quote`` (and ``fields``: kind, reading,
  post_hoc, family, ...). A claim no pattern matches is an error."""
  out = {}
  for item, c in claims.items():
    for entry in words:
      pattern, where, quote = entry[:3]
      if re.search(pattern, item):
        out[item] = dataclasses.replace(c, where=where, quote=quote,
                                        **(entry[3] if len(entry) > 3 else {}))
        break
    else:
      raise ValueError(f"claim {item!r}: no paper words declared for it")
  return out


IDENTITY = {"kind": "identity"}
SENSITIVITY = {"kind": "sensitivity"}


def per_seed_axis(x: Any, axis: int = 0) -> list[float]:
  """Per-seed values (``axis`` the seed axis; other axes averaged)."""
  a = np.asarray(x, dtype=float)
  a = np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1).mean(axis=1)
  return [float(v) for v in a]


def jacobian_samples(cfg: MLPConfig, key: jax.Array, alpha: float, beta: float, *,
                     num_seeds: int = 1, num_inputs: int = 1, path_sums: bool = False,
                     num_chunks: int | None = None, reference: str = "product",
                     spectra_layers: tuple[int, ...] | None = None) -> dict:
  """Per-sample study arrays (leading (seeds, inputs) axes) as numpy.

  Compiled once per shape-determining config (alpha and beta are traced).
  ``spectra_layers``: the layers whose ranks are measured (``StudyOptions``; all).
  """
  base = dataclasses.replace(cfg, alpha=1.0)
  if reference == "product":   # the network reference reads cfg.beta (static)
    base = dataclasses.replace(base, beta=1.0)
  else:
    base = dataclasses.replace(base, beta=beta)
  fn = measure.make_study_fn(base, num_inputs, num_seeds, path_sums=path_sums,
                             num_chunks=num_chunks, reference=reference,
                             spectra_layers=spectra_layers)
  with single_blas_thread():
    out = fn(key, alpha, beta)
    return {k: np.asarray(v) for k, v in out.items()}
