"""gcp-storage-emulator with the object preconditions and generation headers of GCS.

  python tests/train/gcs_emulator.py start --host H --port P --in-memory ...

(the emulator's own arguments). tensorstore, Orbax's array storage, relies on two things
real GCS does (https://cloud.google.com/storage/docs/request-preconditions):

* a download names the object's generation in ``x-goog-generation``;
* ``ifGenerationMatch`` / ``ifGenerationNotMatch`` (and the metageneration pair) are
  honoured: a read whose ``NotMatch`` fails is ``304 Not Modified``, any other failed
  precondition ``412 Precondition Failed``.

gcp-storage-emulator does neither. When tensorstore read an OCDBT manifest it had
just written (``ifGenerationNotMatch=<its generation>``), the emulator sent the whole
object with no generation, tensorstore failed the read with "Malformed
StorageGeneration", and the checkpoint's background save died: in CI the step-4
checkpoint never committed. This launcher adds the two behaviours around the
emulator's own object handlers and runs it unchanged otherwise.
"""

from __future__ import annotations

import functools
import sys
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_CONDITIONS = (("ifGenerationMatch", "generation", True),
               ("ifGenerationNotMatch", "generation", False),
               ("ifMetagenerationMatch", "metageneration", True),
               ("ifMetagenerationNotMatch", "metageneration", False))


def _object_name(request) -> str | None:
  if "object_id" in request.params:
    return request.params["object_id"]
  names = request.query.get("name")          # a media upload names its object in the query
  return names[0] if names else None


def _failed_precondition(request, obj: dict | None, reading: bool) -> HTTPStatus | None:
  """The status GCS answers for the first precondition that fails, None if all hold.
  A missing object has generation 0 (``ifGenerationMatch=0``: create only)."""
  for param, field, must_match in _CONDITIONS:
    if param not in request.query:
      continue
    wanted = int(request.query[param][0])
    have = int(obj[field]) if obj is not None else 0
    if (have == wanted) != must_match:
      return HTTPStatus.NOT_MODIFIED if reading and not must_match else HTTPStatus.PRECONDITION_FAILED
  return None


def _with_preconditions(handler, reading: bool):
  @functools.wraps(handler)
  def wrapped(request, response, storage, *args, **kwargs):
    name = _object_name(request)
    obj = None
    if name is not None:
      try:
        obj = storage.get_file_obj(request.params["bucket_name"], name)
      except NotFound:
        if reading:                           # GCS: 404 whatever the preconditions
          return handler(request, response, storage, *args, **kwargs)
    status = _failed_precondition(request, obj, reading) if name is not None else None
    if status is not None:
      response.status = status
      if obj is not None:
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])
      return None
    result = handler(request, response, storage, *args, **kwargs)
    if reading and response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT) and obj:
      response["x-goog-generation"] = str(obj["generation"])
      response["x-goog-metageneration"] = str(obj["metageneration"])
    return result
  return wrapped


def patch_handlers() -> None:
  """Wraps the object reads, writes and deletes in every route table of the server."""
  reads = {objects.get, objects.download}
  writes = {objects.insert, objects.delete, objects.patch, objects.xml_upload}
  for _, methods in server.HANDLERS:
    for method, handler in list(methods.items()):
      if handler in reads:
        methods[method] = _with_preconditions(handler, reading=True)
      elif handler in writes:
        methods[method] = _with_preconditions(handler, reading=False)
  objects_insert = objects.insert                  # the router's fallback for bare uploads
  objects.insert = _with_preconditions(objects_insert, reading=False)


if __name__ == "__main__":
  patch_handlers()
  from gcp_storage_emulator.__main__ import main
  main(sys.argv[1:])
