"""Metrics of a run: ``WORKDIR/metrics.jsonl``, TensorBoard, and the console.

Every update appends one JSON line (``{"step", "loss", "grad_norm", "lr", ...}``;
evaluation rows carry ``"kind": "eval"``). TensorBoard event files go to
``WORKDIR/tensorboard`` when ``tensorboardX`` is installed (else the run's first lines
say TensorBoard is off): train scalars every
``log_every`` updates, every evaluation, and every diagnostics step's arrays and
per-layer profile images (tags and layout in ``rankjax._src.train.tensorboard``); a resumed
run first drops the events after its checkpoint step (a run started over at step 0,
e.g. after a kill before the first checkpoint, drops them all), so each step is in
the files once. On a terminal (a TTY) a tqdm progress bar shows step, loss and throughput
(tokens/s, or images/s for image tasks); otherwise (a log file, SLURM) one plain line
is printed every ``log_every`` updates. Throughput is the mean over the log window's
updates that compiled nothing (``loop.throughput``). Only process 0 writes.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, TextIO

import jax
from etils import epath

from rankjax._src import storage
from rankjax._src.train import tensorboard as tb_lib

REPLACED = "metrics_replaced.jsonl"
# Row keys that are no time series (not written to TensorBoard).
NOT_SCALARS = ("step", "kind", "compile_step")
# Throughput metrics (``loop.throughput``) and their console labels.
THROUGHPUT = (("tokens_per_s_avg", "tokens/s"), ("images_per_s_avg", "images/s"))


def _clean(v: Any) -> Any:
  """Python floats for numbers (NaN/Inf are written as JSON's NaN / Infinity)."""
  return float(v) if hasattr(v, "dtype") or isinstance(v, (int, float)) else v


class MetricsWriter:
  """Appends metrics to metrics.jsonl (+ TensorBoard) and reports progress."""

  def __init__(self, workdir: str | epath.PathLike, *, total_steps: int, log_every: int,
               start_step: int = 0, stream: TextIO | None = None,
               progress_bar: bool | None = None, image_every: int = 1, diag_every: int = 1):
    """``image_every``: the per-layer profile images (a matplotlib drawing each, ~0.3 s
    of host time) are drawn at update 1 and on the first diagnostics step of every
    ``image_every`` updates (diagnostics every ``diag_every``); scalars and histograms
    at every diagnostics step."""
    self.enabled = jax.process_index() == 0
    self.image_every, self.diag_every = max(image_every, 1), max(diag_every, 1)
    workdir = storage.as_path(workdir, "workdir")
    self.path = workdir / "metrics.jsonl"
    self.log_every = log_every
    self.stream = stream or sys.stdout
    self._tb = None
    self._bar = None
    self._backfilled: set[tuple[str, int]] = set()
    if not self.enabled:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._file = self._open()
    try:
      from tensorboardX import SummaryWriter  # optional
      logdir = str(workdir / "tensorboard")
      if not storage.is_remote(workdir):   # a fresh start (0) drops a killed run's steps too
        tb_lib.purge_after(logdir, start_step)
      # purge_step: TensorBoard itself also discards older events of steps > start
      # (object stores, where the files are not rewritten).
      # The suffix keeps a restart within the same second from overwriting a file
      # (tensorboardX names files by the second and the host only).
      self._tb = SummaryWriter(logdir, purge_step=start_step + 1,
                               filename_suffix=f".{os.getpid()}.{start_step}")
    except ImportError:
      self.stream.write("TensorBoard off: tensorboardX is not installed "
                        "(pip install \"rankjax[logging]\"); metrics.jsonl has every metric\n")
    except Exception as e:  # noqa: BLE001 - e.g. a URL tensorboardX cannot write to
      self.stream.write(f"TensorBoard off: cannot write to {workdir / 'tensorboard'} ({e})\n")
    if progress_bar is None:
      progress_bar = self.stream.isatty()
    if progress_bar:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total_steps, initial=start_step, file=self.stream,
                       dynamic_ncols=True, desc="train")

  def _open(self):
    """Local: a line-buffered append (every line survives SIGKILL). Object stores
    cannot append: lines are kept and the whole object rewritten at each ``flush``
    (before every checkpoint save and at the end), so a kill loses at most the lines
    after the last checkpoint, which the resumed run writes again."""
    if not storage.is_remote(self.path):
      return open(self.path, "a", buffering=1)
    return _RewrittenObject(self.path)

  @staticmethod
  def truncate(workdir: str | epath.PathLike, step: int) -> None:
    """Drops lines after ``step`` (a resumed run rewrites them); process 0 only.

    No line up to ``step`` is lost: the file is replaced atomically
    (``storage.write_text_atomic``), and the dropped lines (those after ``step``, and
    a last line cut short by a kill) are appended to ``metrics_replaced.jsonl``
    first.
    """
    path = storage.as_path(workdir) / "metrics.jsonl"
    if jax.process_index() != 0 or not path.exists():
      return
    keep, dropped = [], []
    for line in path.read_text().splitlines():
      try:
        (keep if json.loads(line).get("step", 0) <= step else dropped).append(line)
      except json.JSONDecodeError:
        dropped.append(line)
    if not dropped:
      return
    replaced = path.parent / REPLACED
    old = replaced.read_text() if replaced.exists() else ""
    storage.write_text_atomic(replaced, old + "".join(f"{line}\n" for line in dropped))
    storage.write_text_atomic(path, "".join(f"{line}\n" for line in keep))

  def write(self, step: int, metrics: Mapping[str, Any], kind: str = "train") -> None:
    if not self.enabled:
      return
    row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
    if kind != "train":
      row["kind"] = kind
    self._file.write(json.dumps(row) + "\n")
    if self._tb is not None and (kind != "train" or step % self.log_every == 0):
      self._add_scalars(step, [(f"{kind}/{k}", v) for k, v in row.items()
                               if k not in NOT_SCALARS and isinstance(v, float)])
    if kind != "train":
      self.message(f"step {step} {kind}: " + " ".join(
          f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float)))
      return
    if self._bar is not None:
      self._bar.update(step - self._bar.n)
      if step % self.log_every == 0:
        speed = {label: f"{row[k]:.3g}" for k, label in THROUGHPUT if k in row}
        self._bar.set_postfix({"loss": f"{row.get('loss', float('nan')):.4f}", **speed})
    elif step % self.log_every == 0:
      self.stream.write(self.format(row) + "\n")
      self.stream.flush()


  def backfill(self, up_to: int, history: Any = None) -> int:
    """Writes to TensorBoard what step ``up_to`` (the restored checkpoint) covers but
    the event files lack; returns the number of scalars written (a diagnostics step's
    histograms and per-layer images that the files lack are written too).

    tensorboardX queues events for a writer thread and its ``flush`` does not wait
    for the queue, so a killed run can lose events that metrics.jsonl (line-buffered)
    and the checkpoint's diagnostics history hold. A resumed run rewrites those from
    metrics.jsonl (train rows every ``log_every`` steps, eval rows) and ``history``
    (a ``diagnostics.DiagnosticsHistory``). Local workdirs only.
    """
    if not self.enabled or self._tb is None or not up_to or storage.is_remote(self.path):
      return 0
    # on disk, plus what an earlier call queued (tensorboardX writes asynchronously)
    have = tb_lib.written_summaries(self._tb.logdir) | self._backfilled
    written = 0
    lines = self.path.read_text().splitlines() if self.path.exists() else []
    for line in lines:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue
      step, kind = int(row.get("step", 0)), row.get("kind", "train")
      if step > up_to or (kind == "train" and step % self.log_every):
        continue
      missing = [(f"{kind}/{k}", v) for k, v in row.items() if k not in NOT_SCALARS
                 and isinstance(v, float) and (f"{kind}/{k}", step) not in have]
      self._add_scalars(step, missing)
      have.update((tag, step) for tag, _ in missing)
      written += len(missing)
    if history is not None:
      for i, step in enumerate(history.steps):
        if step > up_to:
          continue
        diag = {name: {key: values[i] for key, values in keys.items()}
                for name, keys in history.series.items()}
        missing = [(t, v) for t, v in tb_lib.diagnostic_scalars(diag) if (t, step) not in have]
        self._add_scalars(step, missing)
        have.update((tag, step) for tag, _ in missing)
        written += len(missing)
        self._write_arrays(step, diag, skip=have)
    self._backfilled = have
    return written

  def write_diagnostics(self, step: int, diag: Mapping[str, Mapping[str, Any]]) -> None:
    """One diagnostics step ({diagnostic: {key: array}}, host arrays) to TensorBoard."""
    if not self.enabled or self._tb is None:
      return
    self._add_scalars(step, list(tb_lib.diagnostic_scalars(diag)))
    self._write_arrays(step, diag)

  def _add_scalars(self, step: int, scalars: list[tuple[str, float]]) -> None:
    self._add_summary(step, tb_lib.scalar_values(scalars))

  def _add_summary(self, step: int, values: list[Any]) -> None:
    """One TensorBoard event holding every summary value of ``step`` (a Summary of
    several values, as TensorFlow's own writers emit; tensorboardX's ``add_scalar`` and
    ``add_histogram`` write one event per tag through the same call). A diagnostics step
    has hundreds of per-layer scalars, and one event each made the loop wait on
    tensorboardX's 10-event queue: 3.6 of 5.5 s of TensorBoard time in a 60-update
    quick Post-Norm run with diagnostics at every update, 1.1 s as one event a step."""
    if values:
      self._tb._get_file_writer().add_summary(tb_lib.summary(values), step)

  def _write_arrays(self, step: int, diag: Mapping[str, Mapping[str, Any]],
                    skip: set[tuple[str, int]] | None = None) -> None:
    """A diagnostics step's histograms and per-layer profile images, except the
    (tag, step) pairs in ``skip`` (which gains those written)."""
    histograms = [(tag, values) for tag, values in tb_lib.diagnostic_histograms(diag)
                  if skip is None or (tag, step) not in skip]
    self._add_summary(step, tb_lib.histogram_values(histograms, self._tb.default_bins))
    if skip is not None:
      skip.update((tag, step) for tag, _ in histograms)
    if not self.draws_images(step):
      return
    for tag, image in tb_lib.diagnostic_images(step, diag, skip=skip):
      self._tb.add_image(tag, image, step, dataformats="HWC")
      if skip is not None:
        skip.add((tag, step))

  def draws_images(self, step: int) -> bool:
    """Whether diagnostics step ``step`` gets profile images (see ``image_every``)."""
    return step <= 1 or step // self.image_every != (step - self.diag_every) // self.image_every

  @staticmethod
  def format(row: Mapping[str, Any]) -> str:
    parts = [f"step {row['step']}"]
    for key, label, fmt in (("loss", "loss", ".4f"), ("grad_norm", "grad_norm", ".3g"),
                            ("lr", "lr", ".3g"), ("accuracy", "accuracy", ".3f"),
                            *((k, label, ".4g") for k, label in THROUGHPUT),
                            ("mfu", "MFU", ".1%")):
      if isinstance(row.get(key), float):
        parts.append(f"{label} {row[key]:{fmt}}")
    return "  ".join(parts)

  def message(self, text: str) -> None:
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.write(text)
    else:
      self.stream.write(text + "\n")
      self.stream.flush()

  def flush(self) -> None:
    if self.enabled:
      self._file.flush()
      if self._tb is not None:
        self._tb.flush()

  def close(self) -> None:
    if not self.enabled:
      return
    self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._bar is not None:
      self._bar.close()


class _RewrittenObject:
  """A file-like append target on an object store: ``flush`` rewrites the object."""

  def __init__(self, path: epath.Path):
    self.path = path
    self._text = path.read_text() if path.exists() else ""
    self._dirty = False

  def write(self, text: str) -> None:
    self._text += text
    self._dirty = True

  def flush(self) -> None:
    if self._dirty:
      self.path.write_text(self._text)
      self._dirty = False

  def close(self) -> None:
    self.flush()
