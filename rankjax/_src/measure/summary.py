"""What ``rankjax measure mlp`` writes: mean and spread, sweep tables, figures.

``spread(samples)`` takes the per-sample arrays of ``mlp_jacobian_study(...,
return_samples=True)`` (leading (seeds, inputs) axes) and gives, per field, over
all seeds x inputs samples: ``sd`` (ddof=1), ``min``, ``max``, and ``sd_seed_means``
(the sd, ddof=1, of the per-seed means: the inputs of one weight draw are not
independent, so this is the spread to quote for the mean over seeds). The means
are ``JacobianStudy``'s (Transforming Rank Eq. 3 ranks, App A.1 path masses, ...).

Path masses everywhere in these outputs are natural logs (``order_log_mass`` =
ln mu_k); figures plot mu_k / max_k mu_k.

A sweep is the cartesian product of ``--sweep field=v1,v2,...`` over MLPConfig
fields: one row per point (``sweep_row``), written as JSON, CSV and Markdown
(``write_table``) and drawn as one figure (``plot_sweep``). Each column's name says
its aggregate over the seeds x inputs samples: ``erank_L_mean``, ``erank_L_sd``,
``erank_L_min``, ``erank_L_max``, ...; ``reconstruction_error_max`` (App A.1's check
keeps the worst sample) with its ``_sd`` and ``_min``. Points differing only
in ``alpha`` / ``beta`` share one compiled program (both are traced arguments of
``make_study_fn``); other fields change shapes or the traced graph and compile
once per value.
"""

from __future__ import annotations

import csv
import io
import itertools
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from rankjax._src import plotting
from rankjax._src.errors import UserError

# per-sample fields with leading (seeds, inputs) axes
SAMPLE_FIELDS = ("erank", "stable_rank", "order_profile", "order_log_mass", "mean_order",
                 "stream_rms", "branch_to_skip", "accumulated_branch",
                 "accumulated_uncorrelated", "reconstruction_error")
# the scalar columns of a sweep table: (name, field, index into the field's last axis,
# what the study's value of the field is over the samples)
TABLE_COLUMNS = (("erank_L", "erank", -1, "mean"), ("stable_rank_L", "stable_rank", -1, "mean"),
                 ("mean_order", "mean_order", None, "mean"),
                 ("stream_rms_L", "stream_rms", -1, "mean"),
                 ("reconstruction_error", "reconstruction_error", None, "max"))


def spread(samples: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
  """{field: {"sd", "sd_seed_means", "min", "max"}} as lists (NaN where undefined)."""
  out = {}
  for field in SAMPLE_FIELDS:
    if field not in samples:
      continue
    a = np.asarray(samples[field], np.float64)
    s, i = a.shape[:2]
    flat = a.reshape(s * i, *a.shape[2:])
    with np.errstate(invalid="ignore", divide="ignore"):
      sd = np.std(flat, axis=0, ddof=1) if s * i > 1 else np.full(flat.shape[1:], np.nan)
      seed_means = a.mean(axis=1)
      sd_seeds = np.std(seed_means, axis=0, ddof=1) if s > 1 else np.full(a.shape[2:], np.nan)
    out[field] = {"sd": sd.tolist(), "sd_seed_means": sd_seeds.tolist(),
                  "min": flat.min(axis=0).tolist(), "max": flat.max(axis=0).tolist()}
  return out


def parse_sweeps(sweeps: Sequence[str]) -> list[tuple[str, list[str]]]:
  """``["depth=12,24", "norm_position=pre,post"]`` -> [(field, [raw values])]."""
  out = []
  for item in sweeps:
    key, sep, values = item.partition("=")
    items = [v.strip() for v in values.split(",")]
    if not sep or not key.strip() or not any(items):
      raise UserError(f"--sweep expects field=v1,v2,..., got {item!r}")
    if not all(items):
      raise UserError(f"--sweep {item!r}: an empty value in the list")
    if any(k == key.strip() for k, _ in out):
      raise UserError(f"--sweep {key.strip()} given twice")
    out.append((key.strip(), items))
  return out


def sweep_points(sweeps: Sequence[tuple[str, list[str]]]) -> list[list[str]]:
  """The cartesian product as lists of ``field=value`` overrides (the first sweep
  varies slowest)."""
  if not sweeps:
    return [[]]
  return [[f"{k}={v}" for (k, _), v in zip(sweeps, combo)]
          for combo in itertools.product(*(values for _, values in sweeps))]


def sweep_row(point: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
  """One table row: the swept values, then ``<column>_<aggregate>`` over the samples:
  mean, sd, min, max (``reconstruction_error``: max, sd, min; the study keeps its
  max, the worst sample)."""
  row = dict(point)
  for name, field, index, value_is in TABLE_COLUMNS:
    value = np.asarray(result[field], np.float64)
    stats = result["spread"].get(field, {})
    pick = (lambda v: float(np.asarray(v, np.float64)[index])) if index is not None else (
        lambda v: float(np.asarray(v, np.float64)))
    row[f"{name}_{value_is}"] = pick(value)
    for stat in ("sd", "min", "max"):
      if stat in stats and stat != value_is:
        row[f"{name}_{stat}"] = pick(stats[stat])
  row["dtype"] = result["dtype"]
  return row


def write_table(rows: Sequence[Mapping[str, Any]], out_json: pathlib.Path) -> list[pathlib.Path]:
  """``rows`` as ``out.csv`` and ``out.md`` next to ``out_json``; returns the paths."""
  columns = list(rows[0])
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=columns)
  writer.writeheader()
  writer.writerows(rows)
  csv_path = out_json.with_suffix(".csv")
  csv_path.write_text(buf.getvalue())
  fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(fmt(r[c]) for c in columns) + " |" for r in rows]
  md_path = out_json.with_suffix(".md")
  md_path.write_text("\n".join(lines) + "\n")
  return [csv_path, md_path]


def _band(ax, x, result, field, label, color=None):
  mean = np.asarray(result[field], np.float64)
  line, = ax.plot(x, mean, label=label, color=color)
  stats = result.get("spread", {}).get(field)
  if stats:
    lo, hi = np.asarray(stats["min"], np.float64), np.asarray(stats["max"], np.float64)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
  return line


def plot_study(result: Mapping[str, Any], path: pathlib.Path, title: str = "") -> pathlib.Path:
  """erank/d and stable rank/d of dh_l/dh_0 (Eq. 3, Fig 1), mu_k / max mu_k (Fig 3a,
  from ln masses) and rms(h_l) (Fig 5a): means, min-max over samples shaded."""
  plt = plotting.pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
  layers = np.arange(1, len(result["erank"]) + 1)
  _band(axes[0], layers, result, "erank", "effective rank / d")
  _band(axes[0], layers, result, "stable_rank", "stable rank / d")
  axes[0].set(xlabel="layer l", ylabel="rank of dh_l/dh_0 / d", ylim=(0, 1.05))
  axes[0].legend()
  log_mass = np.asarray(result["order_log_mass"], dtype=float)
  if np.all(np.isnan(log_mass)):
    axes[1].text(0.5, 0.5, "path sums not computed", ha="center", transform=axes[1].transAxes)
  else:
    axes[1].semilogy(np.arange(len(log_mass)), np.exp(log_mass - np.nanmax(log_mass)))
  axes[1].set(xlabel="path order k", ylabel="mu_k / max_k mu_k")
  rms = np.asarray(result["stream_rms"], np.float64)
  _band(axes[2], np.arange(len(rms)), result, "stream_rms", "rms(h_l)")
  axes[2].set(xlabel="layer l", ylabel="rms(h_l)")
  if rms.max() / max(rms.min(), 1e-30) > 100:
    axes[2].set_yscale("log")
  n = f"{result['num_seeds']} seeds x {result['num_inputs']} inputs, {result['dtype']}"
  fig.suptitle(f"{title} ({n}; shaded: min-max)" if title else n)
  plotting.plain_ticks(fig)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def plot_sweep(points: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]],
               path: pathlib.Path) -> pathlib.Path:
  """erank/d of dh_l/dh_0 against depth fraction l/L for every sweep point (min-max
  shaded), and the final erank/d per point with sd error bars."""
  plt = plotting.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(12, 4))
  labels = [", ".join(f"{k}={v}" for k, v in p.items()) or "config" for p in points]
  for label, result in zip(labels, results):
    depth = len(result["erank"])
    _band(axes[0], np.arange(1, depth + 1) / depth, result, "erank", label)
  axes[0].set(xlabel="l / L", ylabel="erank(dh_l/dh_0) / d", ylim=(0, 1.05))
  axes[0].legend(fontsize=7)
  final = [np.asarray(r["erank"], np.float64)[-1] for r in results]
  sd = [np.asarray(r["spread"]["erank"]["sd"], np.float64)[-1] for r in results]
  axes[1].errorbar(np.arange(len(final)), final, yerr=np.nan_to_num(sd), fmt="o", capsize=3)
  axes[1].set_xticks(np.arange(len(final)), labels, rotation=30, ha="right", fontsize=7)
  axes[1].set(ylabel="erank(dh_L/dh_0) / d (+- sd)")
  n = results[0]
  fig.suptitle(f"{n['num_seeds']} seeds x {n['num_inputs']} inputs, {n['dtype']}")
  plotting.plain_ticks(fig)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
