"""Every path the training system touches, as ``etils.epath.Path``.

A workdir (or data_dir, config file) is a local path or a URL of a filesystem
``etils.epath`` reaches through fsspec: ``gs://bucket/run`` needs the ``gcsfs``
package, ``s3://`` ``s3fs``. ``as_path`` refuses a URL whose package is missing with
one line naming it. Orbax and tensorstore read and write the same URLs themselves
(tensorstore's own GCS driver; see ``rankjax._src.train.checkpoint``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from typing import Any

from etils import epath

from rankjax._src.errors import UserError

# URL scheme -> the fsspec package epath needs for it.
FILESYSTEM_PACKAGES = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}


def scheme(path: str | os.PathLike) -> str | None:
  text = os.fspath(path)
  return text.split("://", 1)[0] if "://" in text else None


def is_remote(path: str | os.PathLike) -> bool:
  return scheme(path) is not None


def as_path(path: str | os.PathLike, what: str = "path") -> epath.Path:
  """``epath.Path(path)``; a URL whose filesystem package is missing: one ValueError."""
  if isinstance(path, epath.Path) and not is_remote(path):
    return path
  s = scheme(path)
  if s is not None:
    package = FILESYSTEM_PACKAGES.get(s)
    if package is None:
      raise UserError(f"{what} {os.fspath(path)}: the URL scheme {s}:// is not supported; "
                       f"use a local path or one of {[k + '://' for k in FILESYSTEM_PACKAGES]}")
    if importlib.util.find_spec(package) is None:
      raise UserError(f"{what} {os.fspath(path)} needs the {package} package "
                       f"(pip install {package})")
  return epath.Path(path)


def check_output(path: str | os.PathLike, what: str, *, file: bool = False) -> epath.Path:
  """``path`` as ``epath.Path`` once it is known that a command can write its outputs
  there: a folder (``file``: one output file); called before any work, creates nothing.

  Raises:
    ValueError (one line): ``path`` is a file (``file``: a folder), a folder above it
    is a file, the nearest existing folder is not writable, or a URL's bucket does not
    exist.
  """
  p = as_path(path, what)
  if p.exists() and p.is_dir() == file:
    raise UserError(f"{what} {path} is a {'folder' if file else 'file'}, "
                     f"not a {'file' if file else 'directory'}")
  if is_remote(p):       # object stores have no folders to check, only the bucket
    bucket = epath.Path(f"{scheme(p)}://{p.parts[2]}")
    if not bucket.exists():
      raise UserError(f"{what} {path}: the bucket {bucket} does not exist")
    return p
  existing = p.parent if file else p
  while not existing.exists():
    existing = existing.parent
  if not existing.is_dir():
    raise UserError(f"{what} {path}: {existing} is a file, not a directory")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UserError(f"{what} {path}: {existing} is not writable")
  return p


def check_new_outputs(outputs, what: str, overwrite: bool) -> None:
  """Refuses (one-line ValueError, before any work) to replace earlier results: the
  first of ``outputs`` that exists is named unless ``overwrite`` (``--overwrite``)."""
  if overwrite:
    return
  existing = [os.fspath(p) for p in outputs if as_path(p, what).exists()]
  if existing:
    more = f" (and {len(existing) - 1} more of its outputs)" if len(existing) > 1 else ""
    raise UserError(f"{what}: {existing[0]} exists{more}; add --overwrite to replace "
                     "the earlier results")


def absolute(path: epath.Path) -> epath.Path:
  """A local path made absolute (Orbax wants one); URLs as they are."""
  return path if is_remote(path) else epath.Path(os.path.abspath(os.fspath(path)))


def read_json(path: str | os.PathLike) -> Any:
  """The JSON document in ``path``; a damaged file is bad input: one UserError naming
  it (a file rankjax wrote, cut short or edited)."""
  try:
    return json.loads(as_path(path).read_text())
  except json.JSONDecodeError as e:
    raise UserError(f"{os.fspath(path)} is not valid JSON ({e}): a damaged file; restore "
                    "it, or remove it to write it again") from None


def write_text_atomic(path: epath.Path, text: str) -> None:
  """Writes ``text`` so a reader sees the old file or the whole new one.

  Local: a temporary file in the same folder, then ``os.replace``. Object stores
  (gs://, s3://) make an uploaded object visible only once complete, so a plain
  write is atomic there.
  """
  path.parent.mkdir(parents=True, exist_ok=True)
  if is_remote(path):
    path.write_text(text)
    return
  tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
  tmp.write_text(text)
  os.replace(os.fspath(tmp), os.fspath(path))


def _filesystem(s: str):
  import fsspec
  return fsspec.filesystem("gcs" if s == "gs" else s,
                           **({"finalize_on_close": True} if s == "gs" else {}))


def refresh(path: epath.Path) -> None:
  """Forgets fsspec's cached listings under ``path`` (object stores), so files written
  by other clients (tensorstore, other processes) since it last listed are seen."""
  if is_remote(path):
    fs = _filesystem(scheme(path))
    fs.invalidate_cache(fs._strip_protocol(os.fspath(path)))


def move(src: epath.Path, dst: epath.Path) -> None:
  """Moves a file or folder: a rename locally. On an object store folders exist only
  through their objects (epath's rename wants the parent "folder" to exist), so each
  object is copied server-side, then deleted one by one (no batch request)."""
  if not is_remote(src):
    dst.parent.mkdir(parents=True, exist_ok=True)
    src.rename(dst)
    return
  fs = _filesystem(scheme(src))
  root, target = fs._strip_protocol(os.fspath(src)), fs._strip_protocol(os.fspath(dst))
  files = fs.find(root) if fs.isdir(root) else [root]
  for f in files:
    fs.copy(f, target + f[len(root):])
  for f in files:
    fs.rm_file(f)
