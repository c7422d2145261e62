"""Peak host memory of ``rankjax analyze`` with the weights read one layer at a time
against all of them resident.

A random Llama-family checkpoint of TinyLlama-1.1B's shape (22 layers, d=2048, d_ff=5632,
32 heads, 4 key-value heads, vocabulary 32000; 1.10B parameters) is written by
``hf.write_random_checkpoint`` (bfloat16, a shard per layer). Each run is a fresh
process (``rankjax analyze`` on ``--measures stream,attention,gradients``) that reports
its own peak resident set (``VmHWM``); the same run on a 1-layer d=64 model gives
the process's floor (Python, JAX, XLA's compilations). The target: with one layer at a time
the peak stays well under the model's float32 size, at about the floor plus the
non-layer weights plus a few layers (float32 copies and the safetensors pages of the
layer being read) plus the activations.

  python -m experiments.benchmarks.analyze_memory [--smoke] [--keep DIR]

``--smoke`` writes a 4-layer d=256 model instead (the test of this script).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time

from experiments.benchmarks import common

SECTION = "## rankjax analyze: peak host memory, one layer at a time"
TINYLLAMA = dict(hidden_size=2048, num_layers=22, intermediate_size=5632, num_heads=32,
                 num_kv_heads=4, vocab_size=32000)
SMOKE = dict(hidden_size=256, num_layers=4, intermediate_size=512, num_heads=4,
             num_kv_heads=2, vocab_size=1000)
FLOOR = dict(hidden_size=64, num_layers=1, intermediate_size=96, num_heads=4, num_kv_heads=2,
             vocab_size=64)

# VmHWM, the peak resident set of this process image (ru_maxrss would carry over the
# parent's peak across fork + exec)
_CHILD = textwrap.dedent("""
    import json, re, sys
    from rankjax._src import cli
    rc = cli.main(sys.argv[1:])
    status = open("/proc/self/status").read()
    peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1)) * 1024
    print(json.dumps({"rc": rc, "peak": peak}))
""")


def peak_rss(argv: list[str]) -> tuple[int, float]:
  """``(peak resident bytes, seconds)`` of ``rankjax ARGV`` in a fresh process."""
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True,
                        text=True, timeout=3600)
  seconds = time.perf_counter() - start
  last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
  if proc.returncode or not last.startswith("{"):
    raise RuntimeError(f"rankjax {' '.join(argv)} failed: {proc.stderr[-2000:]}")
  out = json.loads(last)
  if out["rc"]:
    raise RuntimeError(f"rankjax {' '.join(argv)} exited {out['rc']}: {proc.stderr[-2000:]}")
  return int(out["peak"]), seconds


def sizes(shape: dict) -> dict[str, int]:
  """Parameter counts: one layer, the non-layer tensors, the whole model."""
  d, m, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
  kv = shape["num_kv_heads"] * d // shape["num_heads"]
  layer = 2 * d * d + 2 * d * kv + 3 * d * m + 2 * d
  top = 2 * v * d + d
  return {"layer": layer, "top": top, "model": shape["num_layers"] * layer + top}


def measure(folder: pathlib.Path, tokens: int = 64, sequences: int = 2) -> dict:
  """Peak host bytes and seconds of the three runs (floor, per layer, resident)."""
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    ids = tmp / "ids.txt"
    ids.write_text(" ".join(str(i % 50) for i in range(tokens * sequences)))
    common_args = ["--token-ids", str(ids), "--sequences", str(sequences),
                   "--measures", "stream,attention,gradients"]
    out = {}
    from rankjax._src.models import hf
    tiny = hf.write_random_checkpoint(tmp / "tiny", **FLOOR)
    out["floor"] = peak_rss(["analyze", str(tiny), "--out", str(tmp / "floor"), "--tokens",
                             str(tokens), *common_args])
    for mode in ("on", "off"):
      out[mode] = peak_rss(["analyze", str(folder), "--out", str(tmp / mode), "--tokens",
                            str(tokens), "--layer-at-a-time", mode, *common_args])
    analysis = json.loads((tmp / "on" / "analysis.json").read_text())
  out["seconds_per_layer"] = analysis["seconds_per_layer"]
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--smoke", action="store_true", help="a 4-layer d=256 model (no RESULTS.md)")
  p.add_argument("--keep", help="write (or reuse) the checkpoint here")
  args = p.parse_args(argv)
  from rankjax._src.models import hf
  shape = SMOKE if args.smoke else TINYLLAMA
  n = sizes(shape)
  with tempfile.TemporaryDirectory() as tmp:
    folder = pathlib.Path(args.keep or tmp) / "random_llama"
    t0 = time.perf_counter()
    written = "reused from --keep"
    if not (folder / "config.json").is_file():
      hf.write_random_checkpoint(folder, dtype="bfloat16", seed=0, **shape)
      written = f"written in {time.perf_counter() - t0:.0f} s"
    r = measure(folder)
  gib = lambda b: b / 2 ** 30
  f32 = lambda k: 4 * n[k]
  floor, on, off = r["floor"][0], r["on"][0], r["off"][0]
  fwd = r["seconds_per_layer"]["forward"]
  bwd = r["seconds_per_layer"]["backward"]
  lines = [
      SECTION, "",
      f"Machine: {common.machine_name()}; load {common.load_average():.2f} at the start; "
      f"`python -m experiments.benchmarks.analyze_memory{' --smoke' if args.smoke else ''}`.",
      f"Model: random Llama, {shape['num_layers']} layers, d={shape['hidden_size']}, "
      f"d_ff={shape['intermediate_size']}, {shape['num_heads']} heads "
      f"({shape['num_kv_heads']} kv), vocabulary {shape['vocab_size']}: "
      f"{n['model'] / 1e9:.3f}B parameters, stored bfloat16 ({gib(2 * n['model']):.2f} GiB, "
      f"{written}), analyzed in float32 ({gib(f32('model')):.2f} GiB; one "
      f"layer {gib(f32('layer')):.3f} GiB, embeddings + head {gib(f32('top')):.3f} GiB). "
      "Input: 2 sequences of 64 tokens; measures stream, attention, gradients.", "",
      "| run | peak host memory (GiB) | above the floor (GiB) | wall (s) |",
      "|---|---|---|---|",
      f"| floor: 1 layer, d=64 | {gib(floor):.2f} | 0 | {r['floor'][1]:.0f} |",
      f"| `--layer-at-a-time on` | {gib(on):.2f} | {gib(on - floor):.2f} | {r['on'][1]:.0f} |",
      f"| `--layer-at-a-time off` (resident) | {gib(off):.2f} | {gib(off - floor):.2f} | "
      f"{r['off'][1]:.0f} |", "",
      f"One layer at a time: {gib(on - floor):.2f} GiB above the floor = "
      f"{(on - floor) / f32('layer'):.1f} float32 layers' worth (the embeddings and head "
      f"are {f32('top') / f32('layer'):.1f} of them), {(on - floor) / f32('model'):.0%} of the "
      f"model in float32; resident: {(off - floor) / f32('model'):.0%}. Per layer "
      f"(median, one layer at a time): forward {sorted(fwd)[len(fwd) // 2]:.3f} s, "
      f"backward (read + VJP) {sorted(bwd)[len(bwd) // 2]:.3f} s.",
  ]
  text = "\n".join(lines)
  print(text)
  if not args.smoke:
    common.write_section(SECTION, text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
