"""``rankjax reproduce STUDY --scale quick|paper``: runs a paper's experiments.

Each study folder ``experiments/<study>/`` has ``reproduce.py`` with
``run_all(out_dir, scale, only=None) -> dict``, which writes figures, JSON and a
``summary.md`` (paper vs measured); this command then builds the same self-contained
HTML report as ``rankjax report`` (``<out>/<study>/report/report.html``: the tables
and every figure, embedded; for ``all`` also ``<out>/report/report.html``). The
experiments ship with the source checkout
(not with an installed wheel), so this command runs from a clone.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

STUDIES = ("postnorm_collapse", "softmax_sensitivity", "transforming_rank")


def experiments_root() -> pathlib.Path:
  root = pathlib.Path(__file__).resolve().parents[1] / "experiments"
  if not (root / "__init__.py").is_file():
    raise FileNotFoundError(
        f"no experiments/ folder next to the rankjax package ({root}); "
        "reproduce runs from a source checkout (git clone, pip install -e .)")
  return root


def _study_module(study: str):
  root = experiments_root()
  if str(root.parent) not in sys.path:
    sys.path.insert(0, str(root.parent))
  return importlib.import_module(f"experiments.{study}.reproduce")


def _split_all(only: list[str]) -> dict[str, list[str]]:
  """For ``all``: each study gets the ``only`` names it knows (``names()`` of its
  reproduce module); a name no study knows fails before anything runs."""
  wanted = [p.strip() for n in only for p in n.split(",") if p.strip()]
  known = {s: {k.lower(): k for k in _study_module(s).names()} for s in STUDIES}  # any case
  unknown = [n for n in wanted if not any(n.lower() in k for k in known.values())]
  if unknown:
    raise ValueError(f"--only {unknown}: no study has such an experiment; "
                     + "; ".join(f"{s}: {sorted(k.values())}" for s, k in known.items()))
  return {s: [known[s][n.lower()] for n in wanted if n.lower() in known[s]] for s in STUDIES}


def run(study: str, out_dir: str | pathlib.Path, scale: str = "quick",
        only: list[str] | None = None) -> dict:
  """Runs one study (or ``all``) into ``out_dir/<study>/`` and builds its report.

  With ``all``, ``only`` names run in every study that has them (``fig3`` is a figure
  of each paper), and studies with none of them are skipped.
  """
  from rankjax.report import build_report

  if study == "all":
    plan = _split_all(only) if only else {s: None for s in STUDIES}
    results = {s: run(s, out_dir, scale, names) for s, names in plan.items()
               if names is None or names}
    print(f"report: {build_report(out_dir)}")
    return results
  if study not in STUDIES:
    raise ValueError(f"study {study!r} is not known; choose one of {list(STUDIES) + ['all']}")
  if scale not in ("quick", "paper"):
    raise ValueError(f"--scale {scale!r} is not known; choose 'quick' or 'paper'")
  module = _study_module(study)
  out = pathlib.Path(out_dir) / study
  out.mkdir(parents=True, exist_ok=True)
  print(f"reproduce {study} ({scale} scale) -> {out}")
  results = module.run_all(str(out), scale=scale, only=only)
  print(f"report: {build_report(out)}")
  return results


def add_parser(sub) -> None:
  p = sub.add_parser("reproduce", help="run a paper's experiments and write figures and "
                                       "a paper-vs-measured summary")
  p.add_argument("study", choices=STUDIES + ("all",))
  p.add_argument("--scale", default="quick", choices=("quick", "paper"))
  p.add_argument("--out", default="runs/reproduce", help="output directory")
  p.add_argument("--only", action="append", default=None, metavar="NAME",
                 help="run only this experiment (e.g. fig3); repeatable")
  p.set_defaults(func=lambda a: run(a.study, a.out, a.scale, a.only) and 0)
