"""Runs every Transforming Rank experiment and writes ``summary.md`` (paper vs ours).

  python -m experiments.transforming_rank.reproduce --scale quick --out runs/tr [--only fig3]

``run_all(out_dir, scale, only)`` is what ``rankjax reproduce transforming_rank`` calls.
Quick scale keeps the paper's depths, ratios and sweeps with the width scaled down
(mostly d=256 -> 64) and fewer seeds; paper scale uses the paper's settings. The
trainability experiments (Fig 6, 13, 16, Table 5: ``fig6_trainability``) train on
CIFAR-10 when tfds has it prepared, else on the offline image set (Fashion-MNIST or
sklearn digits), and name the set used; quick scale trains width-16 networks on a
subset for 200 steps.
The GPT-2 measurements (Fig 12, Fig 8c: ``fig12_gpt2_ffn``) run here at GPT-2
initialization (quick: depths 12 / 24, width scaled down); pretrained weights need
``python -m experiments.transforming_rank.fig12_gpt2_ffn --checkpoint PATH``
(Hugging Face ``model.safetensors``; nothing is downloaded).
"""
from __future__ import annotations

import argparse
import importlib
import pathlib
import time
import traceback
from typing import Sequence

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
}
# What each script also covers, for --only lookups.
ALIASES = {"fig10": "fig4", "fig11": "fig5", "table4": "fig5", "fig14": "fig7",
           "fig17": "fig9", "table2": "fig4", "fig8c": "fig12",
           "fig13": "fig6", "fig16": "fig6", "table5": "fig6"}


def names() -> set[str]:
  """Every name ``run_all(only=...)`` accepts (experiments and aliases)."""
  return set(EXPERIMENTS) | set(ALIASES)


def resolve(only: str | Sequence[str] | None) -> list[str]:
  if only is None:
    return list(EXPERIMENTS)
  names = [only] if isinstance(only, str) else list(only)
  out = []
  for n in names:
    for part in n.split(","):
      part = ALIASES.get(part.strip().lower(), part.strip().lower())
      if part not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {part!r}; choose from "
                         f"{sorted(EXPERIMENTS) + sorted(ALIASES)}")
      if part not in out:
        out.append(part)
  return out


def _cell(x) -> str:
  return str(x).replace("|", "\\|").replace("\n", " ")


def run_all(out_dir: str, scale: str = "quick", only: str | Sequence[str] | None = None) -> dict:
  """Runs the selected experiments into ``out_dir`` and writes ``summary.md``.

  Returns ``{name: result dict or {"error": traceback}}``. A failing experiment is
  recorded in the summary and does not stop the others.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  results, times = {}, {}
  for name in resolve(only):
    module = importlib.import_module(f"experiments.transforming_rank.{EXPERIMENTS[name]}")
    start = time.time()
    try:
      results[name] = module.run(str(out), scale=scale)
    except Exception:   # keep going; the summary shows the failure
      results[name] = {"error": traceback.format_exc()}
    times[name] = time.time() - start
    print(f"[{name}] {times[name]:.0f} s", flush=True)

  lines = [f"# Transforming Rank: paper vs rankjax ({scale} scale)", ""]
  if scale == "quick":
    lines += ["Quick scale: the paper's depths, ratios (m/d, beta*alpha^M, L) and sweeps with "
              "width mostly 256 -> 64 and fewer seeds; width-dependent numbers (e.g. a "
              "one-direction rank loss, 1/d) are expected to differ. See EXPECTED.md.", ""]
  lines += ["| experiment | item | paper | ours | note |", "|---|---|---|---|---|"]
  for name, res in results.items():
    if "error" in res:
      last = res["error"].strip().splitlines()[-1]
      lines.append(f"| {name} | FAILED | | | {_cell(last)} |")
      continue
    for r in res.get("summary", []):
      lines.append(f"| {name} | {_cell(r['item'])} | {_cell(r['paper'])} | {_cell(r['ours'])} | "
                   f"{_cell(r.get('note', ''))} |")
  lines += ["", "Run times (s): " + ", ".join(f"{n} {t:.0f}" for n, t in times.items()), ""]
  (out / "summary.md").write_text("\n".join(lines))
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", default="runs/transforming_rank")
  parser.add_argument("--scale", default="quick", choices=["quick", "paper"])
  parser.add_argument("--only", default=None, help="comma-separated, e.g. fig3,table1")
  args = parser.parse_args()
  run_all(args.out, args.scale, args.only)
  print((pathlib.Path(args.out) / "summary.md").read_text())


if __name__ == "__main__":
  main()
