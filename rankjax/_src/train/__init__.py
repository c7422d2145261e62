"""Training: the jitted step (``state``), the loop, the tasks, the diagnostics recorded
inside the step, and reading a finished run (``run_reader``).

The implementation (private); the public names are ``rankjax.train``.
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
