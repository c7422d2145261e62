"""The one form of a study, and the runner that judges it.

A study is a package whose ``reproduce.py`` defines ``STUDY`` (a :class:`Study`): its
experiments by name, each an :class:`Experiment` naming a module of the package. The
module declares, at import and so before anything runs,

- ``CLAIMS``: ``evidence.claims([Claim(...), ...])``, what its rows judge;
- ``SCALES``: ``{scale: settings}``, the scales it has a path for;

and defines ``run(out_dir, scale, **options) -> dict``: the figure data, its
``"settings"``, and ``"measured"``, a list of :func:`evidence.measured` values (one
number, or one per seed, for a declared claim's item). The runner judges each measured
value by its claim (``Claim.judge``) and writes the rows; an experiment never writes
a status. ``rankjax reproduce`` finds the study packages (``rankjax._src.studies.finder``).

Every run writes, into the study's output folder,

- ``results/<scale>/<experiment>.json`` per experiment: its rows, settings, seeds,
  figure data and provenance (``rankjax._src.studies.results``);
- ``summary.json``: every row, one quantity each, fields :data:`FIELDS`, judged by the
  claim the experiment declared before it ran (``rankjax._src.studies.evidence``);
- ``summary.md``: the same rows rendered as a table (nothing parses it back; the HTML
  report of ``rankjax report`` is rendered from ``summary.json``).

An experiment that raises is one ``failed`` row and the others still run;
:func:`run_study` returns the failed names so the command exits non-zero. An
experiment with no path at the chosen scale is one ``missing`` row, announced before
anything runs; one whose data are not prepared stops the study before anything runs
(:class:`NotPrepared`, one line naming the data set and the command that prepares it).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import pathlib
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

from rankjax._src.studies import evidence, results as results_files, training
from rankjax._src.train import plan as plan_lib
from rankjax._src.errors import UserError
from rankjax._src.studies import listing

STATUSES = evidence.STATUSES
FIELDS = evidence.FIELDS


PAPER_SETTING = "paper"   # Experiment.setting's value for the paper's own setting


class NotPrepared(UserError):
  """A data set the chosen scale needs is not prepared (raised before anything runs)."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment of a study.

  module: the study package's module (``CLAIMS``, ``SCALES``, ``run``; see above). At a
    scale its ``SCALES`` lacks it is a ``missing`` row (``why_missing``).
  folder: output sub-folder of the study folder ("" = the study folder itself).
  needs: scale -> None, or one line naming an unprepared data set (and its command).
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
  figures: the PNG files (under its output folder) that ``--record`` commits beside its
    results (``results/<scale>/figures/``), which EXPECTED.md shows.
  runs: scale -> ``{name: TrainConfig}``, the ``rankjax train`` runs it reads at that
    scale (``rankjax._src.studies.training``; None or {} for none). The runner trains them in
    ``<folder>/runs/<name>`` before any experiment runs, in every process of a
    multi-host job (skipping finished runs, resuming half-done ones); ``run`` then finds
    them finished.
  """
  module: str
  folder: str = ""
  needs: Callable[[str], str | None] | None = None
  why_missing: str = "no path at this scale"
  options: tuple[str, ...] = ()
  runs: Callable[[str], Mapping[str, Any]] | None = None
  setting: Mapping[str, str] = dataclasses.field(default_factory=dict)
  scale_free: frozenset[str] = frozenset()
  trained: bool = False
  recheck_rtol: float = results_files.RECHECK_RTOL
  recheck_atol: float = 0.0
  recheck_why: str = ""
  figures: tuple[str, ...] = ()

  def __post_init__(self):
    if (self.recheck_rtol != results_files.RECHECK_RTOL or self.recheck_atol) \
        and not self.recheck_why:
      raise ValueError(f"{self.module}: a recheck tolerance other than "
                       f"{results_files.RECHECK_RTOL:g} relative needs its reason "
                       "(recheck_why)")


@dataclasses.dataclass(frozen=True)
class Study:
  """A study: its experiments by name (``Experiment``), aliases for ``--only``, the
  scales it knows, summary notes per scale, the register of the paper's items (every
  figure, table and quantitative statement, ``rankjax._src.studies.items``); ``package`` and ``folder`` are set when
  ``rankjax._src.studies.finder.load`` imports it."""
  name: str
  title: str
  experiments: dict[str, Experiment]
  aliases: dict[str, str] = dataclasses.field(default_factory=dict)
  scales: tuple[str, ...] = ("quick", "paper", "tiny")
  notes: dict[str, str] = dataclasses.field(default_factory=dict)   # scale -> summary note
  register: tuple = ()   # every item of the paper (rankjax._src.studies.items.PaperItem)
  package: str = ""   # its import name (set by rankjax._src.studies.finder.load)
  folder: pathlib.Path | None = None   # its folder: results/, EXPECTED.md (finder.load)

  def module(self, name: str):
    """The module of experiment ``name`` (imported from the study's package)."""
    if not self.package:
      raise ValueError(f"study {self.name!r} has no package (load it with "
                       "rankjax._src.studies.finder.load)")
    module = importlib.import_module(f"{self.package}.{self.experiments[name].module}")
    for attr in ("CLAIMS", "SCALES", "run"):
      if not hasattr(module, attr):
        raise ValueError(f"{self.name}/{name}: module {module.__name__} defines no {attr} "
                         "(an experiment declares CLAIMS and SCALES and defines run)")
    return module

  def claims(self, name: str) -> Mapping[str, evidence.Claim]:
    """The claims experiment ``name`` declares (its module's ``CLAIMS``), checked
    against the study's ``scale_free`` items."""
    exp = self.experiments[name]
    claims = self.module(name).CLAIMS
    unknown = set(exp.scale_free) - set(claims)
    if unknown:
      raise ValueError(f"{self.name}/{name}: scale_free names no declared claim: "
                       f"{sorted(unknown)}")
    return claims

  def scales_of(self, name: str) -> tuple[str, ...]:
    """The scales experiment ``name`` has a path for (its module's ``SCALES``)."""
    return tuple(self.module(name).SCALES)

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
          raise UserError(f"{self.name}: unknown experiment {name!r}; choose from (wall "
                          "time of the committed results): "
                          + listing.experiments_with_costs(self))
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


def judged(name: str, claims: Mapping[str, evidence.Claim], result: dict[str, Any]
           ) -> list[dict[str, Any]]:
  """The rows of ``result["measured"]``, each judged by its declared claim."""
  rows = []
  for m in result.get("measured") or []:
    claim = claims.get(m.get("item"))
    if claim is None:
      raise ValueError(f"{name}: measured {m.get('item')!r} is not a declared claim")
    rows.append(claim.judge(m["values"], seeds=m.get("seeds"), note=m.get("note") or "",
                            untested=m.get("untested") or ""))
  return rows


def partial_setting(runs: Mapping[str, Any]) -> str | None:
  """The setting of an experiment whose runs (``{workdir: cfg}``) end early: "partial:
  ..." naming each that trains to ``stop_at`` or stopped itself on collapse
  (``stop_on_collapse``: its ``stopped.json``), or None when every run trained its
  whole schedule."""
  from rankjax._src.train.checkpoint import read_stopped
  short = {}
  for path, c in runs.items():
    stopped = read_stopped(path) if getattr(c, "stop_on_collapse", 0) else None
    if stopped:
      short[os.path.basename(path)] = (f"stopped itself at update {stopped['step']} of "
                                       f"{c.total_steps} (stop_on_collapse)")
    elif 0 < getattr(c, "stop_at", 0) < c.total_steps:
      short[os.path.basename(path)] = f"trained to update {c.stop_at} of {c.total_steps}"
  if not short:
    return None
  return "partial: " + ", ".join(f"{n} {why}" for n, why in sorted(short.items()))


def _complete(name: str, r: dict[str, Any], scale: str, exp: Experiment,
              partial: str | None = None) -> dict:
  """A judged row with every field of :data:`FIELDS` (the experiment's name and the
  scale added); a ``proxy`` away from the paper's setting, or when its runs are
  ``partial`` (:func:`partial_setting`), whatever the scale (at ``tiny``, never judged,
  the note names it)."""
  if scale != "tiny" and r["item"] not in exp.scale_free:
    setting = setting_of(name, exp, scale)
    if setting != PAPER_SETTING:
      r = evidence.as_proxy(r, setting)
  if partial:
    r = (evidence.as_proxy(r, partial) if scale != "tiny"
         else {**r, "note": "; ".join(filter(None, (partial, r.get("note"))))})
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
    if exp.runs is None or scale not in study.scales_of(n):
      continue
    folder = pathlib.Path(out_dir) / exp.folder if exp.folder else pathlib.Path(out_dir)
    for run_name, cfg in (exp.runs(scale) or {}).items():
      path = training.workdir(folder, run_name)
      if out.get(path, cfg) != cfg:
        raise ValueError(f"{study.name}: two experiments train {path} with different configs")
      out[path] = cfg
  return out


def preflight(study: Study, names: Sequence[str], scale: str,
              out_dir: str | pathlib.Path | None = None, listed: bool = False) -> list[str]:
  """Before anything runs: the experiments without a path at ``scale`` (returned, and
  announced); raises :class:`NotPrepared` when a data set is missing. With ``out_dir``
  also the training runs: their plan is printed (``rankjax._src.train.plan.plan_text``) and a run
  that cannot start (data, tokenizer, memory: ``rankjax._src.train.plan.refusals``) raises
  :class:`NotPrepared`. ``listed`` (``reproduce --plan``): the plan says when the scale
  trains nothing, and every refusal is printed under it, each with its fix, instead of
  raised."""
  if scale not in study.scales:
    raise UserError(f"{study.name}: --scale {scale!r} is not known; choose one of "
                     f"{list(study.scales)}")
  missing = [n for n in names if scale not in study.scales_of(n)]
  if missing:
    print(f"{study.name}: no {scale}-scale path for "
          + "; ".join(f"{n} ({study.experiments[n].why_missing})" for n in missing)
          + "; recorded as missing", flush=True)
  for n in names:
    study.claims(n)                       # declared, and scale_free names only them
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
      print(plan_lib.plan_text(plan_lib.plan(runs)), flush=True)
      lacks += [line for line in plan_lib.refusals(runs) if line not in lacks]
    elif listed:
      print(f"plan: {study.name} --scale {scale} has no rankjax train runs to plan"
            + ("; a refusal below may hide some (a study may list its runs only once "
               "their data are given)" if lacks else
               " (its experiments compute inside their own run, or train nothing)"),
            flush=True)
  if lacks and listed:
    print(f"  refusals ({len(lacks)}; each stops the command before anything trains):\n"
          + "\n".join(f"    - {line}" for line in lacks), flush=True)
  elif lacks:
    raise NotPrepared(f"{study.name} --scale {scale}: " + "; ".join(lacks))
  return missing


def check_options(study: Study, names: Sequence[str], options: Mapping[str, Any]) -> None:
  """Every option is taken by some experiment of ``names`` (else one line)."""
  for key in options:
    if not any(key in study.experiments[n].options for n in names):
      takers = [n for n, e in study.experiments.items() if key in e.options]
      raise UserError(f"{study.name}: no requested experiment takes {key!r} "
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
             [n for n in names if scale not in study.scales_of(n)])
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  every = [n for n in study.resolve(None) if scale in study.scales_of(n)]
  untrained = training.train_all(
      training_runs(study, [n for n in names if n not in missing], scale, out),
      cache_dir=out / "xla_cache", groups_of=training_runs(study, every, scale, out))
  if jax.process_index() != 0:
    return {"results": {}, "rows": [], "failed": [], "seconds": {}, "analysed": False}
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
      module = study.module(name)
      given = {k: v for k, v in options.items() if k in exp.options}
      result = module.run(str(out / exp.folder) if exp.folder else str(out), scale=scale,
                          **given)
      claims = study.claims(name)
      mine = [_complete(name, r, scale, exp, partial_setting(
          training_runs(study, [name], scale, out))) for r in judged(name, claims, result)]
      results_files.write_result(out, study.name, name, scale, result, mine,
                                 time.time() - start,
                                 claims_file=module.__file__)
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
