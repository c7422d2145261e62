"""Studies: a paper's claims, the experiments that measure them, and the verdicts.

A study is a package (``experiments/<study>/`` for the three papers, or your own,
run with ``rankjax reproduce NAME --studies PATH``) whose ``reproduce.py`` defines
``STUDY = Study(...)``. Each experiment is a module of the package that declares its
``CLAIMS`` (``claims([Claim(...), ...])``, before anything runs) and ``SCALES``, and
defines ``run(out_dir, scale)``; the runner judges what it measured
(``evidence``: the 95% t-interval of the seeds' mean against the declared band),
writes the results files (``results``), summary.json / summary.md and EXPECTED.md's
tables (``expected``), and trains the ``rankjax train`` runs the experiments read
(``training``). Modules: ``evidence``, ``runner``, ``results``, ``expected``,
``training``, ``finder``.
"""
from rankjax.studies.evidence import (
    Abs,
    Bound,
    Claim,
    OneMinus,
    Qualitative,
    Rel,
    claims,
    measured,
)
from rankjax.studies.runner import (
    PAPER_SETTING,
    Experiment,
    NotPrepared,
    Study,
    run_study,
    to_jsonable,
    write_json,
)

__all__ = [
    "PAPER_SETTING",
    "Abs",
    "Bound",
    "Claim",
    "Experiment",
    "NotPrepared",
    "OneMinus",
    "Qualitative",
    "Rel",
    "Study",
    "claims",
    "measured",
    "run_study",
    "to_jsonable",
    "write_json",
    "evidence",
    "expected",
    "finder",
    "results",
    "runner",
    "training",
]
