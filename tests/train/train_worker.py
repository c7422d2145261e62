"""Runs ``rankjax._src.train.loop.train`` in its own process for the resume/signal tests.

  python tests/train/train_worker.py CONFIG.json WORKDIR [--kill-at S] [--term-at S]
      [--wait-checkpoint N]

``--kill-at S``: after update S, SIGKILL this process (no cleanup of any kind);
with ``--wait-checkpoint N`` it first waits until checkpoint N is committed on disk
(exit code 3 if it is not within 120 s).
``--term-at S``: after update S, send SIGTERM to this process (the loop saves and
returns). Prints one JSON line with the result. With ``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` set it is one process of a
multi-process run (``jax.distributed`` on localhost).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("config")
  parser.add_argument("workdir")
  parser.add_argument("--kill-at", type=int)
  parser.add_argument("--term-at", type=int)
  parser.add_argument("--wait-checkpoint", type=int)
  args = parser.parse_args()
  from rankjax._src import distributed
  distributed.maybe_initialize_distributed()   # JAX_COORDINATOR_ADDRESS etc.: several processes
  from rankjax._src import config as config_lib
  from rankjax._src.config import TrainConfig
  from rankjax._src.train.loop import train

  cfg = config_lib.from_json(TrainConfig, args.config)

  def on_step(step: int) -> None:
    if step == args.kill_at:
      if args.wait_checkpoint is not None:
        from etils import epath
        done = epath.Path(args.workdir) / "checkpoints" / str(args.wait_checkpoint)
        deadline = time.time() + 120
        from rankjax._src import storage
        while not (done / "commit_success.txt").exists():
          if time.time() > deadline:     # say so (exit 3) rather than kill as if saved
            print(f"checkpoint {args.wait_checkpoint} not committed in 120 s", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
          time.sleep(0.05)
          storage.refresh(done)   # gcsfs caches listings (the step folder and its parents)
      os.kill(os.getpid(), signal.SIGKILL)
    if step == args.term_at:
      os.kill(os.getpid(), signal.SIGTERM)

  result = train(cfg, args.workdir, on_step=on_step, progress_bar=False)
  print(json.dumps({"step": result.step, "status": result.status,
                    "start_step": result.start_step}))
  sys.stdout.flush()


if __name__ == "__main__":
  main()
