"""Where studies are: ordinary Python packages, found by folder, imported by name.

A study is a package folder holding ``__init__.py`` and ``reproduce.py``; its
``reproduce.py`` defines ``STUDY`` (:class:`rankjax._src.studies.Study`). The folders
searched are the source checkout's ``experiments/`` (the three papers' studies; absent
from an installed wheel) and every ``--studies PATH`` given to ``rankjax reproduce``: a
study folder itself, or a folder of study folders.

A study's import name is its dotted path from the first folder above it that is not a
package (``experiments/transforming_rank`` -> ``experiments.transforming_rank``; a
user's ``~/work/my_study`` -> ``my_study``); that folder goes on ``sys.path`` once, and
the package is imported the ordinary way. Its folder is where its committed results
(``results/<scale>/``) and ``EXPECTED.md`` live.
"""
from __future__ import annotations

import dataclasses
import importlib
import pathlib
import sys
from typing import Iterable

from rankjax._src.errors import UserError

CHECKOUT_STUDIES = pathlib.Path(__file__).resolve().parents[3] / "experiments"


def is_study(folder: pathlib.Path) -> bool:
  return (folder / "__init__.py").is_file() and (folder / "reproduce.py").is_file()


def find(extra: Iterable[str | pathlib.Path] = ()) -> dict[str, pathlib.Path]:
  """``{study name: folder}`` of the checkout's studies and those under ``extra`` (a
  study folder or a folder of them); a name found twice, or an ``extra`` path holding
  no study, is an error."""
  roots = [CHECKOUT_STUDIES] if CHECKOUT_STUDIES.is_dir() else []
  out: dict[str, pathlib.Path] = {}
  for root in [*roots, *(pathlib.Path(p).expanduser().resolve() for p in extra)]:
    if not root.is_dir():
      raise FileNotFoundError(f"--studies {root}: no such folder")
    found = [root] if is_study(root) else sorted(p for p in root.iterdir()
                                                 if p.is_dir() and is_study(p))
    if not found and root is not CHECKOUT_STUDIES:
      raise UserError(f"--studies {root}: neither a study (a package with reproduce.py) "
                       "nor a folder of studies")
    for folder in found:
      if folder.name in out and out[folder.name] != folder:
        raise UserError(f"two studies are named {folder.name!r}: {out[folder.name]} and "
                         f"{folder}")
      out[folder.name] = folder
  return out


def import_name(folder: pathlib.Path) -> tuple[str, pathlib.Path]:
  """(dotted package name, the folder that goes on ``sys.path``) of a package folder."""
  parts, top = [folder.name], folder.parent
  while (top / "__init__.py").is_file():
    parts.insert(0, top.name)
    top = top.parent
  return ".".join(parts), top


def load(folder: str | pathlib.Path):
  """The ``STUDY`` of the package at ``folder``, with its folder and package set."""
  folder = pathlib.Path(folder).resolve()
  name, top = import_name(folder)
  head = sys.modules.get(name.split(".")[0])
  if head is not None and getattr(head, "__file__", None) is not None:
    where = pathlib.Path(head.__file__).resolve().parent
    expected = top / name.split(".")[0]
    if where != expected:
      raise UserError(f"a different package named {name.split('.')[0]!r} is already "
                       f"imported ({where}); the study at {folder} needs {expected}")
  if str(top) not in sys.path:
    sys.path.insert(0, str(top))
  study = importlib.import_module(f"{name}.reproduce").STUDY
  return dataclasses.replace(study, package=name, folder=folder)


def folder_of(study) -> pathlib.Path:
  """The folder of ``study``: a :class:`Study`, a folder, or a checkout study's name."""
  if isinstance(study, pathlib.Path):
    return study
  if hasattr(study, "folder"):
    if study.folder is None:
      raise ValueError(f"study {study.name!r} has no folder (load it with "
                       "rankjax._src.studies.finder.load)")
    return study.folder
  known = find()
  if study not in known:
    raise UserError(f"study {study!r} is not known; choose one of {sorted(known)}")
  return known[study]
