"""Configs to and from dicts and JSON, ``key=value`` overrides (``--set``) and diffs.

A config's JSON form is its fields, nested configs as objects. A field holding one of a
family of configs (``Tagged``: the model of a ``TrainConfig``) is tagged with the
member's kind: ``"model": {"kind": "transformer", "d_model": 512, ...}``. A class with
``JSON_FORMAT`` (``TrainConfig``) writes ``"format": JSON_FORMAT``; it reads format 2
(a model's fields flat: ``"rope_base"``, ``"remat"``, ...) converted (``convert_format2``:
the fields a model config's ``MOVED`` names go into its sub-configs) and refuses format 1
and unknown formats in one line; ``convert_file`` rewrites a config of format 1 (a
``"model"`` name beside ``"lm"`` and ``"mlp"`` objects) or 2 as format 3
(``rankjax convert-config``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import pathlib
import types
import typing
from typing import Any, Mapping, Sequence, TypeVar

from rankjax._src.errors import UserError

C = TypeVar("C")

# The JSON layout of a TrainConfig: 3, one tagged "model" object whose sub-configs are
# objects ("rope": {...}, "kernels": {...}). Format 2 had those fields flat in the model
# ("rope_base", "remat": the model class's MOVED); format 1 (no "format" key) had
# ``"model": "lm"`` or ``"mlp"`` beside both models' objects ``"lm"``, ``"mlp"``.
FORMAT = 3
_FORMAT1_MODELS = {"lm": "transformer", "mlp": "mlp"}


class JsonConfig:
  """``Config.from_json(path_or_text)`` / ``cfg.to_json(path=None)`` on every config
  (the module functions ``from_json(cls, ...)`` / ``to_json(cfg, ...)`` do the same)."""

  @classmethod
  def from_json(cls, path_or_text):
    return from_json(cls, path_or_text)

  def to_json(self, path=None) -> str:
    return to_json(self, path)


class Tagged(JsonConfig):
  """The root of a family of configs whose JSON form names the member:
  ``{"kind": KIND, **fields}``. The family (``models.ModelConfig``) maps kinds to
  classes and back: ``kinds()``, ``of_kind(kind)`` (a one-line ValueError for an
  unknown kind) and ``kind_of_class()``."""

  @property
  def kind(self) -> str:
    """This config's kind (its class's)."""
    return type(self).kind_of_class()

  @classmethod
  def kind_of_class(cls) -> str:
    raise NotImplementedError

  @classmethod
  def kinds(cls) -> list[str]:
    raise NotImplementedError

  @classmethod
  def of_kind(cls, kind: Any) -> type:
    raise NotImplementedError


class FormatError(UserError):
  """A JSON config of another format than this code's (``FORMAT``)."""


def _plain(value: Any) -> Any:
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return to_dict(value)
  if isinstance(value, (list, tuple)):
    return type(value)(_plain(v) for v in value)
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  return value


def to_dict(cfg: Any) -> dict[str, Any]:
  """The fields of ``cfg`` as a dict, nested configs as dicts (a ``Tagged`` one with
  its ``"kind"`` first), ``"format"`` first for a class with ``JSON_FORMAT``."""
  out: dict[str, Any] = {}
  if getattr(type(cfg), "JSON_FORMAT", None) is not None:
    out["format"] = type(cfg).JSON_FORMAT
  if isinstance(cfg, Tagged):
    out["kind"] = cfg.kind
  for f in dataclasses.fields(cfg):
    out[f.name] = _plain(getattr(cfg, f.name))
  return out


def _family(hint: Any) -> type | None:
  """The ``Tagged`` family a field's type names, else None."""
  return hint if isinstance(hint, type) and issubclass(hint, Tagged) else None


def _dataclass_type(hint: Any) -> type | None:
  if dataclasses.is_dataclass(hint):
    return hint
  if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
    for arg in typing.get_args(hint):
      if dataclasses.is_dataclass(arg):
        return arg
  return None


def written_format(data: Mapping[str, Any]) -> Any:
  """The format a TrainConfig's JSON object was written in: its ``"format"``, else 1
  when it has format 1's layout (a ``"model"`` name, ``"lm"`` / ``"mlp"`` objects),
  else ``FORMAT`` (a hand-written config of today's layout)."""
  if "format" in data:
    return data["format"]
  old = isinstance(data.get("model"), str) or "lm" in data or "mlp" in data
  return 1 if old else FORMAT


def _check_format(data: Mapping[str, Any], cls: type, source: str) -> Mapping[str, Any]:
  """``data`` in ``cls.JSON_FORMAT`` (format 2 converted), or a one-line FormatError."""
  written = written_format(data)
  if written == cls.JSON_FORMAT:
    return data
  if written == 2 and cls.JSON_FORMAT == 3:
    return convert_format2(cls, data)
  if isinstance(written, int) and not isinstance(written, bool) and written < cls.JSON_FORMAT:
    raise FormatError(
        f"{source} written by rankjax before config format 2 (a \"model\" "
        "name beside \"lm\" / \"mlp\" objects): convert it with rankjax convert-config "
        "(its config.json or its run folder)")
  raise FormatError(f"{source} has config format {written!r}; this rankjax reads format "
                    f"{cls.JSON_FORMAT}: use the rankjax that wrote it")


def _tagged(name: str, family: type, value: Any) -> Any:
  if not isinstance(value, Mapping) or "kind" not in value:
    kind = value if isinstance(value, str) else "KIND"
    raise UserError(f"{name}={value!r} must be an object with a \"kind\" (one of "
                     f"{family.kinds()}) and that kind's fields; --set {name}.kind={kind} "
                     "switches kind")
  return from_dict(family.of_kind(value["kind"]), value)


def from_dict(cls: type[C], data: Mapping[str, Any], source: str = "config") -> C:
  """Builds ``cls`` from a (nested) dict; unknown keys raise ValueError. A dict of
  another ``JSON_FORMAT`` raises ``FormatError`` naming ``source`` (where it was read)."""
  if not isinstance(data, Mapping):
    raise UserError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
  if getattr(cls, "JSON_FORMAT", None) is not None:
    data = _check_format(data, cls, source)
    data = {k: v for k, v in data.items() if k != "format"}
  kind = ""
  if issubclass(cls, Tagged):         # a member read on its own: its tag, if any, is its own
    kind = f" (model kind {cls.kind_of_class()!r})"
    if data.get("kind", cls.kind_of_class()) != cls.kind_of_class():
      raise UserError(f"{cls.__name__} reads model kind {cls.kind_of_class()!r}, not "
                       f"{data['kind']!r}")
    data = {k: v for k, v in data.items() if k != "kind"}
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(data) - set(fields))
  moved = [k for k in unknown if k in getattr(cls, "MOVED", {})]
  if moved:
    raise UserError(f"{cls.__name__} field {moved[0]!r} is {cls.MOVED[moved[0]]!r} since "
                     f"config format {FORMAT}{kind} (rankjax convert-config converts a "
                     "file of format 2)")
  if unknown:
    raise UserError(f"unknown {cls.__name__} field(s) {unknown}{kind}; known fields: "
                     f"{sorted(fields)}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, value in data.items():
    family, sub = _family(hints[name]), _dataclass_type(hints[name])
    if family is not None:
      kwargs[name] = _tagged(name, family, value)
    else:
      kwargs[name] = from_dict(sub, value) if sub is not None else value
  return cls(**kwargs)


def to_json(cfg: Any, path: str | pathlib.Path | None = None) -> str:
  """The JSON text of ``cfg``; with ``path`` (local or an ``etils.epath`` URL) also
  written there."""
  text = json.dumps(to_dict(cfg), indent=2, sort_keys=True)
  if path is not None:
    from etils import epath
    epath.Path(path).write_text(text + "\n")
  return text


def _read_json(path_or_text: str | pathlib.Path) -> tuple[Any, str]:
  """(the parsed JSON, the name of its source) of a file path or a JSON string."""
  text, source = str(path_or_text), "config"
  if not text.lstrip().startswith("{"):
    from rankjax._src import storage
    path = storage.as_path(text, "config file")
    if not path.is_file():
      raise UserError(f"config file {path} " + ("is a folder, not a JSON file"
                                                 if path.is_dir() else "does not exist"))
    text, source = path.read_text(), f"config {path}"
  try:
    return json.loads(text), source
  except json.JSONDecodeError as e:
    raise UserError(f"{source} is not valid JSON: {e}") from None


def from_json(cls: type[C], path_or_text: str | pathlib.Path) -> C:
  """Loads ``cls`` from a JSON file path or a JSON string."""
  data, source = _read_json(path_or_text)
  return from_dict(cls, data, source)


def moved(cls: type, fields: Mapping[str, Any]) -> dict[str, Any]:
  """A config dict of ``cls`` written flat (config format 2) with the fields ``cls.MOVED``
  names (``{"rope_base": "rope.base", ...}``) put in their sub-configs' objects."""
  out = dict(fields)
  for old, new in getattr(cls, "MOVED", {}).items():
    if old in out:
      group, name = new.split(".")
      if not isinstance(out.get(group, {}), dict):
        raise UserError(f"{cls.__name__} {group}={out[group]!r} must be an object")
      out[group] = {**out.get(group, {}), name: out.pop(old)}
  return out


def convert_format2(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
  """A JSON object of ``cls`` (``TrainConfig``) of format 2 in format 3: every tagged
  config in it (the model) with its flat fields moved into its sub-configs (``moved``);
  a model of an unknown kind is left for ``from_dict`` to refuse."""
  hints = typing.get_type_hints(cls)
  out = {k: v for k, v in data.items() if k != "format"}
  for name, value in out.items():
    family = _family(hints[name]) if name in hints else None
    if family is not None and isinstance(value, Mapping) and value.get("kind") in family.kinds():
      out[name] = moved(family.of_kind(value["kind"]), value)
  return {"format": FORMAT, **out}


def convert_format1(data: Mapping[str, Any]) -> dict[str, Any]:
  """A TrainConfig's JSON object of format 1 in format 2: the ``"lm"`` or ``"mlp"``
  object the ``"model"`` name chose, tagged (``transformer`` / ``mlp``; the other
  dropped); an LM's ``"remat": true/false`` as ``"full"`` / ``"none"``."""
  rest = {k: v for k, v in data.items() if k not in ("model", "lm", "mlp", "format")}
  name = data.get("model", "lm")
  if name not in _FORMAT1_MODELS:
    raise UserError(f"model {name!r} is a plug-in's: its format 1 config cannot be "
                     f"converted; write its \"model\" object ({{\"kind\": {name!r}, ...}}) "
                     "by hand")
  model = {"kind": _FORMAT1_MODELS[name], **data.get(name, {})}
  if isinstance(model.get("remat"), bool):
    model["remat"] = "full" if model["remat"] else "none"
  return {"format": 2, "model": model, **rest}


def convert_file(path: str | pathlib.Path, cls: type) -> tuple[Any, Any]:
  """Rewrites the config file ``path`` (or a run folder's ``config.json``) of format 1
  or 2 in format ``FORMAT`` (``convert_format1``, then ``convert_format2``), after
  checking that ``cls`` reads the result; the original is kept beside it as
  ``<name>.format1`` / ``.format2``. Returns (the rewritten path, the backup's path).

  Raises:
    ValueError (one line): no such file, not JSON, not format 1 or 2, or the converted
      config is invalid (nothing written then).
  """
  from rankjax._src import storage
  path = storage.as_path(path, "config")
  if path.is_dir():
    path = path / "config.json"
  data, source = _read_json(path)
  if not isinstance(data, Mapping):
    raise UserError(f"{source} is not a JSON object")
  written = written_format(data)
  if written not in (1, 2):
    raise UserError(f"{source} has config format {written!r}, not 1 or 2: nothing to convert")
  new = convert_format2(cls, convert_format1(data) if written == 1 else data)
  try:
    from_dict(cls, new)
  except UserError as e:
    raise UserError(f"{source} converted is not a valid config ({e}); nothing written") from None
  backup = path.parent / (path.name + f".format{written}")
  if backup.exists():
    raise UserError(f"{backup} exists already: move it aside to convert {path} again")
  storage.write_text_atomic(backup, path.read_text())
  storage.write_text_atomic(path, json.dumps(new, indent=2, sort_keys=True) + "\n")
  return path, backup


def _json_or_text(raw: str) -> Any:
  try:
    return json.loads(raw)
  except json.JSONDecodeError:
    return raw


def _node_class(parent: type, name: str, node: Mapping[str, Any]) -> type | None:
  """The config class of the dict ``node``, the field ``name`` of a ``parent``."""
  hint = typing.get_type_hints(parent)[name]
  family = _family(hint)
  if family is not None:
    return family.of_kind(node.get("kind"))
  return _dataclass_type(hint)


def _known_keys(node: Mapping[str, Any], typed: str) -> str:
  """"; known keys: [...]" of a config dict, its nested configs and the closest to
  ``typed``."""
  nested = sorted(k for k, v in node.items() if isinstance(v, dict))
  close = difflib.get_close_matches(typed, list(node), n=1)
  return (f"; known keys: {sorted(node)}" + (f" (nested: {', '.join(nested)})" if nested else "")
          + (f"; did you mean {close[0]!r}?" if close else ""))


def override(cfg: C, assignments: Sequence[str], option: str = "--set") -> C:
  """Applies ``key=value`` strings (``--set``; ``option`` names the flag in errors);
  dotted keys reach nested configs (``model.d_model=1024``).

  Values are parsed as JSON when possible (``depth=48``, ``beta=0.5``,
  ``p_norm=null``, ``norm_gain=true``), otherwise taken as strings. A list field
  takes ``a,b`` (each item parsed the same way) or a JSON list (``["a", "b"]``).
  ``model.kind=KIND`` switches the model to that kind's defaults (later assignments
  then set its fields; the same kind changes nothing); a field the model's kind lacks
  is refused naming the kind and its fields. Assignments apply in order. ``cfg`` is
  valid, so a config the assignments make invalid is refused naming ``option`` (and
  both list syntaxes when a list field was set).
  """
  data = to_dict(cfg)
  lists = []
  for item in assignments:
    if "=" not in item:
      raise UserError(f"{option} expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    key = key.strip()
    value = _json_or_text(raw)
    node, cls, parts = data, type(cfg), key.split(".")
    for part in parts[:-1]:
      if not isinstance(node.get(part), dict):
        raise UserError(f"unknown config key {key!r} in {option}: {part!r} is "
                        + ("not a key" if part not in node else "not a nested config")
                        + _known_keys(node, part))
      node, cls = node[part], _node_class(cls, part, node[part])
    leaf = parts[-1]
    tagged = len(parts) > 1 and cls is not None and issubclass(cls, Tagged)
    if tagged and leaf == "kind":
      try:
        new = cls.of_kind(value)
      except UserError as e:
        raise UserError(f"{option} {key}: {e}") from None
      if new is not cls:
        node.clear()
        node.update(to_dict(new()))
      continue
    if leaf not in node:
      if cls is not None and leaf in getattr(cls, "MOVED", {}):
        raise UserError(f"{option} {key}: now {key[:-len(leaf)]}{cls.MOVED[leaf]} (since "
                         f"config format {FORMAT})")
      if tagged:
        raise UserError(f"{option} {key}: model kind {node['kind']!r} has no field {leaf!r}; "
                         f"its fields: {sorted(k for k in node if k != 'kind')}")
      raise UserError(f"unknown config key {key!r} in {option}" + _known_keys(node, leaf))
    if isinstance(node[leaf], (list, tuple)):
      lists.append(key)
      if not isinstance(value, list):
        value = [_json_or_text(v.strip()) for v in raw.split(",") if v.strip()]
    node[leaf] = value
  try:
    return from_dict(type(cfg), data)
  except UserError as e:
    syntax = (f" (a list is written {option} {lists[0]}=a,b or {option} "
              f"'{lists[0]}=[\"a\", \"b\"]')" if lists else "")
    raise UserError(f"{option}: {e}{syntax}") from None


def diff(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
  """Flat {dotted.key: (a_value, b_value)} of the fields where two configs differ (a
  nested config of another kind: its ``kind`` alone)."""
  out: dict[str, tuple[Any, Any]] = {}

  def walk(x, y, prefix):
    for k in sorted(set(x) | set(y)):
      xv, yv = x.get(k), y.get(k)
      if isinstance(xv, dict) and isinstance(yv, dict) and xv.get("kind") != yv.get("kind"):
        out[f"{prefix}{k}.kind"] = (xv["kind"], yv["kind"])   # other kinds: other fields
      elif isinstance(xv, dict) and isinstance(yv, dict):
        walk(xv, yv, f"{prefix}{k}.")
      elif xv != yv:
        out[f"{prefix}{k}"] = (xv, yv)

  walk(to_dict(a), to_dict(b), "")
  return out
