"""``rankjax measure mlp [--config CFG.json] [--set key=value ...] --seeds S --out R.json``.

Measures a residual MLP at initialization with ``mlp_jacobian_study`` (Transforming
Rank: effective/stable rank of dh_l/dh_0, per-order path masses, stream RMS,
branch-to-skip ratios), writes the averaged results as JSON and a figure next to it
(``R.png``).
"""

from __future__ import annotations

import argparse
import json
import pathlib


def add_parser(subparsers) -> None:
  parser = subparsers.add_parser("measure", help="measure a model at initialization")
  sub = parser.add_subparsers(dest="target", metavar="TARGET")
  sub.required = True
  mlp = sub.add_parser("mlp", help="Jacobian spectra and path sums of a residual MLP",
                       description=__doc__.split("\n\n")[0])
  mlp.add_argument("--config", help="MLPConfig JSON file (default: the paper's defaults)")
  mlp.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override an MLPConfig field; repeatable")
  mlp.add_argument("--seeds", type=int, default=1, help="independent weight draws")
  mlp.add_argument("--inputs", type=int, default=1, help="random inputs per weight draw")
  mlp.add_argument("--seed", type=int, default=0, help="PRNG seed")
  mlp.add_argument("--no-paths", action="store_true", help="skip the path-sum DP")
  mlp.add_argument("--out", required=True, help="output JSON path (figure: same name .png)")
  mlp.set_defaults(func=run_mlp)


def run_mlp(args: argparse.Namespace) -> int:
  import jax

  from rankjax import config as config_lib
  from rankjax.config import MLPConfig
  from rankjax.measure.jacobians import mlp_jacobian_study
  from rankjax.report import plot_jacobian_study

  if args.seeds < 1 or args.inputs < 1:
    raise ValueError("--seeds and --inputs must be positive integers")
  cfg = config_lib.from_json(MLPConfig, args.config) if args.config else MLPConfig()
  cfg = config_lib.override(cfg, args.overrides)
  out = pathlib.Path(args.out)
  if out.suffix != ".json":
    raise ValueError(f"--out {out} must end in .json")
  out.parent.mkdir(parents=True, exist_ok=True)
  study = mlp_jacobian_study(cfg, jax.random.key(args.seed), num_inputs=args.inputs,
                             num_seeds=args.seeds, path_sums=not args.no_paths)
  result = {"config": config_lib.to_dict(cfg), "seed": args.seed, **study.to_dict()}
  out.write_text(json.dumps(result, indent=2))
  figure = plot_jacobian_study(result, out.with_suffix(".png"),
                               title=f"{cfg.norm_position}-norm, L={cfg.depth}, d={cfg.width}")
  print(f"erank/d at depth {cfg.depth}: {result['erank'][-1]:.4f}; "
        f"mean path order {result['mean_order']:.3f}")
  print(f"wrote {out} and {figure}")
  return 0
