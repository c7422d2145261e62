"""The one runner convention of every study under ``experiments/``.

A study is a folder ``experiments/<study>/`` whose ``reproduce.py`` defines ``STUDY``
(a :class:`Study`): its experiments by name, each an :class:`Experiment` naming the
module whose ``run(out_dir, scale) -> dict`` it calls and the function that turns that
result into rows. ``rankjax reproduce`` finds the folders itself; nothing lists them.

Every run writes, into the study's output folder,

- ``results/<scale>/<experiment>.json`` per experiment: its rows, settings, seeds,
  figure data and provenance (``experiments.results``);
- ``summary.json``: every row, one quantity each, fields :data:`FIELDS`, judged by the
  claim the experiment declared before it ran (``experiments.evidence``);
- ``summary.md``: the same rows rendered as a table (nothing parses it back; the HTML
  report of ``rankjax report`` is rendered from ``summary.json``).

An experiment that raises is one ``failed`` row and the others still run;
:func:`run_study` returns the failed names so the command exits non-zero. An
experiment with no path at the chosen scale is one ``missing`` row, announced before
anything runs; one whose data are not prepared stops the study before anything runs
(:class:`NotPrepared`, one line naming the data set and the command that prepares it).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import pathlib
import sys
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

from experiments import evidence, results as results_files, training

STATUSES = evidence.STATUSES
FIELDS = evidence.FIELDS


PAPER_SETTING = "paper"   # Experiment.setting's value for the paper's own setting


class NotPrepared(ValueError):
  """A data set the chosen scale needs is not prepared (raised before anything runs)."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment of a study.

  module: the study package's module whose ``run(out_dir, scale)`` runs it.
  rows: result dict -> list of :func:`row` dicts.
  folder: output sub-folder of the study folder ("" = the study folder itself).
  scales: the scales it has a path for; at another scale it is a ``missing`` row.
  needs: scale -> None, or one line naming an unprepared data set (and its command).
  claims: the claims its rows judge (``evidence.claims``), declared before it runs;
    a row whose item, paper or rule is not the declared claim's is an error.
  options: keyword arguments of its ``run`` that a command line may give (e.g.
    ``checkpoints``: ``rankjax reproduce --checkpoint``).
  setting: scale -> :data:`PAPER_SETTING` when that scale runs the paper's own setting
    (model, data, steps) for these claims, else one line saying how it differs (ours vs
    the paper's): its rows are then ``proxy`` rows (``evidence.as_proxy``), never a
    match. Every scale it runs but ``tiny`` must be declared.
  scale_free: items judged against the paper at any scale (mathematics that holds at
    every size; a measurement whose setting is the paper's at every scale).
  trained: its numbers come out of training (one optimizer step counts), which a
    change of rounding alone moves: ``--check`` judges a rerun at the distribution level
    (its seeds' interval overlaps the committed one), not number by number.
  recheck_rtol, recheck_atol: ``--check``'s relative and absolute tolerance for a
    deterministic number (``results.RECHECK_RTOL`` and 0 unless ``recheck_why`` says
    why not: e.g. rows that are rounding residuals, or contours interpolated between
    float32 ranks).
  runs: scale -> ``{name: TrainConfig}``, the ``rankjax train`` runs it reads at that
    scale (``experiments.training``; None or {} for none). The runner trains them in
    ``<folder>/runs/<name>`` before any experiment runs, in every process of a
    multi-host job (skipping finished runs, resuming half-done ones); ``run`` then finds
    them finished.
  """
  module: str
  rows: Callable[[dict[str, Any]], list[dict[str, Any]]]
  folder: str = ""
  scales: tuple[str, ...] = ("quick", "paper", "tiny")
  needs: Callable[[str], str | None] | None = None
  why_missing: str = "no path at this scale"
  claims: Mapping[str, evidence.Claim] = dataclasses.field(default_factory=dict)
  options: tuple[str, ...] = ()
  runs: Callable[[str], Mapping[str, Any]] | None = None
  setting: Mapping[str, str] = dataclasses.field(default_factory=dict)
  scale_free: frozenset[str] = frozenset()
  trained: bool = False
  recheck_rtol: float = results_files.RECHECK_RTOL
  recheck_atol: float = 0.0
  recheck_why: str = ""

  def __post_init__(self):
    unknown = set(self.scale_free) - set(self.claims)
    if unknown:
      raise ValueError(f"{self.module}: scale_free names no declared claim: {sorted(unknown)}")
    if (self.recheck_rtol != results_files.RECHECK_RTOL or self.recheck_atol) \
        and not self.recheck_why:
      raise ValueError(f"{self.module}: a recheck tolerance other than "
                       f"{results_files.RECHECK_RTOL:g} relative needs its reason "
                       "(recheck_why)")


@dataclasses.dataclass(frozen=True)
class Study:
  name: str
  title: str
  experiments: dict[str, Experiment]
  aliases: dict[str, str] = dataclasses.field(default_factory=dict)
  scales: tuple[str, ...] = ("quick", "paper", "tiny")
  notes: dict[str, str] = dataclasses.field(default_factory=dict)   # scale -> summary note
  package: str = ""   # where the modules are; "" = experiments.<name>

  def names(self) -> set[str]:
    """Every name ``only`` accepts (experiments and aliases)."""
    return set(self.experiments) | set(self.aliases)

  def resolve(self, only: str | Sequence[str] | None) -> list[str]:
    """Experiment names to run, in the study's order; ``only`` takes names, aliases
    and comma-separated lists in any case; a name run twice runs once."""
    if not only:
      return list(self.experiments)
    lower = {n.lower(): n for n in self.names()}
    wanted = []
    for part in ([only] if isinstance(only, str) else list(only)):
      for name in (p.strip() for p in part.split(",")):
        if not name:
          continue
        if name.lower() not in lower:
          raise ValueError(f"{self.name}: unknown experiment {name!r}; choose from "
                           f"{sorted(self.names())}")
        name = lower[name.lower()]
        name = self.aliases.get(name, name)
        if name not in wanted:
          wanted.append(name)
    return [n for n in self.experiments if n in wanted]


def _jsonable(x: Any) -> Any:
  if isinstance(x, float) and math.isnan(x):
    return None
  if isinstance(x, (str, int, float, bool)) or x is None:
    return x
  if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
    return _jsonable(x.item())
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  return str(x)


def setting_of(name: str, exp: Experiment, scale: str) -> str:
  """``exp.setting[scale]`` (one line naming the undeclared scale otherwise)."""
  if scale not in exp.setting:
    raise ValueError(f"{name}: Experiment.setting does not say whether --scale {scale} is "
                     "the paper's setting")
  return exp.setting[scale]


def _complete(name: str, r: dict[str, Any], scale: str, exp: Experiment) -> dict:
  """A row with every field of :data:`FIELDS` (the experiment's name and the scale
  added), checked against the claim the experiment declared; a ``proxy`` away from
  the paper's setting."""
  claim = exp.claims.get(r.get("item"))
  if claim is None or claim.paper != r.get("paper") or claim.rule.describe() != r.get("rule"):
    raise ValueError(f"{name}: row {r.get('item')!r} is not one of the declared claims "
                     "(item, paper and rule come from evidence.Claim.judge)")
  if scale != "tiny" and r["item"] not in exp.scale_free:
    setting = setting_of(name, exp, scale)
    if setting != PAPER_SETTING:
      r = evidence.as_proxy(r, setting)
  return _filled(name, r, scale)


def _filled(name: str, r: dict[str, Any], scale: str) -> dict:
  out = {k: r.get(k) for k in FIELDS}
  out["experiment"], out["scale"] = name, scale
  out["note"] = out.get("note") or ""
  if scale == "tiny" and out["status"] in (*evidence.JUDGED, "proxy", "qualitative"):
    out["status"] = "tiny"     # the code path of paper scale, at sizes no paper number fits
  if out["status"] not in STATUSES:
    raise ValueError(f"{name}: row {out['item']!r} has status {out['status']!r}")
  return {k: _jsonable(v) for k, v in out.items()}


def _runner_row(item: str, status: str, note: str) -> dict[str, Any]:
  """A ``missing`` or ``failed`` row (the runner's own, judged by no claim)."""
  return {"item": item, "quantity": None, "paper": None, "ours": None, "status": status,
          "rule": None, "note": note}


def training_runs(study: Study, names: Sequence[str], scale: str,
                  out_dir: str | pathlib.Path) -> dict[str, Any]:
  """``{workdir: TrainConfig}`` of every training run the experiments ``names`` read at
  ``scale`` (``Experiment.runs``), under ``out_dir``; a run two experiments share once."""
  out: dict[str, Any] = {}
  for n in names:
    exp = study.experiments[n]
    if exp.runs is None or scale not in exp.scales:
      continue
    folder = pathlib.Path(out_dir) / exp.folder if exp.folder else pathlib.Path(out_dir)
    for run_name, cfg in (exp.runs(scale) or {}).items():
      path = training.workdir(folder, run_name)
      if out.get(path, cfg) != cfg:
        raise ValueError(f"{study.name}: two experiments train {path} with different configs")
      out[path] = cfg
  return out


def preflight(study: Study, names: Sequence[str], scale: str,
              out_dir: str | pathlib.Path | None = None) -> list[str]:
  """Before anything runs: the experiments without a path at ``scale`` (returned, and
  announced); raises :class:`NotPrepared` when a data set is missing. With ``out_dir``
  also the training runs: their plan is printed (``training.plan_text``) and a run
  that cannot start (data, tokenizer, memory: ``training.refusals``) raises
  :class:`NotPrepared`."""
  if scale not in study.scales:
    raise ValueError(f"{study.name}: --scale {scale!r} is not known; choose one of "
                     f"{list(study.scales)}")
  missing = [n for n in names if scale not in study.experiments[n].scales]
  if missing:
    print(f"{study.name}: no {scale}-scale path for "
          + "; ".join(f"{n} ({study.experiments[n].why_missing})" for n in missing)
          + "; recorded as missing", flush=True)
  for n in names:
    if n not in missing and scale != "tiny":
      setting_of(n, study.experiments[n], scale)
  lacks = []
  for n in names:
    exp = study.experiments[n]
    line = exp.needs(scale) if exp.needs and n not in missing else None
    if line and line not in lacks:
      lacks.append(line)
  if out_dir is not None:
    runs = training_runs(study, [n for n in names if n not in missing], scale, out_dir)
    if runs:
      print(training.plan_text(training.plan(runs)), flush=True)
      lacks += [line for line in training.refusals(runs) if line not in lacks]
  if lacks:
    raise NotPrepared(f"{study.name} --scale {scale}: " + "; ".join(lacks))
  return missing


def check_options(study: Study, names: Sequence[str], options: Mapping[str, Any]) -> None:
  """Every option is taken by some experiment of ``names`` (else one line)."""
  for key in options:
    if not any(key in study.experiments[n].options for n in names):
      takers = [n for n, e in study.experiments.items() if key in e.options]
      raise ValueError(f"{study.name}: no requested experiment takes {key!r} "
                       f"(only {', '.join(takers) or 'none'})")


def run_study(study: Study, out_dir: str | pathlib.Path, scale: str = "quick",
              only: str | Sequence[str] | None = None, checked: bool = False,
              options: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """Runs the experiments into ``out_dir``, writes ``summary.json`` and ``summary.md``.
  ``checked``: the caller ran :func:`preflight` already (no second announcement).
  ``options``: keyword arguments for the experiments that take them
  (``Experiment.options``).

  The experiments' training runs (``Experiment.runs``) are trained first, in every
  process of a multi-host job; the experiments then run on process 0 only (the others
  return no rows, ``"analysed": False``).

  Returns ``{"results": {name: result or {"error": traceback}}, "rows": [...],
  "failed": [names], "seconds": {name: s}, "analysed": bool}``.
  """
  import jax
  names = study.resolve(only)
  options = dict(options or {})
  check_options(study, names, options)
  missing = (preflight(study, names, scale, out_dir) if not checked else
             [n for n in names if scale not in study.experiments[n].scales])
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  untrained = training.train_all(
      training_runs(study, [n for n in names if n not in missing], scale, out),
      cache_dir=out / "xla_cache")
  if jax.process_index() != 0:
    return {"results": {}, "rows": [], "failed": [], "seconds": {}, "analysed": False}
  package = study.package or f"{__package__ or 'experiments'}.{study.name}"
  results, rows, failed, seconds = {}, [], [], {}
  for name in names:
    exp = study.experiments[name]
    if name in missing:
      rows.append(_filled(name, _runner_row("(not run)", "missing", exp.why_missing), scale))
      continue
    start = time.time()
    try:
      bad = [e for p, e in untrained.items()
             if p in training_runs(study, [name], scale, out)]
      if bad:
        raise RuntimeError("; ".join(bad))
      module = importlib.import_module(f"{package}.{exp.module}")
      given = {k: v for k, v in options.items() if k in exp.options}
      result = module.run(str(out / exp.folder) if exp.folder else str(out), scale=scale,
                          **given)
      mine = [_complete(name, r, scale, exp) for r in exp.rows(result)]
      results_files.write_result(out, study.name, name, scale, result, mine,
                                 time.time() - start)
      rows.extend(mine)
      results[name] = result
    except Exception as e:  # noqa: BLE001 (recorded as a failed row; the others still run)
      results[name] = {"error": traceback.format_exc()}
      failed.append(name)
      rows.append(_filled(name, _runner_row(
          "FAILED", "failed", f"{type(e).__name__}: {e}".splitlines()[0][:300]), scale))
    seconds[name] = time.time() - start
    print(f"[{study.name}/{name}] {seconds[name]:.0f} s"
          + (" FAILED" if name in failed else ""), flush=True)
  (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
  (out / "summary.md").write_text(results_files.summary_markdown(study, rows, scale) + (
      "\nRun times (s): " + ", ".join(f"{n} {t:.0f}" for n, t in seconds.items()) + "\n"
      if seconds else ""))
  return {"results": results, "rows": rows, "failed": failed, "seconds": seconds,
          "analysed": True}


to_jsonable = results_files.to_jsonable   # the studies' JSON values


def write_json(out_dir: str | pathlib.Path, name: str, obj: Any) -> pathlib.Path:
  """``out_dir/name`` (``.json`` added when missing) holding ``to_jsonable(obj)``."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  path = out / (name if name.endswith(".json") else f"{name}.json")
  path.write_text(json.dumps(to_jsonable(obj), indent=1) + "\n")
  return path


def script_main(run: Callable[..., dict], doc: str, *, default_out: str,
                scales: Sequence[str] = ("quick", "paper"),
                show: Callable[[dict], Any] | None = None,
                options: dict[str, dict[str, Any]] | None = None,
                argv: Sequence[str] | None = None) -> None:
  """The command line of one experiment script (``python -m experiments.<study>.<name>``):
  ``--out``, ``--scale`` and the script's ``options`` (``{"--seed": {"type": int,
  "default": 0}}``, passed to ``run`` by name); prints the result's rows (or
  ``show(result)`` as JSON) and the wall time."""
  parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
  parser.add_argument("--out", default=default_out, help="output folder")
  parser.add_argument("--scale", default=scales[0], choices=list(scales))
  for flag, kw in (options or {}).items():
    parser.add_argument(flag, **kw)
  args = vars(parser.parse_args(argv))
  out, scale = args.pop("out"), args.pop("scale")
  start = time.time()
  result = run(out, scale, **args)
  if show is not None:
    print(json.dumps(to_jsonable(show(result)), indent=2))
  for r in result.get("summary", []) if isinstance(result.get("summary"), list) else []:
    if isinstance(r, dict) and "item" in r:
      print(f"{r['item']}: paper {r['paper']} | ours {r['ours']} {r.get('note') or ''}")
  print(f"done in {time.time() - start:.1f} s -> {out}")


def main(study: Study, argv: Sequence[str] | None = None) -> int:
  """The command line of a study's ``reproduce.py`` (``python -m
  experiments.<study>.reproduce``): ``--out``, ``--scale``, ``--only``; exits non-zero
  naming the failed experiments."""
  parser = argparse.ArgumentParser(description=study.title)
  parser.add_argument("--out", default=f"runs/{study.name}")
  parser.add_argument("--scale", default="quick", choices=list(study.scales))
  parser.add_argument("--only", default=None,
                      help="comma-separated names: " + ",".join(sorted(study.names())))
  args = parser.parse_args(argv)
  try:
    res = run_study(study, args.out, args.scale, args.only)
  except ValueError as e:
    print(f"{study.name}: error: {e}", file=sys.stderr)
    return 2
  print((pathlib.Path(args.out) / "summary.md").read_text())
  if res["failed"]:
    print(f"{study.name}: FAILED: {', '.join(res['failed'])}", file=sys.stderr)
    return 1
  return 0
