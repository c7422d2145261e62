"""Runs every experiment of the softmax-sensitivity paper and writes ``summary.md``.

Scripts (each ``run(out_dir, scale) -> dict``, output in ``out_dir/<name>/``):
  theorem_check         Theorem 3.2 at L in {8, 16}, greedy certificate (App D.2)
  certificates_large_L  certificates at L up to 1024 (Fig 2)
  prepost_training      Pre-LN vs Post-LN early training (Fig 1, Table 1, Fig 3, Fig 4)

Run:  python experiments/softmax_sensitivity/reproduce.py --out runs/softmax --scale quick
      [--only theorem_check,prepost_training]
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any, Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ("theorem_check", "certificates_large_L", "prepost_training")


def names() -> set[str]:
  """Every name ``run_all(only=...)`` accepts (experiments and aliases)."""
  return set(SCRIPTS)


def _module(name: str):
  if HERE not in sys.path:
    sys.path.insert(0, HERE)
  return importlib.import_module(name)


def _pm(ms: Sequence[float], digits: int = 3) -> str:
  return f"{ms[0]:.{digits}f} +- {ms[1]:.{digits}f}"


def _theorem_rows(r: dict[str, Any]) -> list[str]:
  out = []
  for L, paper in (("8", "17.8%"), ("16", "2.6%")):
    t = r["per_length"][L]["tau=1"]
    out.append(f"| Thm 3.2 max relative error, L = {L} | < 1e-13 | {t['max_rel_error']:.1e} |")
    out.append(f"| greedy certificate = exact, L = {L} | {paper} | "
               f"{100 * t['greedy_prefix']['match_fraction']:.1f}% |")
  gaps = [r["per_length"][L]["tau=1"]["greedy_prefix"]["worst_gap"] for L in ("8", "16")]
  out.append(f"| worst gap theta - greedy certificate | ~0.11 | {max(gaps):.3f} |")
  return out


def _certificate_rows(r: dict[str, Any]) -> list[str]:
  rows = r["per_scale"]["1"]
  out = []
  for L in ("32", "1024"):
    g = rows[L]["greedy_prefix"]
    out.append(f"| Fig 2 greedy certificate, L = {L}, median / worst | near 1 (figure) | "
               f"{g['median']:.6f} / {g['min']:.6f} |")
  return out


def _prepost_rows(r: dict[str, Any]) -> list[str]:
  t, f3, paper = r["table1"], r["fig3"], r["paper"]
  out = []
  for arch in ("pre", "post"):
    name = f"{arch.capitalize()}-LN"
    per_seed = ", ".join(f"{x:.3f}" for x in t[arch]["final_loss_per_seed"])
    out.append(f"| Table 1 {name} loss, final 50 updates | {paper['final_loss'][arch]} | "
               f"{_pm(t[arch]['final_loss'])} ({per_seed}) |")
    out.append(f"| Table 1 {name} spike updates | {paper['spikes'][arch]} | "
               f"{_pm(t[arch]['spikes'], 1)} |")
    out.append(f"| Table 1 {name} last-checkpoint theta_cert (greedy) | "
               f"{paper['last_theta_cert'][arch]:.5f} | {t[arch]['last_theta_cert']:.5f} "
               f"(balance: {t[arch]['last_theta_balance']:.5f}) |")
    out.append(f"| {name} largest pre-clip gradient norm | {paper['max_grad_norm'][arch]:g} | "
               f"{t[arch]['max_grad_norm']:.2f} |")
  p = f3["pre"]
  out.append(f"| Fig 3 Pre-LN normalized entropy, first -> last | "
             f"{paper['entropy_first_last'][0]} -> {paper['entropy_first_last'][1]} | "
             f"{p['entropy_first_last'][0]:.3f} -> {p['entropy_first_last'][1]:.3f} |")
  out.append(f"| Fig 3 Pre-LN mean p_max, first -> last | "
             f"{paper['p_max_first_last'][0]} -> {paper['p_max_first_last'][1]} | "
             f"{p['p_max_first_last'][0]:.3f} -> {p['p_max_first_last'][1]:.3f} |")
  out.append(f"| Fig 3 Pre-LN lowest per-layer median certificate (any layer, step, seed) | "
             f">= 0.995 | {p['min_cert_median_any_layer_step_seed']:.4f} |")
  out.append(f"| Fig 3 Pre-LN envelope at the last checkpoint | [0.26, 1.00] | "
             f"[{p['envelope_last'][0]:.4f}, {p['envelope_last'][1]:.4f}] |")
  post = r["per_seed"]["post"]
  pm = [(d["last_p_max_median"], d["last_p_max_mean"], d["uniform_p_max_mean"])
        for d in post.values()]
  out.append(f"| Post-LN sampled-row p_max at the last checkpoint, median / mean vs uniform "
             f"support (per seed) | {paper['post_plateau_p_max']} (two plateaued seeds) | "
             + "; ".join(f"{a:.4f} / {b:.4f} vs {c:.4f}" for a, b, c in pm) + " |")
  for arch in ("pre", "post"):
    g = r["fig1"][arch]["fig1d_block_grad_norm"]
    out.append(f"| Fig 1(d) {arch}-LN per-block grad norm, seed {r['fig1'][arch]['fig1d_seed']}, "
               f"layer 0 .. last | see Sec 5 | " + ", ".join(f"{x:.2g}" for x in g) + " |")
  for arch in ("pre", "post"):
    f4 = r["fig4"][arch]
    cells = "; ".join(f"L{l}: {m:.4f} [{a:.4f}, {b:.4f}]"
                      for l, m, a, b in zip(f4["layers"], f4["median"], f4["p5"], f4["p95"]))
    out.append(f"| Fig 4 {arch}-LN seed {f4['seed']}: median [p5, p95] per layer | "
               f"medians near 1; Pre-LN middle-layer p5 ~0.35 | {cells} |")
  return out


ROWS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "theorem_check": _theorem_rows, "certificates_large_L": _certificate_rows,
    "prepost_training": _prepost_rows}


def summary_markdown(results: dict[str, dict[str, Any]], scale: str) -> str:
  lines = [f"# Softmax sensitivity: paper vs ours ({scale} scale)", "",
           "| quantity | paper | ours |", "|---|---|---|"]
  for name, res in results.items():
    if "error" in res:
      lines.append(f"| {name} | — | failed: {res['error']} |")
      continue
    try:
      lines.extend(ROWS[name](res))
    except (KeyError, IndexError, TypeError) as e:  # a script's output changed shape
      lines.append(f"| {name} | — | see {name}.json ({type(e).__name__}: {e}) |")
  lines += ["", "Details, settings the paper leaves open and deviations: EXPECTED.md.", ""]
  return "\n".join(lines)


def run_all(out_dir: str, scale: str = "quick", only: Sequence[str] | None = None
            ) -> dict[str, Any]:
  """Runs the scripts (all, or ``only``), writes ``out_dir/summary.md``."""
  names = list(only) if only else list(SCRIPTS)
  unknown = [n for n in names if n not in SCRIPTS]
  if unknown:
    raise ValueError(f"unknown scripts {unknown}; available: {list(SCRIPTS)}")
  os.makedirs(out_dir, exist_ok=True)
  results: dict[str, Any] = {}
  for name in names:
    t0 = time.time()
    results[name] = _module(name).run(os.path.join(out_dir, name), scale=scale)
    results[name]["wall_seconds"] = time.time() - t0
  with open(os.path.join(out_dir, "summary.md"), "w") as f:
    f.write(summary_markdown(results, scale))
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="runs/softmax_sensitivity")
  parser.add_argument("--scale", default="quick", choices=("quick", "paper"))
  parser.add_argument("--only", default="", help="comma-separated script names")
  args = parser.parse_args()
  run_all(args.out, args.scale, [s for s in args.only.split(",") if s] or None)
  print(open(os.path.join(args.out, "summary.md")).read())


if __name__ == "__main__":
  main()
