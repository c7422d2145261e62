"""``python -m rankjax COMMAND ...``: the ``rankjax`` command (the launch scripts' form)."""
from rankjax._src.cli import run

if __name__ == "__main__":
  run()
