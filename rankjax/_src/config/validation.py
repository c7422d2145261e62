"""The one validation helper of the configs: ``check(name, value, rule)``; and the
``Literal``-typed choices, read from the annotations (``literal_choices``).

Every refusal is a one-line ``ValueError`` naming the field, its value and what it must
be (for a choice, the allowed values).
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from typing import Any, Literal, Sequence

from rankjax._src.errors import UserError


def _number(v: Any) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


# rule -> (test of the value, what the value must be)
RULES: dict[str, tuple[Any, str]] = {
    "positive": (lambda v: _number(v) and v > 0, "a positive number"),
    "positive int": (lambda v: _integer(v) and v > 0, "a positive integer"),
    "non-negative": (lambda v: _number(v) and v >= 0, "a non-negative number"),
    "non-negative int": (lambda v: _integer(v) and v >= 0, "an integer >= 0"),
    "rate": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "fraction": (lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "int": (_integer, "an integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
}


def check(name: str, value: Any, rule: str, *, optional: bool = False, note: str = "") -> None:
  """Raises ``ValueError("NAME=VALUE must be ...")`` unless ``value`` obeys ``rule`` (a
  key of ``RULES``); ``optional``: None passes too (and is named in the message);
  ``note`` is appended in parentheses (what a special value means)."""
  test, what = RULES[rule]
  if (optional and value is None) or test(value):
    return
  what += " or null" if optional else ""
  raise UserError(f"{name}={value!r} must be {what}" + (f" ({note})" if note else ""))


def choice(name: str, value: Any, allowed: Sequence[Any]) -> None:
  """Raises a ``ValueError`` naming ``allowed`` unless ``value`` is one of them."""
  is_bool = isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed)
  if is_bool or value not in allowed:      # true is not the choice 1
    raise UserError(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")


def literal_choices(cfg: Any, prefix: str = "") -> None:
  """Checks every ``Literal``-typed field of the dataclass ``cfg`` (also ``X | None``);
  ``prefix`` precedes the field's name in the message (a sub-config's: ``"rope."``).

  The one place the typed string choices are validated: the allowed values are the
  ``Literal``'s arguments, so the annotation is the whole specification.
  """
  hints = typing.get_type_hints(type(cfg))
  for f in dataclasses.fields(cfg):
    hint, optional = hints[f.name], False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
      args = [a for a in typing.get_args(hint) if a is not type(None)]
      optional = len(args) < len(typing.get_args(hint))
      hint = args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is Literal:
      value = getattr(cfg, f.name)
      if not (optional and value is None):
        choice(prefix + f.name, value, typing.get_args(hint))
