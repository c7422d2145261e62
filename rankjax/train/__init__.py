"""Training: ``rankjax train`` as a library, its plug-in points, and reading a run.

The public face of ``rankjax.train`` (the implementation, the loop's hooks, sharding,
checkpoints and the per-run program included, is ``rankjax._src.train``).

- ``train(cfg, workdir)``: a run, resumed from its Orbax checkpoint when one is there
  (the same code as ``rankjax train``); ``load_run(workdir)``: a finished or partial
  run's config, metrics, diagnostics and parameters;
- the pieces of one step, for experiments that take a step by hand: ``make_task``,
  ``make_data_iterator``, ``make_init``, ``make_optimizer``, ``make_step``;
- plug-in points: ``register_task`` (a new ``model.kind``'s task; ``ClassifierTask`` is
  the one the MLP studies use), ``register_diagnostic`` and its input ``DiagInputs``;
- ``summarize_run``: the Post-Norm diagnostics of a run summarised (postnorm Sec 4.2-4.3:
  the transition step, the last layer's token similarity, the gradient-norm ratio).
"""
from rankjax._src.train.diagnostics import DiagInputs
from rankjax._src.train.diagnostics import register as register_diagnostic
from rankjax._src.train.diagnostics_postnorm import summarize_run
from rankjax._src.train.loop import make_data_iterator, train
from rankjax._src.train.state import make_init, make_optimizer, make_step
from rankjax._src.train.tasks import ClassifierTask, make_task, register_task


def __getattr__(name: str):
  """``load_run`` on first use: it brings Orbax and grain."""
  if name == "load_run":
    from rankjax._src.train.run_reader import load_run
    return load_run
  raise AttributeError(f"module 'rankjax.train' has no attribute {name!r}")


__all__ = [
    "ClassifierTask",
    "DiagInputs",
    "load_run",
    "make_data_iterator",
    "make_init",
    "make_optimizer",
    "make_step",
    "make_task",
    "register_diagnostic",
    "register_task",
    "summarize_run",
    "train",
]
