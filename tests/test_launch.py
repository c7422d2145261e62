"""The launchers (launch/): the XLA flags they set, the versions they pin, and what
slurm.sbatch and tpu_pod.sh actually run, with srun / scontrol / gcloud replaced by
scripts that record their arguments and environment."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import stat
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"


def _sourced(name: str, env: dict | None = None) -> str:
  out = subprocess.run(["bash", "-c", f'source launch/xla_flags.sh; printf %s "${name}"'],
                       cwd=ROOT, capture_output=True, text=True, check=True,
                       env=dict(os.environ, **(env or {})))
  return out.stdout


def _jax_starts(xla_flags: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-c",
                         "import jax.numpy as jnp; print(float(jnp.ones(3).sum()))"],
                        env=env, capture_output=True, text=True, timeout=120)


def test_gpu_flags_parse_in_this_jaxlib():
  """XLA aborts at start-up on a flag it does not know ("Unknown flag in XLA_FLAGS"),
  and every jaxlib parses the GPU options (debug_options_flags.cc is compiled into the
  CPU build too): so a renamed or removed flag fails here, not on a cluster."""
  flags = _sourced("RANKJAX_GPU_XLA_FLAGS").split()
  assert len(flags) >= 6 and all(re.fullmatch(r"--xla_gpu_\w+=\w+", f) for f in flags), flags
  assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
  assert {"--xla_gpu_enable_pipelined_all_gather=true",
          "--xla_gpu_enable_pipelined_reduce_scatter=true"} <= set(flags)
  ok = _jax_starts(" ".join(flags))
  assert ok.returncode == 0 and ok.stdout.strip() == "3.0", ok.stderr[-2000:]
  bad = _jax_starts(" ".join(flags + ["--xla_gpu_no_such_flag_anywhere=true"]))
  assert bad.returncode != 0 and "Unknown flag" in bad.stderr     # the check can fail


def test_tpu_flags_and_the_off_switch():
  tpu = _sourced("RANKJAX_TPU_LIBTPU_ARGS").split()
  assert tpu and all(re.fullmatch(r"--xla_\w+=true", f) for f in tpu), tpu
  assert _sourced("RANKJAX_GPU_XLA_FLAGS", {"RANKJAX_XLA_FLAGS": "0"}) == ""
  assert _sourced("RANKJAX_TPU_LIBTPU_ARGS", {"RANKJAX_XLA_FLAGS": "0"}) == ""


def _pins(name: str) -> dict[str, str]:
  pins = {}
  for line in (LAUNCH / name).read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
      m = re.fullmatch(r"([\w\-]+)(\[[\w\-,]+\])?(?:==([\w.*]+))?", line)
      assert m, (name, line)
      pins[m.group(1)] = m.group(3)
  return pins


def test_pinned_versions_agree_and_meet_the_package_bounds():
  from packaging.requirements import Requirement
  from packaging.version import Version
  import tomllib
  gpu, tpu = _pins("requirements-gpu.txt"), _pins("requirements-tpu.txt")
  assert gpu["jax"] and gpu["jax"] == gpu["jaxlib"] == tpu["jax"] == tpu["jaxlib"]
  shared = set(gpu) & set(tpu)
  assert {"jax", "flax", "optax", "orbax-checkpoint", "grain"} <= shared
  assert all(gpu[k] == tpu[k] for k in shared), (gpu, tpu)
  deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
  bounds = {Requirement(d).name: Requirement(d).specifier for d in deps}
  for name, version in gpu.items():
    if name in bounds and version:
      assert Version(version) in bounds[name], (name, version, bounds[name])


def _recorder(folder: pathlib.Path, name: str, exit_code: int = 0) -> None:
  """A stand-in command that appends its argv and XLA_FLAGS to folder/calls."""
  path = folder / name
  path.write_text("#!/bin/bash\n"
                  f'printf "%s\\n" "{name} $* | XLA_FLAGS=$XLA_FLAGS" >> "{folder}/calls"\n'
                  f"exit {exit_code}\n")
  path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _slurm(tmp_path, *args, srun_exit=0, **env):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(parents=True)
  _recorder(bin_dir, "srun", srun_exit)
  _recorder(bin_dir, "scontrol")
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True, exist_ok=True)
  (venv / "bin" / "activate").write_text("")
  full = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", VENV=str(venv),
              SLURM_SUBMIT_DIR=str(ROOT), SLURM_JOB_ID="42", SLURM_NTASKS="8",
              SLURM_JOB_NODELIST="node1", **env)
  if "XLA_FLAGS" not in env:
    full.pop("XLA_FLAGS", None)
  proc = subprocess.run(["bash", str(LAUNCH / "slurm.sbatch"), *args], env=full,
                        capture_output=True, text=True, timeout=60)
  calls = (bin_dir / "calls").read_text().splitlines() if (bin_dir / "calls").exists() else []
  return proc, calls


def test_slurm_sets_the_flags_before_yours_and_requeues_on_75(tmp_path):
  ours = _sourced("RANKJAX_GPU_XLA_FLAGS")
  proc, calls = _slurm(tmp_path, "cfg.json", "/shared/run", "--set", "seed=1",
                       XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=false")
  assert proc.returncode == 0, proc.stderr
  (srun,) = calls
  cmd, flags = srun.split(" | XLA_FLAGS=")
  assert cmd == ("srun --kill-on-bad-exit=1 --gpus-per-task=1 --gpu-bind=single:1 python -m "
                 "rankjax train --config cfg.json --workdir /shared/run --set seed=1")
  assert flags == ours + " --xla_gpu_enable_latency_hiding_scheduler=false"   # yours last

  proc, calls = _slurm(tmp_path / "b", "reproduce", "postnorm_collapse", "--scale", "paper",
                       srun_exit=75, RANKJAX_XLA_FLAGS="0")
  assert proc.returncode == 75
  assert calls[0] == ("srun --kill-on-bad-exit=1 --gpus-per-task=1 --gpu-bind=single:1 python "
                      "-m rankjax reproduce postnorm_collapse --scale paper | XLA_FLAGS=")
  assert calls[1].startswith("scontrol requeue 42")


@pytest.mark.parametrize("command", ["train", "reproduce"])
def test_tpu_pod_passes_libtpu_args_to_every_worker(tmp_path, command):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  _recorder(bin_dir, "gcloud")
  args = (["cfg.json", "gs://b/run"] if command == "train"
          else ["postnorm_collapse", "--scale", "paper", "--out", "gs://b/r"])
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
             LIBTPU_INIT_ARGS="--xla_tpu_mine=true")
  proc = subprocess.run(["bash", str(LAUNCH / "tpu_pod.sh"), command, "tpu1", "zone1", *args],
                        env=env, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  (call,) = (bin_dir / "calls").read_text().splitlines()
  assert "--worker=all" in call and f"-m rankjax {command}" in call
  # the remote shell's reading of the command (printf %q escaped the spaces)
  (value,) = [w.split("=", 1)[1] for w in shlex.split(call) if w.startswith("LIBTPU_INIT_ARGS=")]
  passed = value.split()
  assert passed == _sourced("RANKJAX_TPU_LIBTPU_ARGS").split() + ["--xla_tpu_mine=true"]


@pytest.mark.parametrize("command", ["train", "reproduce"])
def test_tpu_pod_forwards_a_studys_data_settings(tmp_path, command):
  """RANKJAX_FINEWEB (and the other study settings) set here reach the workers' command;
  one unset is not invented."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  _recorder(bin_dir, "gcloud")
  args = (["cfg.json", "gs://b/run"] if command == "train"
          else ["softmax_sensitivity", "--scale", "paper", "--out", "gs://b/r"])
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
             RANKJAX_FINEWEB="gs://b/fine web", TFDS_DATA_DIR="/data/tfds")
  env.pop("RANKJAX_TINY_DATA_DIR", None)
  proc = subprocess.run(["bash", str(LAUNCH / "tpu_pod.sh"), command, "tpu1", "zone1", *args],
                        env=env, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  (call,) = (bin_dir / "calls").read_text().splitlines()
  # the remote shell's reading of the command (printf %q escaped the space)
  remote = shlex.split(call.split(" | XLA_FLAGS=")[0])
  assert "RANKJAX_FINEWEB=gs://b/fine web" in remote      # one word on the worker's shell
  assert "TFDS_DATA_DIR=/data/tfds" in remote
  assert not any(w.startswith("RANKJAX_TINY_DATA_DIR=") for w in remote)
  assert remote.index("RANKJAX_FINEWEB=gs://b/fine web") < remote.index("-m")
