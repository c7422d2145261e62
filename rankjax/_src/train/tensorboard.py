"""TensorBoard event files of a run: what goes in, reading them back, resume purging.

Tags (the same names as ``metrics.jsonl`` and ``rankjax.load_run``):

* ``train/<metric>`` every ``log_every`` updates; ``eval/<metric>`` at each evaluation;
* ``diagnostics/<diagnostic>/<key>`` at every diagnostics step (``diag_every``), the
  series ``load_run`` returns as ``"<diagnostic>/<key>"`` (``rankjax report`` plots
  those): a scalar value as one scalar; a per-layer profile (L,) as one scalar per
  layer, ``.../layer_00`` ... (layer 0 is the first, as in ``load_run``'s columns and
  the report; TensorBoard's regex filter ``tsim_y2/layer`` overlays them), plus a
  histogram of the profile; larger arrays as a histogram. A diagnostic that measures
  some layers only returns their indices as its ``layers`` key (the attention one:
  e.g. layers 0, 2, 3 of 4): its profiles of that length are tagged by the layer they
  measure (``attention/theta_cert_p50/layer_03``), and ``layers`` itself is no series
  of its own. (Runs written before this rule tagged them by column, ``layer_00`` ...,
  with a ``layers/layer_NN`` series holding the mapping; their checkpoints, which
  ``load_run`` and the report read, are unaffected; resumed, such a run's backfill
  writes its earlier steps again under the layer tags, beside the column ones.)
* ``diagnostics/<diagnostic>/per_layer`` (Images tab) at update 1 and then at the
  first diagnostics step of every ``image_every`` updates (``MetricsWriter``): one
  PNG per diagnostic with a panel per per-layer profile (value against layer, at the
  layers it measures; a log axis for a positive profile spanning more than two
  decades), so TensorBoard's step slider shows how e.g. the token similarity or the
  gradient norm evolves along the depth. Rendered with matplotlib's Agg canvas
  (``matplotlib.figure.Figure``, no pyplot, no process-wide backend; plain tick
  labels, ``plotting.plain_ticks``), imported the first time an image is drawn. A
  figure took about 0.1 s per panel on a loaded CPU core (4 panels 0.4 s, 22 panels
  1.9 s); the loop draws it while the next update runs on the device.

A resumed run continues from a checkpoint step s that is older than the last step
the killed run wrote: ``purge_after(logdir, s)`` rewrites the existing event files
without their events of steps > s (the resumed run writes them again), so every step
is in the files once. A run killed before its first checkpoint starts over at step 0,
and ``purge_after(logdir, 0)`` drops every step the killed run wrote. tensorboardX
writes from a queue that its ``flush`` does not drain, so a kill can also lose events
up to s that metrics.jsonl and the checkpoint hold: ``MetricsWriter.backfill`` writes
those again. Readers need no TensorBoard
install: ``read_scalars``.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Container, Iterator, Mapping

import numpy as np

from rankjax._src import plotting

MAX_LAYER_SCALARS = 256   # profiles longer than this get only the histogram
LAYERS_KEY = "layers"     # a diagnostic's indices of the layers it measures


def _measured(values: Mapping[str, Any]) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
  """(key, array, layer of each entry along a 1-D array) of one diagnostic's values:
  the ``layers`` key's indices (integers) for 1-D arrays of its length (that key itself
  left out), else 0, 1, ..."""
  layers = np.asarray(values.get(LAYERS_KEY, 0.0))
  layers = layers.reshape(-1) if np.issubdtype(layers.dtype, np.integer) else None
  for key, v in values.items():
    if key == LAYERS_KEY and layers is not None:
      continue
    a = np.asarray(v)
    at = layers if a.ndim == 1 and layers is not None and len(layers) == a.size else None
    yield key, a, np.arange(a.size) if at is None else at


def diagnostic_scalars(diag: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, float]]:
  """(tag, value) of every scalar TensorBoard gets from one diagnostics step."""
  for name, values in diag.items():
    for key, a, layers in _measured(values):
      tag = f"diagnostics/{name}/{key}"
      if a.ndim == 0:
        yield tag, float(a)
      elif a.ndim == 1 and a.size <= MAX_LAYER_SCALARS:
        for layer, x in zip(layers, a):
          yield f"{tag}/layer_{layer:02d}", float(x)


def scalar_values(scalars: list[tuple[str, float]]) -> list[Any]:
  """The ``Summary.Value`` of each ``(tag, value)`` as a scalar (tensorboardX's
  ``summary.scalar``, as ``add_scalar`` writes it); one event may hold many, and
  TensorBoard reads each as its tag's value at the event's step."""
  from tensorboardX.summary import scalar
  return [v for tag, x in scalars for v in scalar(tag, x).value]


def histogram_values(histograms: list[tuple[str, np.ndarray]], bins: Any) -> list[Any]:
  """The ``Summary.Value`` of each ``(tag, values)`` as a histogram over ``bins``
  (tensorboardX's ``summary.histogram``, as ``add_histogram`` writes it)."""
  from tensorboardX.summary import histogram
  return [v for tag, a in histograms for v in histogram(tag, a, bins).value]


def summary(values: list[Any]) -> Any:
  """One ``Summary`` proto of the values (one TensorBoard event)."""
  from tensorboardX.proto.summary_pb2 import Summary
  return Summary(value=values)


def diagnostic_histograms(diag: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, np.ndarray]]:
  """(tag, finite values) of every non-scalar diagnostic array."""
  for name, values in diag.items():
    for key, a, _ in _measured(values):
      a = a.astype(np.float64)
      if a.ndim >= 1 and np.isfinite(a).any():
        yield f"diagnostics/{name}/{key}", a[np.isfinite(a)].reshape(-1)


def per_layer_profiles(diag: Mapping[str, Mapping[str, Any]]
                       ) -> Iterator[tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]]:
  """(image tag, [(key, (L,) layers, (L,) profile), ...]) of every diagnostic with
  per-layer profiles: 1-D arrays of 2 to ``MAX_LAYER_SCALARS`` values, some finite."""
  for name, values in diag.items():
    profiles = []
    for key, a, layers in _measured(values):
      a = a.astype(np.float64)
      if a.ndim == 1 and 2 <= a.size <= MAX_LAYER_SCALARS and np.isfinite(a).any():
        profiles.append((key, layers, a))
    if profiles:
      yield f"diagnostics/{name}/per_layer", profiles


PANEL_COLUMNS = 3
PANEL_INCHES = (3.2, 2.3)
IMAGE_DPI = 80


def render_profiles(title: str, profiles: list[tuple[str, np.ndarray, np.ndarray]]
                    ) -> np.ndarray:
  """One figure, a panel per ``(key, layers, profile)`` (the profile against its
  layers), as an (H, W, 3) uint8 RGB image."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator
  cols = min(PANEL_COLUMNS, len(profiles))
  rows = -(-len(profiles) // cols)
  width, height = PANEL_INCHES[0] * cols, PANEL_INCHES[1] * rows + 0.4
  fig = Figure(figsize=(width, height), dpi=IMAGE_DPI)
  canvas = FigureCanvasAgg(fig)
  # fixed margins in inches (a constrained layout costs a third more time)
  fig.subplots_adjust(left=0.55 / width, right=1 - 0.15 / width, bottom=0.45 / height,
                      top=1 - 0.65 / height, wspace=0.35, hspace=0.55)
  fig.suptitle(title, y=1 - 0.1 / height, va="top")
  for i, (key, layers, profile) in enumerate(profiles):
    ax = fig.add_subplot(rows, cols, i + 1)
    ax.plot(layers, profile, marker="o", markersize=2.5, linewidth=1.0)
    finite = profile[np.isfinite(profile)]
    if finite.size and finite.min() > 0 and finite.max() > 100 * finite.min():
      ax.set_yscale("log")
    ax.set_title(key, fontsize=9)
    ax.set_xlabel("layer", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
  plotting.plain_ticks(fig)
  canvas.draw()
  return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def diagnostic_images(step: int, diag: Mapping[str, Mapping[str, Any]],
                      skip: Container[tuple[str, int]] | None = None
                      ) -> Iterator[tuple[str, np.ndarray]]:
  """(tag, (H, W, 3) uint8 image) of every diagnostic with per-layer profiles; those
  whose (tag, step) is in ``skip`` are not drawn."""
  for tag, profiles in per_layer_profiles(diag):
    if skip is not None and (tag, step) in skip:
      continue
    name = tag.split("/")[1]
    yield tag, render_profiles(f"{name}, update {step}", profiles)


def _records(path: str) -> Iterator[bytes]:
  """The TFRecord payloads of an event file; stops at a record cut short by a kill."""
  with open(path, "rb") as f:
    while True:
      header = f.read(12)
      if len(header) < 12:
        return
      (length,) = struct.unpack("<Q", header[:8])
      data = f.read(length)
      if len(data) < length or len(f.read(4)) < 4:
        return
      yield data


def event_files(logdir: str) -> list[str]:
  if not os.path.isdir(logdir):
    return []
  return sorted(os.path.join(logdir, n) for n in os.listdir(logdir) if "tfevents" in n)


def read_events(logdir: str) -> Iterator[Any]:
  """Every event (``tensorboardX.proto.event_pb2.Event``) of every file, in file order."""
  from tensorboardX.proto import event_pb2
  for path in event_files(logdir):
    for data in _records(path):
      event = event_pb2.Event()
      event.ParseFromString(data)
      yield event


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} of every scalar event, in the order written."""
  out: dict[str, list[tuple[int, float]]] = {}
  for event in read_events(logdir):
    for value in event.summary.value:
      if value.HasField("simple_value"):
        out.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
  return out


def written_summaries(logdir: str) -> set[tuple[str, int]]:
  """(tag, step) of every summary value (scalar, histogram, image) in the files."""
  return {(value.tag, int(event.step)) for event in read_events(logdir)
          for value in event.summary.value}


def read_images(logdir: str) -> dict[str, list[tuple[int, tuple[int, int]]]]:
  """{tag: [(step, (height, width)), ...]} of every image event, in the order written."""
  out: dict[str, list[tuple[int, tuple[int, int]]]] = {}
  for event in read_events(logdir):
    for value in event.summary.value:
      if value.HasField("image"):
        size = (int(value.image.height), int(value.image.width))
        out.setdefault(value.tag, []).append((int(event.step), size))
  return out


def purge_after(logdir: str, step: int) -> int:
  """Rewrites each local event file without the summaries of steps > ``step``.

  Atomic per file (temp file + rename). Returns the number of events removed.
  """
  from tensorboardX.proto import event_pb2
  from tensorboardX.record_writer import RecordWriter
  removed = 0
  for path in event_files(logdir):
    keep, dropped = [], 0
    for data in _records(path):
      event = event_pb2.Event()
      event.ParseFromString(data)
      if event.HasField("summary") and event.step > step:
        dropped += 1
      else:
        keep.append(data)
    size = os.path.getsize(path)
    if not dropped and sum(len(d) + 16 for d in keep) == size:
      continue                        # nothing to drop and no truncated tail
    tmp = path + ".tmp"
    writer = RecordWriter(tmp)
    for data in keep:
      writer.write(data)
    writer.flush()
    writer.close()
    os.replace(tmp, path)
    removed += dropped
  return removed
