"""A gs:// workdir end to end against a GCS-protocol server started on localhost.

``gcp-storage-emulator`` (PyPI) serves the GCS JSON API; gcsfs (etils.epath's
backend for gs://) finds it through ``STORAGE_EMULATOR_HOST``, tensorstore (Orbax's
array storage) through ``TENSORSTORE_GCS_HTTP_URL`` with a dummy token
(``GOOGLE_AUTH_TOKEN_FOR_TESTING``). Train, SIGKILL after a checkpoint, resume, read
the run back and build the report, all on gs://.
"""

from __future__ import annotations

import importlib.util
import logging
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from rankjax._src.train.loop import train
from tests.train.conftest import Worker, logs_warning, losses, tiny_mlp

needs_emulator = pytest.mark.skipif(
    importlib.util.find_spec("gcp_storage_emulator") is None
    or importlib.util.find_spec("gcsfs") is None,
    reason="needs the test extra (gcsfs, gcp-storage-emulator)")

BUCKET = "rankjax-test"
EMULATOR = pathlib.Path(__file__).with_name("gcs_emulator.py")   # + GCS preconditions


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator's URL; the test process and workers talk to it."""
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  log = tmp_path_factory.mktemp("gcs") / "emulator.log"
  proc = subprocess.Popen(
      [sys.executable, str(EMULATOR), "start", "--host", "127.0.0.1",
       "--port", str(port), "--in-memory", "--default-bucket", BUCKET],
      stdout=open(log, "w"), stderr=subprocess.STDOUT)
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}", timeout=1)
      break
    except Exception:  # noqa: BLE001 - not up yet
      if time.time() > deadline or proc.poll() is not None:
        proc.kill()
        pytest.fail(f"the GCS emulator did not start: {log.read_text()[-2000:]}")
      time.sleep(0.2)
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token"}
  yield env
  proc.kill()
  proc.wait(timeout=10)


@pytest.fixture
def gcs_env(gcs, monkeypatch):
  for k, v in gcs.items():
    monkeypatch.setenv(k, v)
  logging.getLogger("gcsfs").setLevel(logging.ERROR)   # "no default credentials"
  return gcs


@needs_emulator
@pytest.mark.slow
@pytest.mark.serial   # CI runs this test alone, after the others (it was where the
                      # emulator's missing preconditions showed: see gcs_emulator.py)
def test_gs_workdir_train_kill_resume_report(gcs_env, worker_env, tmp_path, compile_cache,
                                            caplog):
  from etils import epath
  from rankjax._src.report import build_report
  from rankjax._src.train.run_reader import load_run

  cfg = tiny_mlp()
  reference = train(cfg, tmp_path / "local", progress_bar=False)
  assert reference.step == 8
  url = f"gs://{BUCKET}/runs/mlp"
  work = Worker({**worker_env, **gcs_env}, tmp_path)
  code, _, err = work(cfg, url, "--kill-at", "6", "--wait-checkpoint", "4")
  assert code == -signal.SIGKILL, err[-3000:]
  root = epath.Path(url)
  assert (root / "checkpoints" / "4" / "commit_success.txt").exists()
  assert (root / "config.json").exists()
  assert not (tmp_path / "gs:").exists()                  # nothing in a local ./gs: folder

  code, result, err = work(cfg, url)
  assert code == 0, err[-3000:]
  assert (result["start_step"], result["step"], result["status"]) == (4, 8, "completed")
  remote = {}
  import json
  for line in (root / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    if "loss" in row and row.get("kind", "train") == "train":
      remote[row["step"]] = row["loss"]
  assert remote == losses(tmp_path / "local")             # bitwise, through a kill

  run = load_run(url)
  assert run.step == 8 and run.config == cfg
  page = build_report(url)
  assert str(page).startswith("gs://") and "<img" in epath.Path(page).read_text()

  # an unreadable step on gs:// is skipped with a warning naming it (read-only here)
  (root / "checkpoints" / "8" / "state" / "_METADATA").write_text("{ half-written")
  with logs_warning(caplog, r"step 8 .* is unreadable .*using step 4 instead"):
    assert load_run(url).step == 4
  assert (root / "checkpoints" / "8" / "state").exists()


@needs_emulator
def test_emulator_has_the_preconditions_tensorstore_relies_on(gcs):
  """The launcher's GCS semantics (gcs_emulator.py), through the JSON API itself."""
  import json
  import urllib.error
  import urllib.parse
  base, name = gcs["STORAGE_EMULATOR_HOST"], "precondition-test/obj"
  quoted = urllib.parse.quote(name, safe="")

  def call(method, path, data=None):
    req = urllib.request.Request(base + path, data=data, method=method)
    try:
      with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
      return e.code, dict(e.headers), b""

  def upload(data, **cond):
    q = urllib.parse.urlencode({"uploadType": "media", "name": name, **cond})
    return call("POST", f"/upload/storage/v1/b/{BUCKET}/o?{q}", data)

  def download(**cond):
    q = urllib.parse.urlencode({"alt": "media", **cond})
    return call("GET", f"/storage/v1/b/{BUCKET}/o/{quoted}?{q}")

  assert download(ifGenerationNotMatch=0)[0] == 404            # missing: 404 whatever
  assert upload(b"one", ifGenerationMatch=5)[0] == 412         # absent is generation 0
  code, _, body = upload(b"one", ifGenerationMatch=0)          # create only
  assert code == 200
  gen = json.loads(body)["generation"]
  assert upload(b"two", ifGenerationMatch=0)[0] == 412         # exists now
  code, headers, body = download()
  assert (code, body, headers["x-goog-generation"]) == (200, b"one", gen)
  code, headers, body = download(ifGenerationNotMatch=gen)     # unchanged since gen
  assert (code, body, headers["x-goog-generation"]) == (304, b"", gen)
  assert download(ifGenerationMatch=int(gen) + 1)[0] == 412
  code, _, body = upload(b"two", ifGenerationMatch=gen)        # compare-and-swap
  assert code == 200 and json.loads(body)["generation"] != gen
  code, headers, body = download(ifGenerationNotMatch=gen)
  assert (code, body) == (200, b"two") and headers["x-goog-generation"] != gen


def test_gs_workdir_without_gcsfs_is_one_line(monkeypatch, tmp_path):
  import importlib.util as iu
  real = iu.find_spec
  monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a))
  with pytest.raises(ValueError, match=r"^workdir gs://b/run needs the gcsfs package "
                                       r"\(pip install gcsfs\)$"):
    train(tiny_mlp(), "gs://b/run", progress_bar=False)


@needs_emulator
def test_gs_paths_move_atomic_write_and_metrics_truncation(gcs_env):
  """What the corrupt-step handling and a resume do to a gs:// workdir."""
  import json

  from rankjax._src import storage
  from rankjax._src.train.logging import MetricsWriter
  root = storage.as_path(f"gs://{BUCKET}/paths_test")
  step = root / "checkpoints" / "8"
  (step / "state").mkdir(parents=True, exist_ok=True)
  (step / "state" / "_METADATA").write_text("{}")
  (step / "commit_success.txt").write_text("ok")
  dest = root / "corrupt_checkpoints" / "8-unreadable-1"
  storage.move(step, dest)
  assert not step.exists()
  assert (dest / "state" / "_METADATA").read_text() == "{}"
  storage.write_text_atomic(root / "config.json", "{\"a\": 1}\n")
  assert json.loads((root / "config.json").read_text()) == {"a": 1}
  lines = [json.dumps({"step": s, "loss": float(s)}) for s in range(1, 7)]
  (root / "metrics.jsonl").write_text("\n".join(lines) + "\n{\"step\": 7, \"lo")
  MetricsWriter.truncate(root, 4)
  assert (root / "metrics.jsonl").read_text().splitlines() == lines[:4]
  assert (root / "metrics_replaced.jsonl").read_text().splitlines() == \
      lines[4:] + ["{\"step\": 7, \"lo"]


@needs_emulator
@pytest.mark.slow
def test_output_on_a_missing_bucket_is_one_line_before_any_work(gcs_env, capsys):
  from rankjax._src import cli
  from rankjax._src import storage
  assert storage.check_output(f"gs://{BUCKET}/new_run", "workdir").name == "new_run"
  with pytest.raises(ValueError, match=r"^workdir gs://no-such-bucket/run: the bucket "
                                       r"gs://no-such-bucket does not exist$"):
    train(tiny_mlp(), "gs://no-such-bucket/run", progress_bar=False)
  assert cli.main(["measure", "mlp", "--out", "gs://no-such-bucket/x.json"]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      "rankjax measure: error: --out gs://no-such-bucket/x.json: the bucket "
      "gs://no-such-bucket does not exist"]


@needs_emulator
def test_a_text_dataset_on_gs_reads_as_the_local_folder(gcs_env, tmp_path):
  """dataset=gs://bucket/dir (the softmax study's FineWeb location) gives the documents
  of the same folder on disk; a gs:// folder that is not there is one line, never a tfds
  lookup; a study's data check (training.missing_directory) accepts the URL."""
  from etils import epath
  from rankjax._src.data import common, text
  from rankjax._src.studies import training
  local = tmp_path / "fineweb"
  local.mkdir()
  remote = epath.Path(f"gs://{BUCKET}/fineweb")
  for i in range(12):
    body = f"document {i}\r\nline two of {i} \u00e9\n"
    (local / f"d{i:02d}.txt").write_text(body, encoding="utf-8", newline="")
    (remote / f"d{i:02d}.txt").write_text(body)
  seen = 0
  for split in ("train", "validation"):
    ours, theirs = text.text_source(str(remote), split), text.text_source(str(local), split)
    assert ours.in_memory and len(ours.docs) == len(theirs.docs) > 0
    assert [ours.docs[i] for i in range(len(ours.docs))] == \
        [theirs.docs[i] for i in range(len(theirs.docs))]
    seen += len(ours.docs)
  assert seen == 12
  # the training batches, packed in memory and streamed, are the local folder's
  from rankjax._src.data import pipeline

  def batches(dataset):
    it = pipeline.make_iterator("text", dataset=dataset, batch_size=2, seq_len=8,
                                tokenizer="byte", seed=3)
    return [next(it)["inputs"].tolist() for _ in range(3)]
  assert batches(str(remote)) == batches(str(local))
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(text, "IN_MEMORY_MAX_BYTES", 0)
    assert not text.text_source(str(remote), "train").in_memory
    assert batches(str(remote)) == batches(str(local))
  assert training.missing_directory(str(remote), "RANKJAX_FINEWEB") is None
  gone = f"gs://{BUCKET}/no-such-set"
  with pytest.raises(common.DataUnavailableError, match=f"directory {gone} does not exist"):
    text.text_source(gone, "train")
  assert training.missing_directory(gone, "RANKJAX_FINEWEB") == \
      f"RANKJAX_FINEWEB={gone} is not a directory"
