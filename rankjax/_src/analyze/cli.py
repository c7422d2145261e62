"""``rankjax analyze CHECKPOINT --out DIR``: the papers' per-layer measures of a
pretrained checkpoint or a rankjax run, written to ``DIR/analysis.json`` and figures.

CHECKPOINT is a Hugging Face folder (``config.json`` + ``*.safetensors``, sharded or not;
GPT-2, Llama, Mistral, Qwen2) or a rankjax LM training workdir (``--step``: default the
newest checkpoint). The input is ``--token-ids FILE`` (integers, whitespace-separated),
``--text FILE`` (tokenized with the checkpoint's ``tokenizer.json`` / ``tokenizer.model``;
without one, UTF-8 bytes, and the output says so) or ``--dataset shakespeare`` (the
offline corpus's validation split), cut into ``--sequences`` sequences of ``--tokens``
(a shorter input: as many whole sequences as fit, else one of all its tokens; it says so).
The measures (``--measures``): ``stream`` (token similarity, mean spike, coherence),
``attention`` (per head), ``jacobian`` (at ``--positions``), ``gradients`` (with the
next-token loss on the sequences: alpha_k, sqrt(d)/||y||, the contraction c, per-layer
gradient norms; postnorm Sec 4.2); ``rankjax._src.analyze.measures`` says what each is.
Any size (``rankjax._src.analyze.passes``: a layer at a time): ``--layer-at-a-time`` reads a
Hugging Face folder's layers from the memory-mapped files on every pass (auto: when the
weights exceed half the free memory), ``--mesh-fsdp`` shards the weights over the local
devices by the training rules, ``--dtype bfloat16`` computes in bf16.
Layer l is block l, 0 = the first (as in training's diagnostics, TensorBoard and
``load_run``): ``layers[l]`` of ``analysis.json`` and the trajectory's columns; the
embeddings' stream measures are ``embeddings``. The page shows effective ranks / d.
Results already in ``DIR`` are refused (one line, exit 2) unless ``--overwrite``.
Bad input is one line and exit 2; checkpoints unreadable (a rankjax run's all corrupt)
one line and exit 3; nothing is downloaded.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np

from rankjax._src.errors import UserError

MEASURES = ("stream", "attention", "jacobian", "gradients")
DEFAULT_TOKENS = 64


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("analyze", help="the papers' measures of a pretrained checkpoint",
                            description=__doc__.split("\n\n", 1)[0])
  p.add_argument("checkpoint", nargs="+",
                 help="Hugging Face checkpoint folder(s) or rankjax workdir(s); several: "
                      "a trajectory")
  p.add_argument("--out", required=True, help="output folder (analysis.json, figures)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace the results of an earlier analysis in --out (without it "
                      "existing results are refused)")
  p.add_argument("--step", type=int, default=None, help="a rankjax run's checkpoint step")
  p.add_argument("--steps", default=None,
                 help="several steps of one rankjax run (comma-separated, or 'all'): each is "
                      "analyzed and the measures are drawn against the step")
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--text", help="a text file, tokenized with the checkpoint's tokenizer")
  src.add_argument("--token-ids", help="a file of whitespace-separated token ids")
  src.add_argument("--dataset", choices=["shakespeare"], help="the offline corpus")
  p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                 help="tokens per sequence (%(default)s)")
  p.add_argument("--sequences", type=int, default=2,
                 help="sequences (%(default)s; a shorter input: as many as fit)")
  p.add_argument("--positions", default="-1",
                 help="comma-separated token positions of the Jacobians (%(default)s: the "
                      "last; negative counts from the end)")
  p.add_argument("--measures", default=",".join(MEASURES),
                 help=f"comma-separated subset of {', '.join(MEASURES)}")
  p.add_argument("--no-paths", action="store_true",
                 help="skip the path-order profile (O(L^2 d^3) per position)")
  p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                 help="compute dtype of the forward pass (%(default)s; bfloat16: matrices "
                      "cast, norms in float32)")
  p.add_argument("--layer-at-a-time", choices=["auto", "on", "off"], default="auto",
                 help="read a Hugging Face folder's weights one layer at a time from the "
                      "memory-mapped files on every pass (on), place them all once (off), "
                      "or per layer when they exceed half the free memory (%(default)s)")
  p.add_argument("--mesh-fsdp", type=int, default=0,
                 help="shard the weights over this many local devices by the training "
                      "rules (%(default)s: all of them; 1: no mesh)")
  p.set_defaults(func=run)


BYTES = "byte (the checkpoint has no tokenizer)"   # text read as UTF-8 bytes
BYTES_NOTE = "the checkpoint has no tokenizer file: the text is read as UTF-8 bytes (ids 0-255)"


def _token_ids(args, model) -> tuple[np.ndarray, str]:
  """``(ids, tokenizer description)`` of the requested input."""
  if args.token_ids:
    path = pathlib.Path(args.token_ids)
    if not path.is_file():
      raise FileNotFoundError(f"--token-ids file {path} not found")
    try:
      ids = np.array([int(x) for x in path.read_text().split()], np.int64)
    except ValueError:
      raise UserError(f"{path}: not whitespace-separated integers") from None
    return ids, "token ids given"
  from rankjax._src.data import tokenizer as tokenizer_lib
  if args.text:
    path = pathlib.Path(args.text)
    if not path.is_file():
      raise FileNotFoundError(f"--text file {path} not found")
    text = path.read_text(encoding="utf-8", errors="replace")
  else:
    from rankjax._src.data import corpus
    text = "\n".join(corpus.read_document(p) for p in corpus.document_paths("validation"))
  if model.tokenizer:
    tok = tokenizer_lib.make_tokenizer(model.tokenizer)
    return tok.encode(text).astype(np.int64), tok.name
  return tokenizer_lib.ByteTokenizer().encode(text).astype(np.int64), BYTES


def too_long(n: int, model) -> str:
  """The refusal of ``--tokens n`` beyond the model's positions; a sliding window
  (Mistral) that caps them is named as such, beside the model's own positions."""
  window = model.description.get("sliding_window")
  if window and model.max_len == window:
    return (f"--tokens {n} exceeds the model's sliding window of {window} tokens (it has "
            f"{model.description['max_position_embeddings']} positions; rankjax attends "
            f"without a window, so analyze is exact up to {window} tokens)")
  return (f"--tokens {n} exceeds the model's {model.max_len} positions (--tokens is "
          f"{DEFAULT_TOKENS} unless given: give --tokens {model.max_len} or fewer)")


def fitted_shape(available: int, tokens: int, sequences: int) -> tuple[int, int]:
  """``(sequences, tokens)`` analyzed from ``available`` input tokens: as asked when
  they suffice, else as many whole sequences of ``tokens`` as fit, else one sequence of
  all of them."""
  if available >= tokens * sequences:
    return sequences, tokens
  if available >= tokens:
    return available // tokens, tokens
  return 1, available


def _sequences(ids: np.ndarray, args, model) -> tuple[np.ndarray, str | None]:
  """The (K, T) sequences analyzed, and the note saying so when the input is short."""
  n, k = args.tokens, args.sequences
  if n < 2 or k < 1:
    raise UserError(f"--tokens must be >= 2 and --sequences >= 1; got {n}, {k}")
  if ids.size < 2:
    raise UserError(f"the input has {ids.size} token(s); rankjax analyze needs at least 2")
  k_fit, n_fit = fitted_shape(ids.size, n, k)
  if n_fit > model.max_len:
    raise UserError(too_long(n, model))
  if ids.min() < 0 or ids.max() >= model.vocab_size:
    raise UserError(f"token ids must lie in [0, {model.vocab_size}); the input has "
                     f"{ids.min()}..{ids.max()}")
  note = None
  if (k_fit, n_fit) != (k, n):
    note = (f"the input has {ids.size} tokens, fewer than {k} sequences of {n}; analyzing "
            f"{k_fit} sequence(s) of {n_fit} tokens")
  return ids[:n_fit * k_fit].reshape(k_fit, n_fit).astype(np.int32), note


def _positions(spec: str, n: int) -> list[int]:
  try:
    raw = [int(x) for x in spec.split(",") if x.strip()]
  except ValueError:
    raise UserError(f"--positions {spec!r}: comma-separated integers") from None
  out = []
  for p in raw:
    if not -n <= p < n:
      raise UserError(f"--positions: {p} is outside a sequence of {n} tokens")
    out.append(p % n)
  return out


def analyze(model, seqs: np.ndarray, positions: list[int], measures: set[str],
            with_paths: bool = True) -> dict:
  """The measures of ``model`` on ``seqs`` (K, T): the ``analysis.json`` dict
  (``passes``: a forward pass, and a backward pass for the gradients). ``layers[l]``
  is layer l, 0 = the first block (its attention, Jacobians and gradients, and the
  stream measures of its output); the stream measures of the embeddings are
  ``embeddings``."""
  from rankjax._src.analyze import measures as m
  from rankjax._src.analyze import passes
  out = {"layers": [{"layer": l} for l in range(model.num_layers)]}
  fwd = passes.forward_pass(model, seqs, positions if "jacobian" in measures else [],
                            keep_streams=bool(measures & {"stream", "gradients"}),
                            attention="attention" in measures)
  out["seconds_per_layer"] = fwd["seconds"]
  if "stream" in measures:
    streams = np.swapaxes(fwd["streams"], 0, 1)                         # (K, L+1, T, d)
    stream = m.stream_measures(streams)
    out["embeddings"] = stream["embeddings"]
    for row, entry in zip(out["layers"], stream["layers"]):
      row.update(entry)
  for l, heads in enumerate(fwd["attention"]):
    out["layers"][l]["attention"] = heads
  if "attention" in measures:
    out["attention_rows"] = m.attention_rows(seqs.shape[1])
  if "jacobian" in measures:
    depth = {}
    for pos, blocks in fwd["token_blocks"].items():
      jac = m.jacobian_measures(blocks, with_paths=with_paths)
      for l, entry in enumerate(jac["layers"]):
        out["layers"][l].setdefault("jacobian", {})[str(pos)] = entry
      depth[str(pos)] = jac["through_depth"]
    out["through_depth"] = depth
  if "gradients" in measures:
    bwd = passes.backward_pass(model, seqs, fwd["streams"])
    out["loss"] = bwd["loss"]
    out["seconds_per_layer"]["backward"] = bwd["seconds"]
    for l, row in enumerate(bwd["layers"]):
      out["layers"][l]["gradients"] = row
  return out


def _figure(result: dict, path: pathlib.Path) -> None:
  from rankjax._src import plotting
  plt = plotting.pyplot()
  layers = result["layers"]
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
  if "embeddings" in result:
    axes[0].plot([r["layer"] for r in layers], [r["token_similarity"]["mean"] for r in layers],
                 marker="o", label="output of layer l")
    axes[0].plot([-1], [result["embeddings"]["token_similarity"]["mean"]], marker="s",
                 ls="", color="gray", label="embeddings (at -1)")
    axes[0].set(xlabel="layer l (0 = first block)", ylabel="token similarity",
                title="Token similarity (postnorm Def 2.1)")
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(fontsize=7)
  for pos, depth in result.get("through_depth", {}).items():
    er = depth["erank_over_d"]
    axes[1].plot(np.arange(len(er)) / 2, er, marker=".", label=f"token {pos}")
  if result.get("through_depth"):
    axes[1].set(xlabel="layer (0 = first block): l after its attention, l + 0.5 its FFN",
                ylabel="erank(dh/dh_0) / d",
                title="Token Jacobian through depth (TR Eq. 3)")
    axes[1].xaxis.get_major_locator().set_params(integer=True)
    axes[1].legend()
  fig.suptitle(result["source"])
  fig.tight_layout()
  plotting.save_figure(fig, path)
  plt.close(fig)


def _targets(args) -> list[tuple[str, str, int | None]]:
  """``(label, checkpoint, step)`` of each checkpoint to analyze."""
  from rankjax._src.analyze import trajectory
  if args.steps is not None:
    if len(args.checkpoint) != 1 or args.step is not None:
      raise UserError("--steps reads one rankjax run (and replaces --step)")
    wd = args.checkpoint[0]
    if _is_hugging_face(wd):
      raise UserError(f"--steps reads the checkpoints of a rankjax run; {wd} is a Hugging "
                      "Face checkpoint folder (one set of weights: analyze it without --steps)")
    saved = trajectory.run_steps(wd)
    steps = saved if args.steps == "all" else _ints(args.steps, "--steps")
    _check_steps(steps, saved)
    return [(f"step_{s}", wd, s) for s in steps]
  if len(args.checkpoint) == 1:
    if args.step is not None and (pathlib.Path(args.checkpoint[0]) / "checkpoints").is_dir():
      _check_steps([args.step], trajectory.run_steps(args.checkpoint[0]))
    return [("", args.checkpoint[0], args.step)]
  if args.step is not None:
    raise UserError("--step reads one rankjax run; give --steps for several")
  labels = [pathlib.Path(c).name or f"checkpoint_{i}" for i, c in enumerate(args.checkpoint)]
  if len(set(labels)) < len(labels):
    labels = [f"{i}_{lab}" for i, lab in enumerate(labels)]
  return [(lab, c, None) for lab, c in zip(labels, args.checkpoint)]


def _is_hugging_face(folder: str) -> bool:
  """Whether ``folder`` holds a Hugging Face checkpoint: a config.json stating a
  model_type (a rankjax run's config.json states none)."""
  config = pathlib.Path(folder) / "config.json"
  try:
    stated = json.loads(config.read_text())
  except (OSError, ValueError):
    return False
  return isinstance(stated, dict) and "model_type" in stated


def _check_steps(steps: list[int], saved: list[int]) -> None:
  """Refuses steps the run did not save, listing those it did."""
  missing = [s for s in steps if s not in saved]
  if missing:
    plural = "s" if len(missing) > 1 else ""
    raise UserError(f"no checkpoint at step{plural} {', '.join(map(str, missing))}; the run "
                     f"has steps {', '.join(map(str, saved))}")


def _ints(spec: str, flag: str) -> list[int]:
  try:
    return [int(x) for x in spec.split(",") if x.strip()]
  except ValueError:
    raise UserError(f"{flag} {spec!r}: comma-separated integers or 'all'") from None


def jacobian_bytes(model, tokens: int) -> int:
  """An estimate of the memory of one attention sublayer's token Jacobian: ``jax.jacfwd``
  pushes d tangents through the sublayer on all T tokens, each carrying the (H, T, T)
  probabilities and about eight (T, d) activations."""
  d, h = model.d_model, model.num_heads
  itemsize = np.dtype(model.description.get("compute_dtype", "float32")).itemsize
  return itemsize * d * (h * tokens * tokens + 8 * tokens * d)


def _check_jacobian_memory(model, tokens: int) -> None:
  from rankjax._src.analyze import checkpoints
  free = checkpoints.available_bytes(checkpoints.Placement())
  need = jacobian_bytes(model, tokens)
  if need > free:
    fits = max(t for t in range(1, tokens + 1) if jacobian_bytes(model, t) <= free) \
        if jacobian_bytes(model, 1) <= free else 0
    raise UserError(f"--measures jacobian at d={model.d_model}, {tokens} tokens needs about "
                     f"{need / 2**30:.0f} GiB for an attention sublayer's d tangents; "
                     f"{free / 2**30:.0f} GiB are free: use --tokens {fits} or fewer, or "
                     "leave jacobian out of --measures")


def _placement(args):
  """The devices and dtype of the weights: a ``(1, n)`` mesh over ``--mesh-fsdp`` local
  devices (0: all) when n > 1."""
  import jax
  from rankjax._src.analyze import checkpoints
  from rankjax._src.train import sharding
  devices = jax.local_devices()
  n = len(devices) if args.mesh_fsdp == 0 else args.mesh_fsdp
  if not 1 <= n <= len(devices):
    raise UserError(f"--mesh-fsdp {args.mesh_fsdp}: this host has {len(devices)} devices")
  mesh = sharding.make_mesh(data=1, fsdp=n, devices=devices[:n]) if n > 1 else None
  return checkpoints.Placement(mesh, args.dtype)


def _write(out: pathlib.Path, result: dict, measures: set[str]) -> None:
  from rankjax._src import report
  out.mkdir(parents=True, exist_ok=True)
  (out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
  if "stream" in measures or "jacobian" in measures:
    _figure(result, out / "analysis.png")
  report.build_analysis_report(out, result)


def _outputs(out: pathlib.Path, targets) -> list[pathlib.Path]:
  """What ``run`` writes: each target's analysis files, and a trajectory's."""
  files = [(out / label if label else out) / f"analysis.{ext}" for label, _, _ in targets
           for ext in ("json", "png", "html")]
  return files + ([out / "trajectory.json", out / "trajectory.png"] if len(targets) > 1 else [])


def run(args) -> int:
  from rankjax._src import provenance
  from rankjax._src.analyze import checkpoints, trajectory
  from rankjax._src import storage
  measures = {x.strip() for x in args.measures.split(",") if x.strip()}
  unknown = measures - set(MEASURES)
  if unknown or not measures:
    raise UserError(f"--measures: {', '.join(sorted(unknown)) or 'none'}; choose from "
                     f"{', '.join(MEASURES)}")
  out = pathlib.Path(args.out)
  storage.check_output(str(out), "--out")
  targets = _targets(args)
  storage.check_new_outputs(_outputs(out, targets), f"--out {args.out}", args.overwrite)
  placement = _placement(args)
  seqs = positions = tokenizer = None
  results = []
  for label, path, step in targets:
    start = time.time()
    model = checkpoints.open_checkpoint(path, step, placement=placement,
                                        layer_at_a_time=args.layer_at_a_time)
    if seqs is None:      # the same token sequences for every checkpoint
      ids, tokenizer = _token_ids(args, model)
      try:
        seqs, shape_note = _sequences(ids, args, model)
      except UserError as e:
        if tokenizer != BYTES:
          raise
        raise UserError(f"{e} ({BYTES_NOTE})") from None
      positions = _positions(args.positions, seqs.shape[1])
      if "jacobian" in measures:
        _check_jacobian_memory(model, seqs.shape[1])
      # what the input became, said once every argument is known to be good
      if tokenizer == BYTES:
        print(f"rankjax analyze: {BYTES_NOTE}", file=sys.stderr)
      if shape_note:
        print(f"rankjax analyze: {shape_note}", file=sys.stderr)
    elif seqs.max() >= model.vocab_size or seqs.shape[1] > model.max_len:
      raise UserError(f"{model.source}: its vocabulary or positions do not fit the "
                       "sequences of the first checkpoint")
    result = {"source": model.source, "family": model.family, "model": model.description,
              "tokenizer": tokenizer, "tokens": int(seqs.size), "sequences": int(seqs.shape[0]),
              "sequence_length": int(seqs.shape[1]), "positions": positions,
              "measures": sorted(measures)}
    result.update(analyze(model, seqs, positions, measures, not args.no_paths))
    result["seconds"] = time.time() - start
    result["provenance"] = provenance.provenance(result["seconds"])
    _write(out / label if label else out, result, measures)
    results.append((label, step, result))
    print(f"rankjax analyze: {out / label / 'analysis.json'} ({result['seconds']:.1f} s)")
  if len(results) > 1:
    traj = trajectory.collect(results)
    (out / "trajectory.json").write_text(json.dumps(traj, indent=1) + "\n")
    trajectory.figure(traj, out / "trajectory.png")
    print(f"rankjax analyze: {out / 'trajectory.json'}, {out / 'trajectory.png'}")
  return 0
