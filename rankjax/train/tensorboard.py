"""TensorBoard event files of a run: what goes in, reading them back, resume purging.

Tags (the same names as ``metrics.jsonl`` and ``rankjax.load_run``):

* ``train/<metric>`` every ``log_every`` updates; ``eval/<metric>`` at each evaluation;
* ``diagnostics/<diagnostic>/<key>`` at every diagnostics step (``diag_every``), the
  series ``load_run`` returns as ``"<diagnostic>/<key>"`` (``rankjax report`` plots
  those): a scalar value as one scalar; a per-layer profile (L,) as one scalar per
  layer, ``.../layer_00`` ... (TensorBoard's regex filter ``tsim_y2/layer`` overlays
  them), plus a histogram of the profile; larger arrays as a histogram.

A resumed run continues from a checkpoint step s that is older than the last step
the killed run wrote: ``purge_after(logdir, s)`` rewrites the existing event files
without their events of steps > s (the resumed run writes them again), so every step
is in the files once. tensorboardX writes from a queue that its ``flush`` does not
drain, so a kill can also lose events up to s that metrics.jsonl and the checkpoint
hold: ``MetricsWriter.backfill`` writes those again. Readers need no TensorBoard
install: ``read_scalars``.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Iterator, Mapping

import numpy as np

MAX_LAYER_SCALARS = 256   # profiles longer than this get only the histogram


def diagnostic_scalars(diag: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, float]]:
  """(tag, value) of every scalar TensorBoard gets from one diagnostics step."""
  for name, values in diag.items():
    for key, v in values.items():
      a = np.asarray(v)
      tag = f"diagnostics/{name}/{key}"
      if a.ndim == 0:
        yield tag, float(a)
      elif a.ndim == 1 and a.size <= MAX_LAYER_SCALARS:
        for layer, x in enumerate(a):
          yield f"{tag}/layer_{layer:02d}", float(x)


def diagnostic_histograms(diag: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, np.ndarray]]:
  """(tag, finite values) of every non-scalar diagnostic array."""
  for name, values in diag.items():
    for key, v in values.items():
      a = np.asarray(v, np.float64)
      if a.ndim >= 1 and np.isfinite(a).any():
        yield f"diagnostics/{name}/{key}", a[np.isfinite(a)].reshape(-1)


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
