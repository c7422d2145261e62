"""One entry point for the training loop: ``make_iterator`` and ``dataset_info``.

``make_iterator`` returns a ``grain.DatasetIterator`` of batches, each a dict of
numpy arrays with a leading per-host batch axis:

  text:   {"inputs": (B, T) int32, "targets": (B, T) int32}   targets = next token
  images: {"inputs": (B, D) float32, "targets": (B,) int32}   D = 3072 (cifar10), ...

Each host reads its own shard (``shard_index`` of ``shard_count``, by default
``jax.process_index()`` of ``jax.process_count()``); the order is a deterministic
function of ``seed`` (and the shard). Training: the defaults (shuffle, repeat forever).
Evaluation: ``split="validation", shuffle=False, num_epochs=1`` (add
``drop_remainder=False`` to keep a last short batch). In-memory sets (the default
corpus, text folders up to 64 MiB, fashion_mnist, digits) and cifar10 give every
host its part of the same global batches (the run does not depend on the number of
hosts; ``common.EpochBatches``), and so do repeated passes over streamed text (tfds,
ArrayRecord, large text folders: one packing stream per global batch row over one
global document order, ``rankjax._src.data.streams``). A finite pass over streamed text
is sharded by document, so it can give hosts different numbers of batches (the
training loop's evaluation stops when the first host runs out).

Check a model config against the data before training::

  info = dataset_info("text", dataset=..., seq_len=..., tokenizer=..., data_dir=...)
  check_model_fits(info, vocab_size=cfg.vocab_size, max_seq_len=cfg.max_seq_len)

Saving and restoring the iterator with the checkpoint (Orbax ``args=`` API; the
handler ships with grain, ``grain.checkpoint.CheckpointHandler``, and its args are
registered with Orbax when both are imported)::

  import grain, orbax.checkpoint as ocp
  it = make_iterator("text", dataset="shakespeare", split="train", batch_size=8,
                     seq_len=128, seed=0)
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=grain.checkpoint.CheckpointSave(it)))
  # resume: build the same iterator (same arguments), then restore into it
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state),
      data=grain.checkpoint.CheckpointRestore(it)))
  it = restored.data          # the same object, positioned after the saved batch

Save after the step has consumed its batch: the state is "the next batch to yield".
The handler writes one ``process_{i}-of-{n}.json`` per host (a few hundred bytes).
Without Orbax the state is a small JSON-able dict: ``it.get_state()`` /
``it.set_state(state)``. Tested in ``tests/data/test_text.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import grain

from rankjax._src.data import common
from rankjax._src.data import images as images_lib
from rankjax._src.data import text as text_lib
from rankjax._src.data.tokenizer import Tokenizer, as_tokenizer
from rankjax._src.errors import UserError

Kind = Literal["text", "images"]
KINDS = ("text", "images")


@dataclasses.dataclass(frozen=True)
class DataInfo:
  """What a data set gives the model; checked against the config before training.

  Attributes:
    name: the data set actually used (e.g. "shakespeare", "c4/en", a directory,
      "cifar10", "fashion_mnist", "digits"); outputs name it.
    kind: "text" or "images".
    vocab_size: tokenizer vocabulary (text), else None.
    num_classes: number of labels (images), else None.
    input_dim: flattened input size (images), else None.
    seq_len: tokens per example (text), else None.
    tokenizer: tokenizer description (text), else None.
  """

  name: str
  kind: str
  vocab_size: int | None = None
  num_classes: int | None = None
  input_dim: int | None = None
  seq_len: int | None = None
  tokenizer: str | None = None


def make_iterator(
    kind: Kind,
    *,
    dataset: str | None = None,
    split: str = "train",
    batch_size: int,
    seq_len: int | None = None,
    tokenizer: str | Tokenizer | None = None,
    data_dir: str | None = None,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_index: int | None = None,
    shard_count: int | None = None,
    text_feature: str = "text",
    drop_remainder: bool = True,
    num_threads: int | None = None,
    micro_batches: int = 1,
) -> grain.DatasetIterator:
  """Batches of ``kind`` data for this host, as a checkpointable grain iterator.

  Args:
    kind: "text" (packed LM sequences) or "images" (flattened, normalized images).
    dataset: text (``rankjax._src.data.text``): None/"shakespeare" (the offline corpus), a
      tfds name such as "c4/en" (read from ``data_dir``), or a directory of .txt or
      .array_record files. Images (``rankjax._src.data.images``): None/"auto" (cifar10 when
      prepared in ``data_dir``, else fashion_mnist, else digits), or one of
      "cifar10", "fashion_mnist", "digits" (an error when not available).
    split: "train", or a held-out split: "validation" (also "test", "val", "valid";
      tfds text sets get the name as given, cifar10 reads "test").
    batch_size: examples per batch on this host.
    seq_len: T, tokens per example (text only; each example packs T+1 tokens).
    tokenizer: None (byte-level), or a path to a sentencepiece ``.model`` or a
      tiktoken ``.tiktoken`` file.
    data_dir: tfds data directory.
    seed: shuffling seed; the order is a deterministic function of it.
    shuffle: shuffle documents / examples.
    num_epochs: passes over the data; None repeats forever (training).
    shard_index, shard_count: this host's shard; default jax.process_index() and
      jax.process_count().
    text_feature: feature holding the text in a tfds / ArrayRecord data set.
    drop_remainder: drop a last partial batch (only reached when num_epochs is set).
    num_threads: reader threads for streamed sources (tfds, ArrayRecord, large text
      folders); default min(16, 2 * cpus).
    micro_batches: the batch's micro-batches (gradient accumulation). Hosts then get
      their parts of each global micro-batch, so the global batches (and the training
      run) do not depend on the number of hosts (``common.host_rows``; a finite pass
      over a streamed set shards by document and does).

  Returns:
    a ``grain.DatasetIterator`` yielding dicts of numpy arrays (see module doc);
    ``get_state()``/``set_state()`` and ``grain.checkpoint.CheckpointSave`` save it.

  Raises:
    ValueError: unknown kind / data set, a data set not prepared in ``data_dir``
      (the message names the directory and the command that prepares it), a bad
      tokenizer file, missing seq_len for text.
  """
  if kind not in KINDS:
    raise UserError(f"kind={kind!r} is not allowed; choose one of {list(KINDS)}")
  if not isinstance(batch_size, int) or batch_size <= 0:
    raise UserError(f"batch_size={batch_size!r} must be a positive integer")
  if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs <= 0):
    raise UserError(f"num_epochs={num_epochs!r} must be a positive integer or None")
  shard_index, shard_count = common.default_shard(shard_index, shard_count)
  if kind == "text":
    if not isinstance(seq_len, int) or seq_len <= 0:
      raise UserError(f"seq_len={seq_len!r} must be a positive integer for text data")
    ds, _, _ = text_lib.text_dataset(
        dataset=dataset, split=split, seq_len=seq_len, batch_size=batch_size,
        tokenizer=tokenizer, data_dir=data_dir, seed=seed, shuffle=shuffle,
        num_epochs=num_epochs, shard_index=shard_index, shard_count=shard_count,
        drop_remainder=drop_remainder, text_feature=text_feature, num_threads=num_threads,
        micro_batches=micro_batches)
  else:
    ds, _ = images_lib.image_dataset(
        dataset=dataset, split=split, batch_size=batch_size, data_dir=data_dir, seed=seed,
        shuffle=shuffle, num_epochs=num_epochs, shard_index=shard_index,
        shard_count=shard_count, drop_remainder=drop_remainder, num_threads=num_threads,
        micro_batches=micro_batches)
  return iter(ds)


def dataset_info(
    kind: Kind,
    *,
    dataset: str | None = None,
    seq_len: int | None = None,
    tokenizer: str | Tokenizer | None = None,
    data_dir: str | None = None,
) -> DataInfo:
  """vocab_size / num_classes / input_dim / name of the data ``make_iterator`` reads.

  Cheap: it does not read the data (for images it checks which set is available).
  """
  if kind == "text":
    tok = as_tokenizer(tokenizer)
    name = text_lib.text_source(dataset, "train", data_dir=data_dir).name
    return DataInfo(name=name, kind="text", vocab_size=tok.vocab_size, seq_len=seq_len,
                    tokenizer=tok.name)
  if kind == "images":
    name = images_lib.resolve_image_set(dataset, data_dir)
    input_dim, num_classes = images_lib.IMAGE_SHAPES[name]
    return DataInfo(name=name, kind="images", num_classes=num_classes, input_dim=input_dim)
  raise UserError(f"kind={kind!r} is not allowed; choose one of {list(KINDS)}")


def check_model_fits(info: DataInfo, *, vocab_size: int | None = None,
                     num_classes: int | None = None, input_dim: int | None = None,
                     max_seq_len: int | None = None) -> None:
  """Raises one clear ValueError when a model config cannot take this data."""
  if info.kind == "text":
    if vocab_size is not None and vocab_size < info.vocab_size:
      raise UserError(f"model vocab_size={vocab_size} is smaller than the {info.tokenizer} "
                       f"tokenizer's vocabulary of {info.vocab_size}")
    if max_seq_len is not None and info.seq_len is not None and info.seq_len > max_seq_len:
      raise UserError(f"data seq_len={info.seq_len} is longer than the model's "
                       f"max_seq_len={max_seq_len}")
  else:
    if num_classes is not None and num_classes != info.num_classes:
      raise UserError(f"model num_classes={num_classes} does not match {info.name}'s "
                       f"{info.num_classes} classes")
    if input_dim is not None and input_dim != info.input_dim:
      sets = ", ".join(f"{k} {v[0]}" for k, v in images_lib.IMAGE_SHAPES.items())
      raise UserError(f"model input_dim={input_dim} does not match {info.name}'s "
                       f"flattened images of {info.input_dim} values (input_dim of each "
                       f"set: {sets}; name the set with --set dataset=...)")
