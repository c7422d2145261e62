"""``rankjax train --config CONFIG.json [--set key=value ...] --workdir DIR``.

Running the same command again with the same workdir resumes from the newest
readable checkpoint (a workdir holding a run with another config is refused).
Exit codes (for requeue scripts: requeue on 75, never on 0):
  0   the run finished (reached total_steps), or was already complete;
  1   the loss became NaN/Inf (the last good checkpoint is kept), or a bug (its
      traceback is printed);
  2   bad input (one line on stderr; nothing written);
  3   checkpoints unreadable: none could be read (all corrupt, or their metadata
      damaged), or one could not be read for a reason that is not its integrity
      (one line; nothing was moved);
  75  stopped by SIGTERM (preemption, ``scancel``) or Ctrl-C after saving a checkpoint
      of the current step (one that comes before the first update has nothing to
      save): run the same command to resume (EX_TEMPFAIL);
  any other error after training started saves the newest finite step first.
"""

from __future__ import annotations

import argparse
import sys

from rankjax._src import plugins

EXIT_PREEMPTED = 75   # sysexits.h EX_TEMPFAIL: "try again later"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
  parser = subparsers.add_parser(
      "train", help="train an LM or MLP classifier (resumes an interrupted run)",
      description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="TrainConfig JSON file")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE",
                      help="override a config field; dotted keys reach nested configs "
                           "(model.num_layers=4; model.kind=mlp: that kind's defaults); "
                           "repeatable")
  plugins.add_argument(parser)
  parser.add_argument("--workdir", required=True,
                      help="run directory: config.json, metrics.jsonl, checkpoints/")
  parser.add_argument("--seeds", metavar="SEEDS",
                      help="train these seeds (0-7, 0,3,5) as one program, each a run of "
                           "its own in WORKDIR/seed_<s>")
  from rankjax._src.config import MLPConfig, TrainConfig, per_run_paths
  swept = [f for f in dict.fromkeys(per_run_paths(TrainConfig())
                                    + per_run_paths(TrainConfig(model=MLPConfig())))
           if f != "seed"]
  parser.add_argument("--sweep", action="append", default=[], metavar="FIELD=V1,V2",
                      help="also train these values of a per-run scalar "
                           f"({', '.join(swept)}; model.alpha: mlp only) in the same "
                           "program, each in WORKDIR/<field>_<value>[/seed_<s>]; "
                           "repeatable (every combination)")
  parser.set_defaults(func=run)
  convert = subparsers.add_parser(
      "convert-config", help="rewrite a config.json of config format 1 or 2 in format 3",
      description="Rewrites a TrainConfig JSON written by an older rankjax as config "
                  "format 3: format 1 (a \"model\" name beside \"lm\" / \"mlp\" objects) "
                  "and format 2 (the model's fields flat: rope_base, remat, ...; read "
                  "converted anyway) get one \"model\" object tagged with its kind, its "
                  "RoPE settings in \"rope\" and its kernel knobs in \"kernels\". The "
                  "original is kept beside it as config.json.format1 / .format2. A run's "
                  "checkpoints are not touched: one whose parameters are named otherwise "
                  "than today's model is refused on restore.")
  convert.add_argument("path", metavar="PATH", help="a run folder (its config.json) or a "
                                                    "config JSON file")
  convert.set_defaults(func=convert_config)
  return parser


def convert_config(args: argparse.Namespace) -> int:
  from rankjax._src import config as config_lib
  from rankjax._src.config import TrainConfig
  path, backup = config_lib.convert_file(args.path, TrainConfig)
  print(f"rankjax convert-config: {path} rewritten in config format {config_lib.FORMAT}; "
        f"the original is {backup}")
  return 0


def run(args: argparse.Namespace) -> int:
  """SIGTERM exits 75 from the first instant: until ``train`` takes the signal over
  (saving a step first) it stops the command here, with nothing to save
  (``rankjax._src.preemption``)."""
  from rankjax._src import preemption
  try:
    with preemption.outside_training():
      return _run(args)
  except preemption.Stopped as e:
    print(f"rankjax train: stopped ({e}) before training started; nothing to save: run the "
          f"same command to start (exit {EXIT_PREEMPTED})", file=sys.stderr)
    return EXIT_PREEMPTED


def _run(args: argparse.Namespace) -> int:
  from rankjax._src import distributed
  distributed.maybe_initialize_distributed()  # before any other JAX call

  from rankjax._src import config as config_lib
  from rankjax._src.config import TrainConfig
  from rankjax._src.train.hooks import RunStatus
  from rankjax._src.train.loop import NonFiniteLossError, train

  plugins.import_modules(args.imports)
  cfg = config_lib.override(TrainConfig.from_json(args.config), args.overrides)
  if args.seeds or args.sweep:
    return _run_many(cfg, args)
  try:
    result = train(cfg, args.workdir)
  except NonFiniteLossError as e:
    print(f"rankjax train: {e}", file=sys.stderr)
    return 1
  if result.status == RunStatus.PREEMPTED:
    saved = ("nothing new to save" if result.step == result.start_step
             else f"checkpoint saved in {args.workdir}")
    print(f"rankjax train: stopped (SIGTERM or Ctrl-C) at step {result.step}; {saved}; run "
          f"the same command to resume (exit {EXIT_PREEMPTED})", file=sys.stderr)
    return EXIT_PREEMPTED
  return 0


def _run_many(cfg, args: argparse.Namespace) -> int:
  """``--seeds`` / ``--sweep``: the runs as one program (``rankjax._src.train.runs``); exit 1
  when a run's loss became NaN/Inf (the others trained on), 75 when stopped."""
  from rankjax._src.train import runs
  from rankjax._src.train.hooks import RunStatus
  cfgs = runs.expand(cfg, args.workdir, runs.parse_seeds(args.seeds) if args.seeds else None,
                     runs.parse_sweep(args.sweep, cfg))
  results = runs.train_runs(cfgs)
  failed = {w: r.error for w, r in results.items() if r.status == RunStatus.FAILED}
  for workdir, error in failed.items():
    print(f"rankjax train: {workdir}: {error}", file=sys.stderr)
  if failed:
    return 1
  if any(r.status == RunStatus.PREEMPTED for r in results.values()):
    print(f"rankjax train: stopped (SIGTERM or Ctrl-C); the runs under {args.workdir} saved "
          f"their step; run the same command to resume (exit {EXIT_PREEMPTED})",
          file=sys.stderr)
    return EXIT_PREEMPTED
  return 0
