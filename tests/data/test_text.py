"""Text pipelines: packing, exact resume (also through Orbax), sharding, sources, errors."""

import numpy as np
import pytest

from rankjax._src import data
from rankjax._src.data import text as text_lib
from rankjax._src.data.tokenizer import ByteTokenizer
from tests.data.util import chunks_of, collect

EOD = ByteTokenizer.eod_id


def byte_stream(docs: list[str]) -> np.ndarray:
  return text_lib.stream_tokens(docs, ByteTokenizer())


def one_pass(dataset, *, seq_len, split="train", shard_index=0, shard_count=1, **kw):
  it = data.make_iterator(
      "text", dataset=dataset, split=split, batch_size=3, seq_len=seq_len, seed=0,
      shuffle=False, num_epochs=1, shard_index=shard_index, shard_count=shard_count,
      drop_remainder=False, **kw)
  return chunks_of(list(it))


def train_docs(docs: list[str]) -> list[str]:
  return [d for i, d in enumerate(docs) if i % 10 != 9]


@pytest.mark.parametrize("source", ["txt_dir", "txt_dir_streamed", "array_record_dir"])
def test_packing_keeps_every_token_without_padding(source, request, monkeypatch):
  if source == "txt_dir_streamed":  # a text folder too large to hold in memory
    monkeypatch.setattr(text_lib, "IN_MEMORY_MAX_BYTES", 0)
    source = "txt_dir"
  root, docs = request.getfixturevalue(source)
  stream = byte_stream(train_docs(docs))
  chunks = one_pass(str(root), seq_len=15)
  assert chunks.shape[1] == 16 and chunks.dtype == np.int32
  assert len(chunks) == len(stream) // 16  # only the last partial chunk is dropped
  np.testing.assert_array_equal(chunks.reshape(-1), stream[:chunks.size])
  # one end-of-document token after every document that made it in
  assert (chunks == EOD).sum() == (stream[:chunks.size] == EOD).sum() >= len(docs) * 0.9 - 1


def test_targets_are_next_tokens(txt_dir):
  root, _ = txt_dir
  it = data.make_iterator("text", dataset=str(root), batch_size=4, seq_len=32, seed=1)
  for batch in collect(it, 3):
    assert batch["inputs"].shape == batch["targets"].shape == (4, 32)
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])


@pytest.mark.parametrize("source", ["txt_dir", "array_record_dir"])
def test_shards_partition_the_data(source, request):
  root, docs = request.getfixturevalue(source)
  train = train_docs(docs)
  shards = [one_pass(str(root), seq_len=7, shard_index=s, shard_count=3) for s in range(3)]
  if source == "txt_dir":  # small: chunks are sharded, equal counts per host
    full = one_pass(str(root), seq_len=7)
    assert len({len(s) for s in shards}) == 1
    # of each global batch (3 hosts x 3) of the first len - len % 3 chunks, host s
    # gets the s-th third (common.EpochBatches: hosts share one order)
    kept = full[:len(full) - len(full) % 3]
    for s, chunks in enumerate(shards):
      expected = [block[s * (len(block) // 3):(s + 1) * (len(block) // 3)]
                  for block in (kept[i:i + 9] for i in range(0, len(kept), 9))]
      np.testing.assert_array_equal(chunks, np.concatenate(expected))
  else:  # streamed: documents are sharded
    for s, chunks in enumerate(shards):
      expected = byte_stream(train[s::3])
      np.testing.assert_array_equal(chunks.reshape(-1), expected[:chunks.size])


def test_same_seed_same_order_other_seed_other_order(array_record_dir):
  root, _ = array_record_dir

  def first(seed):
    it = data.make_iterator("text", dataset=str(root), batch_size=2, seq_len=16, seed=seed)
    return np.stack([b["inputs"] for b in collect(it, 3)])

  np.testing.assert_array_equal(first(0), first(0))
  assert not np.array_equal(first(0), first(1))


@pytest.mark.parametrize("source", ["txt_dir", "array_record_dir"])
def test_state_restore_gives_the_same_next_batches(source, request):
  root, _ = request.getfixturevalue(source)

  def make():
    return data.make_iterator("text", dataset=str(root), batch_size=2, seq_len=24, seed=3)

  it = make()
  collect(it, 5)
  state = it.get_state()
  expected = collect(it, 6)
  restored = make()
  restored.set_state(state)
  for a, b in zip(expected, collect(restored, 6)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    np.testing.assert_array_equal(a["targets"], b["targets"])


def test_state_restore_across_epoch_boundaries(tmp_path):
  for i in range(3):
    (tmp_path / f"{i}.txt").write_text(f"document {i} " * 10)  # 12 chunks of 25

  def make():
    return data.make_iterator("text", dataset=str(tmp_path), batch_size=2, seq_len=24, seed=3)

  it = make()
  collect(it, 5)
  state = it.get_state()
  expected = collect(it, 8)  # epoch 1 ends after 6 batches
  restored = make()
  restored.set_state(state)
  for a, b in zip(expected, collect(restored, 8)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
  assert not np.array_equal(expected[1]["inputs"], expected[7]["inputs"])  # reshuffled


def test_orbax_round_trip_of_iterator_state(array_record_dir, tmp_path):
  import grain
  import orbax.checkpoint as ocp

  root, _ = array_record_dir

  def make():
    return data.make_iterator("text", dataset=str(root), batch_size=2, seq_len=20, seed=5)

  it = make()
  collect(it, 3)
  with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
    mngr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
  expected = collect(it, 4)
  fresh = make()
  with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
    restored = mngr.restore(
        mngr.latest_step(), args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  for a, b in zip(expected, collect(restored.data, 4)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])


def test_text_folder_split_subdirectories(tmp_path):
  (tmp_path / "train").mkdir()
  (tmp_path / "validation").mkdir()
  (tmp_path / "train" / "a.txt").write_text("train text " * 20)
  (tmp_path / "validation" / "b.txt").write_text("held out " * 20)
  val = one_pass(str(tmp_path), seq_len=7, split="validation")
  assert b"held out" in bytes(val[val < 256].astype(np.uint8))
  assert b"train" not in bytes(val[val < 256].astype(np.uint8))


def test_tfds_text_set_under_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=12):
    it = data.make_iterator("text", dataset="lm1b", batch_size=2, seq_len=8, seed=0,
                            num_threads=2)
    collect(it, 2)
    state = it.get_state()
    expected = collect(it, 3)
    again = data.make_iterator("text", dataset="lm1b", batch_size=2, seq_len=8, seed=0,
                               num_threads=2)
    again.set_state(state)
    for a, b in zip(expected, collect(again, 3)):
      np.testing.assert_array_equal(a["inputs"], b["inputs"])
    assert data.dataset_info("text", dataset="lm1b").name == "lm1b"


@pytest.mark.parametrize("name", ["lm1b", "c4/en"])
def test_unprepared_tfds_set_names_data_dir_and_command(name, tmp_path):
  with pytest.raises(data.DataUnavailableError) as e:
    data.make_iterator("text", dataset=name, data_dir=str(tmp_path), batch_size=2, seq_len=8)
  msg = str(e.value)
  assert "\n" not in msg and str(tmp_path) in msg and f"tfds build {name}" in msg


def test_bad_inputs_get_one_line_errors(txt_dir, tmp_path):
  root, _ = txt_dir
  cases = [
      dict(dataset=str(tmp_path / "missing_dir")),
      dict(dataset=str(root), split="dev"),
      dict(dataset=str(root), seq_len=0),
      dict(dataset=str(root), tokenizer=str(tmp_path / "missing.model")),
      dict(dataset=str(root), tokenizer=str(tmp_path / "vocab.json")),
      dict(dataset=str(root), shard_index=3, shard_count=3),
  ]
  for kw in cases:
    kw = {"seq_len": 8, **kw}
    with pytest.raises(ValueError) as e:
      data.make_iterator("text", batch_size=2, **kw)
    assert "\n" not in str(e.value), kw


def test_model_too_small_for_tokenizer():
  info = data.DataInfo(name="x", kind="text", vocab_size=257, seq_len=128, tokenizer="byte")
  data.check_model_fits(info, vocab_size=257, max_seq_len=128)
  with pytest.raises(ValueError, match="vocab_size=256 is smaller"):
    data.check_model_fits(info, vocab_size=256)
  with pytest.raises(ValueError, match="seq_len=128 is longer"):
    data.check_model_fits(info, max_seq_len=64)


def test_global_batches_do_not_depend_on_the_host_count():
  """With gradient accumulation: hosts' parts, reassembled as the training loop does
  (micro-batch j of every host, host after host), give the one-host batches."""
  def host_batches(index, count, n=3):
    it = data.make_iterator("text", batch_size=8 // count, seq_len=8, seed=3,
                            shard_index=index, shard_count=count, micro_batches=2)
    return collect(it, n)

  one = host_batches(0, 1)
  for count in (2, 4):
    parts = [host_batches(i, count) for i in range(count)]
    for step in range(3):
      micro = [np.concatenate([p[step]["inputs"].reshape(2, -1, 8)[j] for p in parts])
               for j in range(2)]
      np.testing.assert_array_equal(np.concatenate(micro), one[step]["inputs"])
