"""Training: the jitted step (``state``), the loop, the tasks, the diagnostics recorded
inside the step, and reading a finished run (``run_reader``).

The public modules are listed in ``__all__``; the others are internals.
"""

__all__ = [
    "diagnostics",
    "diagnostics_attention",
    "diagnostics_postnorm",
    "loop",
    "run_reader",
    "state",
    "tasks",
]
