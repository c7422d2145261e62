"""``rankjax report``: one self-contained HTML page from what a workdir saved.

A page opens with sentences computed from the saved numbers (``report_story``), then
a table of the runs and the figures (``report_figures``; matplotlib on first use, Agg
unless pyplot was already loaded: ``rankjax._src.plotting``), every PNG embedded. For
``rankjax reproduce`` output it renders each study's ``summary.json`` rows and the
figures the study wrote, captioned by what they show (the titles saved in each PNG,
``plotting.save_figure``).
"""

from __future__ import annotations

import html
import pathlib

from rankjax._src import plotting, plugins
from rankjax._src import report_figures as figs
from rankjax._src import report_story as story


# ---------------------------------------------------------------------------
# The run report: ``rankjax report WORKDIR`` -> WORKDIR/report/{report.html, *.png}


def find_runs(workdir: pathlib.Path) -> dict[str, pathlib.Path]:
  """A training run (``config.json`` at the top) or a folder of runs, by name."""
  if (workdir / "config.json").is_file():
    return {workdir.name: workdir}
  return {p.name: p for p in sorted(workdir.iterdir())
          if p.is_dir() and (p / "config.json").is_file()}


def _page(title: str, body: list[str]) -> str:
  return "\n".join([
      f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
      "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 1em}"
      "img{max-width:100%}td,th{padding:2px 10px;border-bottom:1px solid #ddd;"
      "vertical-align:top}table{border-collapse:collapse}figure{margin:1.5em 0}"
      ".summary{font-size:1.05em;line-height:1.45}.note{color:#555}</style></head><body>",
      f"<h1>{html.escape(title)}</h1>", *body, "</body></html>"])


def _paragraph(sentences: list[str], cls: str = "summary") -> str:
  return f"<p class='{cls}'>" + " ".join(html.escape(s) for s in sentences) + "</p>"


def _figure(path: pathlib.Path, caption: str, name: str | None = None) -> str:
  """A PNG embedded as base64 (the page needs no other file and no network)."""
  import base64
  data = base64.b64encode(path.read_bytes()).decode()
  name = name or path.name
  return (f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(name)}'>"
          f"<figcaption>{html.escape(caption)}</figcaption></figure>")


STATUS_COLORS = {"match": "#dfd", "mismatch": "#fdd", "inconclusive": "#ffd",
                 "qualitative": "#eef", "tiny": "#ffe", "missing": "#eee",
                 "failed": "#f99"}
ROW_FIELDS = ("experiment", "item", "where", "kind", "quantity", "paper", "ours", "sd", "n",
              "interval", "band", "limit", "rule", "status", "scale", "note")   # rankjax._src.studies.evidence.FIELDS minus the per-seed lists


def rows_to_html(rows: list[dict]) -> str:
  """The rows of a study's ``summary.json`` as one table (every cell escaped), with
  the counts by paper item (``rankjax._src.studies.items``) and the rows per status above it."""
  import html

  from rankjax._src.studies import items
  counts = {}
  for r in rows:
    counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
  cell = lambda x: ("" if x is None else f"{x + 0.0:.4g}" if isinstance(x, float)  # no -0
                    else ", ".join(map(cell, x)) if isinstance(x, list) else str(x))
  head = "".join(f"<th>{f}</th>" for f in ROW_FIELDS)
  body = "".join(
      f"<tr style='background:{STATUS_COLORS.get(r.get('status'), '#fff')}'>"
      + "".join(f"<td>{html.escape(cell(r.get(f)))}</td>" for f in ROW_FIELDS) + "</tr>"
      for r in rows)
  tally = ", ".join(f"{html.escape(str(k))} {v}" for k, v in counts.items())
  return (f"<p>{html.escape(items.counts_text(rows))}</p><p>rows per status: {tally}</p>"
          f"<table><tr>{head}</tr>{body}</table>")


# ---------------------------------------------------------------------------
# The analysis report: ``rankjax analyze`` -> OUT/analysis.html


def _analysis_sentences(r: dict) -> list[str]:
  """Opening sentences computed from ``analysis.json`` (what the numbers say)."""
  layers = r["layers"]
  out = [f"{r['model'].get('model_type', r['family'])} with {r['model']['parameters']:,} "
         f"parameters, {len(layers)} layers, read from {r['source']}; "
         f"{r['sequences']} sequence(s) of {r['sequence_length']} tokens ({r['tokenizer']})."]
  if "embeddings" in r:
    first, last = r["embeddings"]["token_similarity"]["mean"], \
        layers[-1]["token_similarity"]["mean"]
    out.append(f"Token similarity of the residual stream goes from {first:.3f} at the "
               f"embeddings to {last:.3f} after the last block (1 = every token the same "
               "direction: rank collapse).")
  for pos, depth in r.get("through_depth", {}).items():
    er = depth["erank_over_d"]
    out.append(f"At token {pos} the stream Jacobian's effective rank / d is {er[0]:.3f} "
               f"after the first sublayer and {er[-1]:.3f} after the last.")
    break
  if "loss" in r:
    out.append(f"Next-token loss on the input: {r['loss']:.3f}.")
  return out


def build_analysis_report(out_dir: pathlib.Path, r: dict) -> pathlib.Path:
  """``out_dir/analysis.html``: the sentences, a per-layer table (layer 0 = the first
  block; the embeddings a row of their own) and the figure. Effective ranks are shown
  divided by d throughout."""
  pos = next(iter(r.get("through_depth", {})), None)

  def block_erank_over_d(l: dict) -> float | None:
    e = l.get("jacobian", {}).get(pos, {}).get("block", {}).get("erank")
    return None if e is None else e / r["model"]["d_model"]

  cols = [("token similarity", lambda l: l.get("token_similarity", {}).get("mean")),
          ("mean spike", lambda l: l.get("mean_spike")),
          ("block erank / d", block_erank_over_d),
          ("median p_max", lambda l: _mean_of(l.get("attention"), "p_max")),
          ("median theta_cert (every row)",
           lambda l: _mean_of(l.get("attention"), "theta_cert")),
          ("median theta_exact (short rows)",
           lambda l: _mean_of(l.get("attention"), "theta_exact")),
          ("median theta_cert (short rows)",
           lambda l: _mean_of(l.get("attention"), "theta_cert_exact_rows")),
          ("alpha_1", lambda l: l.get("gradients", {}).get("alpha_1")),
          ("alpha_2", lambda l: l.get("gradients", {}).get("alpha_2")),
          ("c_1 (Thm 3.6)", lambda l: l.get("gradients", {}).get("contraction_1")),
          ("grad norm", lambda l: l.get("gradients", {}).get("grad_norm"))]
  cols = [(name, f) for name, f in cols if any(f(l) is not None for l in r["layers"])]
  head = "".join(f"<th>{html.escape(n)}</th>"
                 for n in ["layer (0 = first block)"] + [n for n, _ in cols])
  rows = ([("embeddings", r["embeddings"])] if "embeddings" in r else []) + \
      [(l["layer"], l) for l in r["layers"]]
  body = "".join("<tr>" + f"<td>{name}</td>" + "".join(
      f"<td>{'' if f(l) is None else format(f(l), '.4g')}</td>" for _, f in cols) + "</tr>"
      for name, l in rows)
  rows_note = ("<p class='note'>Attention medians are means over heads; which rows "
               "each covers: " + "; ".join(f"{html.escape(k)}: {html.escape(v)}" for k, v in
                                         r["attention_rows"].items()) +
               ". The certificate is a lower bound of theta row by row: compare it with "
               "theta_exact over the same (short) rows.</p>"
               if "attention_rows" in r else "")
  parts = [_paragraph(_analysis_sentences(r)),
           f"<table><tr>{head}</tr>{body}</table>", rows_note,
           "<p class='note'>Per-head attention statistics (percentiles over rows), every "
           "Jacobian's top singular values and the path-order profile are in "
           "analysis.json (there erank and stable_rank are absolute; keys ending _over_d "
           "are divided by d).</p>"]
  png = out_dir / "analysis.png"
  if png.is_file():
    parts.append(_figure(png, "Token similarity of each layer's output (layer 0 = the "
                              "first block; the embeddings at -1); the erank / d of the "
                              "token's stream Jacobian through the sublayers"))
  path = out_dir / "analysis.html"
  path.write_text(_page(f"rankjax analyze: {pathlib.Path(r['source']).name}", parts))
  return path


def _mean_of(heads: list[dict] | None, name: str) -> float | None:
  """The mean over heads of a per-head statistic's median."""
  if not heads:
    return None
  return sum(h[name]["p50"] for h in heads) / len(heads)


def study_dirs(workdir: pathlib.Path) -> dict[str, pathlib.Path]:
  """Output folders of ``rankjax reproduce`` (each holds a ``summary.json``)."""
  if (workdir / "summary.json").is_file():
    return {workdir.name: workdir}
  return {p.name: p for p in sorted(workdir.iterdir())
          if p.is_dir() and (p / "summary.json").is_file()}


def build_study_report(workdir: pathlib.Path, studies: dict[str, pathlib.Path]) -> pathlib.Path:
  """``WORKDIR/report/report.html`` for ``rankjax reproduce`` output: per study, a
  sentence of its statuses, its paper-vs-measured rows (``summary.json``) and every
  figure it wrote, embedded and captioned by the titles saved in the PNG."""
  from rankjax._src import storage
  loaded = {name: storage.read_json(folder / "summary.json") for name, folder in studies.items()}
  out = workdir / "report"
  out.mkdir(exist_ok=True)
  body = [_paragraph([story.study_sentence(n, rows) for n, rows in loaded.items()])]
  for name, folder in studies.items():
    rows = loaded[name]
    scales = sorted({str(r.get("scale")) for r in rows})
    body.append(f"<h2>{html.escape(name)} ({html.escape(', '.join(scales))} scale)</h2>")
    body.append(rows_to_html(rows))
    for png in sorted(folder.rglob("*.png")):
      if out in png.parents or (folder / "report") in png.parents:
        continue
      rel = str(png.relative_to(folder))
      shows = plotting.png_description(png)
      caption = (f"{name}: {shows}" if shows else
                 f"{name}: {rel} (saved without a description; run the study again to "
                 "caption it)")
      body.append(_figure(png, caption, name=rel))
  page = out / "report.html"
  page.write_text(_page(f"rankjax reproduce: {workdir}", body))
  return page


def _cell(value: float | None, fmt: str = ".3f") -> str:
  return "not recorded" if value is None else format(value, fmt)


def _runs_table(runs: dict, numbers: dict[str, story.RunNumbers]) -> str:
  from rankjax._src.train import tasks as task_lib
  rows = []
  for name, run in runs.items():
    n = numbers[name]
    task = task_lib.make_task(run.config)

    def lm_cell(value: float | None) -> str:
      """The number the sentences quote (any model kind); else why there is none."""
      return _cell(value) if value is not None or task.data_kind == "text" else "n/a (LM runs)"

    last_sim = float(n.tsim[-1, -1]) if n.tsim is not None else None
    speed = story.throughput(run.history, task.throughput_unit)
    rate = "not logged" if speed is None else f"{speed[0]:.4g} {speed[1]}"
    logged = [r for r in run.history if "mfu" in r]
    mfu = f"{logged[-1]['mfu']:.1%}" if logged else "n/a"
    cells = [html.escape(name), str(n.updates), _cell(n.final_loss), lm_cell(n.freq_loss),
             lm_cell(last_sim), rate, mfu]
    rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
  return ("<table><tr><th>run</th><th>updates</th><th>final loss</th>"
          "<th>frequency loss</th><th>last-layer token similarity</th><th>throughput (last "
          "log window, excluding compile steps)</th><th>MFU (spec peak; n/a without "
          "one)</th></tr>" + "".join(rows) + "</table>")


def _diagnostics_table(runs: dict) -> str:
  """Every diagnostics series the runs recorded: its shape per update, its values at
  the last diagnostics update and the figure that draws it."""
  import numpy as np
  shown = figs.shown_in(runs)
  rows = []
  for name, run in runs.items():
    for key in sorted(run.diagnostics):
      values = np.asarray(run.diagnostics[key])
      shape = "x".join(map(str, values.shape[1:])) + " values" if values.ndim > 1 else "scalar"
      at = figs.layers_of(run, key)
      if at is not None:
        shape += f" (layers {', '.join(map(str, at))})"
      where = f"figure {shown[key]}" if shown[key] else "this table only"
      cells = [name, key, shape, str(len(values)), story.last_values(values), where]
      rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
  if not rows:
    return ""
  head = "".join(f"<th>{h}</th>" for h in ("run", "diagnostic series", "per update",
                                           "updates", "at the last diagnostics update",
                                           "drawn in"))
  return (f"<details><summary>Every recorded diagnostic ({len(rows)} series; "
          "rankjax.load_run(...).diagnostics holds them all)</summary>"
          f"<table><tr>{head}</tr>{''.join(rows)}</table></details>")


def build_report(workdir: str | pathlib.Path) -> pathlib.Path:
  """Builds ``WORKDIR/report/report.html`` (figures embedded) from what is saved:
  training runs and a tour's ``jacobians.json``, or ``rankjax reproduce`` output
  (folders with a ``summary.json``).

  Raises FileNotFoundError / ValueError with one line when the workdir does not exist
  or holds no run or a run with no complete checkpoint, ``RestoreError`` when a run's
  checkpoints are all corrupt (or unreadable now). Writes only under
  ``WORKDIR/report/``.
  """

  from rankjax._src import storage
  from rankjax._src.train.run_reader import load_run

  workdir = storage.as_path(workdir, "workdir")   # a gs:// URL as etils.epath
  if not storage.is_remote(workdir):
    workdir = pathlib.Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"workdir {workdir} " + ("is a file, not a run's folder"
                                                     if workdir.exists() else "does not exist"))
  storage.check_output(workdir / "report", "report folder")
  studies = study_dirs(workdir)
  if studies:
    return build_study_report(workdir, studies)
  run_dirs = find_runs(workdir)
  jac_path = workdir / "jacobians.json"
  if not run_dirs and not jac_path.is_file():
    raise FileNotFoundError(f"{workdir} holds no rankjax run (no config.json, jacobians.json "
                            "or reproduce summary.json)")
  runs = {}
  for name, path in run_dirs.items():
    try:
      runs[name] = load_run(path)
    except FileNotFoundError as e:
      raise FileNotFoundError(f"{path} holds a half-written run: {e}") from None
  jac = storage.read_json(jac_path) if jac_path.is_file() else None
  out = workdir / "report"
  out.mkdir(exist_ok=True)
  figures = []
  for builder in figs.RUN_FIGURES if runs else ():
    made = builder(runs, out)
    if made is not None:
      figures.append(made)
  if jac is not None:
    figures.append(figs.fig_jacobian(jac, out))

  numbers = {name: story.numbers_of(name, run) for name, run in runs.items()}
  smoke = story.smoke_sentence({name: run.config for name, run in runs.items()})
  body = [_paragraph([p]) for p in story.workdir_paragraphs(runs, jac)]
  if runs:
    body.append(_runs_table(runs, numbers))
    missing = {name: story.not_recorded(n) for name, n in numbers.items()}
    missing = {name: m for name, m in missing.items() if m}
    if missing:
      body.append(_paragraph(
          [f"Not recorded in {name}: {'; '.join(m)}." for name, m in missing.items()]
          + [f"To record them, {story.RECORD_HINT}."], cls="note"))
    body.append(_paragraph(["Layers are numbered from 0 (the first layer), as in "
                            "rankjax.load_run's columns and TensorBoard's layer_00 tags; "
                            "the attention diagnostic measures some layers only, named "
                            "by its layers series."],
                           cls="note"))
    body.append(_diagnostics_table(runs))
  body += [_figure(path, caption) for path, caption in figures]
  page = out / "report.html"
  title = "rankjax smoke tour" if smoke else "rankjax report"
  page.write_text(_page(f"{title}: {workdir}", body))
  return page


def add_parser(sub) -> None:
  p = sub.add_parser("report", help="build an HTML report (figures embedded) from a saved "
                                    "run or tour workdir",
                     epilog="exit status: 0 written, 2 bad input, 3 checkpoints unreadable "
                            "(a run's all corrupt); a failure is one line on stderr")
  p.add_argument("workdir")
  plugins.add_argument(p)    # a run of a model registered by a module of one's own

  def run(args) -> int:
    plugins.import_modules(args.imports)    # RestoreError: exit 3 (rankjax._src.cli)
    print(f"report: {build_report(args.workdir)}")
    return 0

  p.set_defaults(func=run)
