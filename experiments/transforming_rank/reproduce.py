"""Runs every Transforming Rank experiment and writes ``summary.md`` (paper vs ours).

  python -m experiments.transforming_rank.reproduce --scale quick --out runs/tr [--only fig3]

``STUDY`` is what ``rankjax reproduce transforming_rank`` runs (``experiments.runner``).
Quick scale keeps the paper's depths, ratios and sweeps with the width scaled down
(mostly d=256 -> 64) and fewer seeds; paper scale uses the paper's settings. The
trainability experiments (Fig 6, 13, 16, Table 5: ``fig6_trainability``) train on
CIFAR-10 when tfds has it prepared, else on the offline image set (Fashion-MNIST or
sklearn digits), and name the set used; quick scale trains width-16 networks on a
subset for 200 steps.
The GPT-2 measurements (Fig 12, Fig 8c: ``fig12_gpt2_ffn``) run here at GPT-2
initialization (quick: depths 12 / 24, width scaled down); pretrained weights:
``rankjax reproduce transforming_rank --only fig12 --checkpoint PATH`` (repeatable: GPT-2
Small and Medium; Hugging Face ``model.safetensors`` or its folder; nothing is
downloaded), judged against the paper's pretrained numbers.
Tiny scale (``--scale tiny``, every script's ``SCALES["tiny"]``) runs the paper scale's
code path with widths 8-32, two seeds, fewer sweep points and steps (Fig 6 on sklearn
digits, Fig 12 on GPT-2-shaped models of d=64 / 128) in a few CPU minutes; its rows are
measured, not judged (status ``tiny``).
"""
from __future__ import annotations

import importlib
from typing import Sequence

from experiments import runner
from experiments.transforming_rank import common

EXPERIMENTS = {
    "fig1": "fig1_skip_spacing",
    "fig2": "fig2_branch_scale",
    "fig3": "fig3_path_orders",
    "fig4": "fig4_placement",
    "fig5": "fig5_depth_law",
    "table3": "table3_projections",
    "fig7": "fig7_mean_spike",
    "table1": "table1_coherence",
    "table6": "table6_width",
    "fig15": "fig15_output_norm",
    "fig8": "fig8_width_expansion",
    "fig9": "fig9_marchenko_pastur",
    "fig12": "fig12_gpt2_ffn",
    "fig6": "fig6_trainability",
    "appc": "appc_backward",
    "appc_mean": "appc_mean_growth",
    "appa2": "appa2_skip_scale",
    "appa4": "appa4_training_symmetry",
    "appd3": "appd3_rank_equality",
}
# What each script also covers, for --only lookups.
ALIASES = {"fig10": "fig4", "fig11": "fig5", "table4": "fig5", "fig14": "fig7",
           "fig17": "fig9", "table2": "fig4", "fig8c": "fig12",
           "fig13": "fig6", "fig16": "fig6", "table5": "fig6"}


def _rows(result: dict) -> list[dict]:
  """A script's ``summary`` rows (each made by one of its declared ``CLAIMS``)."""
  return list(result.get("summary", []))


def claims(name: str) -> dict:
  """The claims experiment ``name`` declares at import (``experiments.evidence``)."""
  return importlib.import_module(f"experiments.transforming_rank.{EXPERIMENTS[name]}").CLAIMS


def _needs_cifar10(scale: str) -> str | None:
  """Paper scale trains on CIFAR-10 (never a fallback set): one line when tfds lacks it."""
  if scale != "paper":
    return None
  from rankjax.data import images
  return images.missing_image_set_line("cifar10", None)


# their numbers come out of training runs (--check: at the distribution level)
TRAINED = ("fig6", "appa4")

STUDY = runner.Study(
    name="transforming_rank",
    title="Transforming Rank: paper vs rankjax",
    experiments={name: runner.Experiment(module, _rows, scales=common.SCALE_NAMES,
                                         needs=_needs_cifar10 if name == "fig6" else None,
                                         claims=claims(name), trained=name in TRAINED,
                                         options=("checkpoints",) if name == "fig12" else ())
                 for name, module in EXPERIMENTS.items()},
    aliases=ALIASES,
    notes={"quick": "Quick scale: the paper's depths, ratios (m/d, beta*alpha^M, L) and sweeps "
                    "with width mostly 256 -> 64 and fewer seeds; width-dependent numbers (e.g. "
                    "a one-direction rank loss, 1/d) are expected to differ. See EXPECTED.md.",
           "tiny": "Tiny scale: the paper scale's code path at widths 8-32, two seeds and "
                   "fewer sweep points and steps (Fig 6 on sklearn digits); a row's quantity "
                   "may name the paper's depth (e.g. L=384) where the tiny run is shallower "
                   "(the settings are in each results file). Measured, not judged."})


def names() -> set[str]:
  """Every name ``run_all(only=...)`` accepts (experiments and aliases)."""
  return STUDY.names()


def resolve(only: str | Sequence[str] | None) -> list[str]:
  return STUDY.resolve(only)


def run_all(out_dir: str, scale: str = "quick", only: str | Sequence[str] | None = None) -> dict:
  """Runs the selected experiments into ``out_dir``; writes ``summary.json`` and
  ``summary.md`` (``experiments.runner.run_study``)."""
  return runner.run_study(STUDY, out_dir, scale, only)


if __name__ == "__main__":
  raise SystemExit(runner.main(STUDY))
