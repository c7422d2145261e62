"""Tokenizers: byte-level default, sentencepiece and tiktoken model files, clear errors."""

import base64

import numpy as np
import pytest

from rankjax._src import data
from rankjax._src.data import tokenizer as tokenizer_lib

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind"


def test_byte_tokenizer_round_trip():
  tok = data.make_tokenizer(None)
  assert tok is not None and data.make_tokenizer("byte").vocab_size == tok.vocab_size == 257
  ids = tok.encode(TEXT + " é")
  assert ids.dtype == np.int32 and ids.max() < 256 and tok.eod_id == 256
  assert tok.decode(np.append(ids, tok.eod_id)) == TEXT + " é"


def test_sentencepiece_model_file(tmp_path):
  spm = pytest.importorskip("sentencepiece")
  lines = [TEXT, "the slings and arrows of outrageous fortune", "or to take arms against"] * 20
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_prefix=str(tmp_path / "tiny"), vocab_size=60,
      model_type="bpe", minloglevel=2)
  tok = data.make_tokenizer(str(tmp_path / "tiny.model"))
  assert tok.vocab_size == 60 and 0 <= tok.eod_id < 60
  ids = tok.encode(TEXT)
  assert ids.dtype == np.int32 and ids.max() < tok.vocab_size and tok.eod_id not in ids
  assert tok.decode(ids) == TEXT


def write_ranks(path, merges=(b"th", b"he", b"the", b"to", b" t")):
  tokens = [bytes([i]) for i in range(256)] + list(merges)
  path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)))
  return len(tokens)


def test_tiktoken_ranks_file(tmp_path):
  pytest.importorskip("tiktoken")
  n = write_ranks(tmp_path / "tiny.tiktoken")
  tok = data.make_tokenizer(str(tmp_path / "tiny.tiktoken"))
  assert tok.eod_id == n and tok.vocab_size == n + 1
  ids = tok.encode(TEXT + " <|endoftext|>")
  assert ids.dtype == np.int32 and ids.max() < n  # special text is ordinary text
  assert 258 in ids  # "the" merged
  assert tok.decode(np.append(ids, tok.eod_id)) == TEXT + " <|endoftext|>"


def test_tiktoken_known_encoding_name_keeps_its_special_ids(tmp_path):
  pytest.importorskip("tiktoken")
  write_ranks(tmp_path / "cl100k_base.tiktoken")
  tok = data.make_tokenizer(str(tmp_path / "cl100k_base.tiktoken"))
  assert tok.eod_id == 100257 and tok.vocab_size == 100277
  assert tok.decode(tok.encode(TEXT)) == TEXT


@pytest.mark.parametrize("name,content,match", [
    ("missing.model", None, "does not exist"),
    ("missing.tiktoken", None, "does not exist"),
    ("vocab.json", "{}", "is not a tokenizer.json"),
    ("broken.model", "not a model", "not a sentencepiece model"),
    ("broken.tiktoken", "@@ nope\n", "not a tiktoken ranks file"),
])
def test_bad_tokenizer_files_get_one_line_errors(tmp_path, name, content, match):
  if name.endswith(".model"):
    pytest.importorskip("sentencepiece")
  if name.endswith(".tiktoken"):
    pytest.importorskip("tiktoken")
  path = tmp_path / name
  if content is not None:
    path.write_text(content)
  with pytest.raises(ValueError, match=match) as e:
    data.make_tokenizer(str(path))
  assert "\n" not in str(e.value)


def test_tokenizer_object_is_accepted_as_is():
  tok = tokenizer_lib.ByteTokenizer()
  assert tokenizer_lib.as_tokenizer(tok) is tok
