"""The committed quick-scale results are fresh at HEAD.

Each committed ``experiments/<study>/results/<scale>/<name>.json`` of every scale but
``paper`` (``quick``, and the quick model's other settings such as the softmax study's
``quick_paper_lr``) is rerun by
``rankjax reproduce STUDY --scale SCALE --check --only NAME`` in a process of its own (the
short ones of a study and scale a few to a process: ``SHARED_BELOW_S``), under the XLA
flags its provenance records (not the test suite's compile flags), and the test fails
naming every row whose status changed or whose number moved beyond the row's tolerance
(``rankjax._src.studies.results.compare``), or a rerun that read another data set.

Marked ``slow`` and ``committed``: CI runs them in its slow stage, before the other
slow tests (``.ci/run``; ``tests/conftest.py`` orders them first).
None is in the default suite: the fastest two (Post-Norm fig7, TR table3) were its two
slowest tests (20 s of test time) with the suite already at its 4-minute budget.
The scales in ``SCALES_NOT_IN_CI`` (and any experiment in ``NOT_IN_CI``) train for too
long for CI; ``rankjax reproduce STUDY --check`` reruns them (and everything else) by
hand. Those in ``WITH`` read another experiment's training runs and rerun in its
process (the Post-Norm trained experiments: one process, the runs trained once).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rankjax._src.studies import results
from rankjax._src import reproduce
from rankjax._src.data import images

PAPER = "paper"           # the one committed scale CI does not rerun (accelerator-sized)
# one rerun's limit: the Post-Norm trained group, the longest, took 1418 s on the 2-core
# Xeon VM beside the stage's other worker, and passed 1500 s (run 25 of its 28) in a
# later clean-clone CI run there; at 2100 s it timed out once more on a loaded machine
# (2026-12-06, another reproduce sharing the two cores: its fig6 took 889 s); the test's
# own limits, the same by hand as in CI: pytest-timeout's is the mark below (200 s more),
# faulthandler's watchdog sits 60 s above the mark (tests/watchdog.py; the ini's 1100 s
# would end the Post-Norm group), the stage's (.ci/run: timeout 4200) above both;
# issue 53 (seeds as one program) is the real fix
TIMEOUT_S = 2400
# (study, experiment) -> why CI does not rerun it (at any scale): none today
NOT_IN_CI: dict[tuple[str, str], str] = {}
# (study, scale) -> why CI reruns none of that scale's experiments
SCALES_NOT_IN_CI: dict[tuple[str, str], str] = {
    ("softmax_sensitivity", "quick_sharpen"): (
        "a second proxy setting of the quick model (every row a proxy): its six 800-update "
        "runs and their bounds are the committed stage's largest single cost after the "
        "Post-Norm group; `rankjax reproduce softmax_sensitivity --scale quick_sharpen "
        "--check` reruns it by hand"),
    ("postnorm_collapse", "quick_deep"): (
        "the collapse study's nine 150-update runs at 48 layers took 2111 s on the "
        "shared 2-core Xeon VM (EXPECTED.md, Quick-deep scale); `rankjax reproduce "
        "postnorm_collapse --scale quick_deep --only collapse --check` reruns it by hand"),
    ("softmax_sensitivity", "quick_seeds8"): (
        "the quick setting at 8 seeds (issue 53; every row a proxy): 16 training runs and "
        "their bounds, about 2.7x quick's CPU cost; `rankjax reproduce softmax_sensitivity "
        "--scale quick_seeds8 --check` reruns it by hand"),
    ("postnorm_collapse", "quick_seeds8"): (
        "quick's trained runs at seeds 0-7 (issue 53 item 4; every row a proxy): the "
        "collapse study's 24 150-update runs (1093 s to record) and, for fig3_fig5, fig6, "
        "fig10, fig12 and sec43, 42 more (the 60-update warmup, ablation and 1e-2 runs at "
        "seeds 0-7, the 120-update and window runs) and Fig 6's 16 in-process one-batch / "
        "one-sequence runs; with quick's runs reused, seeds 3-7 (25 runs, 5 post_collapse "
        "runs, 10 in-process) took 2460 s to record on the 2-core Xeon shared at load "
        "8-16; `rankjax reproduce postnorm_collapse --scale quick_seeds8 --only "
        "collapse,fig3_fig5,fig6,fig10,fig12,sec43 --check` reruns it by hand (thm38, "
        "propd2 and the init-time experiments have no path there)"),
    ("transforming_rank", "quick_seeds3"): (
        "fig6 at three networks per (cell, lr) (issue 53 item 4; every trained row a "
        "proxy): three times quick's fig6 grid, 861 s to record; `rankjax reproduce "
        "transforming_rank --scale quick_seeds3 --only fig6 --check` reruns it by hand"),
    ("softmax_sensitivity", "quick_deep"): (
        "the quick setting at 36 layers (issue 53; every row a proxy): six 36-layer runs, "
        "about 6x quick's training time on the CPU; `rankjax reproduce softmax_sensitivity "
        "--scale quick_deep --check` reruns it by hand")}
# experiments that read another's training runs rerun in its process (trained once): the
# Post-Norm trained experiments share the collapse study's runs, which train once in the
# "collapse" test (propd2 too: alone it trained post_collapse again, 94 s in CI)
WITH = {("softmax_sensitivity", "trained_bounds"): "prepost_training",
        **{("postnorm_collapse", n): "collapse"
           for n in ("fig3_fig5", "fig6", "fig10", "fig12", "sec43", "thm38", "propd2")}}


def scales(study: str) -> list[str]:
  """The committed scales of ``study`` that CI reruns (all but ``PAPER`` and
  ``SCALES_NOT_IN_CI``)."""
  return [sc for sc in committed_scales(study) if (study, sc) not in SCALES_NOT_IN_CI]


def committed_scales(study: str) -> list[str]:
  """Every committed scale of ``study`` but ``PAPER``."""
  root = results.committed_dir(study, "quick").parent
  return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != PAPER)


def committed() -> list[tuple[str, str, str]]:
  """Every committed result CI may rerun, as (study, scale, experiment)."""
  return [(s, sc, n) for s in reproduce.studies() for sc in scales(s)
          for n in results.load(results.committed_dir(s, sc))]


def names(study: str, scale: str, name: str) -> list[str]:
  """``name`` (several joined by ``+``: short reruns sharing a process, ``SHARED_BELOW_S``)
  and the experiments that rerun with each (``WITH``, those committed at ``scale``)."""
  there = results.load(results.committed_dir(study, scale))
  return [m for part in name.split("+")
          for m in [part] + [n for (s, n), host in WITH.items()
                             if s == study and host == part and n in there]]


def _recorded_seconds(study: str, scale: str, name: str) -> float:
  """The wall time the committed results of ``name`` and those rerun with it recorded."""
  docs = results.load(results.committed_dir(study, scale))
  return sum(float(docs[n]["provenance"].get("wall_s") or 0) for n in names(study, scale, name))


# longest first, so that the two workers end together instead of one waiting on a long
# rerun that started last: the groups that train shared runs (their recorded times leave
# the training out: the Post-Norm group, the longest, first), then by recorded time
BY_COST = sorted([(s, sc, n) for s, sc, n in committed()
                  if (s, n) not in NOT_IN_CI and (s, n) not in WITH],
                 key=lambda k: (-len(names(*k)), -_recorded_seconds(*k)))
# ... except the two shortest, which go right behind the longest: xdist (`--dist load`,
# .ci/run's `--maxschedchunk 1`) hands each worker its first two tests at once and keeps
# one queued behind the running test, so whatever follows the Post-Norm group waits the
# group's 19 minutes on its worker; the baseline of 2026-12-06 queued the softmax group
# and TR fig6 there (11.5 minutes alone at the stage's end while the other worker idled)
CHECKED = BY_COST[:1] + BY_COST[-2:] + BY_COST[1:-2]
# reruns that recorded less than SHARED_BELOW_S share a process, SHARED_SIZE at most, with
# those of their study and scale (each process's start-up, JAX's import and the study's
# own, cost a few seconds; reproduce runs any experiments together, as `--check` without
# --only does): the two queued behind the Post-Norm group stay alone
SHARED_BELOW_S, SHARED_SIZE = 50.0, 5


def _flags(study: str, scale: str, name: str) -> str:
  docs = results.load(results.committed_dir(study, scale))
  return docs[name]["provenance"].get("xla_flags") or ""


def _sharing(checked: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
  out, open_ = [], {}
  for i, (s, sc, n) in enumerate(checked):
    if i < 3 or _recorded_seconds(s, sc, n) >= SHARED_BELOW_S:
      out.append((s, sc, n))
      continue
    key = (s, sc, _flags(s, sc, n))     # one process: one set of XLA flags
    at = open_.get(key)
    if at is None or out[at][2].count("+") + 1 >= SHARED_SIZE:
      open_[key] = len(out)
      out.append((s, sc, n))
    else:
      out[at] = (s, sc, f"{out[at][2]}+{n}")
  return out


CHECKED = _sharing(CHECKED)


def reruns(checked: list[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
  """Every (study, scale, experiment) the entries of ``checked`` rerun, groups split."""
  return {(s, sc, part) for s, sc, n in checked for part in n.split("+")}


def test_every_exclusion_names_a_committed_result():
  """An exclusion outlives nothing: each names a committed result (no stale entries),
  and the check covers every other one, at every scale but paper."""
  every = set(committed())
  by_name = {(s, n) for s, _, n in every}
  assert set(NOT_IN_CI) <= by_name and set(WITH) <= by_name
  assert all(sc in committed_scales(s) for s, sc in SCALES_NOT_IN_CI)
  assert {key for key in every if (key[0], key[2]) in NOT_IN_CI or (key[0], key[2]) in WITH
          } | reruns(CHECKED) == every and len(reruns(CHECKED)) >= 20
  assert {(s, host) for (s, _), host in WITH.items()} <= {(s, n) for s, _, n in CHECKED}
  assert ("softmax_sensitivity", "quick_paper_lr", "prepost_training") in CHECKED
  assert names("softmax_sensitivity", "quick", "prepost_training") == [
      "prepost_training", "trained_bounds"]
  assert names("softmax_sensitivity", "quick_paper_lr", "prepost_training") == [
      "prepost_training"]
  assert not any(sc == "quick_deep" for s, sc, _ in CHECKED if s == "postnorm_collapse")
  # the longest rerun first, the two shortest queued behind it (xdist's batch of two)
  assert CHECKED[0] == ("postnorm_collapse", "quick", "collapse") == BY_COST[0]
  assert reruns(CHECKED) == set(BY_COST) and set(CHECKED[1:3]) == set(BY_COST[-2:])
  shared = [n.split("+") for _, _, n in CHECKED if "+" in n]
  assert shared and all(len(group) <= SHARED_SIZE for group in shared)
  assert all(_recorded_seconds(*k) <= min(_recorded_seconds(*j) for j in CHECKED[3:])
             for k in CHECKED[1:3])


def _environment(provenance: dict) -> dict:
  """This process's environment with the committed run's XLA flags (unset when none)."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  if provenance.get("xla_flags"):
    env["XLA_FLAGS"] = provenance["xla_flags"]
  return env


@pytest.mark.slow
@pytest.mark.committed
@pytest.mark.timeout(TIMEOUT_S + 200)
@pytest.mark.parametrize("study,scale,name", CHECKED,
                         ids=[f"{s}/{sc}/{n}" for s, sc, n in CHECKED])
def test_committed_quick_result_reproduces(study, scale, name, tmp_path):
  docs = results.load(results.committed_dir(study, scale))
  for n in names(study, scale, name):     # an image set this machine lacks: skip, naming it
    data = docs[n].get("data") if isinstance(docs[n].get("data"), dict) else {}
    if data.get("dataset") in images.IMAGE_SETS and (
        why := images.missing_image_set_line(data["dataset"], None)):
      pytest.skip(f"committed on {data['dataset']}: {why}")
  cmd = [sys.executable, "-m", "rankjax._src.cli", "reproduce", study, "--scale", scale,
         "--check", "--only", ",".join(names(study, scale, name)), "--out", str(tmp_path)]
  proc = subprocess.run(cmd, env=_environment(docs[name.split("+")[0]]["provenance"]), cwd=tmp_path,
                        capture_output=True, text=True, timeout=TIMEOUT_S)
  said = [line for line in proc.stderr.splitlines() if line.startswith("rankjax reproduce")]
  assert proc.returncode == 0, "\n".join(said or proc.stderr.splitlines()[-20:])
  assert f"check {study}: every committed number within its tolerance" in proc.stdout
