"""Image classification sets for the MLP studies, flattened and normalized per channel.

Examples are ``{"inputs": (D,) float32, "targets": () int32}``; pixels are scaled to
[0, 1], then each channel has its training-set mean subtracted and is divided by its
training-set standard deviation; images are flattened in (H, W, C) order.

``dataset=``:

  "cifar10"          tfds ``cifar10`` from a prepared ``data_dir`` (ArrayRecord format),
                     D = 3072, 10 classes; "validation"/"test" read its test split.
  "fashion_mnist"    Debian's ``dataset-fashion-mnist`` files under
                     ``/usr/share/datasets/fashion-mnist/`` (or ``$RANKJAX_FASHION_MNIST``),
                     D = 784, 10 classes; held-out splits read its t10k files.
  "digits"           scikit-learn's bundled 8x8 digits (no download; scikit-learn is a
                     dependency, so every install has them), D = 64, 10 classes;
                     1797 images, every 10th is held out.
  None / "auto"      the first of cifar10, fashion_mnist, digits that is available; a
                     fallback past cifar10 warns, naming the set taken.

The set actually used is ``ImageSource.name`` (and ``DataInfo.name``).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import os
import pathlib
import warnings
from typing import Any, Callable, Sequence

import grain
import numpy as np

from rankjax._src.data import common
from rankjax._src.errors import UserError

CIFAR10_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
CIFAR10_STD = np.array([0.2470, 0.2435, 0.2616], np.float32)
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
IMAGE_SETS = ("cifar10", "fashion_mnist", "digits")


@dataclasses.dataclass(frozen=True)
class ImageSource:
  """Examples of one split: ``examples[i]`` is an example dict.

  In-memory sets also have ``examples.take(indices) -> batch`` (one vectorized
  gather); the pipeline then batches whole epochs with ``common.EpochBatches``.
  """

  name: str
  examples: Sequence[dict[str, np.ndarray]]
  num_classes: int
  input_dim: int


class _Normalize:
  """Picklable ``(image uint8 (..., C), label) -> example`` with per-channel stats."""

  def __init__(self, mean: np.ndarray, std: np.ndarray, scale: float):
    self.mean = np.asarray(mean, np.float32)
    self.std = np.asarray(std, np.float32)
    self.scale = np.float32(scale)

  def __call__(self, image: np.ndarray, label: Any) -> dict[str, np.ndarray]:
    x = (np.asarray(image, np.float32) * self.scale - self.mean) / self.std
    return {"inputs": x.reshape(-1), "targets": np.asarray(label, np.int32)}

  def batch(self, images: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    x = (images.astype(np.float32) * self.scale - self.mean) / self.std
    return {"inputs": x.reshape(len(x), -1), "targets": labels.astype(np.int32)}


class _ArrayExamples:
  """Random access over in-memory (images, labels) arrays."""

  def __init__(self, images: np.ndarray, labels: np.ndarray, normalize: _Normalize):
    self.images, self.labels, self.normalize = images, labels, normalize

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return self.normalize(self.images[i], self.labels[i])

  def take(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    return self.normalize.batch(self.images[indices], self.labels[indices])


class _RecordExamples:
  """Random access over tfds records ``{"image", "label"}``."""

  def __init__(self, source: Any, normalize: _Normalize):
    self.source, self.normalize = source, normalize

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    record = self.source[i]
    return self.normalize(record["image"], record["label"])


def _channel_stats(images: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and std of uint8 ``images * scale`` (channels last), exactly."""
  values = np.arange(256, dtype=np.float64) * scale
  means, stds = [], []
  for c in range(images.shape[-1]):
    counts = np.bincount(images[..., c].reshape(-1), minlength=256).astype(np.float64)
    mean = counts @ values / counts.sum()
    means.append(mean)
    stds.append(np.sqrt(counts @ (values - mean) ** 2 / counts.sum()))
  return np.array(means, np.float32), np.array(stds, np.float32)


def _cifar10(split: str, data_dir: str | None) -> ImageSource:
  import tensorflow_datasets as tfds

  held_out = common.check_split(split)
  tfds_split = "test" if held_out else "train"
  root = common.tfds_data_dir(data_dir)
  try:
    source = tfds.data_source("cifar10", split=tfds_split, data_dir=root, download=False)
  except Exception as e:  # tfds raises many kinds (not found, not prepared, tfrecord)
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise common.DataUnavailableError(
        f"tfds data set 'cifar10' split {tfds_split!r} is not prepared in data_dir={root} "
        f"({reason}); prepare it with: tfds build cifar10 --data_dir {root} "
        f"--file_format array_record") from None
  normalize = _Normalize(CIFAR10_MEAN, CIFAR10_STD, 1 / 255)
  return ImageSource("cifar10", _RecordExamples(source, normalize), 10, 32 * 32 * 3)


def fashion_mnist_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get("RANKJAX_FASHION_MNIST", FASHION_MNIST_DIR))


def _read_idx(path: pathlib.Path) -> np.ndarray:
  """An IDX file (``.gz`` or not) as a uint8 array."""
  opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rb") as f:
    data = f.read()
  ndim = data[3]
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _fashion_file(root: pathlib.Path, stem: str) -> pathlib.Path | None:
  for name in (f"{stem}.gz", stem):
    if (root / name).is_file():
      return root / name
  return None


def fashion_mnist_available() -> bool:
  root = fashion_mnist_dir()
  return all(_fashion_file(root, f"{p}-{k}-idx{n}-ubyte") for p in ("train", "t10k")
             for k, n in (("images", 3), ("labels", 1)))


_STATS: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _fashion_mnist(split: str) -> ImageSource:
  held_out = common.check_split(split)
  root = fashion_mnist_dir()
  if not fashion_mnist_available():
    raise common.DataUnavailableError(
        f"Fashion-MNIST files are not in {root}; install them with: "
        f"apt-get install dataset-fashion-mnist (or set RANKJAX_FASHION_MNIST to a folder "
        f"of its four idx files), or train on scikit-learn's 8x8 digits: --set "
        f"dataset=digits --set model.input_dim=64 (experiments/configs/mlp_classifier.json)")

  def load(prefix: str) -> tuple[np.ndarray, np.ndarray]:
    images = _read_idx(_fashion_file(root, f"{prefix}-images-idx3-ubyte"))
    labels = _read_idx(_fashion_file(root, f"{prefix}-labels-idx1-ubyte"))
    return images[..., None], labels

  images, labels = load("t10k" if held_out else "train")
  if "fashion_mnist" not in _STATS:
    train_images = load("train")[0] if held_out else images
    _STATS["fashion_mnist"] = _channel_stats(train_images, 1 / 255)
  normalize = _Normalize(*_STATS["fashion_mnist"], 1 / 255)
  return ImageSource("fashion_mnist", _ArrayExamples(images, labels, normalize), 10, 784)


def _digits_file() -> pathlib.Path | None:
  """scikit-learn's bundled ``digits.csv.gz``, found without importing sklearn (slow)."""
  spec = importlib.util.find_spec("sklearn")
  if spec is None or spec.origin is None:
    return None
  path = pathlib.Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
  return path if path.is_file() else None


def digits_available() -> bool:
  return importlib.util.find_spec("sklearn") is not None


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
  """(images (1797, 8, 8, 1) uint8 in 0..16, labels (1797,) int32)."""
  path = _digits_file()
  if path is not None:  # the file sklearn.datasets.load_digits reads
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    pixels, labels = table[:, :-1], table[:, -1]
  else:
    from sklearn.datasets import load_digits
    bunch = load_digits()
    pixels, labels = bunch.data, bunch.target
  return pixels.astype(np.uint8).reshape(-1, 8, 8, 1), labels.astype(np.int32)


def _digits(split: str) -> ImageSource:
  held_out = common.check_split(split)
  if not digits_available():
    raise common.DataUnavailableError(
        "the digits set needs scikit-learn: pip install scikit-learn")
  images, labels = _load_digits()
  train = common.split_indices(len(labels), held_out=False)
  normalize = _Normalize(*_channel_stats(images[train], 1 / 16), 1 / 16)
  index = common.split_indices(len(labels), held_out)
  return ImageSource("digits", _ArrayExamples(images[index], labels[index], normalize), 10, 64)


def _cifar10_available(data_dir: str | None) -> bool:
  try:
    _cifar10("train", data_dir)
  except common.DataUnavailableError:
    return False
  return True


def missing_image_set_line(dataset: str, data_dir: str | None) -> str | None:
  """None when ``dataset`` can be read, else one line naming it and the command that
  prepares it (what a run that must not fall back stops with)."""
  try:
    image_source(dataset, "train", data_dir=data_dir)
  except common.DataUnavailableError as e:
    return str(e).splitlines()[0]
  return None


def _fell_back(name: str, passed_over: Sequence[str]) -> str:
  """Says (a warning, never silently) which set ``auto`` took and which it passed over."""
  warnings.warn(f"image set 'auto' -> {name!r}: {', '.join(passed_over)} not available "
                f"(every output names the set used)", stacklevel=3)
  return name


def resolve_image_set(dataset: str | None, data_dir: str | None) -> str:
  """The image set ``dataset`` names; for None/"auto", the first one available (a
  warning names the set when it is not CIFAR-10)."""
  if dataset in (None, "", "auto"):
    if _cifar10_available(data_dir):
      return "cifar10"
    if fashion_mnist_available():
      return _fell_back("fashion_mnist", ["cifar10"])
    if digits_available():
      return _fell_back("digits", ["cifar10", "fashion_mnist"])
    raise common.DataUnavailableError(
        f"no image set is available: prepare cifar10 (tfds build cifar10 --data_dir "
        f"{common.tfds_data_dir(data_dir)} --file_format array_record), or apt-get install "
        f"dataset-fashion-mnist, or pip install scikit-learn")
  if dataset not in IMAGE_SETS:
    raise UserError(f"image dataset={dataset!r} is not allowed; choose one of "
                     f"{['auto', *IMAGE_SETS]}")
  if dataset == "cifar10":          # a named set that is absent: its one-line error now,
    _cifar10("train", data_dir)     # before training, saying how to get it
  elif dataset == "fashion_mnist" and not fashion_mnist_available():
    _fashion_mnist("train")
  elif dataset == "digits" and not digits_available():
    _digits("train")
  return dataset


IMAGE_SHAPES = {"cifar10": (3072, 10), "fashion_mnist": (784, 10), "digits": (64, 10)}


def image_source(dataset: str | None, split: str, *, data_dir: str | None = None) -> ImageSource:
  """The examples of ``split`` of ``dataset`` (see the module docstring)."""
  name = resolve_image_set(dataset, data_dir)
  if name == "cifar10":
    return _cifar10(split, data_dir)
  if name == "fashion_mnist":
    return _fashion_mnist(split)
  return _digits(split)


def image_dataset(
    *,
    dataset: str | None,
    split: str,
    batch_size: int,
    data_dir: str | None,
    seed: int,
    shuffle: bool,
    num_epochs: int | None,
    shard_index: int,
    shard_count: int,
    drop_remainder: bool = True,
    micro_batches: int = 1,
    num_threads: int | None = None,
) -> tuple[grain.IterDataset, ImageSource]:
  """Batches for one host (every host gets the same number of examples)."""
  source = image_source(dataset, split, data_dir=data_dir)
  examples = source.examples
  what = f"{source.name} {split} ({len(examples)} images)"
  if hasattr(examples, "take"):
    batches = common.EpochBatches(
        len(examples), examples.take, batch_size=batch_size, seed=seed, shuffle=shuffle,
        num_epochs=num_epochs, drop_remainder=drop_remainder, shard_index=shard_index,
        shard_count=shard_count, what=what, micro_batches=micro_batches)
    return common.epoch_batches_dataset(batches), source
  ds = grain.MapDataset.source(examples)
  ds = ds[:len(ds) - len(ds) % shard_count]
  ds = common.shard_shuffle_repeat(ds, shard_index=shard_index, shard_count=shard_count,
                                   seed=seed, shuffle=shuffle, num_epochs=num_epochs, what=what)
  threads = num_threads or min(16, 2 * (os.cpu_count() or 1))
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads,
                                            prefetch_buffer_size=max(4 * threads, batch_size)))
  return ds.batch(batch_size, drop_remainder=drop_remainder), source
