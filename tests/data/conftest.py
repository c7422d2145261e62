"""Fixtures for the data tests: small text folders and ArrayRecord files."""

import pathlib

import pytest

from tests.data.util import make_docs


@pytest.fixture
def txt_dir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
  root = tmp_path / "texts"
  root.mkdir()
  docs = make_docs(30)
  for i, doc in enumerate(docs):
    (root / f"{i:03d}.txt").write_text(doc)
  return root, docs


@pytest.fixture
def array_record_dir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
  from array_record.python.array_record_module import ArrayRecordWriter

  root = tmp_path / "records"
  root.mkdir()
  docs = make_docs(40, seed=1)
  writer = ArrayRecordWriter(str(root / "docs.array_record"), "group_size:1")
  for doc in docs:
    writer.write(doc.encode("utf-8"))
  writer.close()
  return root, docs
