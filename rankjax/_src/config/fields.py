"""Run-control metadata on config fields (``run_field``) and what is derived from it.

``fields_with`` lists the fields with a flag (``rankjax._src.train.checkpoint.RESUMABLE_FIELDS``,
``rankjax._src.train.loop._NOT_BUILT``); ``per_run_paths`` the dotted names of the per-run
scalars of a config, its model config's included (``model.beta``); ``step_shape`` a
config without them: configs with equal step shapes train as one program
(``rankjax._src.train.runs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

_DEFAULTS = {"resumable": False, "build": True, "per_run": False}


def run_field(default: Any, *, resumable: bool = False, build: bool = True,
              per_run: bool = False) -> Any:
  """A config field with its run-control metadata (read by ``fields_with``):

  resumable: the field may change when a run resumes (it does not change the
    trajectory; ``rankjax._src.train.checkpoint.check_workdir_config``).
  build: ``rankjax._src.train.loop.build`` reads it (runs differing only in fields with
    ``build=False`` share one compiled build).
  per_run: a scalar that may differ between the runs of one program
    (``rankjax._src.train.runs``: the seed, the optimizer's hyperparameters and the model
    scalars the model reads only arithmetically, per-run arrays of the vmapped step);
    it changes no shape (:func:`step_shape`). A model field the model branches on in
    Python (``if cfg.x:``) or passes to a kernel as a static number must not be one.
  """
  return dataclasses.field(default=default, metadata={"resumable": resumable, "build": build,
                                                      "per_run": per_run})


def fields_with(cls: type, key: str, value: bool) -> tuple[str, ...]:
  """Names of ``cls``'s fields whose metadata ``key`` (``run_field``) is ``value``;
  fields without metadata count as ``resumable=False, build=True, per_run=False``."""
  default = _DEFAULTS[key]
  return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(key, default) == value)


def _is_config(value: Any) -> bool:
  return dataclasses.is_dataclass(value) and not isinstance(value, type)


def per_run_paths(cfg: Any) -> tuple[str, ...]:
  """The dotted names of ``cfg``'s per-run fields, those of the configs it holds
  (``model``) included: ``("learning_rate", ..., "seed", "model.alpha", "model.beta")``."""
  out = list(fields_with(type(cfg), "per_run", True))
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    if _is_config(value):
      out.extend(f"{f.name}.{p}" for p in per_run_paths(value))
  return tuple(out)


def get_path(cfg: Any, path: str) -> Any:
  """``cfg``'s field at a dotted ``path`` (``"model.beta"``)."""
  for name in path.split("."):
    cfg = getattr(cfg, name)
  return cfg


def step_shape(cfg: Any) -> tuple[tuple[str, Any], ...]:
  """``cfg``'s fields but the ``per_run`` ones, recursively (a model config's per-run
  fields dropped too; its class kept): configs with equal step shapes compile to the
  same programs (their steps, their memory) and train as one program
  (``rankjax._src.train.runs``)."""
  per_run = set(fields_with(type(cfg), "per_run", True))
  out = []
  for f in dataclasses.fields(cfg):
    if f.name in per_run:
      continue
    value = getattr(cfg, f.name)
    out.append((f.name, (type(value), step_shape(value)) if _is_config(value) else value))
  return tuple(out)
