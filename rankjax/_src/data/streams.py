"""Repeated passes over a streamed text set in one global order, whatever the host count.

A streamed source (tfds, ArrayRecord, a large text folder) is random access by
document. A training pass over it (``num_epochs=None``) is cut into global batches of
``S = batch_size * shard_count`` packed sequences, row g of every global batch coming
from packing stream g:

* each epoch e has one order of all N documents, drawn from (seed, e) by grain's index
  shuffle (``grain.MapDataset.shuffle``; unshuffled: the source order);
* stream g packs (concatenate-and-chunk with the end-of-document id, as
  ``rankjax._src.data.text``) the documents at positions g, g+S, g+2S, ... of epoch 0's
  order, then those of epoch 1's, and so on, so within an epoch every document is read
  by exactly one stream, and row g of consecutive batches continues stream g;
* host i of ``shard_count`` packs only the streams of its rows (``common.host_rows``:
  ``EpochBatches``' layout, so ``rankjax._src.train.sharding.global_batch`` reassembles the
  same global batches, micro-batches included, for any number of hosts).

Global batch k is therefore a function of (source, tokenizer, seed, shuffle, S,
seq_len, k) only. A host's state is the global batch index, S, and for each of its
streams the position of the document being cut and the offset into it (restoring
re-reads and re-tokenizes that one document). The states of all hosts together
describe every stream, so ``merge_states`` turns the files written by one process
count into a state every host of another count restores from (each takes its own
streams): resuming with another number of processes continues exactly.
"""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any, Callable, Sequence

import grain
import numpy as np
from etils import epath

from rankjax._src.data import common
from rankjax._src.errors import UserError

STATE_KEYS = frozenset({"next_batch", "streams", "rows", "docs", "offsets"})


class _Streams:
  """The packing streams of this host's rows; ``next_batch()`` cuts one sequence from
  each (in ``num_threads`` threads: reading a document may wait on storage)."""

  def __init__(self, docs: Sequence[str], encode: Callable[[str], np.ndarray], *,
               length: int, rows: np.ndarray, streams: int, seed: int, shuffle: bool,
               num_threads: int):
    self._docs, self._encode, self._length = docs, encode, length
    self._num_docs, self._streams = len(docs), streams
    order = grain.MapDataset.range(self._num_docs)
    self._order = order.shuffle(seed=seed % 2**32) if shuffle else order
    self.rows = [int(r) for r in rows]
    self.batch = 0
    self.positions = [0] * len(self.rows)    # per stream: the document being cut ...
    self.offsets = [0] * len(self.rows)      # ... and its first token not yet emitted
    self._tokens: list[np.ndarray | None] = [None] * len(self.rows)
    self._pool = concurrent.futures.ThreadPoolExecutor(max(1, num_threads))

  def _document(self, row: int, position: int) -> np.ndarray:
    per_epoch = len(range(row, self._num_docs, self._streams))
    epoch, i = divmod(position, per_epoch)
    index = int(self._order[epoch * self._num_docs + row + i * self._streams])
    return self._encode(self._docs[index])

  def _sequence(self, s: int) -> np.ndarray:
    out = np.empty((self._length,), np.int32)
    filled = 0
    while filled < self._length:
      if self._tokens[s] is None:
        self._tokens[s] = self._document(self.rows[s], self.positions[s])
      tokens, offset = self._tokens[s], self.offsets[s]
      take = min(self._length - filled, len(tokens) - offset)
      out[filled:filled + take] = tokens[offset:offset + take]
      filled += take
      if offset + take == len(tokens):
        self.positions[s], self.offsets[s], self._tokens[s] = self.positions[s] + 1, 0, None
      else:
        self.offsets[s] = offset + take
    return out

  def next_batch(self) -> np.ndarray:
    chunks = np.stack(list(self._pool.map(self._sequence, range(len(self.rows)))))
    self.batch += 1
    return chunks

  def get_state(self) -> dict[str, Any]:
    return {"next_batch": self.batch, "streams": self._streams, "rows": list(self.rows),
            "docs": list(self.positions), "offsets": list(self.offsets)}

  def set_state(self, state: dict[str, Any]) -> None:
    """This host's streams from ``state``: its own, or ``merge_states`` of every host's."""
    if not isinstance(state, dict) or set(state) != STATE_KEYS:
      raise UserError("the saved data iterator state is not one of the global streamed "
                       "order (a checkpoint of the earlier per-host document order?); "
                       "resume it with the rankjax version that wrote it, or train in a "
                       "new --workdir")
    if int(state["streams"]) != self._streams:
      raise UserError(f"the saved data iterator packs {state['streams']} streams (the global "
                       f"batch size it was written with) and this run has {self._streams}; "
                       "resume with the same global batch size")
    saved = {int(r): (int(d), int(o))
             for r, d, o in zip(state["rows"], state["docs"], state["offsets"])}
    missing = [r for r in self.rows if r not in saved]
    if missing:
      raise ValueError(f"the saved data iterator state has no position for stream(s) "
                       f"{missing[:8]} of this host")
    self.batch = int(state["next_batch"])
    self.positions = [saved[r][0] for r in self.rows]
    self.offsets = [saved[r][1] for r in self.rows]
    self._tokens = [None] * len(self.rows)


class _StreamsIterator(grain.DatasetIterator):
  """Batches of ``_Streams``, the next one cut in a background thread while this one
  is used; the state is that after the last batch returned."""

  def __init__(self, streams: _Streams):
    super().__init__()
    self._streams = streams
    self._state = streams.get_state()
    self._ahead: concurrent.futures.Future | None = None
    self._background = concurrent.futures.ThreadPoolExecutor(1)

  def _cut(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    chunks = self._streams.next_batch()
    return ({"inputs": np.ascontiguousarray(chunks[:, :-1]),
             "targets": np.ascontiguousarray(chunks[:, 1:])}, self._streams.get_state())

  def __next__(self) -> dict[str, np.ndarray]:
    batch, self._state = self._cut() if self._ahead is None else self._ahead.result()
    self._ahead = self._background.submit(self._cut)
    return batch

  def get_state(self) -> dict[str, Any]:
    return self._state

  def set_state(self, state: dict[str, Any]) -> None:
    if self._ahead is not None:
      concurrent.futures.wait([self._ahead])     # a batch being cut: let it finish
      self._ahead = None
    self._streams.set_state(state)
    self._state = self._streams.get_state()


class StreamsIterDataset(grain.IterDataset):
  """This host's batches of the global streamed order (see the module docstring)."""

  def __init__(self, docs: Sequence[str], encode: Callable[[str], np.ndarray], *,
               seq_len: int, batch_size: int, seed: int, shuffle: bool, shard_index: int,
               shard_count: int, micro_batches: int, num_threads: int, what: str):
    super().__init__()
    streams = batch_size * shard_count
    if len(docs) < streams:
      raise UserError(f"{what} has {len(docs)} documents, fewer than the {streams} rows of "
                       f"a global batch (one packing stream each)")
    self._args = dict(length=seq_len + 1, streams=streams, seed=seed, shuffle=shuffle,
                      num_threads=num_threads,
                      rows=common.host_rows(batch_size, micro_batches, shard_index,
                                            shard_count))
    self._docs, self._encode = docs, encode

  def __iter__(self) -> _StreamsIterator:
    return _StreamsIterator(_Streams(self._docs, self._encode, **self._args))

  def __str__(self) -> str:
    return f"StreamsIterDataset(streams={self._args['streams']})"


def merge_states(states: Sequence[Any]) -> dict[str, Any] | None:
  """One state holding every stream, from the states of all hosts of one process count;
  None when they are not states of this order. ValueError (one line) when they are but
  do not fit together (different batches or stream counts, streams missing or twice)."""
  if not states or not all(isinstance(s, dict) and set(s) == STATE_KEYS for s in states):
    return None
  batches = sorted({int(s["next_batch"]) for s in states})
  counts = sorted({int(s["streams"]) for s in states})
  if len(batches) > 1 or len(counts) > 1:
    raise ValueError(f"the processes' iterators were at global batches {batches} with "
                     f"stream counts {counts}")
  rows = [int(r) for s in states for r in s["rows"]]
  if sorted(rows) != list(range(counts[0])):
    raise ValueError(f"the processes' iterators hold {len(rows)} stream positions "
                     f"({len(set(rows))} distinct) for {counts[0]} streams")
  return {"next_batch": batches[0], "streams": counts[0], "rows": rows,
          "docs": [int(d) for s in states for d in s["docs"]],
          "offsets": [int(o) for s in states for o in s["offsets"]]}


def resharded_state(states: Sequence[Any]) -> dict[str, Any]:
  """The iterator state a run on another number of processes continues from, given the
  states every process of the old count saved (in process order).

  Two kinds of state re-shard, both describing the same global batches for any number
  of hosts, so the run continues exactly as with the old process count (same global
  batch size): no example is repeated or skipped.

  * position-only (``{"next_index": k}``: in-memory text and image sets,
    ``rankjax._src.data.common.EpochBatches``): every host reads its part of global
    batches drawn from one order of the whole set per epoch, and k counts global
    batches, so every process of the new run continues at global batch k;
  * the global streamed order of streamed text (tfds, ArrayRecord): each process saved
    the positions of its packing streams; they are merged (:func:`merge_states`) into
    one state holding every stream, from which each new process takes its own.

  Raises:
    ValueError: any other state (a finite pass's per-host document shards; the earlier
      per-host streamed order), or states that do not fit together; its text says why
      when it can (empty when the states are of no re-shardable kind).
  """
  merged = merge_states(states)
  if merged is not None:
    return merged
  if not all(isinstance(s, dict) and set(s) == {"next_index"} for s in states):
    raise ValueError("")
  positions = {int(s["next_index"]) for s in states}
  if len(positions) != 1:
    raise ValueError(f"the processes were at batches {sorted(positions)}")
  return {"next_index": positions.pop()}


def rebuild_data_state(data_dir: epath.Path, saved_count: int) -> dict[str, Any]:
  """The iterator state this process continues from, given the ``data/`` item of a
  checkpoint step written by ``saved_count`` processes (grain's checkpoint handler: one
  ``process_{i}-of-{saved_count}.json`` per process): their states, read in process
  order and re-sharded by :func:`resharded_state`.

  Raises:
    FileNotFoundError: a process's file is missing; an unreadable file's error as
      reading it raised it (``json.JSONDecodeError``, ...).
    ValueError: as :func:`resharded_state` (the states do not re-shard).
  """
  states = []
  for i in range(saved_count):
    f = data_dir / f"process_{i}-of-{saved_count}.json"
    if not f.exists():
      raise FileNotFoundError(f"{f.name} is missing")
    states.append(json.loads(f.read_text()))
  return resharded_state(states)
