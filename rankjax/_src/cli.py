"""The ``rankjax`` command.

A thin entry point: each subcommand parses its arguments and calls the library.
Subcommands that belong to a part of the library are defined next to it, in a
module exposing ``add_parser(subparsers)``; the parser sets ``func`` to the function
that runs the command. A refusal is one line on stderr and a documented exit code:
2 bad input (``rankjax._src.errors.UserError``, and a path the OS refuses: missing, a file
for a folder, no permission), 3 a run's checkpoints cannot be read (all corrupt, their
metadata damaged, or unreadable now: ``RestoreError``); a command documents its others.
Any other exception is a bug: its traceback goes to stderr and to the log, exit 1.
What Orbax and TensorStore print meanwhile goes to a log file (``cli_quiet``), which
the line names when it holds errors.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from rankjax._src import cli_quiet
from rankjax._src.errors import UserError

# Modules that each add one or more subcommands: add_parser(subparsers).
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "rankjax._src.tour",
    "rankjax._src.train.cli",
    "rankjax._src.measure.cli",
    "rankjax._src.reproduce",
    "rankjax._src.report",
    "rankjax._src.analyze.cli",
    "rankjax._src.studies.expected",
    "rankjax._src.studies.rejudge",
)


def _version(_: argparse.Namespace) -> int:
  import jax
  from rankjax._src import __version__
  print(f"rankjax {__version__} (jax {jax.__version__}, backend {jax.default_backend()})")
  return 0


class OneLineParser(argparse.ArgumentParser):
  """argparse whose errors are one line, ``rankjax CMD: error: ...`` (exit 2), without
  the usage block; ``--help`` shows the usage. Subcommands inherit the class."""

  def error(self, message: str):
    self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
  parser = OneLineParser(
      prog="rankjax",
      description="Rank collapse in deep residual networks and Transformers: "
                  "models, measurements, training and reports (JAX/Flax).")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  sub.required = True
  version = sub.add_parser("version", help="print the rankjax and jax versions")
  version.set_defaults(func=_version)
  for name in SUBCOMMAND_MODULES:
    importlib.import_module(name).add_parser(sub)
  return parser


EXIT_BUG = 1
EXIT_BAD_INPUT = 2
EXIT_UNREADABLE = 3


def _unreadable(e: BaseException) -> bool:
  """Whether ``e`` is a ``RestoreError`` (its module is loaded once one was raised)."""
  ckpt = sys.modules.get("rankjax._src.train.checkpoint")
  return ckpt is not None and isinstance(e, ckpt.RestoreError)


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  with cli_quiet.quiet(args.command) as log:
    try:
      return int(args.func(args) or 0)
    except (UserError, FileNotFoundError, PermissionError, IsADirectoryError,
            NotADirectoryError) as e:      # bad input, or an output place refusing writes
      line, code = f"error: {e}", EXIT_BAD_INPUT
    except KeyboardInterrupt:
      line, code = "interrupted", 130
    except Exception as e:
      if _unreadable(e):
        line, code = str(e), EXIT_UNREADABLE
        log.abandoned = True
      else:                                # a bug: the whole traceback, here and logged
        trace = traceback.format_exc()
        print(trace, end="", file=sys.stderr)
        log.write(trace)
        line, code = f"internal error, a bug (not your input): {type(e).__name__}: {e}", EXIT_BUG
  if code == EXIT_BUG:
    line += f" (traceback above, also in {log.path})"
  elif log.errors:     # counted once the stragglers settled
    line += f" (library messages: {log.path})"
  print(f"rankjax {args.command}: {line}", file=sys.stderr)
  global _LATE_NOISE_TO
  if log.errors or log.abandoned:
    _LATE_NOISE_TO = log.path
  return code


_LATE_NOISE_TO: str | None = None   # where stderr goes after a failure's one line


def run() -> None:
  """The ``rankjax`` executable: :func:`main`, then the exit. After a failure whose
  reads were abandoned, the process's stderr (file descriptor 2) goes to the log file:
  TensorStore's threads and the interpreter's shutdown may still report them, after
  the one line was printed."""
  code = main()
  if _LATE_NOISE_TO is not None:
    sys.stderr.flush()
    fd = os.open(_LATE_NOISE_TO, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
  sys.exit(code)


if __name__ == "__main__":
  run()
