"""Figures from saved measurements (matplotlib on first use, Agg backend unless pyplot
was already loaded: ``rankjax.plotting``).

Each function takes plain dicts/arrays as saved in JSON and writes one PNG.
"""

from __future__ import annotations

import pathlib

import numpy as np

from rankjax import plotting, plugins


# ---------------------------------------------------------------------------
# The run report: ``rankjax report WORKDIR`` -> WORKDIR/report/{report.html, *.png}

PLACEMENT_COLORS = {"pre": "tab:blue", "post": "tab:red", "output": "tab:green",
                    "none": "tab:gray", "peri": "tab:purple"}


def find_runs(workdir: pathlib.Path) -> dict[str, pathlib.Path]:
  """A training run (``config.json`` at the top) or a folder of runs, by name."""
  if (workdir / "config.json").is_file():
    return {workdir.name: workdir}
  return {p.name: p for p in sorted(workdir.iterdir())
          if p.is_dir() and (p / "config.json").is_file()}


def _series(run, key: str):
  """(steps, values) of a saved diagnostics series, or None when absent."""
  if key not in run.diagnostics:
    return None
  return np.asarray(run.diagnostic_steps), np.asarray(run.diagnostics[key], dtype=float)


def _label(name: str, run) -> str:
  lm = run.config.lm
  return f"{name} ({lm.norm_position}-norm)" if run.config.model == "lm" else name


def _color(run) -> str | None:
  return PLACEMENT_COLORS.get(run.config.lm.norm_position) if run.config.model == "lm" else None


def _save(fig, out: pathlib.Path, name: str) -> pathlib.Path:
  plt = plotting.pyplot()
  path = out / f"{name}.png"
  fig.tight_layout()
  with path.open("wb") as f:  # an etils.epath path: local or gs://
    fig.savefig(f, dpi=100, format="png")
  plt.close(fig)
  return path


def fig_loss(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  freq = []
  for name, run in runs.items():
    rows = [r for r in run.history if r.get("kind", "train") == "train" and "loss" in r]
    if rows:
      ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], color=_color(run),
              label=_label(name, run))
    s = _series(run, "postnorm/freq_loss")
    if s is not None:
      freq.append(float(np.mean(s[1])))
  if freq:
    ax.axhline(np.mean(freq), color="k", ls="--", label="frequency loss (Def 3.7)")
  ax.set(xlabel="update", ylabel="training loss (nats/token)", title="Loss")
  ax.legend(fontsize=8)
  return _save(fig, out, "loss"), ("Training loss per update; the dashed line is the "
                                   "frequency loss, where a collapsed network settles.")


def fig_similarity(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r, _series(r, "basic/tsim_y2")) for n, r in runs.items()]
  items = [i for i in items if i[2] is not None]
  if not items:
    return None
  fig, axes = plt.subplots(1, len(items), figsize=(5 * len(items), 3.8), squeeze=False)
  for ax, (name, run, (steps, sim)) in zip(axes[0], items):
    im = ax.imshow(sim.T, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="magma",
                   extent=(steps[0], steps[-1], 0.5, sim.shape[1] + 0.5))
    ax.set(xlabel="update", ylabel="layer l", title=f"token similarity of Y_2^l: {name}")
  fig.colorbar(im, ax=axes[0].tolist(), shrink=0.9)
  path = out / "token_similarity.png"
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path, ("Token similarity (postnorm Def 2.1) of each layer's residual sum over "
                "training: a band reaching 1 means the layer's tokens have collapsed.")


def fig_grad_profile(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r, _series(r, "basic/grad_norm")) for n, r in runs.items()]
  items = [i for i in items if i[2] is not None]
  if not items:
    return None
  fig, axes = plt.subplots(1, len(items), figsize=(5 * len(items), 3.8), squeeze=False)
  for ax, (name, run, (steps, g)) in zip(axes[0], items):
    picks = sorted(set(np.linspace(0, len(steps) - 1, min(5, len(steps))).astype(int)))
    for i in picks:
      ax.semilogy(np.arange(1, g.shape[1] + 1), np.maximum(g[i], 1e-30),
                  label=f"update {steps[i]}")
    ax.set(xlabel="layer l", ylabel="parameter-gradient norm", title=name)
    ax.legend(fontsize=7)
  return _save(fig, out, "grad_profile"), (
      "Per-layer parameter-gradient norms at chosen updates: after a Post-Norm collapse "
      "the early layers' gradients fall by orders of magnitude (postnorm Sec 4.2).")


def fig_contraction(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r, _series(r, "postnorm/contraction_2"), _series(r, "postnorm/rms_factor_mean_2"))
           for n, r in runs.items()]
  items = [i for i in items if i[2] is not None and i[3] is not None]
  if not items:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  for name, run, (steps, c), (_, r) in items:
    for layer, ls in ((0, ":"), (c.shape[1] // 2, "--"), (c.shape[1] - 1, "-")):
      axes[0].semilogy(steps, c[:, layer], ls=ls, color=_color(run),
                       label=f"{name} layer {layer + 1}")
      axes[1].semilogy(steps, r[:, layer], ls=ls, color=_color(run))
  axes[0].axhline(1.0, color="k", lw=0.8)
  axes[0].set(xlabel="update", ylabel="c = alpha max|g| max_i sqrt(d)/||y_i||",
              title="FFN contraction bound c_2^l")
  axes[1].set(xlabel="update", ylabel="sqrt(d)/||y_2^l||", title="RMSNorm factor")
  axes[0].legend(fontsize=7)
  return _save(fig, out, "contraction"), (
      "Thm 3.6 / Prop D.1: below the line the bound c (largest row factor, learned gain) "
      "is < 1 and the backward signal contracts; the RMSNorm factor (token mean) falls as "
      "the residual norm grows.")


def fig_attention(runs: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  items = [(n, r) for n, r in runs.items() if "attention/theta_cert_p50" in r.diagnostics]
  if not items:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  for name, run in items:
    steps = run.diagnostic_steps
    last = -1  # the last measured layer
    for ax, key, title in ((axes[0], "theta_cert", "greedy-prefix certificate theta_cert"),
                           (axes[1], "entropy_norm", "normalized entropy")):
      mid = np.asarray(run.diagnostics[f"attention/{key}_p50"])[:, last]
      lo = np.asarray(run.diagnostics.get(f"attention/{key}_p5", mid[:, None]))
      hi = np.asarray(run.diagnostics.get(f"attention/{key}_p95", mid[:, None]))
      ax.plot(steps, mid, color=_color(run), label=f"{name} median")
      ax.fill_between(steps, lo[:, last], hi[:, last], color=_color(run), alpha=0.2)
      ax.set(xlabel="update", ylabel=title, title=f"{title} (last layer, 5-95%)")
  axes[0].legend(fontsize=7)
  return _save(fig, out, "attention"), (
      "Attention rows' greedy-prefix certificate of theta (softmax paper Thm 3.2, the "
      "paper's App D.2 certificate) and entropy: sharpening attention lowers both.")


def fig_jacobian(jac: dict, out: pathlib.Path):
  plt = plotting.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
  for position, study in jac["studies"].items():
    erank = np.asarray(study["erank"])
    axes[0].plot(np.arange(1, len(erank) + 1), erank, color=PLACEMENT_COLORS.get(position),
                 label=position)
    profile = np.asarray(study["order_profile"], dtype=float)
    if not np.all(np.isnan(profile)):
      axes[1].semilogy(np.arange(len(profile)), np.maximum(profile, 1e-300),
                       color=PLACEMENT_COLORS.get(position), label=position)
  axes[0].set(xlabel="layer l", ylabel="erank(dh_l/dh_0) / d", ylim=(0, 1.02),
              title="Jacobian effective rank (Transforming Rank Fig 4a)")
  axes[1].set(xlabel="path order k", ylabel="share of mass mu_k", title="Path-order profile (Fig 3b)")
  axes[0].legend(fontsize=8)
  axes[1].legend(fontsize=8)
  return _save(fig, out, "jacobian"), (
      "Residual MLPs at initialization: Post-Norm's input-output Jacobian loses rank "
      "with depth while Pre- and Output-Norm keep a floor; the path profile shows which "
      "path orders carry the Jacobian.")


def _page(title: str, body: list[str]) -> str:
  import html
  return "\n".join([
      f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
      "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
      "img{max-width:100%}td,th{padding:2px 10px;border-bottom:1px solid #ddd;"
      "vertical-align:top}table{border-collapse:collapse}</style></head><body>",
      f"<h1>{html.escape(title)}</h1>", *body, "</body></html>"])


def _figure(path: pathlib.Path, caption: str, name: str | None = None) -> str:
  """A PNG embedded as base64 (the page needs no other file and no network)."""
  import base64
  import html
  data = base64.b64encode(path.read_bytes()).decode()
  name = name or path.name
  return (f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(name)}'>"
          f"<figcaption>{html.escape(caption)} ({html.escape(name)})</figcaption></figure>")


STATUS_COLORS = {"match": "#dfd", "mismatch": "#fdd", "qualitative": "#eef", "missing": "#eee",
                 "failed": "#f99"}
ROW_FIELDS = ("experiment", "item", "paper", "ours", "status", "scale", "seeds", "spread", "note")


def rows_to_html(rows: list[dict]) -> str:
  """The rows of a study's ``summary.json`` as one table (every cell escaped), with
  the status counts above it."""
  import html
  counts = {}
  for r in rows:
    counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
  head = "".join(f"<th>{f}</th>" for f in ROW_FIELDS)
  body = "".join(
      f"<tr style='background:{STATUS_COLORS.get(r.get('status'), '#fff')}'>"
      + "".join(f"<td>{html.escape('' if r.get(f) is None else str(r.get(f)))}</td>"
                for f in ROW_FIELDS) + "</tr>" for r in rows)
  tally = ", ".join(f"{html.escape(str(k))} {v}" for k, v in counts.items())
  return f"<p>status: {tally}</p><table><tr>{head}</tr>{body}</table>"


def study_dirs(workdir: pathlib.Path) -> dict[str, pathlib.Path]:
  """Output folders of ``rankjax reproduce`` (each holds a ``summary.json``)."""
  if (workdir / "summary.json").is_file():
    return {workdir.name: workdir}
  return {p.name: p for p in sorted(workdir.iterdir())
          if p.is_dir() and (p / "summary.json").is_file()}


def build_study_report(workdir: pathlib.Path, studies: dict[str, pathlib.Path]) -> pathlib.Path:
  """``WORKDIR/report/report.html`` for ``rankjax reproduce`` output: per study, its
  paper-vs-measured rows (``summary.json``) and every figure it wrote, embedded."""
  import html
  import json
  out = workdir / "report"
  out.mkdir(exist_ok=True)
  body = []
  for name, folder in studies.items():
    rows = json.loads((folder / "summary.json").read_text())
    scales = sorted({str(r.get("scale")) for r in rows})
    body.append(f"<h2>{html.escape(name)} ({html.escape(', '.join(scales))} scale)</h2>")
    body.append(rows_to_html(rows))
    for png in sorted(folder.rglob("*.png")):
      if out in png.parents or (folder / "report") in png.parents:
        continue
      rel = png.relative_to(folder)
      body.append(_figure(png, f"{name}: {rel.parent}" if str(rel.parent) != "." else name,
                          name=str(rel)))
  page = out / "report.html"
  page.write_text(_page(f"rankjax reproduce: {workdir}", body))
  return page


def build_report(workdir: str | pathlib.Path) -> pathlib.Path:
  """Builds ``WORKDIR/report/report.html`` (figures embedded) from what is saved:
  training runs and a tour's ``jacobians.json``, or ``rankjax reproduce`` output
  (folders with a ``summary.json``).

  Raises FileNotFoundError / ValueError with one line when the workdir does not exist
  or holds no run or a run with no complete checkpoint, ``RestoreError`` when a run's
  checkpoints are all corrupt (or unreadable now). Writes only under
  ``WORKDIR/report/``.
  """
  import html
  import json

  from rankjax.train.run_reader import load_run

  from rankjax.train import paths
  workdir = paths.as_path(workdir, "workdir")   # a gs:// URL as etils.epath
  if not paths.is_remote(workdir):
    workdir = pathlib.Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"workdir {workdir} does not exist")
  paths.check_output(workdir / "report", "report folder")
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
  out = workdir / "report"
  out.mkdir(exist_ok=True)
  figures = []
  if runs:
    for builder in (fig_loss, fig_similarity, fig_grad_profile, fig_contraction, fig_attention):
      made = builder(runs, out)
      if made is not None:
        figures.append(made)
  if jac_path.is_file():
    figures.append(fig_jacobian(json.loads(jac_path.read_text()), out))

  rows = []
  for name, run in runs.items():
    loss = next((r["loss"] for r in reversed(run.history) if "loss" in r), float("nan"))
    freq = run.diagnostics.get("postnorm/freq_loss")
    sim = run.diagnostics.get("postnorm/last_tsim", run.diagnostics.get("basic/tsim_y2"))
    last_sim = float(np.ravel(sim[-1])[-1]) if sim is not None else float("nan")
    freq_v = float(np.mean(freq)) if freq is not None else float("nan")
    speed = [r for r in run.history if "tokens_per_s_avg" in r]
    tok_s = f"{speed[-1]['tokens_per_s_avg']:.4g}" if speed else "-"
    mfu = f"{speed[-1]['mfu']:.1%}" if speed and "mfu" in speed[-1] else "n/a"
    rows.append(f"<tr><td>{html.escape(name)}</td><td>{run.step}</td><td>{loss:.3f}</td>"
                f"<td>{freq_v:.3f}</td><td>{last_sim:.3f}</td><td>{tok_s}</td>"
                f"<td>{mfu}</td></tr>")
  body = []
  if rows:
    body.append("<table><tr><th>run</th><th>updates</th><th>final loss</th>"
                "<th>frequency loss</th><th>last-layer similarity</th><th>tokens/s (last "
                "log step)</th><th>MFU (spec peak; n/a without one)</th></tr>"
                + "".join(rows) + "</table>")
  body += [_figure(path, caption) for path, caption in figures]
  page = out / "report.html"
  page.write_text(_page(f"rankjax report: {workdir}", body))
  return page


def add_parser(sub) -> None:
  p = sub.add_parser("report", help="build an HTML report (figures embedded) from a saved "
                                    "run or tour workdir")
  p.add_argument("workdir")
  plugins.add_argument(p)    # a run of a model registered by a module of one's own

  def run(args) -> int:
    import sys

    from rankjax.train.checkpoint import RestoreError
    plugins.import_modules(args.imports)
    try:
      page = build_report(args.workdir)
    except RestoreError as e:     # every checkpoint corrupt, or unreadable now: as train
      print(f"rankjax report: {e}", file=sys.stderr)
      return 3
    print(f"report: {page}")
    return 0

  p.set_defaults(func=run)
