"""A study's experiments with what each cost when its committed results were made:
the wall time (``provenance.wall_s``) of ``<study folder>/results/<scale>/<name>.json``,
per scale where one is committed. ``rankjax reproduce --only`` lists them when a name
is not known, so a user picks knowing the cost."""

from __future__ import annotations

import json
import pathlib


def duration(seconds: float) -> str:
  """``28 s``, ``4.2 min``, ``1.3 h``."""
  if seconds < 60:
    return f"{seconds:.0f} s"
  return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def costs(study) -> dict[str, dict[str, float]]:
  """``{experiment: {scale: wall seconds}}`` of ``study``'s committed results (a
  ``Study`` loaded by ``rankjax._src.studies.finder``; none without a folder)."""
  out: dict[str, dict[str, float]] = {name: {} for name in study.experiments}
  results = pathlib.Path(study.folder) / "results" if study.folder else None
  if results is None or not results.is_dir():
    return out
  for scale in sorted(p.name for p in results.iterdir() if p.is_dir()):
    for name in out:
      path = results / scale / f"{name}.json"
      if path.is_file():
        wall = json.loads(path.read_text()).get("provenance", {}).get("wall_s")
        if isinstance(wall, (int, float)):
          out[name][scale] = float(wall)
  return out


def experiments_with_costs(study) -> str:
  """``name (quick 28 s, paper 1.3 h); other (no committed result)``, in the study's
  order, then its aliases."""
  parts = []
  for name, by_scale in costs(study).items():
    cost = ", ".join(f"{scale} {duration(s)}" for scale, s in by_scale.items())
    parts.append(f"{name} ({cost or 'no committed result'})")
  text = "; ".join(parts)
  if study.aliases:
    text += "; aliases: " + ", ".join(f"{a} = {n}" for a, n in sorted(study.aliases.items()))
  return text
