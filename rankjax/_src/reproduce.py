"""``rankjax reproduce STUDY --scale quick|paper``: runs a paper's experiments.

A study is a package folder whose ``reproduce.py`` defines ``STUDY``
(``rankjax._src.studies.Study``): the three papers' under the source checkout's
``experiments/``, a user's own through ``--studies PATH`` (``rankjax._src.studies.finder``);
the folders are found, not listed, so a new study is a new folder. Each run writes, under
``<out>/<study>/``, the experiments' figures and JSON, ``summary.json`` (rows
``rankjax._src.studies.evidence.FIELDS``: one quantity each, judged by the claim the experiment
declared before it ran), ``results/<scale>/<experiment>.json`` (rows, settings, seeds,
provenance) and ``summary.md`` rendered from them, then the self-contained HTML report of ``rankjax
report`` (``<out>/<study>/report/report.html``; for ``all`` also
``<out>/report/report.html``). The command exits 1 naming every failed experiment;
a data set the scale needs and lacks stops it before anything runs (exit 2).
``--record`` copies the results files into the checkout
(``<study folder>/results/<scale>/``) and renders the summary and EXPECTED.md there;
``--check`` compares the rerun with those committed numbers and exits 1 naming every
number that moved beyond its reproducibility tolerance, which is not the paper band
(``rankjax._src.studies.results.compare``: 1e-4 relative for a deterministic experiment unless
it says why; for a trained one, 1e-6 relative per seed where the versions, the XLA flags and
the CPU features equal the record's (``rankjax._src.provenance.same_bits``), elsewhere the
seeds' 95% intervals must overlap; it prints which rule it applied and why).
Training experiments are sets of ``rankjax train`` runs under the study's output folder
(``rankjax._src.studies.training``): before anything runs the command prints their plan (runs,
updates, tokens, checkpoint disk, peak memory, device-hours) and stops with one line
(exit 2) when a data set or tokenizer is missing or a run does not fit the devices;
rerunning it skips finished runs and resumes half-done ones. On a multi-host job (the
same command on every host: ``launch/``) every process trains, process 0 alone
analyses, records and builds the report. ``--scale tiny`` runs the paper-scale code
path at laptop sizes (rows ``tiny``, not judged against the paper). The command ends
with one ``verdicts <study>:`` line per study: its rows per status (match, mismatch,
...), the counts of summary.md.
A run stopped by SIGTERM (preemption, a time limit) saves and the command exits 75, as
``rankjax train`` (requeue and rerun: it resumes). ``--scale paper`` refuses to start without an accelerator (exit 2, after printing the
plan; ``--allow-cpu`` overrides); ``--plan`` prints the plan and every refusal (each with its fix) and exits 0;
``--plan --target KIND:N`` plans for hardware that is not here (``rankjax._src.train.plan.planning_for``);
``--set KEY=VALUE`` reaches every training run the studies build, whose batch split is
fitted to the job's devices (``rankjax._src.studies.training.at_scale``), and a requested experiment with no path at the chosen scale makes the
command exit 1 naming it (its row still says ``missing``): never a quiet exit 0. The
papers' studies ship with the source checkout (not with an installed wheel).
"""

from __future__ import annotations

import pathlib
import sys
from typing import Sequence

from rankjax._src.studies import finder
from rankjax._src.errors import UserError
from rankjax._src.studies import listing

def studies(extra: Sequence[str] = ()) -> tuple[str, ...]:
  """The studies found: the checkout's ``experiments/`` and every ``extra`` path."""
  return tuple(sorted(finder.find(extra)))


def study(name: str, extra: Sequence[str] = ()):
  """The ``STUDY`` of the study package ``name`` (``rankjax._src.studies.finder``)."""
  known = finder.find(extra)
  if name not in known:
    raise UserError(f"study {name!r} is not known; choose one of "
                     f"{sorted(known) + ['all']}" + ("" if extra else
                                                     " (a study of your own: --studies PATH)"))
  return finder.load(known[name])


def _split_all(only: list[str], extra: Sequence[str] = ()) -> dict[str, list[str]]:
  """For ``all``: each study gets the ``only`` names it knows; a name no study knows
  fails before anything runs."""
  wanted = [p.strip() for n in only for p in n.split(",") if p.strip()]
  known = {s: {k.lower(): k for k in study(s, extra).names()} for s in studies(extra)}
  unknown = [n for n in wanted if not any(n.lower() in k for k in known.values())]
  if unknown:
    raise UserError(f"--only {unknown}: no study has such an experiment; they are (wall "
                    "time of the committed results) " + " | ".join(
                        f"{s}: {listing.experiments_with_costs(study(s, extra))}"
                        for s in known))
  return {s: [known[s][n.lower()] for n in wanted if n.lower() in known[s]] for s in known}


def _run_one(the_study, out_dir, scale: str, only, record: bool, check: bool,
             options: dict | None = None) -> dict:
  from rankjax._src.report import build_report
  from rankjax._src.studies import expected, results, runner
  name = the_study.name
  out = pathlib.Path(out_dir) / name
  print(f"reproduce {name} ({scale} scale) -> {out}", flush=True)
  res = runner.run_study(the_study, out, scale, only, checked=True, options=options)
  if not res["analysed"]:     # a multi-host job's other processes: trained, nothing to read
    res["moved"] = []
    return res
  print(f"report: {build_report(out)}")
  ran = [n for n in the_study.resolve(only)
         if n not in res["failed"] and n in res["results"]]
  res["moved"] = []
  if check:
    committed = results.load(results.committed_dir(the_study, scale))
    absent = [n for n in ran if n not in committed]
    res["moved"] = [f"{name}/{n}: no committed results to check against" for n in absent]
    rerun = results.load(out / "results" / scale)
    differ = {n: why for n in ran if n in committed and n in rerun
              if (why := results.input_mismatch(n, rerun[n], committed[n]))}
    res["moved"] += [f"{name}/{why}" for why in differ.values()]
    for n in (n for n in ran if n in committed and n not in differ):
      exp = the_study.experiments[n]
      new = [r for r in res["rows"] if r["experiment"] == n]
      bits, rule = results.check_rule(exp.trained, committed[n], rerun.get(n, {}),
                                      exp.recheck_rtol)
      print(f"check {name}/{n}: {rule}", flush=True)
      res["moved"] += [f"{name}/{line}" for line in results.compare(
          new, committed[n]["rows"], exp.recheck_rtol, exp.trained, exp.recheck_atol,
          same_bits=bits)]
    print(f"check {name}: " + ("every committed number within its tolerance"
                               if not res["moved"] else f"{len(res['moved'])} moved"))
  if record and check and res["moved"]:
    print(f"not recorded {name}: --check found {len(res['moved'])} moved (the committed "
          "results stay; rerun with --record alone to replace them)")
  elif record:
    done = expected.record(the_study, out, scale, ran)
    print(f"recorded {name}: {', '.join(done) or 'nothing'} -> "
          f"{results.committed_dir(the_study, scale)}")
  return res


class NoAccelerator(UserError):
  """``--scale paper`` on a machine whose JAX backend is the CPU, without --allow-cpu."""


def check_accelerator(scale: str, allow_cpu: bool, backend: str | None = None) -> None:
  """Paper-scale runs are sized for GPUs / TPUs: on a CPU-only JAX they stop before
  anything runs unless ``allow_cpu``."""
  if scale != "paper" or allow_cpu:
    return
  if backend is None:
    import jax
    backend = jax.default_backend()
  if backend == "cpu":
    raise NoAccelerator("--scale paper: no accelerator found (the JAX backend is the CPU); "
                        "the paper-scale experiments are sized for GPUs/TPUs: add "
                        "--allow-cpu to run them on this CPU anyway")


def missing(results: dict) -> list[str]:
  """``study/experiment`` of every requested experiment with no path at the scale."""
  return [f"{s}/{r['experiment']}" for s, res in results.items() for r in res["rows"]
          if r["status"] == "missing"]


def run(name: str, out_dir: str | pathlib.Path, scale: str = "quick",
        only: list[str] | None = None, record: bool = False, check: bool = False,
        options: dict | None = None, extra: Sequence[str] = (),
        sets: Sequence[str] = (), plan_only: bool = False, target=None,
        listed: bool = False) -> dict:
  """Runs one study (or ``all``) into ``out_dir/<study>/`` and builds its report;
  ``extra``: ``--studies`` paths (``rankjax._src.studies.finder.find``); ``sets``: ``--set``
  assignments for every run the studies build (``training.user_sets``); ``plan_only``:
  print the plan, check every run (data, devices, memory) and return ``{}``; ``target``
  (``rankjax._src.train.mfu.Target``, with ``plan_only``): plan for that hardware instead of
  this job's devices (``rankjax._src.train.plan.planning_for``); ``listed``: the refusals printed in the
  plan, not raised.

  Returns ``{study: runner.run_study(...) result}``. With ``all``, ``only`` names run
  in every study that has them (``fig3`` is a figure of each paper), and studies with
  none of them are skipped; every study is checked (scale, names, data) before any runs.
  """
  from rankjax._src.studies import training
  from rankjax._src.train import plan as plan_lib
  if sets and (record or check):
    raise UserError("--set changes the runs: their numbers are not the committed results "
                     "(no --record or --check with it)")
  if target is not None and not plan_only:
    raise UserError("--target plans for hardware that is not here: add --plan")
  with training.user_sets(sets), plan_lib.planning_for(target):
    return _run(name, out_dir, scale, only, record, check, options, extra, plan_only,
                listed)


def _run(name, out_dir, scale, only, record, check, options, extra, plan_only,
         listed=False) -> dict:
  from rankjax._src.report import build_report
  from rankjax._src.studies import runner
  from rankjax._src import storage
  storage.check_output(out_dir, "--out")
  plan = (_split_all(only, extra) if only else {s: None for s in studies(extra)}) \
      if name == "all" else {name: only}
  plan = {s: names for s, names in plan.items() if names is None or names}
  if (record or check) and scale == "tiny":
    raise UserError("--scale tiny measures the code path at laptop sizes: its rows are not "
                     "evidence (no --record or --check with it)")
  if options and (record or check):
    raise UserError("--checkpoint measures your weights: its numbers are not the committed "
                     "results (no --record or --check with it)")
  loaded = {s: study(s, extra) for s in plan}
  if len(plan) == 1 and not jax_cache_configured():   # on before anything compiles: the
    from rankjax._src.train.loop import enable_compilation_cache   # plan's steps included
    enable_compilation_cache(str(pathlib.Path(out_dir) / next(iter(plan)) / "xla_cache"))
  for s, names in plan.items():   # every check before the first experiment runs
    runner.preflight(loaded[s], loaded[s].resolve(names), scale, pathlib.Path(out_dir) / s,
                     listed=listed)
    runner.check_options(loaded[s], loaded[s].resolve(names), options or {})
  from rankjax._src.studies import training
  if training.active_sets() and not training.sets_applied():
    raise UserError(f"--set {' '.join(training.active_sets())}: no training run the runner "
                     f"trains at --scale {scale} (the runs of --scale paper and tiny)")
  if plan_only:
    return {}
  results = {s: _run_one(loaded[s], out_dir, scale, names, record, check, options)
             for s, names in plan.items()}
  if name == "all" and all(r["analysed"] for r in results.values()):
    print(f"report: {build_report(out_dir)}")
  return results


def jax_cache_configured() -> bool:
  import jax
  return bool(jax.config.jax_compilation_cache_dir)


def verdicts(results: dict, out_dir: str | pathlib.Path) -> list[str]:
  """One line per analysed study: its rows per status, the counts of summary.md."""
  from rankjax._src.studies.results import counts_text
  return [f"verdicts {s}: " + counts_text(res["rows"])
          + f" ({pathlib.Path(out_dir) / s / 'summary.json'})"
          for s, res in results.items() if res["analysed"]]


def failed(results: dict) -> list[str]:
  """``study/experiment`` of every failed experiment in ``run``'s result."""
  return [f"{s}/{n}" for s, res in results.items() for n in res["failed"]]


# --scale tiny compiles many small programs: XLA's cheaper backend passes (the test
# suite's flags, tests/conftest.py; no change of semantics) cut its CPU time by ~30%
TINY_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def _command(args) -> int:
  import os
  if args.scale == "tiny" and "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = TINY_XLA_FLAGS       # read when the backend starts (below)
  from rankjax._src import distributed
  distributed.maybe_initialize_distributed()           # before any other JAX call (multi-host)
  for path in args.checkpoint:
    if not pathlib.Path(path).exists():
      raise FileNotFoundError(f"--checkpoint {path}: no such file or folder")
  options = {"checkpoints": tuple(args.checkpoint)} if args.checkpoint else None
  from rankjax._src.train.mfu import parse_target
  target = parse_target(args.target) if args.target else None
  if target is not None and not args.plan:
    raise UserError("--target plans for hardware that is not here: add --plan")
  plan = lambda listed=False: run(args.study, args.out, args.scale, args.only, args.record,
                                  args.check, options, args.studies, args.set,
                                  plan_only=True, target=target, listed=listed)
  try:      # the plan first, always: on a CPU without --allow-cpu it is printed, then refused
    check_accelerator(args.scale, args.allow_cpu or args.plan)
  except NoAccelerator as refusal:
    from rankjax._src.studies.runner import NotPrepared
    try:
      plan()
    except NotPrepared as e:                         # both refusals, in one line
      raise NoAccelerator(f"{refusal}; and {e}") from None
    raise                                            # ValueError: one line, exit 2 (cli)
  if args.plan:           # every refusal listed in the plan, with its fix: exit 0
    plan(listed=True)
    return 0
  from rankjax._src import preemption
  from rankjax._src.studies.training import Preempted as preempted
  try:
    with preemption.outside_training():              # SIGTERM between runs: nothing to save
      results = run(args.study, args.out, args.scale, args.only, args.record, args.check,
                    options, args.studies, args.set)
  except preempted as e:                             # every process stopped at the same run
    print(f"rankjax reproduce: {e}", file=sys.stderr)
    return 75
  except preemption.Stopped as e:
    print(f"rankjax reproduce: stopped ({e}) outside a training step; finished runs are "
          "kept: run the same command again to continue", file=sys.stderr)
    return 75
  finally:        # the other processes of a multi-host job wait for process 0's analysis
    distributed.wait_for_every_process("rankjax_reproduce_done")
  for line in verdicts(results, args.out):
    print(line)
  bad = failed(results)
  absent = missing(results)
  if absent:
    print(f"rankjax reproduce: NOT RUN at {args.scale} scale (no path): {', '.join(absent)}",
          file=sys.stderr)
  if bad:
    print(f"rankjax reproduce: FAILED: {', '.join(bad)} (tracebacks in the summary rows' "
          "notes and each study's summary.md)", file=sys.stderr)
  moved = [line for res in results.values() for line in res.get("moved", [])]
  for line in moved:
    print(f"rankjax reproduce --check: {line}", file=sys.stderr)
  return 1 if bad or moved or absent else 0


def add_parser(sub) -> None:
  p = sub.add_parser("reproduce", help="run a paper's experiments and write figures and "
                                       "a paper-vs-measured summary (summary.json, .md)")
  p.add_argument("study", help="a study's name (experiments/<study>/, or one under "
                                "--studies) or all")
  p.add_argument("--studies", action="append", default=[], metavar="PATH",
                 help="a study package of your own (a folder with __init__.py and "
                      "reproduce.py defining STUDY), or a folder of them; repeatable")
  p.add_argument("--scale", default="quick",
                 help="quick (default), paper, or tiny (the paper-scale code path at laptop sizes); "
                      "a study may name more (see its reproduce.py)")
  p.add_argument("--out", default="runs/reproduce", help="output directory")
  p.add_argument("--only", action="append", default=None, metavar="NAME",
                 help="run only this experiment (e.g. fig3); repeatable")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="override a setting of every training run the study builds (the "
                      "syntax of rankjax train --set, e.g. mesh_fsdp=8, "
                      "tokenizer=/path/tokenizer.model, data_dir=/data/tfds); repeatable")
  p.add_argument("--plan", action="store_true",
                 help="print the training plan and every refusal, then stop")
  p.add_argument("--target", metavar="KIND:N",
                 help="with --plan: plan for N devices of KIND (h100, h200, a100, v4, v5e, "
                      "v5p, v6e; e.g. h200:8, v5e:64) from any machine: memory per device "
                      "against KIND's, the batch split fitted to N, device-hours at KIND's "
                      "peak")
  p.add_argument("--allow-cpu", action="store_true",
                 help="run --scale paper on a machine without an accelerator")
  p.add_argument("--record", action="store_true",
                 help="copy the results into the checkout (experiments/<study>/results/"
                      "<scale>/) and render its summary and EXPECTED.md from them")
  p.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                 help="pretrained weights for the experiments that measure them (Transforming "
                      "Rank fig12 / fig8c: a GPT-2 model.safetensors or its folder); "
                      "repeatable; nothing is downloaded")
  p.add_argument("--check", action="store_true",
                 help="exit 1 when a number moved from the committed results beyond its "
                      "reproducibility tolerance (1e-4 relative; for trained experiments "
                      "1e-6 per seed where jax, XLA flags and CPU features are the record's, "
                      "else non-overlapping 95%% intervals; never the paper band)")
  p.set_defaults(func=_command)
