"""``rankjax tour``: the main job. Pre-Norm vs Post-Norm rank collapse, three lenses.

1. Trains a small Post-Norm and a small Pre-Norm decoder LM, identical but for the
   norm placement, on the offline Shakespeare corpus, at a learning rate where the
   Post-Norm model collapses and the Pre-Norm one trains (the collapse setting found
   by the Post-Norm collapse study, experiments/postnorm_collapse/EXPECTED.md). The
   diagnostics step records per-layer token similarity, alpha_k^l, sqrt(d)/||y||,
   c, per-layer gradient norms, the frequency loss and attention certificate / p_max
   / entropy percentiles into each run's Orbax checkpoints.
2. Measures residual MLPs at initialization for the pre / post / output / none
   placements: effective rank of dh_l/dh_0 and the path-order profile.
3. Prints a summary and builds the report (``rankjax report WORKDIR``).

Everything lives in WORKDIR (``lm_post/``, ``lm_pre/``, ``jacobians.json``,
``report/``, and ``tour_summary.json``: the numbers behind the summary's sentences with
their provenance, wall time that of the invocation that finished the tour). The
README's tour paragraph is rendered from a committed copy, ``docs/tour_summary.json``
(``render_readme``; ``rankjax expected`` rewrites it). Interrupt it (Ctrl-C or SIGTERM) and run the same command again: the
training runs resume from their checkpoints and give the same final numbers.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import time

from rankjax._src import preemption
from rankjax._src.tour_runs import PLACEMENTS, lm_configs, mlp_config  # noqa: F401
from rankjax._src.errors import UserError


def measure_jacobians(path: pathlib.Path, smoke: bool = False) -> dict:
  """Phase 2, written atomically to ``path`` (skipped when already there)."""
  if path.is_file():
    from rankjax._src import storage
    return storage.read_json(path)
  import jax
  from tqdm import tqdm

  from rankjax._src import config as config_lib
  from rankjax._src.measure.jacobians import mlp_jacobian_study

  seeds = 2 if smoke else 4
  studies, configs = {}, {}
  for position in tqdm(PLACEMENTS, desc="MLP Jacobians", file=sys.stdout,
                       disable=not sys.stdout.isatty()):   # no \r soup in log files
    cfg = mlp_config(position, smoke)
    studies[position] = mlp_jacobian_study(cfg, jax.random.key(0), num_seeds=seeds).to_dict()
    configs[position] = config_lib.to_dict(cfg)
  result = {"studies": studies, "configs": configs, "num_seeds": seeds}
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(result))
  tmp.replace(path)
  return result


def summary_lines(workdir: pathlib.Path, jac: dict) -> list[str]:
  """The report's opening paragraphs (``report_story``), one a line."""
  from rankjax._src import report_story
  from rankjax._src.train.run_reader import load_run

  runs = {name: load_run(workdir / name) for name in lm_configs()}
  return [f"  {s}" for s in report_story.workdir_paragraphs(runs, jac)]


SUMMARY = "tour_summary.json"   # WORKDIR/tour_summary.json; the README's is docs/
README_BLOCK = re.compile(r"(<!-- tour (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- end tour -->)", re.S)


def write_summary(workdir: pathlib.Path, jac: dict, smoke: bool, prov: dict) -> pathlib.Path:
  """``WORKDIR/tour_summary.json``: the numbers the tour's sentences are made of (each
  LM run's ``report_story.RunNumbers``, the MLP eranks) with their provenance ``prov``
  (``rankjax._src.provenance``, taken when the tour started: the code that computed them)."""
  from rankjax._src import report_story
  from rankjax._src.train.run_reader import load_run

  runs = {name: report_story.numbers_to_dict(report_story.numbers_of(name, load_run(workdir / name)))
          for name in lm_configs(smoke)}
  small = {"studies": {p: {"erank": s["erank"]} for p, s in jac["studies"].items()},
           "configs": {p: {k: c[k] for k in ("depth", "width", "norm_position")}
                       for p, c in jac["configs"].items()},
           "num_seeds": jac["num_seeds"]}
  doc = {"provenance": prov, "smoke": smoke, "seed": 0, "runs": runs,
         "jacobians": small}
  path = workdir / SUMMARY
  path.write_text(json.dumps(doc, indent=1) + "\n")
  return path


def summary_paragraphs(doc: dict) -> list[str]:
  """The tour's sentences from a ``tour_summary.json`` (the report's own sentences)."""
  from rankjax._src import report_story
  out = [report_story.smoke_sentence(lm_configs(smoke=True))] if doc["smoke"] else []
  out += [" ".join(report_story.run_sentences(report_story.numbers_from_dict(r)))
          for r in doc["runs"].values()]
  return out + [report_story.jacobian_sentence(doc["jacobians"])]


def render_readme(text: str, root: pathlib.Path) -> str:
  """``text`` (README.md) with each ``<!-- tour PATH -->`` block rendered from the
  committed summary at ``root / PATH``."""
  def block(m):
    path = root / m.group("path")
    if not path.is_file():
      return m.group(1) + f"(no {m.group('path')} yet)\n" + m.group(4)
    doc = json.loads(path.read_text())
    p = doc["provenance"]
    lines = [f"> {s}" for s in summary_paragraphs(doc)]
    lines = [x for line in lines for x in (line, ">")][:-1]
    lines += ["", f"Rendered from `{m.group('path')}` (`rankjax tour`, seed {doc['seed']}): "
              f"commit {(p.get('commit') or '?')[:10]}{' (dirty)' if p.get('dirty') else ''}, "
              f"{p.get('device_kind')} ({p.get('cpu')}), jax {p.get('jax')}, "
              f"{p.get('wall_s')} s, {p.get('date')}."]
    return m.group(1) + "\n".join(lines) + "\n" + m.group(4)
  return README_BLOCK.sub(block, text)


def check_tour_workdir(workdir: pathlib.Path) -> None:
  """A tour's folder holds the tour's runs only: one holding a ``rankjax train`` run
  (its ``config.json`` or ``checkpoints/``) is refused before anything runs."""
  for marker in ("config.json", "checkpoints"):
    if (workdir / marker).exists():
      raise UserError(f"--workdir {workdir} holds a rankjax train run ({marker}); the tour "
                       "writes its own runs into a folder of their own: choose another")


def run(workdir: str | pathlib.Path, smoke: bool = False) -> int:
  """Runs (or continues) the tour in ``workdir``; 0 when done, 130 when interrupted."""
  from rankjax._src.report import build_report
  from rankjax._src import storage
  from rankjax._src.train.hooks import RunStatus
  from rankjax._src.train.loop import train

  workdir = pathlib.Path(storage.check_output(workdir, "--workdir"))
  check_tour_workdir(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  from rankjax._src.provenance import provenance
  start, prov = time.time(), provenance()
  with preemption.outside_training():   # SIGTERM between runs: as Ctrl-C
    for name, cfg in lm_configs(smoke).items():
      print(f"== training {name} ({cfg.model.norm_position}-norm, {cfg.total_steps} updates, "
            f"lr {cfg.learning_rate:g})", flush=True)
      result = train(cfg, workdir / name)
      if result.status == RunStatus.PREEMPTED:
        print(f"rankjax tour: stopped at update {result.step} of {name}, checkpoint saved; "
              "run the same command again to continue", file=sys.stderr)
        return 130
    print("== residual MLP Jacobians at initialization", flush=True)
    jac = measure_jacobians(workdir / "jacobians.json", smoke)
  summary = write_summary(workdir, jac, smoke,
                          dict(prov, wall_s=round(time.time() - start, 1)))
  page = build_report(workdir)
  print("\n".join(["summary:"] + summary_lines(workdir, jac)))
  print(f"numbers: {summary}")
  print(f"report: {page}")
  return 0


def add_parser(sub) -> None:
  p = sub.add_parser("tour", help="the main job: Pre- vs Post-Norm collapse on real text, "
                                  "MLP Jacobian ranks, and an HTML report (~3 min on an idle 2-core CPU)")
  p.add_argument("--workdir", default="runs/tour", help="output directory (default runs/tour)")
  p.add_argument("--smoke", action="store_true",
                 help="a reduced version (65 s of CPU time: 1-3 minutes)")
  p.set_defaults(func=lambda a: run(a.workdir, a.smoke))
