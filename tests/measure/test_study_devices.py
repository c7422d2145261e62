"""The study's seed loop on devices: memory-bounded seed groups, local devices only."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from rankjax._src.config import MLPConfig
from rankjax._src.measure import jacobians, seed_devices

CFG = MLPConfig(depth=48, width=256, expansion=4.0, norm_position="pre")


class _FakeDevice:
  def __init__(self, platform, stats):
    self.platform, self._stats = platform, stats

  def memory_stats(self):
    if isinstance(self._stats, Exception):
      raise self._stats
    return self._stats


def test_seed_batch_is_bounded_by_device_memory():
  per_seed = seed_devices.study_bytes_per_seed(CFG, 1, True)
  # weights 2 L d m, per input 5 L d^2 + 2 (L+1) d^2, float32
  assert per_seed == 4 * (2 * 48 * 256 * 1024 + 5 * 48 * 256 ** 2 + 2 * 49 * 256 ** 2)
  gpu = lambda limit, used=0: _FakeDevice("gpu", {"bytes_limit": limit, "bytes_in_use": used})
  assert seed_devices.default_seed_batch(CFG, 1, 64, True, gpu(140 << 30)) == 64
  assert seed_devices.default_seed_batch(CFG, 1, 64, True, gpu(10 * per_seed)) == 5
  assert seed_devices.default_seed_batch(CFG, 1, 64, True, gpu(12 * per_seed, 2 * per_seed)) == 5
  assert seed_devices.default_seed_batch(CFG, 1, 64, True, gpu(per_seed)) == 1   # at least one
  budget = seed_devices.DEFAULT_DEVICE_MEMORY_BUDGET
  for stats in (None, {}, RuntimeError("no stats")):
    assert seed_devices.default_seed_batch(CFG, 1, 64, True, _FakeDevice("tpu", stats)) == \
        min(64, budget // per_seed)
  assert seed_devices.default_seed_batch(CFG, 1, 8, True, _FakeDevice("cpu", None)) == 1
  small = MLPConfig(depth=4, width=16, expansion=2.0, norm_position="pre")
  assert seed_devices.default_seed_batch(small, 1, 8, True, _FakeDevice("cpu", None)) == 8


def test_seed_mesh_uses_local_devices():
  mesh = seed_devices.seed_mesh(6)
  assert set(mesh.devices.flat) <= set(jax.local_devices())


def test_explicit_seed_batch_gives_the_same_study():
  cfg = MLPConfig(depth=4, width=16, expansion=2.0, norm_position="pre")
  key = jax.random.PRNGKey(0)
  one = jacobians.mlp_jacobian_study(cfg, key, num_seeds=4, seed_batch=1, num_chunks=1)
  four = jacobians.mlp_jacobian_study(cfg, key, num_seeds=4, seed_batch=4, num_chunks=1)
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


PROCESS = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    port, pid, seeds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if pid >= 0:
      jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
    import numpy as np
    from rankjax._src.config import MLPConfig
    from rankjax._src.measure import jacobians
    cfg = MLPConfig(depth=4, width=8, expansion=2.0, norm_position="pre")
    study = jacobians.mlp_jacobian_study(cfg, jax.random.PRNGKey(seeds), num_seeds=seeds,
                                         num_chunks=1)
    print("RESULT" + json.dumps({"devices": jax.device_count(),
                                 "erank": np.asarray(study.erank).tolist()}))
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_study_in_each_of_two_processes_uses_its_own_devices():
  """Two jax.distributed processes run different studies (4 and 2 seeds) at once; each
  equals the same study run alone. (With a mesh over the global devices the processes'
  different programs error out or time out.)"""
  env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
  port = str(_free_port())
  run = lambda pid, seeds: subprocess.Popen(
      [sys.executable, "-c", PROCESS, port, str(pid), str(seeds)], env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  def result(p):
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return json.loads([l for l in out.splitlines() if l.startswith("RESULT")][-1][6:])

  joint = [run(0, 4), run(1, 2)]
  joint = [result(p) for p in joint]
  alone = [result(run(-1, 4)), result(run(-1, 2))]
  assert [r["devices"] for r in joint] == [4, 4] and alone[0]["devices"] == 2
  for j, a in zip(joint, alone):
    np.testing.assert_allclose(j["erank"], a["erank"], rtol=1e-5)


def test_process_seed_blocks_are_contiguous_and_cover_every_seed():
  assert seed_devices.process_seed_blocks(5, 2) == [range(0, 3), range(3, 5)]
  assert seed_devices.process_seed_blocks(4, 2) == [range(0, 2), range(2, 4)]
  assert seed_devices.process_seed_blocks(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]
  with pytest.raises(ValueError, match="num_seeds=2 is fewer than the 3 processes"):
    seed_devices.process_seed_blocks(2, 3)


SPLIT = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if pid >= 0:
      jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
    import numpy as np
    from jax.experimental import multihost_utils
    from rankjax._src import cli
    from rankjax._src.config import MLPConfig
    from rankjax._src.measure import jacobians
    name = "alone" if pid < 0 else f"p{pid}"
    sent = []                  # what this process hands the gather: the seeds it computed
    gather = multihost_utils.process_allgather
    multihost_utils.process_allgather = lambda tree, tiled=False: (
        sent.append(tree), gather(tree, tiled=tiled))[1]
    cfg = MLPConfig(depth=4, width=8, expansion=2.0, norm_position="pre")
    fn = jacobians.make_study_fn(cfg, 2, 5, seed_batch=1, across_processes=True)
    samples = fn(jax.random.PRNGKey(7), 1.3, 0.7)
    seeds = getattr(fn, "seeds", range(5))
    np.savez(f"{out}/{name}.npz", seeds=np.array([seeds.start, seeds.stop]),
             **{k: np.asarray(v) for k, v in samples.items()},
             **{"sent_" + k: np.asarray(v) for k, v in (sent[0] if sent else {}).items()})
    assert cli.main(["measure", "mlp", "--set", "depth=3", "--set", "width=8", "--seeds", "3",
                     "--inputs", "2", "--out", f"{out}/{name}.json"]) == 0
""")


@pytest.mark.slow   # ~30 s: three interpreters, each compiling the study and the CLI's
def test_two_processes_split_the_seeds_and_both_get_all_of_them(tmp_path):
  """A study with across_processes=True on two jax.distributed processes (localhost,
  gloo): process 0 computes seeds 0-2 and process 1 seeds 3-4 (what each hands the
  gather, padded to 3 rows for process 1), and both get all five seeds, bit for bit
  those of one process running the same study (same per-seed program, same machine).
  ``rankjax measure mlp`` on both: process 0 alone writes, the numbers of one process."""
  env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
  port = str(_free_port())
  run = lambda pid: subprocess.Popen(
      [sys.executable, "-c", SPLIT, port, str(pid), str(tmp_path)], env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  def wait(p):
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]

  for p in [run(0), run(1)]:
    wait(p)
  wait(run(-1))
  alone, *joint = (np.load(tmp_path / f"{n}.npz") for n in ("alone", "p0", "p1"))
  fields = [k for k in alone.files if k != "seeds"]
  assert "erank" in fields and not any(k.startswith("sent_") for k in fields)
  assert [tuple(j["seeds"]) for j in joint] == [(0, 3), (3, 5)]
  for j, (start, stop) in zip(joint, [(0, 3), (3, 5)]):
    for k in fields:
      assert alone[k].shape[:2] == (5, 2), k
      np.testing.assert_array_equal(j[k], alone[k], err_msg=k)      # every seed, same bits
      sent = j["sent_" + k]
      assert sent.shape[0] == 3, k
      np.testing.assert_array_equal(sent[:stop - start], alone[k][start:stop], err_msg=k)
      assert not np.any(sent[stop - start:]), k                      # padding only
  assert (tmp_path / "p0.json").exists() and (tmp_path / "p0.png").exists()
  assert not (tmp_path / "p1.json").exists() and not (tmp_path / "p1.png").exists()
  written, reference = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("p0", "alone"))
  assert written["num_seeds"] == 3 and written["config"] == reference["config"]
  for k in ("erank", "stable_rank", "mean_order", "stream_rms"):
    np.testing.assert_allclose(written[k], reference[k], rtol=1e-5, err_msg=k)
  np.testing.assert_allclose(written["spread"]["erank"]["sd_seed_means"],
                             reference["spread"]["erank"]["sd_seed_means"], rtol=1e-4)
