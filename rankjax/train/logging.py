"""Metrics of a run: ``WORKDIR/metrics.jsonl``, TensorBoard, and the console.

Every update appends one JSON line (``{"step", "loss", "grad_norm", "lr", ...}``;
evaluation rows carry ``"kind": "eval"``). TensorBoard event files go to
``WORKDIR/tensorboard`` when ``tensorboardX`` is installed. On a terminal a tqdm
progress bar shows step, loss and tokens/s; otherwise one line is printed every
``log_every`` updates. Only process 0 writes.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any, Mapping, TextIO

import jax


def _clean(v: Any) -> Any:
  """Python floats for numbers (NaN/Inf are written as JSON's NaN / Infinity)."""
  return float(v) if hasattr(v, "dtype") or isinstance(v, (int, float)) else v


class MetricsWriter:
  """Appends metrics to metrics.jsonl (+ TensorBoard) and reports progress."""

  def __init__(self, workdir: str | pathlib.Path, *, total_steps: int, log_every: int,
               start_step: int = 0, stream: TextIO | None = None,
               progress_bar: bool | None = None):
    self.enabled = jax.process_index() == 0
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.log_every = log_every
    self.stream = stream or sys.stdout
    self._tb = None
    self._bar = None
    if not self.enabled:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._file = open(self.path, "a", buffering=1)  # line-buffered: survives SIGKILL
    try:
      from tensorboardX import SummaryWriter  # optional
      self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))
    except ImportError:
      pass
    if progress_bar is None:
      progress_bar = self.stream.isatty()
    if progress_bar:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total_steps, initial=start_step, file=self.stream,
                       dynamic_ncols=True, desc="train")

  @staticmethod
  def truncate(workdir: str | pathlib.Path, step: int) -> None:
    """Drops lines after ``step`` (a resumed run rewrites them); process 0 only."""
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if jax.process_index() != 0 or not path.exists():
      return
    keep = []
    for line in path.read_text().splitlines():
      try:
        if json.loads(line).get("step", 0) <= step:
          keep.append(line)
      except json.JSONDecodeError:
        pass
    path.write_text("".join(f"{line}\n" for line in keep))

  def write(self, step: int, metrics: Mapping[str, Any], kind: str = "train") -> None:
    if not self.enabled:
      return
    row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
    if kind != "train":
      row["kind"] = kind
    self._file.write(json.dumps(row) + "\n")
    if self._tb is not None:
      for k, v in row.items():
        if k not in ("step", "kind") and isinstance(v, float):
          self._tb.add_scalar(f"{kind}/{k}", v, step)
    if kind != "train":
      self.message(f"step {step} {kind}: " + " ".join(
          f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float)))
      return
    if self._bar is not None:
      self._bar.update(step - self._bar.n)
      if step % self.log_every == 0:
        self._bar.set_postfix(loss=f"{row.get('loss', float('nan')):.4f}",
                              tok_s=f"{row.get('tokens_per_s_avg', 0.0):.3g}")
    elif step % self.log_every == 0:
      self.stream.write(self.format(row) + "\n")
      self.stream.flush()


  @staticmethod
  def format(row: Mapping[str, Any]) -> str:
    parts = [f"step {row['step']}"]
    for key, label, fmt in (("loss", "loss", ".4f"), ("grad_norm", "grad_norm", ".3g"),
                            ("lr", "lr", ".3g"), ("accuracy", "accuracy", ".3f"),
                            ("tokens_per_s_avg", "tokens/s", ".4g")):
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
