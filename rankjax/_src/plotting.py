"""matplotlib's pyplot, imported when a figure is first drawn.

Nothing in rankjax imports matplotlib at import time (``import rankjax`` and the
command line stay free of it). The first figure selects the non-interactive Agg
backend (files only, no display needed) unless pyplot was already imported, in which
case the backend the user chose is kept.

``save_figure`` writes a PNG that carries what the figure shows (its titles and axis
labels, ``figure_description``); ``png_description`` reads it back, and the report
of ``rankjax reproduce`` captions each study figure with it. Every figure rankjax
saves has plain tick labels (``plain_ticks``): a near-constant series reads 0.0423603,
not an offset axis of "1e-9+4.23603e-2".
"""
from __future__ import annotations

import sys


def pyplot():
  """``matplotlib.pyplot``, on the Agg backend unless pyplot was already loaded."""
  if "matplotlib.pyplot" not in sys.modules:
    import matplotlib
    matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def figure_description(fig) -> str:
  """What a figure shows, from its own text: the suptitle, then each panel's title and
  what it plots against what (``y against x``)."""
  parts = [fig.get_suptitle()]
  for ax in fig.axes:
    if not ax.has_data():                 # a colorbar or an empty panel
      continue
    title, x, y = ax.get_title(), ax.get_xlabel(), ax.get_ylabel()
    axes = f"{y} against {x}" if x and y else (x or y)
    parts.append(": ".join(p for p in (title, axes) if p))
  return "; ".join(" ".join(p.split()) for p in parts if p)


def plain_ticks(fig) -> None:
  """No offset on any linear axis of ``fig`` (matplotlib's ``useOffset``): tick labels
  are the values themselves. Called when the figure is saved, after its scales are set
  (``set_yscale`` replaces the formatter)."""
  from matplotlib.ticker import ScalarFormatter
  for ax in fig.axes:
    for axis in (ax.xaxis, ax.yaxis):
      formatter = axis.get_major_formatter()
      if isinstance(formatter, ScalarFormatter):
        formatter.set_useOffset(False)


def save_figure(fig, path, dpi: int = 110) -> None:
  """``fig.savefig(path)`` as a PNG that carries ``figure_description(fig)`` (its
  ``Description`` text chunk; ``png_description`` reads it back: the report's caption),
  with plain tick labels (``plain_ticks``)."""
  plain_ticks(fig)
  fig.savefig(path, dpi=dpi, format="png", metadata={"Description": figure_description(fig)})


def png_description(path) -> str | None:
  """The ``Description`` text of a PNG written by ``save_figure`` (None without one)."""
  import io

  from PIL import Image
  with Image.open(io.BytesIO(path.read_bytes())) as image:
    return image.text.get("Description") or None
