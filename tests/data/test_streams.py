"""The global streamed order (``rankjax._src.data.streams``): one packing stream per global
batch row over an ArrayRecord set, the same global batches for any number of hosts,
and a checkpoint written by one host count resumed exactly by another."""

import json

import numpy as np
import pytest
from etils import epath

from rankjax._src import data
from rankjax._src.data import streams
from rankjax._src.data import text as text_lib
from rankjax._src.data.tokenizer import ByteTokenizer
from rankjax._src.train import checkpoint
from tests.data.util import collect

GLOBAL = 8      # rows of a global batch
SEQ = 12


def host_iterator(root, index, count, *, micro_batches=1, seed=2, shuffle=True):
  return data.make_iterator("text", dataset=str(root), batch_size=GLOBAL // count,
                            seq_len=SEQ, seed=seed, shuffle=shuffle, shard_index=index,
                            shard_count=count, micro_batches=micro_batches)


def global_batches(parts, micro_batches=1):
  """Hosts' batches reassembled as ``sharding.global_batch`` does: micro-batch j of
  every host, host after host."""
  out = []
  for step in zip(*parts):
    micro = [np.concatenate([p["inputs"].reshape(micro_batches, -1, SEQ)[j] for p in step])
             for j in range(micro_batches)]
    out.append(np.concatenate(micro))
  return out


def test_stream_g_packs_documents_g_g_plus_s_and_so_on(array_record_dir):
  """Unshuffled, row g of consecutive batches is the byte stream of the training
  documents g, g+S, g+2S, ... (epoch after epoch), cut into chunks of T+1 tokens."""
  root, docs = array_record_dir
  train = [d for i, d in enumerate(docs) if i % 10 != 9]         # 36 documents
  batches = collect(host_iterator(root, 0, 1, shuffle=False), 40)
  for g in range(GLOBAL):
    mine = train[g::GLOBAL]
    stream = text_lib.stream_tokens(mine * 3, ByteTokenizer())    # three epochs
    rows = np.stack([np.concatenate([b["inputs"][g], b["targets"][g, -1:]]) for b in batches])
    np.testing.assert_array_equal(rows.reshape(-1), stream[:rows.size])


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_global_batches_are_the_same_for_one_two_and_four_hosts(array_record_dir,
                                                                micro_batches):
  root, _ = array_record_dir
  reference = global_batches([collect(host_iterator(root, 0, 1, micro_batches=micro_batches),
                                      6)], micro_batches)
  for count in (2, 4) if micro_batches == 1 else (2,):
    parts = [collect(host_iterator(root, i, count, micro_batches=micro_batches), 6)
             for i in range(count)]
    for a, b in zip(global_batches(parts, micro_batches), reference):
      np.testing.assert_array_equal(a, b)
  other_seed = collect(host_iterator(root, 0, 1, seed=3, micro_batches=micro_batches), 6)
  assert not np.array_equal(other_seed[0]["inputs"], reference[0])


def _save(step_dir, iterators):
  """The step's ``data/`` item as grain's checkpoint handler writes it."""
  out = epath.Path(step_dir) / "data"
  out.mkdir(parents=True)
  for i, it in enumerate(iterators):
    (out / f"process_{i}-of-{len(iterators)}.json").write_text(json.dumps(it.get_state()))
  return out


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2), (2, 4)])
def test_a_state_saved_by_one_host_count_resumes_with_another(array_record_dir, tmp_path,
                                                               before, after):
  """Saved at global batch 30 (streams at different documents, mid-document) by
  ``before`` hosts,
  rebuilt by ``streams.rebuild_data_state`` and restored by each of ``after``
  hosts: the next global batches are those of an uninterrupted run."""
  root, _ = array_record_dir
  old = [host_iterator(root, i, before, micro_batches=2) for i in range(before)]
  for it in old:
    collect(it, 30)
  states = [it.get_state() for it in old]
  assert len({d for s in states for d in s["docs"]}) > 1       # streams at other documents
  assert len({o for s in states for o in s["offsets"]}) > 2    # documents half cut
  data_dir = _save(tmp_path / "30", old)
  merged = streams.rebuild_data_state(data_dir, before)
  assert merged["next_batch"] == 30 and sorted(merged["rows"]) == list(range(GLOBAL))
  new = [host_iterator(root, i, after, micro_batches=2) for i in range(after)]
  for it in new:
    it.set_state(merged)
  expected = global_batches([collect(host_iterator(root, 0, 1, micro_batches=2), 34)[30:]], 2)
  for a, b in zip(global_batches([collect(it, 4) for it in new], 2), expected):
    np.testing.assert_array_equal(a, b)


def test_states_that_do_not_fit_together_are_refused_in_one_line(array_record_dir, tmp_path):
  """As a resume reads them (``checkpoint.reshard_data_state`` over
  ``streams.rebuild_data_state``): states that do not re-shard are a one-line
  ProcessCountError, a missing file makes the step incomplete, an unparsable one is an
  integrity failure."""
  root, _ = array_record_dir
  old = [host_iterator(root, i, 2) for i in range(2)]
  collect(old[0], 3)
  collect(old[1], 2)
  rebuild = lambda data_dir, count, step: checkpoint.reshard_data_state(
      data_dir, count, step, streams.rebuild_data_state)
  with pytest.raises(checkpoint.ProcessCountError) as e:
    rebuild(_save(tmp_path / "3", old), 2, 3)
  msg = str(e.value)
  assert "\n" not in msg and "written by 2 process(es) and this run has 1" in msg
  assert "global batches [2, 3]" in msg
  # a finite pass's per-host document shards (and the earlier streamed order) still refuse
  finite = [data.make_iterator("text", dataset=str(root), batch_size=2, seq_len=SEQ,
                               num_epochs=1, shuffle=False, shard_index=i, shard_count=2)
            for i in range(2)]
  with pytest.raises(checkpoint.ProcessCountError, match="cannot be re-sharded: resume with 2"):
    rebuild(_save(tmp_path / "4", finite), 2, 4)
  fine = [host_iterator(root, i, 2) for i in range(2)]
  gone = _save(tmp_path / "5", fine)
  (gone / "process_1-of-2.json").unlink()
  with pytest.raises(checkpoint.IncompleteStep, match="^data/process_1-of-2.json is missing$"):
    rebuild(gone, 2, 5)
  cut = _save(tmp_path / "6", fine)
  (cut / "process_0-of-2.json").write_text('{"next_batch": ')
  with pytest.raises(json.JSONDecodeError) as e:
    rebuild(cut, 2, 6)
  assert checkpoint.is_integrity_failure(e.value)
  with pytest.raises(ValueError, match="not one of the global streamed order"):
    host_iterator(root, 0, 1).set_state(finite[0].get_state())
  other_size = data.make_iterator("text", dataset=str(root), batch_size=2, seq_len=SEQ)
  with pytest.raises(ValueError, match="packs 8 streams .* this run has 2"):
    other_size.set_state(host_iterator(root, 0, 1).get_state())
  assert streams.merge_states([{"next_index": 3}]) is None


def test_too_few_documents_for_the_global_batch_is_one_line(array_record_dir):
  root, _ = array_record_dir
  with pytest.raises(ValueError, match="36 documents, fewer than the 64 rows"):
    data.make_iterator("text", dataset=str(root), batch_size=32, seq_len=SEQ,
                       shard_index=0, shard_count=2)
