"""matplotlib's pyplot, imported when a figure is first drawn.

Nothing in rankjax imports matplotlib at import time (``import rankjax`` and the
command line stay free of it). The first figure selects the non-interactive Agg
backend (files only, no display needed) unless pyplot was already imported, in which
case the backend the user chose is kept.
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
