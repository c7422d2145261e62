"""Pieces shared by the text and image pipelines: errors, caches, splits, sharding."""

from __future__ import annotations

import math
import os
import pathlib
import sys
from typing import Any, Callable, Sequence

import grain
import numpy as np

from rankjax._src.errors import UserError

VALIDATION_EVERY = 10  # document i (sorted) is held out when i % 10 == 9
TRAIN_SPLITS = ("train",)
HELD_OUT_SPLITS = ("validation", "valid", "val", "test")


class DataUnavailableError(UserError):
  """A data set that is not on this machine; the message says how to get it."""


def cache_root() -> pathlib.Path:
  """``$RANKJAX_CACHE`` or ``~/.cache/rankjax``."""
  root = os.environ.get("RANKJAX_CACHE") or os.path.join("~", ".cache", "rankjax")
  return pathlib.Path(root).expanduser()


def tfds_data_dir(data_dir: str | os.PathLike | None) -> str:
  """The data_dir tfds reads: the argument, else ``$TFDS_DATA_DIR``, else its default."""
  if data_dir:
    if "://" in str(data_dir):   # gs://..., read by tfds through etils.epath
      return str(data_dir)
    return str(pathlib.Path(data_dir).expanduser())
  return str(pathlib.Path(
      os.environ.get("TFDS_DATA_DIR", os.path.join("~", "tensorflow_datasets"))).expanduser())


def check_split(split: str) -> bool:
  """True for a held-out split name, False for train; ValueError otherwise."""
  if split in TRAIN_SPLITS:
    return False
  if split in HELD_OUT_SPLITS:
    return True
  raise UserError(f"split={split!r} is not allowed; choose one of "
                   f"{list(TRAIN_SPLITS + HELD_OUT_SPLITS)}")


def split_indices(num: int, held_out: bool) -> np.ndarray:
  """Indices of the train (or held-out) items: item i is held out iff i % 10 == 9."""
  index = np.arange(num)
  mask = index % VALIDATION_EVERY == VALIDATION_EVERY - 1
  return index[mask] if held_out else index[~mask]


def default_shard(shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
  """(shard_index, shard_count), defaulting to this JAX process of all processes."""
  if shard_index is None or shard_count is None:
    import jax
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise UserError(f"shard_index={shard_index} must lie in [0, shard_count={shard_count})")
  return shard_index, shard_count


def shard_shuffle_repeat(ds: grain.MapDataset, *, shard_index: int, shard_count: int,
                         seed: int, shuffle: bool, num_epochs: int | None,
                         what: str) -> grain.MapDataset:
  """This host's strided shard, shuffled per epoch by ``seed``, repeated."""
  ds = ds[shard_index::shard_count]
  if len(ds) == 0:
    raise UserError(f"{what} has too few items for shard {shard_index} of {shard_count}")
  if shuffle:
    ds = ds.shuffle(seed=seed % 2**32)
  if num_epochs is None or num_epochs > 1:
    ds = ds.repeat(num_epochs)
  return ds


def host_rows(batch_size: int, micro_batches: int, shard_index: int,
              shard_count: int) -> np.ndarray:
  """The rows of a global batch of ``batch_size * shard_count`` that host
  ``shard_index`` holds: of each of its ``micro_batches`` consecutive micro-batches,
  the ``shard_index``-th of ``shard_count`` equal parts (so that
  ``rankjax._src.train.sharding.global_batch`` reassembles micro-batch j as the same rows in
  the same order whatever the number of hosts)."""
  if batch_size % micro_batches:
    raise UserError(f"batch_size={batch_size} is not divisible by "
                     f"micro_batches={micro_batches}")
  part = batch_size // micro_batches
  micro = part * shard_count
  return np.concatenate([j * micro + shard_index * part + np.arange(part)
                         for j in range(micro_batches)])


class IndexedSource:
  """A random-access view ``source[indices[i]]`` with an item transform (picklable)."""

  def __init__(self, source: Any, indices: Sequence[int] | np.ndarray | None = None,
               transform: Callable[[Any], Any] | None = None):
    self._source = source
    self._indices = indices
    self._transform = transform

  def __len__(self) -> int:
    return len(self._source) if self._indices is None else len(self._indices)

  def __getitem__(self, i: int) -> Any:
    j = i if self._indices is None else int(self._indices[i])
    item = self._source[j]
    return item if self._transform is None else self._transform(item)


class EpochBatches:
  """Whole batches of an in-memory set, one random-access element per batch.

  Element e is this host's part of global batch ``e % n`` of epoch ``e // n`` (n
  global batches per epoch). The global batch of ``batch_size * shard_count`` items
  is a slice of one order of all items, drawn afresh each epoch from (seed, epoch)
  and the same on every host; host i takes its rows of it (``host_rows``: after
  ``rankjax._src.train.sharding.global_batch`` reassembles them, micro-batch j is the
  same examples in the same order whatever the number of hosts). One host reads
  the order itself, exactly as before hosts shared it. A grain iterator over it
  saves its position as one integer, the same on every host (which is what lets a
  run resume with another number of processes: ``rankjax._src.train.checkpoint``).
  ``drop_remainder=False`` keeps a last short global batch per epoch (split into
  equal contiguous parts; the fewer than ``shard_count`` items left over dropped, so
  every host has the same number).
  """

  def __init__(self, num_items: int, fetch: Callable[[np.ndarray], Any], *, batch_size: int,
               seed: int, shuffle: bool, num_epochs: int | None, drop_remainder: bool,
               shard_index: int, shard_count: int, what: str, micro_batches: int = 1):
    self._rows = host_rows(batch_size, micro_batches, shard_index, shard_count)
    self._items = np.arange(num_items)
    self._fetch = fetch
    self._batch_size = batch_size
    self._global = batch_size * shard_count
    self._shard = (shard_index, shard_count)
    self._seed = (seed % 2**32, 0)
    self._shuffle = shuffle
    usable = num_items - num_items % shard_count
    self.batches_per_epoch = (num_items // self._global if drop_remainder
                              else math.ceil(usable / self._global))
    if self.batches_per_epoch == 0:
      raise UserError(f"{what} has {num_items} items, too few for one batch of "
                       f"{batch_size} on each of {shard_count} host(s)")
    self._len = sys.maxsize if num_epochs is None else self.batches_per_epoch * num_epochs
    self._order_cache: tuple[int, np.ndarray] | None = None

  def __len__(self) -> int:
    return self._len

  def _order(self, epoch: int) -> np.ndarray:
    if self._order_cache is None or self._order_cache[0] != epoch:
      if self._shuffle:
        order = np.random.default_rng([*self._seed, epoch]).permutation(self._items)
      else:
        order = self._items
      self._order_cache = (epoch, order)
    return self._order_cache[1]

  def __getitem__(self, e: int) -> Any:
    if not 0 <= e < self._len:
      raise IndexError(e)
    epoch, position = divmod(e, self.batches_per_epoch)
    start = position * self._global
    block = self._order(epoch)[start:start + self._global]
    if len(block) == self._global:
      return self._fetch(block[self._rows])
    index, count = self._shard     # a last short batch: equal parts, the rest dropped
    part = len(block) // count
    return self._fetch(block[index * part:(index + 1) * part])


def epoch_batches_dataset(source: EpochBatches) -> grain.IterDataset:
  """The batches of ``source`` in order, read in the calling thread."""
  return grain.MapDataset.source(source).to_iter_dataset(grain.ReadOptions(num_threads=0))
