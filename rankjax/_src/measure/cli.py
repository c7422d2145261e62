"""``rankjax measure mlp [--config CFG.json] [--set key=value ...] [--sweep field=v1,v2 ...] --out R.json``.

Measures a residual MLP at initialization with ``mlp_jacobian_study`` (Transforming
Rank: effective/stable rank of dh_l/dh_0 (Eq. 3), per-order path masses (App A.1,
natural logs), stream RMS, branch-to-skip ratios (Eq. 4)) over several weight draws
and inputs, and writes the means with their spread (sd, sd of the seed means, min,
max; ``rankjax._src.measure.summary``) as JSON and a figure next to it (``R.png``).

``--sweep field=v1,v2,...`` (repeatable, any MLPConfig field) measures the cartesian
product: ``R.json`` holds every point, ``R.csv`` / ``R.md`` one table row per point,
``R.png`` one figure. An existing output is refused (one line, exit 2) unless
``--overwrite``. ``--set param_dtype=float64`` turns on JAX's x64 mode for the
run; every output records the dtype actually computed (``"dtype"``). The weights and
inputs are drawn at float32 and cast to param_dtype, so at one ``--seed`` every dtype
measures the same weights: ``--sweep param_dtype=float32,float64`` compares precision,
not two weight draws.

On a multi-host job (``jax.distributed``: the environment ``rankjax train`` reads,
``distributed.maybe_initialize_distributed``) every process runs the command: the seeds
are split between the processes (``StudyOptions.across_processes``) and process 0
alone writes the outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib

from rankjax._src import plugins
from rankjax._src.errors import UserError

DEFAULT_SEEDS = 4
DEFAULT_INPUTS = 4


def add_parser(subparsers) -> None:
  parser = subparsers.add_parser("measure", help="measure a model at initialization")
  sub = parser.add_subparsers(dest="target", metavar="TARGET")
  sub.required = True
  mlp = sub.add_parser("mlp", help="Jacobian spectra and path sums of a residual MLP",
                       description=__doc__.split("\n\n", 1)[1])
  mlp.add_argument("--config", help="MLPConfig JSON file (default: the paper's defaults)")
  mlp.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override an MLPConfig field; repeatable")
  mlp.add_argument("--sweep", dest="sweeps", action="append", default=[],
                   metavar="FIELD=V1,V2,...",
                   help="measure every value of an MLPConfig field (repeatable: the "
                        "cartesian product); writes a table (.csv, .md) and one figure. "
                        "Every point uses --seed; param_dtype points measure the same "
                        "weights (drawn at float32, then cast)")
  mlp.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help="independent weight draws (the spread's sample; default %(default)s)")
  mlp.add_argument("--inputs", type=int, default=DEFAULT_INPUTS,
                   help="random inputs h_0 ~ N(0, I) per weight draw (default %(default)s)")
  mlp.add_argument("--seed", type=int, default=0,
                   help="PRNG seed (default %(default)s); the weights and inputs are drawn "
                        "at float32 and cast to param_dtype, the same for every dtype")
  mlp.add_argument("--no-paths", action="store_true", help="skip the path-sum DP (it runs by default where the config allows it: skip_every 0 or 1)")
  plugins.add_argument(mlp)
  mlp.add_argument("--out", required=True, help="output JSON path (figure: same name .png)")
  mlp.add_argument("--overwrite", action="store_true",
                   help="replace the outputs of an earlier run at --out (without it an "
                        "existing output is refused)")
  mlp.set_defaults(func=run_mlp)


@contextlib.contextmanager
def x64_if(enabled: bool):
  """JAX's x64 mode for the block when ``enabled`` (float64 parameters), restored after."""
  import jax
  before = jax.config.jax_enable_x64
  if enabled:
    jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", before)


def measure_one(cfg, args) -> dict:
  """The JSON result of one config: means, spread, dtype computed, sample counts."""
  import jax
  import numpy as np

  from rankjax._src import config as config_lib
  from rankjax._src.measure import summary
  from rankjax._src.measure.jacobians import mlp_jacobian_study

  study, samples = mlp_jacobian_study(cfg, jax.random.key(args.seed), num_inputs=args.inputs,
                                      num_seeds=args.seeds,
                                      path_sums=False if args.no_paths else None,
                                      across_processes=True, return_samples=True)
  dtype = str(np.asarray(samples["erank"]).dtype)
  if dtype != cfg.param_dtype:
    raise ValueError(f"param_dtype={cfg.param_dtype} was requested but the study computed "
                     f"{dtype}")
  return {"config": config_lib.to_dict(cfg), "seed": args.seed, "dtype": dtype,
          "path_mass_unit": "ln", **study.to_dict(), "spread": summary.spread(samples)}


def _outputs(out: pathlib.Path, sweep: bool) -> list[pathlib.Path]:
  """What a run writes: the JSON and the figure, and a sweep's tables."""
  return [out.with_suffix(s) for s in (".json", ".png") + ((".csv", ".md") if sweep else ())]


def run_mlp(args: argparse.Namespace) -> int:
  from rankjax._src import config as config_lib
  from rankjax._src.config import MLPConfig
  from rankjax._src.measure import summary
  from rankjax._src import storage
  from rankjax._src import distributed

  distributed.maybe_initialize_distributed()  # before any other JAX call (multi-host)
  import jax
  if args.seeds < 1 or args.inputs < 1:
    raise UserError("--seeds and --inputs must be positive integers")
  plugins.import_modules(args.imports)
  base = config_lib.from_json(MLPConfig, args.config) if args.config else MLPConfig()
  base = config_lib.override(base, args.overrides)
  sweeps = summary.parse_sweeps(args.sweeps)
  configs = [config_lib.override(base, point, "--sweep")
             for point in summary.sweep_points(sweeps)]
  out = pathlib.Path(args.out)
  if out.suffix != ".json":
    raise UserError(f"--out {out} must end in .json")
  storage.check_output(args.out, "--out", file=True)
  storage.check_new_outputs(_outputs(out, bool(sweeps)), f"--out {args.out}", args.overwrite)
  writer = jax.process_index() == 0     # every process measures, process 0 writes
  points = [{k: getattr(cfg, k) for k, _ in sweeps} for cfg in configs]
  results = []
  for point, cfg in zip(points, configs):   # every config is checked before any runs
    with x64_if(cfg.param_dtype == "float64"):
      results.append(measure_one(cfg, args))
    if sweeps and writer:
      print(", ".join(f"{k}={v}" for k, v in point.items()) +
            f": erank/d at depth {cfg.depth} {results[-1]['erank'][-1]:.4f}")
  if not writer:
    return 0
  out.parent.mkdir(parents=True, exist_ok=True)
  if not sweeps:
    result = results[0]
    out.write_text(json.dumps(result, indent=2))
    figure = summary.plot_study(
        result, out.with_suffix(".png"),
        title=f"{base.norm_position}-norm, L={base.depth}, d={base.width}")
    sd = result["spread"]["erank"]["sd"][-1]
    print(f"erank/d at depth {base.depth}: {result['erank'][-1]:.4f} (sd {sd:.2g} over "
          f"{args.seeds} seeds x {args.inputs} inputs, {result['dtype']}); mean path order "
          f"{result['mean_order']:.3f}")
    print(f"wrote {out} and {figure}")
    return 0
  rows = [summary.sweep_row(p, r) for p, r in zip(points, results)]
  out.write_text(json.dumps({"sweep": [k for k, _ in sweeps], "rows": rows,
                             "points": results}, indent=2))
  tables = summary.write_table(rows, out)
  figure = summary.plot_sweep(points, results, out.with_suffix(".png"))
  print(f"wrote {out}, {', '.join(map(str, tables))} and {figure}")
  return 0
