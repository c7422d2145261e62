"""Helpers for the training tests: tiny configs and a worker process.

Runs that must be separate processes (SIGKILL) go through
``tests/train/train_worker.py``; the test process and its workers share a persistent
JAX compilation cache, so a program compiles once per session. Tracing and compiling
dominate these tiny runs on a CPU, so the reference and resumed runs stay in the test
process (``train`` reuses the compiled step for a config it has seen).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import pathlib
import subprocess
import sys

import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import MLPConfig, TrainConfig, TransformerConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).with_name("train_worker.py")


def run_json_worker(script: str, *args: str, timeout: float = 900, **env: str) -> dict:
  """``tests/train/SCRIPT ARGS`` (``hlo_worker.py``, ``multidevice_worker.py``) in a CPU
  process of its own (its host devices set there, before JAX starts; ``env`` added to
  this environment): its last stdout line, parsed as JSON; a failure is an assertion
  naming the worker's stderr."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", **env,
             PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name(script)), *args],
                        env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def tiny_lm(**overrides) -> TrainConfig:
  """A 1-layer LM on the offline Shakespeare corpus (byte tokenizer: 257 ids)."""
  lm = TransformerConfig(vocab_size=257, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                         max_seq_len=16, norm_position="pre", dropout_rate=0.1)
  base = dict(model=lm, seq_len=8, batch_size=8, grad_accum=2, learning_rate=1e-2,
              warmup_steps=2, total_steps=8, log_every=1, checkpoint_every=4, max_to_keep=1,
              diag_every=2, diag_examples=2, eval_every=4, eval_batches=2)
  base.update(overrides)
  return TrainConfig(**base)


def tiny_mlp(**overrides) -> TrainConfig:
  """A depth-2 residual MLP classifier on the offline image set (fashion-mnist/digits)."""
  from rankjax._src.data import dataset_info
  info = dataset_info("images")
  mlp = MLPConfig(depth=2, width=16, expansion=2.0, input_dim=info.input_dim,
                  num_classes=info.num_classes)
  base = dict(model=mlp, optimizer="adam", weight_decay=0.0, b2=0.999,
              lr_schedule="constant", warmup_steps=0, learning_rate=1e-3, batch_size=16,
              total_steps=8, log_every=1, checkpoint_every=4, max_to_keep=3, diag_every=0)
  base.update(overrides)
  return TrainConfig(**base)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> str:
  """A persistent compilation cache shared by this process and its workers: the one
  configured already (CI's, ``JAX_COMPILATION_CACHE_DIR`` in ``.ci/run``, shared by every
  process of the run), else a new one."""
  from jax.experimental.compilation_cache import compilation_cache
  import jax
  path = jax.config.jax_compilation_cache_dir or str(tmp_path_factory.mktemp("jax_cache"))
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  compilation_cache.reset_cache()  # takes effect even after earlier compiles
  return path


@pytest.fixture(scope="session")
def worker_env(compile_cache) -> dict[str, str]:
  """Workers compile with the flags of this process, so their numerics match it."""
  env = dict(os.environ)
  env["JAX_COMPILATION_CACHE_DIR"] = compile_cache
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  env["JAX_PLATFORMS"] = "cpu"
  return env


class Worker:
  """Runs train_worker.py on a config; returns (exit code, last JSON line, stderr)."""

  def __init__(self, env: dict[str, str], tmp: pathlib.Path):
    self.env, self.tmp = env, tmp

  def __call__(self, cfg: TrainConfig, workdir: pathlib.Path | str, *args: str,
               timeout: float = 600) -> tuple[int, dict | None, str]:
    name = pathlib.PurePosixPath(str(workdir)).name
    path = self.tmp / f"{name}-{len(list(self.tmp.glob('*.json')))}.json"
    config_lib.to_json(cfg, path)
    proc = subprocess.run([sys.executable, str(WORKER), str(path), str(workdir), *args],
                          env=self.env, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
    result = None
    for line in reversed(proc.stdout.splitlines()):
      if line.startswith("{"):
        result = json.loads(line)
        break
    return proc.returncode, result, proc.stderr


@pytest.fixture(scope="session")
def worker(worker_env, tmp_path_factory) -> Worker:
  return Worker(worker_env, tmp_path_factory.mktemp("worker_configs"))


@contextlib.contextmanager
def logs_warning(caplog, pattern: str):
  """Like ``pytest.warns`` for the warnings ``rankjax._src.train`` logs (a skipped step)."""
  caplog.clear()
  with caplog.at_level(logging.WARNING, "rankjax._src.train"):
    yield
  assert re.search(pattern, caplog.text), caplog.text


def losses(workdir: pathlib.Path) -> dict[int, float]:
  """{step: loss} from metrics.jsonl (a step logged twice: the last line)."""
  out = {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    if "loss" in row and row.get("kind", "train") == "train":
      out[row["step"]] = row["loss"]
  return out


def shrunk_paper_config(name: str, **knobs):
  """The shipped paper config ``name`` with its sizes shrunk, everything
  else its own (hlo_worker.py's ``paper``); ``knobs`` override more of the model's
  ``kernels`` (``KernelConfig``) fields."""
  import dataclasses

  from rankjax._src import config as config_lib
  from rankjax._src.config import TrainConfig
  cfg = config_lib.from_json(TrainConfig, (ROOT / "experiments" / "configs" / name).read_text())
  lm = dataclasses.replace(cfg.model, num_layers=2, d_model=64, num_heads=2, d_ff=128,
                           vocab_size=1000, max_seq_len=40)
  lm = dataclasses.replace(lm, kernels=dataclasses.replace(
      lm.kernels, vocab_multiple=128, loss_chunk=256, **knobs))
  return dataclasses.replace(cfg, model=lm, seq_len=40, batch_size=64, grad_accum=2,
                             diag_examples=4)
