"""Tokenizers: byte-level by default, sentencepiece or tiktoken from a model file.

Every tokenizer has ``name``, ``vocab_size`` (one more than the largest id it can
produce), ``eod_id`` (the end-of-document id the packer puts between documents),
``encode(text) -> (N,) int32`` (no special ids added) and ``decode(ids) -> str``.

``make_tokenizer(spec)`` picks one:

  None, "", "byte"     byte-level: ids 0..255 are the UTF-8 bytes, 256 ends a
                       document; vocab_size 257. Needs no files.
  PATH.model           sentencepiece model; eod_id is its ``</s>`` id, or one id past
                       its vocabulary when it has none.
  PATH.tiktoken        tiktoken BPE ranks (lines ``base64(token) rank``), read from
                       the file only, never downloaded. A file named like a known
                       OpenAI encoding (gpt2, r50k_base, p50k_base, cl100k_base,
                       o200k_base) gets that encoding's split pattern and
                       ``<|endoftext|>`` id; any other gets the GPT-2 pattern and
                       ``<|endoftext|>`` = one id past the ranks.
"""

from __future__ import annotations

import base64
import pathlib
from typing import Protocol, Sequence
from unittest import mock

import numpy as np

from rankjax._src.errors import UserError

BYTE_VOCAB = 256


class Tokenizer(Protocol):
  name: str
  vocab_size: int
  eod_id: int

  def encode(self, text: str) -> np.ndarray: ...

  def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


class ByteTokenizer:
  """UTF-8 bytes as ids 0..255; 256 is the end-of-document id."""

  name = "byte"
  vocab_size = BYTE_VOCAB + 1
  eod_id = BYTE_VOCAB

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    ids = np.asarray(ids)
    return bytes(ids[ids < BYTE_VOCAB].astype(np.uint8)).decode("utf-8", errors="replace")


class SentencePieceTokenizer:
  """A sentencepiece ``.model`` file."""

  def __init__(self, path: str | pathlib.Path):
    import sentencepiece as spm  # optional: pip install 'rankjax[tokenizers]'

    self.path = str(path)
    self.name = f"sentencepiece:{pathlib.Path(path).name}"
    try:
      self._sp = spm.SentencePieceProcessor(model_file=self.path)
    except (OSError, RuntimeError) as e:
      raise UserError(f"tokenizer file {self.path} is not a sentencepiece model: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    pieces = self._sp.get_piece_size()
    eos = self._sp.eos_id()
    self.eod_id = eos if eos >= 0 else pieces
    self.vocab_size = max(pieces, self.eod_id + 1)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    pieces = self._sp.get_piece_size()
    return self._sp.decode([int(i) for i in ids if int(i) < pieces and int(i) != self.eod_id])


_ENDOFTEXT = "<|endoftext|>"
_KNOWN_TIKTOKEN = ("gpt2", "r50k_base", "p50k_base", "p50k_edit", "cl100k_base", "o200k_base")


def _load_ranks(path: pathlib.Path) -> dict[bytes, int]:
  ranks = {}
  for n, line in enumerate(path.read_bytes().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      token, rank = line.split()
      ranks[base64.b64decode(token, validate=True)] = int(rank)
    except ValueError:
      raise UserError(f"tokenizer file {path} is not a tiktoken ranks file "
                       f"(line {n} is not 'base64(token) rank')") from None
  if not ranks:
    raise UserError(f"tokenizer file {path} is empty")
  return ranks


class TiktokenTokenizer:
  """A tiktoken ``.tiktoken`` BPE ranks file, read offline."""

  def __init__(self, path: str | pathlib.Path):
    import tiktoken  # optional: pip install 'rankjax[tokenizers]'
    from tiktoken_ext import openai_public

    path = pathlib.Path(path)
    self.path = str(path)
    self.name = f"tiktoken:{path.name}"
    ranks = _load_ranks(path)
    stem = path.stem
    if stem in _KNOWN_TIKTOKEN:
      # The constructor would download the ranks; hand it ours instead.
      with mock.patch.object(openai_public, "load_tiktoken_bpe", lambda *a, **k: ranks):
        spec = getattr(openai_public, stem)()
      pat_str, special = spec["pat_str"], dict(spec["special_tokens"])
    else:
      pat_str, special = openai_public.r50k_pat_str, {_ENDOFTEXT: max(ranks.values()) + 1}
    self._enc = tiktoken.Encoding(name=stem, pat_str=pat_str, mergeable_ranks=ranks,
                                  special_tokens=special)
    self.eod_id = special[_ENDOFTEXT]
    self.vocab_size = max(max(ranks.values()), max(special.values())) + 1
    self._num_ranks = max(ranks.values()) + 1

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._enc.encode_ordinary(text), dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self._enc.decode([int(i) for i in ids if int(i) < self._num_ranks])


class HFTokenizer:
  """A Hugging Face ``tokenizer.json`` (the ``tokenizers`` package), read offline; the
  end-of-document id is the first of ``<|endoftext|>``, ``</s>``, ``<|end_of_text|>``,
  ``<eos>`` that the vocabulary has, else one past it."""

  def __init__(self, path: str | pathlib.Path):
    import tokenizers  # optional: pip install 'rankjax[tokenizers]'

    self.path = str(path)
    self.name = f"tokenizers:{pathlib.Path(path).name}"
    try:
      self._tok = tokenizers.Tokenizer.from_file(self.path)
    except Exception as e:   # the Rust error type is not importable: one line for any
      raise UserError(f"tokenizer file {self.path} is not a tokenizer.json: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    size = self._tok.get_vocab_size(with_added_tokens=True)
    ids = [self._tok.token_to_id(t) for t in (_ENDOFTEXT, "</s>", "<|end_of_text|>", "<eos>")]
    self.eod_id = next((i for i in ids if i is not None), size)
    self.vocab_size = max(size, self.eod_id + 1)

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self._tok.decode([int(i) for i in ids if int(i) != self.eod_id])


_SUFFIXES = {".model": SentencePieceTokenizer, ".tiktoken": TiktokenTokenizer,
             ".json": HFTokenizer}


def make_tokenizer(spec: str | pathlib.Path | None = None) -> Tokenizer:
  """The tokenizer named by ``spec``: None/"byte", or a ``.model``/``.tiktoken`` file or a
  Hugging Face ``tokenizer.json``."""
  if spec is None or str(spec) in ("", "byte"):
    return ByteTokenizer()
  path = pathlib.Path(spec).expanduser()
  cls = _SUFFIXES.get(path.suffix)
  if cls is None:
    raise UserError(f"tokenizer {str(spec)!r} is not 'byte', a sentencepiece .model file, "
                     f"a tiktoken .tiktoken file or a Hugging Face tokenizer.json")
  if not path.is_file():
    raise UserError(f"tokenizer file {path} does not exist (nothing is downloaded: put the "
                     f"file there, or --set tokenizer=/path/to/file, or --set tokenizer=byte)")
  try:
    return cls(path)
  except ImportError as e:
    raise UserError(f"tokenizer file {path} needs the {e.name} package: "
                     f"pip install 'rankjax[tokenizers]'") from None


def as_tokenizer(spec: "str | pathlib.Path | Tokenizer | None") -> Tokenizer:
  """``spec`` itself when it is a tokenizer object, else ``make_tokenizer(spec)``."""
  if spec is None or isinstance(spec, (str, pathlib.Path)):
    return make_tokenizer(spec)
  return spec
