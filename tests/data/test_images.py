"""Image pipelines: shapes, normalization, the named fallback, sharding, errors."""

import numpy as np
import pytest

from rankjax._src import data
from rankjax._src.data import images as images_lib
from tests.data.util import collect


@pytest.fixture
def no_cifar_no_fashion(tmp_path, monkeypatch):
  """An empty tfds data_dir and no Fashion-MNIST files: auto falls back to digits."""
  monkeypatch.setenv("RANKJAX_FASHION_MNIST", str(tmp_path / "none"))
  return str(tmp_path / "tfds")


def test_auto_falls_back_to_digits_and_names_it(no_cifar_no_fashion):
  pytest.importorskip("sklearn")
  info = data.dataset_info("images", data_dir=no_cifar_no_fashion)
  assert (info.name, info.input_dim, info.num_classes) == ("digits", 64, 10)
  it = data.make_iterator("images", data_dir=no_cifar_no_fashion, batch_size=16, seed=0)
  batch = next(it)
  assert batch["inputs"].shape == (16, 64) and batch["inputs"].dtype == np.float32
  assert batch["targets"].shape == (16,) and batch["targets"].dtype == np.int32


def test_digits_normalized_on_train_split():
  pytest.importorskip("sklearn")
  it = data.make_iterator("images", dataset="digits", batch_size=100, seed=0, shuffle=False,
                          num_epochs=1, drop_remainder=False)
  batches = list(it)
  x = np.concatenate([b["inputs"] for b in batches])
  y = np.concatenate([b["targets"] for b in batches])
  assert len(x) == 1797 - 179 and set(np.unique(y)) == set(range(10))
  np.testing.assert_allclose(x.mean(), 0, atol=1e-5)
  np.testing.assert_allclose(x.std(), 1, atol=1e-5)
  held_out = list(data.make_iterator("images", dataset="digits", split="test", batch_size=10,
                                     shuffle=False, num_epochs=1, drop_remainder=False))
  assert sum(len(b["targets"]) for b in held_out) == 179


def test_shards_are_disjoint_and_equal():
  pytest.importorskip("sklearn")

  def rows(shard):
    it = data.make_iterator("images", dataset="digits", batch_size=50, seed=0, num_epochs=1,
                            shard_index=shard, shard_count=4, drop_remainder=False)
    return np.concatenate([b["inputs"] for b in it])

  shards = [rows(s) for s in range(4)]
  assert len({len(s) for s in shards}) == 1 and sum(map(len, shards)) == 1616
  index = {r.tobytes(): s for s, x in enumerate(shards) for r in x}
  assert len(index) >= 1616 - 5  # a few digits images are exact duplicates


@pytest.mark.skipif(not images_lib.fashion_mnist_available(),
                    reason="apt-get install dataset-fashion-mnist")
def test_fashion_mnist_from_debian_package():
  it = data.make_iterator("images", dataset="fashion_mnist", batch_size=500, seed=0)
  x = np.concatenate([b["inputs"] for b in collect(it, 4)])
  assert x.shape == (2000, 784)
  assert abs(x.mean()) < 0.1 and abs(x.std() - 1) < 0.1
  assert data.dataset_info("images", dataset="fashion_mnist").input_dim == 784


def test_cifar10_under_mock_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=24):
    assert data.dataset_info("images", data_dir=str(tmp_path)).name == "cifar10"
    it = data.make_iterator("images", dataset="cifar10", batch_size=8, seed=0, num_threads=2)
    collect(it, 2)
    state = it.get_state()
    expected = collect(it, 3)
    again = data.make_iterator("images", dataset="cifar10", batch_size=8, seed=0, num_threads=2)
    again.set_state(state)
    for a, b in zip(expected, collect(again, 3)):
      np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert expected[0]["inputs"].shape == (8, 3072)
    assert expected[0]["targets"].dtype == np.int32


def test_explicit_cifar10_not_prepared_names_data_dir(tmp_path):
  with pytest.raises(data.DataUnavailableError) as e:
    data.make_iterator("images", dataset="cifar10", data_dir=str(tmp_path), batch_size=8)
  msg = str(e.value)
  assert "\n" not in msg and str(tmp_path) in msg and "tfds build cifar10" in msg


def test_bad_image_inputs():
  with pytest.raises(ValueError, match="image dataset='mnist' is not allowed"):
    data.dataset_info("images", dataset="mnist")
  info = data.DataInfo(name="digits", kind="images", num_classes=10, input_dim=64)
  data.check_model_fits(info, num_classes=10, input_dim=64)
  with pytest.raises(ValueError, match="input_dim=3072 does not match digits"):
    data.check_model_fits(info, input_dim=3072)
  with pytest.raises(ValueError, match="kind='audio' is not allowed"):
    data.make_iterator("audio", batch_size=2)


def test_auto_fallback_warns_naming_the_set(monkeypatch):
  monkeypatch.setattr(images_lib, "_cifar10_available", lambda data_dir: False)
  monkeypatch.setattr(images_lib, "fashion_mnist_available", lambda: False)
  monkeypatch.setattr(images_lib, "digits_available", lambda: True)
  with pytest.warns(UserWarning, match=r"'auto' -> 'digits': cifar10, fashion_mnist not"):
    assert images_lib.resolve_image_set("auto", None) == "digits"
  assert images_lib.resolve_image_set("digits", None) == "digits"    # named: no warning


def test_missing_image_set_line_names_the_set_and_its_command(monkeypatch):
  def not_prepared(split, data_dir):
    raise images_lib.common.DataUnavailableError(
        "tfds data set 'cifar10' split 'train' is not prepared\nmore")
  monkeypatch.setattr(images_lib, "_cifar10", not_prepared)
  assert images_lib.missing_image_set_line("cifar10", None) == (
      "tfds data set 'cifar10' split 'train' is not prepared")
  if images_lib.digits_available():
    assert images_lib.missing_image_set_line("digits", None) is None
