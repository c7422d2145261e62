"""Text pipelines: documents -> tokens -> packed language-model examples.

Packing is concatenate-and-chunk: the documents' tokens are joined into one stream
with the tokenizer's end-of-document id after each document, and the stream is cut
into consecutive, non-overlapping chunks of ``seq_len + 1`` tokens. Every token of the
stream lands in exactly one chunk (only a last partial chunk of a finite pass is
dropped); nothing is padded. A chunk becomes the example
``{"inputs": chunk[:-1], "targets": chunk[1:]}``, both ``(seq_len,) int32``.

Sources (``dataset=``):

  None / "shakespeare"   the offline default corpus (``rankjax._src.data.corpus``).
  DIR of *.txt files     one document per file (DIR local or a URL: gs://bucket/dir,
                         read through etils.epath). The split is ``DIR/<split>/`` when
                         that folder exists, else every 10th file (sorted) is held out.
  DIR of ArrayRecord     one document (UTF-8 text) per record. Files whose names
  files (*.array_record*) name the split (``*train*``, ``*validation*``) when there
                         are such, else every 10th record is held out.
  a tfds name ("c4/en", "lm1b", ...)  read with ``tfds.data_source`` from a prepared
                         ``data_dir`` (ArrayRecord format), feature ``text_feature``.

Small sources (the default corpus, text folders up to 64 MiB) are tokenized once in
memory and chunked; every host then takes its part of the same global batches of
chunks (``common.EpochBatches``). Large sources stream. A repeated (training) pass
packs one stream per row of the global batch over one global document order
(``rankjax._src.data.streams``): the global batches do not depend on the number of hosts
and the iterator resumes with another. A finite pass (evaluation) shards documents
across hosts, tokenizes them in threads and packs them by ``PackIterDataset``, whose
checkpoint state is the position of the document being cut and the offset into it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import pathlib
from typing import Any, Sequence

import grain
import numpy as np

from rankjax._src import storage
from rankjax._src.data import common
from rankjax._src.data import corpus
from rankjax._src.data import streams
from rankjax._src.data.tokenizer import Tokenizer, as_tokenizer
from rankjax._src.errors import UserError

IN_MEMORY_MAX_BYTES = 64 * 2**20
_ARRAY_RECORD_GLOBS = ("*.array_record", "*.array_record-*", "*.arrayrecord")


@dataclasses.dataclass(frozen=True)
class TextSource:
  """Documents of one split: ``docs[i]`` is a str; ``in_memory`` selects packing."""

  name: str
  docs: Sequence[str]
  in_memory: bool


def _as_text(value: Any) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, (bytes, np.bytes_)):
    return bytes(value).decode("utf-8", errors="replace")
  raise UserError(f"a text record holds {type(value).__name__}, not text")


class _Feature:
  """Picklable ``record -> record[feature]`` as text."""

  def __init__(self, feature: str):
    self.feature = feature

  def __call__(self, record: Any) -> str:
    if not isinstance(record, dict):
      return _as_text(record)
    if self.feature not in record:
      raise UserError(f"records have no text feature {self.feature!r}; they have "
                       f"{sorted(record)} (set text_feature)")
    return _as_text(record[self.feature])


def _read_txt(path: pathlib.Path) -> str:
  if isinstance(path, pathlib.Path):
    return path.read_text(encoding="utf-8", errors="replace")
  text = path.read_bytes().decode("utf-8", errors="replace")   # a URL (epath): the same
  return text.replace("\r\n", "\n").replace("\r", "\n")      # newlines as text mode's


def _size(path) -> int:
  """Bytes of a file: a local path's ``st_size``, an epath URL's ``length``."""
  stat = path.stat()
  return int(getattr(stat, "st_size", None) or getattr(stat, "length", 0) or 0)


def _files(base, patterns: Sequence[str]) -> list:
  """The files under ``base`` (recursively) whose names match one of ``patterns``,
  sorted: ``rglob`` on a local path, folder by folder on a URL (epath refuses ``**``
  there)."""
  if isinstance(base, pathlib.Path):
    return sorted({p for g in patterns for p in base.rglob(g) if p.is_file()})
  out = []
  for p in base.iterdir():
    if p.is_dir():
      out += _files(p, patterns)
    elif any(fnmatch.fnmatch(p.name, g) for g in patterns):
      out.append(p)
  return sorted(out)


def _split_dir(root: pathlib.Path, split: str) -> pathlib.Path | None:
  names = [split] + (list(common.HELD_OUT_SPLITS) if common.check_split(split) else [])
  for name in names:
    if (root / name).is_dir():
      return root / name
  return None


def _directory_source(root: pathlib.Path, split: str) -> TextSource:
  held_out = common.check_split(split)
  sub = _split_dir(root, split)
  base = sub or root
  txt = _files(base, ("*.txt",))
  records = _files(base, _ARRAY_RECORD_GLOBS)
  if txt and records:
    raise UserError(f"{base} holds both .txt and ArrayRecord files; point dataset at a "
                     f"folder of one kind")
  if txt:
    if sub is None:
      txt = [txt[i] for i in common.split_indices(len(txt), held_out)]
    size = sum(_size(p) for p in txt)
    return TextSource(str(root), common.IndexedSource(txt, transform=_read_txt),
                      in_memory=size <= IN_MEMORY_MAX_BYTES)
  if records:
    named = [p for p in records if any(s in p.name for s in ("train",) + common.HELD_OUT_SPLITS)]
    indices = None
    if sub is None and named:
      wanted = common.HELD_OUT_SPLITS if held_out else ("train",)
      records = [p for p in named if any(s in p.name for s in wanted)]
      if not records:
        raise common.DataUnavailableError(f"{root} has no ArrayRecord files for split {split!r}")
    source = grain.sources.ArrayRecordDataSource([str(p) for p in records])
    if sub is None and not named:
      indices = common.split_indices(len(source), held_out)
    return TextSource(str(root), common.IndexedSource(source, indices, _as_text), in_memory=False)
  raise common.DataUnavailableError(
      f"{base} holds no .txt or .array_record files for split {split!r}")


def _tfds_source(name: str, split: str, data_dir: str | None, text_feature: str) -> TextSource:
  import tensorflow_datasets as tfds

  root = common.tfds_data_dir(data_dir)
  try:
    source = tfds.data_source(name, split=split, data_dir=root, download=False)
  except Exception as e:  # tfds raises many kinds (not found, not prepared, tfrecord)
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise common.DataUnavailableError(
        f"tfds data set {name!r} split {split!r} is not prepared in data_dir={root} "
        f"({reason}); prepare it with: tfds build {name} --data_dir {root} "
        f"--file_format array_record") from None
  return TextSource(name, common.IndexedSource(source, transform=_Feature(text_feature)),
                    in_memory=False)


def text_source(dataset: str | None, split: str, *, data_dir: str | None = None,
                text_feature: str = "text") -> TextSource:
  """The documents of ``split`` of ``dataset`` (see the module docstring).

  tfds sets take any split tfds knows ("train[:1%]", "test", ...); the others take
  "train" or a held-out name ("validation", "val", "valid", "test").
  """
  if dataset in (None, "", "shakespeare"):
    paths = corpus.document_paths(split)
    return TextSource("shakespeare", common.IndexedSource(paths, transform=corpus.read_document),
                      in_memory=True)
  remote = storage.is_remote(dataset)
  path = storage.as_path(dataset, "dataset") if remote else pathlib.Path(dataset).expanduser()
  if path.is_dir():
    return _directory_source(path, split)
  if remote or dataset.startswith(("/", "./", "../", "~")):
    raise common.DataUnavailableError(f"data set directory {dataset} does not exist")
  tfds_split = split if split != "val" else "validation"
  return _tfds_source(dataset, tfds_split, data_dir, text_feature)


_TOKEN_CACHE: dict[tuple, np.ndarray] = {}


def _corpus_tokens(source: TextSource, split: str, tokenizer: Tokenizer) -> np.ndarray:
  """The token stream of an in-memory source; the default corpus's is kept per process."""
  if source.name != "shakespeare":
    return stream_tokens(source.docs, tokenizer)
  key = (split in common.HELD_OUT_SPLITS, getattr(tokenizer, "path", tokenizer.name))
  if key not in _TOKEN_CACHE:
    if len(_TOKEN_CACHE) >= 4:
      _TOKEN_CACHE.pop(next(iter(_TOKEN_CACHE)))
    _TOKEN_CACHE[key] = stream_tokens(source.docs, tokenizer)
  return _TOKEN_CACHE[key]


def stream_tokens(docs: Sequence[str], tokenizer: Tokenizer) -> np.ndarray:
  """All documents' tokens in order, each followed by the end-of-document id."""
  eod = np.array([tokenizer.eod_id], np.int32)
  parts = []
  for i in range(len(docs)):
    parts += [tokenizer.encode(docs[i]), eod]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


def example_from_chunk(chunk: np.ndarray) -> dict[str, np.ndarray]:
  return {"inputs": chunk[:-1], "targets": chunk[1:]}


class _ChunkBatch:
  """Picklable ``indices -> batch`` of in-memory chunks."""

  def __init__(self, chunks: np.ndarray):
    self.chunks = chunks

  def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    rows = self.chunks[indices]
    return {"inputs": np.ascontiguousarray(rows[:, :-1]),
            "targets": np.ascontiguousarray(rows[:, 1:])}


class _Encode:
  """Picklable ``text -> tokens + [eod]``."""

  def __init__(self, tokenizer: Tokenizer):
    self.tokenizer = tokenizer
    self._eod = np.array([tokenizer.eod_id], np.int32)

  def __call__(self, text: str) -> np.ndarray:
    return np.concatenate([self.tokenizer.encode(text), self._eod])


class _PackIterator(grain.DatasetIterator):
  """Cuts a stream of token arrays into chunks of ``length`` tokens.

  State: the parent's state before the document now being cut, and the offset of
  the first token of that document not yet emitted. Restoring re-reads (and
  re-tokenizes) that one document.
  """

  def __init__(self, parent: grain.DatasetIterator, length: int):
    super().__init__(parent)
    self._length = length
    self._doc: np.ndarray | None = None
    self._doc_state: Any = parent.get_state()
    self._offset = 0

  def __next__(self) -> np.ndarray:
    out = np.empty((self._length,), np.int32)
    filled = 0
    while filled < self._length:
      if self._doc is None or self._offset >= len(self._doc):
        self._doc_state = self._parent.get_state()
        self._doc, self._offset = None, 0
        self._doc = np.asarray(next(self._parent), np.int32)  # StopIteration: drop partial
      take = min(self._length - filled, len(self._doc) - self._offset)
      out[filled:filled + take] = self._doc[self._offset:self._offset + take]
      filled += take
      self._offset += take
    return out

  def get_state(self) -> dict[str, Any]:
    if self._doc is None or self._offset >= len(self._doc):
      return {"parent": self._parent.get_state(), "offset": 0}
    return {"parent": self._doc_state, "offset": int(self._offset)}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._doc_state, self._doc, self._offset = state["parent"], None, 0
    if state["offset"]:
      self._doc = np.asarray(next(self._parent), np.int32)
      self._offset = int(state["offset"])


class PackIterDataset(grain.IterDataset):
  """Concatenate-and-chunk packing of token arrays into ``length``-token chunks."""

  def __init__(self, parent: grain.IterDataset, length: int):
    super().__init__(parent)
    self._length = length

  def __iter__(self) -> _PackIterator:
    return _PackIterator(self._parent.__iter__(), self._length)

  def __str__(self) -> str:
    return f"PackIterDataset(length={self._length})"


def text_dataset(
    *,
    dataset: str | None,
    split: str,
    seq_len: int,
    batch_size: int,
    tokenizer: str | Tokenizer | None,
    data_dir: str | None,
    seed: int,
    shuffle: bool,
    num_epochs: int | None,
    shard_index: int,
    shard_count: int,
    drop_remainder: bool = True,
    micro_batches: int = 1,
    text_feature: str = "text",
    num_threads: int | None = None,
) -> tuple[grain.IterDataset, str, Tokenizer]:
  """Batches of packed examples for one host: (dataset, source name, tokenizer)."""
  tok = as_tokenizer(tokenizer)
  source = text_source(dataset, split, data_dir=data_dir, text_feature=text_feature)
  length = seq_len + 1
  if source.in_memory:
    tokens = _corpus_tokens(source, split, tok)
    num_chunks = len(tokens) // length
    chunks = tokens[:num_chunks * length].reshape(num_chunks, length)
    batches = common.EpochBatches(
        num_chunks, _ChunkBatch(chunks), batch_size=batch_size, seed=seed, shuffle=shuffle,
        num_epochs=num_epochs, drop_remainder=drop_remainder, shard_index=shard_index,
        shard_count=shard_count, micro_batches=micro_batches,
        what=f"{source.name} {split} ({num_chunks} sequences of {length} tokens)")
    return common.epoch_batches_dataset(batches), source.name, tok
  threads = num_threads or min(16, 2 * (os.cpu_count() or 1))
  if num_epochs is None:
    ds = streams.StreamsIterDataset(
        source.docs, _Encode(tok), seq_len=seq_len, batch_size=batch_size, seed=seed,
        shuffle=shuffle, shard_index=shard_index, shard_count=shard_count,
        micro_batches=micro_batches, num_threads=threads,
        what=f"{source.name} {split}")
    return ds, source.name, tok
  ds = grain.MapDataset.source(source.docs)
  ds = common.shard_shuffle_repeat(
      ds, shard_index=shard_index, shard_count=shard_count, seed=seed, shuffle=shuffle,
      num_epochs=num_epochs, what=f"{source.name} {split} ({len(source.docs)} documents)")
  ds = ds.map(_Encode(tok)).to_iter_dataset(
      grain.ReadOptions(num_threads=threads, prefetch_buffer_size=4 * threads))
  ds = PackIterDataset(ds, length).map(example_from_chunk)
  return ds.batch(batch_size, drop_remainder=drop_remainder), source.name, tok
