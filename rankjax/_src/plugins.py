"""``--import MODULE``: the user's own diagnostics, tasks and models, without editing
the library.

``rankjax train --import my_pieces`` (and ``rankjax measure mlp --import ...``,
``rankjax report --import ...`` for a run of such a model) imports ``my_pieces``
before the config is read; the module registers what it adds with the
library's ``register`` calls (``rankjax._src.train.diagnostics.register``,
``rankjax._src.train.tasks.register_task``). MODULE is a module name found on the import path
(``PYTHONPATH``, an installed package) or a path to a ``.py`` file. Example:
``examples/plugins/my_diagnostic.py`` (tested by ``tests/test_plugins.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
from typing import Sequence

from rankjax._src.errors import UserError


def add_argument(parser) -> None:
  """The ``--import MODULE`` option (``args.imports``) of every command that takes it."""
  parser.add_argument("--import", dest="imports", action="append", default=[],
                      metavar="MODULE",
                      help="import a module (name or .py path) before reading any config: "
                           "it may register diagnostics, tasks and models "
                           "(rankjax._src.plugins); repeatable")


def import_module(name: str):
  """Imports ``name`` (a dotted module name or a ``.py`` path); one-line ValueError."""
  if name.endswith(".py"):
    path = pathlib.Path(name).expanduser()
    if not path.is_file():
      raise UserError(f"--import {name}: no such file")
    module_name = path.stem
    if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(
        path.resolve()):
      return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module      # dataclasses and pickling look modules up here
    try:
      spec.loader.exec_module(module)
    except Exception as e:
      del sys.modules[module_name]
      raise _failed(name, e) from e
    return module
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name and name.startswith(e.name):
      raise UserError(f"--import {name}: no module named {e.name!r} on the import path "
                       "(add its folder to PYTHONPATH, or pass the .py file's path)") from None
    raise _failed(name, e) from e
  except Exception as e:
    raise _failed(name, e) from e


def _failed(name: str, e: Exception) -> UserError:
  """The one line for a module that raised while ``--import`` ran it (where it raised)."""
  where = ""
  if isinstance(e, SyntaxError):
    where = f" ({e.filename}, line {e.lineno})"
  else:
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
      tb = tb.tb_next
    if tb is not None:
      where = f" ({tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno})"
  return UserError(f"--import {name}: the module raised {type(e).__name__}: "
                   f"{str(e).splitlines()[0] if str(e) else ''}{where}")


def import_modules(names: Sequence[str]) -> None:
  for name in names:
    import_module(name)
