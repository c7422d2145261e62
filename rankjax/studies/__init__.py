"""Studies: a paper's claims, the experiments that measure them, and the verdicts.

The public face of ``rankjax.studies`` (the implementation, the runner, the results
files, EXPECTED.md's renderer and the judge, is ``rankjax._src.studies``).

A study is a package (``experiments/<study>/`` for the three papers, or your own, run
with ``rankjax reproduce NAME --studies PATH``) whose ``reproduce.py`` defines
``STUDY = Study(...)`` of ``Experiment``s. Each experiment is a module that declares
its ``CLAIMS`` (``claims([Claim(...), ...])``, before anything runs) and ``SCALES``, and
defines ``run(out_dir, scale)`` returning ``measured(...)`` rows; the runner judges
them (the 95% t-interval of the seeds' mean against the declared band) and writes the
results files, summary.json / summary.md and EXPECTED.md's tables.

- claims and their bands: ``Claim``, ``claims``, ``measured``, ``Abs``, ``Rel``,
  ``OneMinus``, ``Bound``, ``Qualitative``, ``Rule`` (the base of a rule), ``Draw`` (a
  one-draw row); ``PaperItem`` / ``register``: the paper's every item, quoted;
- the study: ``Study``, ``Experiment``, ``PAPER_SETTING``, ``NotPrepared``,
  ``run_study``; results: ``write_json`` (arrays and numpy scalars as JSON); figures:
  ``save_figure``;
- the runs an experiment trains: ``train_run`` (one ``rankjax train`` run in a study's
  folder), ``train_all`` (runs of one step shape as one program), ``workdir``,
  ``load_config`` (a shipped config with ``--set`` overrides), ``at_scale`` (a config as
  a study scale trains it: at ``tiny``, a paper config shrunk to a laptop run of
  ``TINY_STEPS`` updates), ``user_setting`` (a ``rankjax reproduce --set`` value),
  ``missing_directory`` (why a data folder is not usable, in one line).
"""
from rankjax._src.plotting import save_figure
from rankjax._src.studies.evidence import (
    Abs,
    Bound,
    Claim,
    Draw,
    OneMinus,
    Qualitative,
    Rel,
    Rule,
    claims,
    measured,
)
from rankjax._src.studies.items import PaperItem, register
from rankjax._src.studies.runner import (
    PAPER_SETTING,
    Experiment,
    NotPrepared,
    Study,
    run_study,
    write_json,
)
from rankjax._src.studies.training import (
    TINY_STEPS,
    at_scale,
    missing_directory,
    train_all,
    user_setting,
    workdir,
)
from rankjax._src.studies.training import load as load_config
from rankjax._src.studies.training import train as train_run

__all__ = [
    "PAPER_SETTING",
    "TINY_STEPS",
    "Abs",
    "Bound",
    "Claim",
    "Draw",
    "Experiment",
    "NotPrepared",
    "OneMinus",
    "PaperItem",
    "Qualitative",
    "Rel",
    "Rule",
    "Study",
    "at_scale",
    "claims",
    "load_config",
    "measured",
    "missing_directory",
    "register",
    "run_study",
    "save_figure",
    "train_all",
    "train_run",
    "user_setting",
    "workdir",
    "write_json",
]
