"""``UserError``: the one exception class for bad input.

A command that meets input it cannot use (an argument, a config, a file, data that is
not there) raises ``UserError``; the ``rankjax`` command prints it as one line and
exits 2. Anything else escaping a command is a bug: its traceback is printed and the
exit status is 1. ``UserError`` is a ``ValueError``, so callers catching
``ValueError`` keep working.
"""


class UserError(ValueError):
  """Bad input, told in one line: what was given and what is expected instead."""
