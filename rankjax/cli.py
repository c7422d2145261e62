"""The ``rankjax`` command.

A thin entry point: each subcommand parses its arguments and calls the library.
Subcommands that belong to a part of the library are defined next to it, in a
module exposing ``add_parser(subparsers)``; the parser sets ``func`` to the function
that runs the command. Bad input ends with one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that each add one or more subcommands: add_parser(subparsers).
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "rankjax.tour",
    "rankjax.train.cli",
    "rankjax.measure.cli",
    "rankjax.reproduce",
    "rankjax.report",
    "rankjax.analyze.cli",
)


def _version(_: argparse.Namespace) -> int:
  import jax
  from rankjax import __version__
  print(f"rankjax {__version__} (jax {jax.__version__}, backend {jax.default_backend()})")
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
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


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    return int(args.func(args) or 0)
  except (ValueError, FileNotFoundError) as e:
    print(f"rankjax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"rankjax {args.command}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
