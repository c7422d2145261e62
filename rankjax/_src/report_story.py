"""The sentences a report opens with, computed from the saved numbers.

Pure functions of arrays and configs (nothing here reads files or draws): ``RunNumbers``
holds what one run saved (``numbers_of(run)`` reads it from ``rankjax.load_run``), and
``run_sentences`` / ``jacobian_sentence`` / ``study_sentence`` / ``smoke_sentence``
turn numbers into prose (``workdir_paragraphs`` puts a report's opening together). A quantity that was not recorded is never printed: it is
named by ``not_recorded``, with the setting that records it (``RECORD_HINT``).

A layer has collapsed from update N when its token similarity (postnorm Def 2.1) is
at least ``COLLAPSED_SIM`` at every diagnostics update from N to the end of the run
(the collapse alarm's threshold). Layers are numbered from 0, as everywhere else.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rankjax._src.measure.gradients import ALARM_SIM_MIN as COLLAPSED_SIM
RECORD_HINT = ("train a new run (another --workdir) with --set "
               "diagnostics=basic,postnorm,attention")
PLACEMENT_NAMES = {"pre": "Pre-Norm", "post": "Post-Norm", "output": "Output-Norm",
                   "none": "no norm", "peri": "Peri-Norm"}
NOT_DECLARED = "norm placement not declared by the plug-in"


def placement_of(cfg: Any) -> str | None:
  """The norm placement of the run's model, as its task declares it
  (``Task.norm_position``: the library's models from the norms they build); None
  when a plug-in task does not declare one. Never a config field the model may ignore."""
  from rankjax._src.train import tasks
  return tasks.make_task(cfg).norm_position


def placement_name(placement: str | None) -> str:
  """``Post-Norm``, ``norms at P+R`` or ``NOT_DECLARED``."""
  if placement is None:
    return NOT_DECLARED
  return PLACEMENT_NAMES.get(placement, f"norms at {placement}")


@dataclasses.dataclass(frozen=True)
class RunNumbers:
  """What the sentences about one run need (None: not recorded)."""

  name: str
  model: str                       # the model's kind: "transformer", "mlp" or a plug-in's
  placement: str | None            # Task.norm_position; None: not declared
  layers: int
  updates: int
  final_loss: float | None
  steps: np.ndarray | None = None          # (n,) diagnostics updates
  tsim: np.ndarray | None = None           # (n, L) token similarity of Y_2^l (LM)
  freq_loss: float | None = None           # frequency loss of the diagnostic examples
  grad_norm: np.ndarray | None = None      # (L,) per-layer gradient norm, last diag update
  eval_accuracy: float | None = None
  stopped: dict[str, Any] | None = None    # the run's own stop (stop_on_collapse)


def numbers_of(name: str, run: Any) -> RunNumbers:
  """The numbers of a ``rankjax.load_run`` result."""
  cfg = run.config
  d = run.diagnostics
  loss = next((r["loss"] for r in reversed(run.train_history) if "loss" in r), None)
  acc = next((r["eval_accuracy"] for r in reversed(run.eval_history) if "eval_accuracy" in r),
             None)
  layers = getattr(cfg.model, "num_layers", None) or getattr(cfg.model, "depth", 0)
  return RunNumbers(
      name=name, model=cfg.model.kind, placement=placement_of(cfg), layers=int(layers),
      updates=int(run.step), final_loss=loss,
      steps=np.asarray(run.diagnostic_steps) if len(run.diagnostic_steps) else None,
      tsim=np.asarray(d["basic/tsim_y2"], float) if "basic/tsim_y2" in d else None,
      freq_loss=float(np.mean(d["postnorm/freq_loss"])) if "postnorm/freq_loss" in d else None,
      grad_norm=np.asarray(d["basic/grad_norm"], float)[-1] if "basic/grad_norm" in d else None,
      eval_accuracy=acc, stopped=getattr(run, "stopped", None))


_ARRAYS = ("steps", "tsim", "grad_norm")


def numbers_to_dict(r: RunNumbers) -> dict[str, Any]:
  """``r`` as JSON values (arrays as lists); ``numbers_from_dict`` reads it back."""
  out = dataclasses.asdict(r)
  for k in _ARRAYS:
    out[k] = None if out[k] is None else np.asarray(out[k]).tolist()
  return out


def numbers_from_dict(d: dict[str, Any]) -> RunNumbers:
  return RunNumbers(**{k: (np.asarray(v) if k in _ARRAYS and v is not None else v)
                       for k, v in d.items()})


@dataclasses.dataclass(frozen=True)
class Collapse:
  step: int                 # the first update from which some layer stays collapsed
  first_layers: tuple[int, ...]   # the layers collapsed from that update on
  layers: tuple[int, ...]   # every layer collapsed by the end of the run


def collapse(steps: np.ndarray, tsim_NxL: np.ndarray, threshold: float = COLLAPSED_SIM
             ) -> Collapse | None:
  """The run's collapse (see module doc), or None when no layer ends collapsed."""
  high = np.asarray(tsim_NxL) >= threshold
  # stays[i, l]: layer l is collapsed at every diagnostics update from i to the end
  stays = np.flip(np.cumprod(np.flip(high, 0), 0), 0).astype(bool)
  if not stays[-1].any():
    return None
  since = np.where(stays.any(0), np.argmax(stays, 0), len(steps))
  first = int(since.min())
  return Collapse(int(steps[first]), tuple(int(l) for l in np.flatnonzero(since == first)),
                  tuple(int(l) for l in np.flatnonzero(stays[-1])))


def layer_ranges(layers: Sequence[int]) -> str:
  """``layer 3`` / ``layers 2-5`` / ``layers 0, 2-3``."""
  layers = sorted(layers)
  parts, start = [], layers[0]
  for a, b in zip(layers, layers[1:] + [None]):
    if b != a + 1:
      parts.append(f"{start}" if start == a else f"{start}-{a}")
      start = b
  return ("layer " if len(layers) == 1 else "layers ") + ", ".join(parts)


def _g(x: float) -> str:
  return f"{x:.3f}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2g}"


def run_sentences(r: RunNumbers) -> list[str]:
  """What one run shows: its size, whether and where it collapsed, its losses."""
  what = placement_name(r.placement)
  unit = ("layer" if r.model == "transformer" else "block") + ("s" if r.layers != 1 else "")
  out = [f"{r.name} ({what}, {r.layers} {unit}) trained {r.updates} updates"
         + (f" to a loss of {_g(r.final_loss)} nats per target" if r.final_loss is not None
            else "")
         + (f" (frequency loss {_g(r.freq_loss)})" if r.freq_loss is not None else "")
         + (f", held-out accuracy {r.eval_accuracy:.1%}" if r.eval_accuracy is not None else "")
         + "."]
  if r.tsim is not None and r.steps is not None:
    c = collapse(r.steps, r.tsim)
    end = int(r.steps[-1])
    if c is None:
      last = r.tsim[-1]
      top = int(np.argmax(last))
      out.append(f"It did not collapse: no layer's token similarity stayed at or above "
                 f"{COLLAPSED_SIM} to the end (at update {end} the highest was "
                 f"{last[top]:.3f}, in layer {top}).")
    else:
      s = (f"It collapsed at update {c.step}: from then to the last diagnostics update "
           f"({end}) the token similarity of {layer_ranges(c.first_layers)} stayed at or "
           f"above {COLLAPSED_SIM}")
      if c.layers != c.first_layers:
        s += f", and by the end that of {layer_ranges(c.layers)}"
      out.append(s + ".")
  if r.stopped:
    out.append(f"It stopped itself at update {r.stopped['step']} (stop_on_collapse): "
               f"{r.stopped['reason']}.")
  if r.grad_norm is not None and len(r.grad_norm) > 1 and r.grad_norm[-1] > 0:
    ratio = r.grad_norm[0] / r.grad_norm[-1]
    out.append(f"At the last diagnostics update layer 0's parameter-gradient norm was "
               f"{_g(ratio)} times layer {len(r.grad_norm) - 1}'s.")
  return out


def throughput(history: Sequence[dict], unit: str) -> tuple[float, str] | None:
  """(value, "<unit>/s") of the last log window in ``metrics.jsonl`` rows (compile
  steps excluded: ``<unit>_per_s_avg``), or None when none was logged."""
  for r in reversed(history):
    if isinstance(r.get(f"{unit}_per_s_avg"), float):
      return r[f"{unit}_per_s_avg"], f"{unit}/s"
  return None


def last_values(values: np.ndarray) -> str:
  """A diagnostics series' values at its last update: the number, a few numbers, or
  the min / mean / max of a longer vector (non-finite entries counted, not printed)."""
  last = np.ravel(np.asarray(values, float)[-1]) if len(values) else np.zeros(0)
  finite = last[np.isfinite(last)]
  bad = len(last) - len(finite)
  if len(finite) == 0:
    return f"{len(last)} non-finite value(s)" if len(last) else "empty"
  if len(last) <= 4:
    text = ", ".join(f"{x:.4g}" if np.isfinite(x) else "non-finite" for x in last)
  else:
    text = (f"min {finite.min():.4g}, mean {finite.mean():.4g}, max {finite.max():.4g} "
            f"over {len(last)}")
  return text + (f" ({bad} non-finite)" if bad and len(last) > 4 else "")


def not_recorded(r: RunNumbers) -> list[str]:
  """The report's quantities this LM run did not record (MLP runs have none of them)."""
  if r.model != "transformer":
    return []
  missing = []
  if r.freq_loss is None:
    missing.append("the frequency loss and the contraction bound (the postnorm diagnostic)")
  if r.tsim is None:
    missing.append("per-layer token similarity and gradient norms (the basic diagnostic)")
  return missing


def jacobian_sentence(jac: dict) -> str:
  """The tour's residual-MLP measurement at initialization, ranked."""
  ranks = {p: float(s["erank"][-1]) for p, s in jac["studies"].items()}
  cfg = next(iter(jac["configs"].values()))
  order = sorted(ranks, key=ranks.get, reverse=True)
  listed = ", ".join(f"{ranks[p]:.3f} for {PLACEMENT_NAMES.get(p, p)}" for p in order)
  return (f"Residual MLPs at initialization (depth {cfg['depth']}, width {cfg['width']}, "
          f"{jac['num_seeds']} weight draws): erank(dh_L/dh_0)/d is {listed}.")


def smoke_sentence(configs: dict[str, Any]) -> str | None:
  """For the runs of ``rankjax tour --smoke`` (``{name: TrainConfig}``): that its size
  is too small to show the effect; None for any other runs."""
  from rankjax._src.tour_runs import lm_configs
  smoke, full = lm_configs(smoke=True), lm_configs()
  if configs.keys() != smoke.keys() or any(configs[n] != smoke[n] for n in smoke):
    return None
  s, f = smoke["lm_post"], full["lm_post"]
  return (f"This is the smoke tour (rankjax tour --smoke): {s.model.num_layers} layers of width "
          f"{s.model.d_model} trained {s.total_steps} updates, a size too small to show the "
          f"effect; it checks that every step runs. The full tour (rankjax tour: "
          f"{f.model.num_layers} layers of width {f.model.d_model}, {f.total_steps} updates) is "
          "sized to show it.")


def workdir_paragraphs(runs: dict[str, Any], jac: dict | None) -> list[str]:
  """The opening of a report (and the tour's printed summary), one paragraph per
  topic: ``runs`` are ``rankjax.load_run`` results by name, ``jac`` a tour's
  ``jacobians.json`` or None."""
  smoke = smoke_sentence({name: run.config for name, run in runs.items()})
  out = [smoke] if smoke else []
  out += [" ".join(run_sentences(numbers_of(name, run))) for name, run in runs.items()]
  return out + ([jacobian_sentence(jac)] if jac is not None else [])


def study_sentence(name: str, rows: list[dict]) -> str:
  """One study of ``rankjax reproduce``: its rows' statuses, the failed and mismatched
  experiments named."""
  scales = ", ".join(sorted({str(r.get("scale")) for r in rows}))
  counts: dict[str, int] = {}
  for r in rows:
    counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
  s = (f"{name} ({scales} scale): {len(rows)} paper items, "
       + ", ".join(f"{n} {k}" for k, n in counts.items()))
  for status in ("mismatch", "failed"):
    names = list(dict.fromkeys(r["experiment"] for r in rows if r.get("status") == status))
    if names:
      s += f"; {status}: {', '.join(names)}"
  return s + "."
