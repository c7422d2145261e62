"""Studies: a paper's claims, the experiments that measure them, and the verdicts.

The implementation (private); the public names are ``rankjax.studies``.

A study is a package (``experiments/<study>/`` for the three papers, or your own,
run with ``rankjax reproduce NAME --studies PATH``) whose ``reproduce.py`` defines
``STUDY = Study(...)``. Each experiment is a module of the package that declares its
``CLAIMS`` (``claims([Claim(...), ...])``, before anything runs) and ``SCALES``, and
defines ``run(out_dir, scale)``; the runner judges what it measured
(``evidence``: the 95% t-interval of the seeds' mean against the declared band),
writes the results files (``results``), summary.json / summary.md and EXPECTED.md's
tables (``expected``), and trains the ``rankjax train`` runs the experiments read
(``training``). Each claim names the paper item it tests and quotes it; the counts are
by paper item, from experiment rows only, and the study's register lists every item
of the paper (``items``); ``rejudge`` judges committed values again by the claims as
now declared. Modules: ``evidence``, ``items``, ``runner``, ``results``, ``expected``,
``rejudge``, ``training``, ``finder``.
"""
