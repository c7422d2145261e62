"""``rankjax analyze`` on the tiny Hugging Face fixtures (tests/fixtures/hf, written by
transformers) and on a rankjax run: the measures against independent computations
(transformers' own hidden states; a direct SVD; the engine's reconstruction), the input
paths (token ids, tokenizer.json, byte fallback) and one-line errors (exit 2)."""
import json
import pathlib

import numpy as np
import pytest

from rankjax._src import cli
from rankjax._src.measure import similarity

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"


def _ids_file(tmp_path, ids) -> str:
  path = tmp_path / "ids.txt"
  path.write_text(" ".join(str(int(i)) for i in ids))
  return str(path)


def test_gpt2_analysis_matches_transformers_streams(tmp_path, capsys):
  expected = np.load(FIXTURES / "gpt2" / "expected.npz")
  out = tmp_path / "out"
  ids = _ids_file(tmp_path, expected["token_ids"])
  assert cli.main(["analyze", str(FIXTURES / "gpt2"), "--out", str(out), "--token-ids", ids,
                   "--tokens", "12", "--sequences", "1", "--positions=-1,4"]) == 0
  r = json.loads((out / "analysis.json").read_text())
  assert (r["family"], r["tokens"], r["positions"]) == ("decoder", 12, [11, 4])
  assert (r["model"]["model_type"], r["model"]["norm_op"], r["model"]["ffn_bias"]) == (
      "gpt2", "layer", True)
  assert r["model"]["parameters"] == 27936          # transformers' count (tied head)
  layers = r["layers"]          # layer 0 = the first block; the embeddings apart
  assert [l["layer"] for l in layers] == [0, 1] and (out / "analysis.png").is_file()
  page = (out / "analysis.html").read_text()
  assert "data:image/png;base64," in page and "Token similarity of the residual stream" in page
  assert f"{layers[1]['token_similarity']['mean']:.4g}" in page
  assert "<th>layer (0 = first block)</th>" in page and "<td>embeddings</td>" in page
  assert "block erank / d" in page
  # token similarity of the embeddings and of layer 0's output against transformers'
  # hidden states (the last one transformers returns is after ln_f; ours is before any
  # final norm)
  ref = np.asarray(similarity.token_similarity(expected["hidden_states"][:-1]))
  got = np.array([r["embeddings"]["token_similarity"]["mean"],
                  layers[0]["token_similarity"]["mean"]])
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  assert "branch_mean_coherence" in layers[0] and "branch_mean_coherence" not in layers[1]
  heads = layers[0]["attention"]
  assert len(heads) == 4 and "attention" in layers[1] and "attention" not in r["embeddings"]
  for h in heads:       # the certificate is a lower bound of the exact theta (App D.2)
    assert h["theta_cert"]["p5"] <= 1 and 0 <= h["entropy_norm"]["mean"] <= 1
    assert h["p_max"]["p5"] >= 1 / 12 - 1e-6
  jac = layers[1]["jacobian"]["11"]
  top = jac["block"]["top_singular_values"]
  assert top == sorted(top, reverse=True) and jac["block"]["erank"] <= 32
  depth = r["through_depth"]["11"]
  assert len(depth["erank_over_d"]) == 4 and depth["reconstruction_error"] < 1e-5
  assert abs(sum(depth["order_profile"]) - 1) < 1e-5
  assert r["provenance"]["commit"]
  # the next-token loss on the sequence against transformers' logits
  logits = expected["logits"][:-1].astype(np.float64)
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  ce = np.mean(lse - logits[np.arange(11), expected["token_ids"][1:]])
  np.testing.assert_allclose(r["loss"], ce, rtol=1e-5)
  # Y_2 of layer l is its output: its sqrt(d)/||y|| factor from transformers' hidden states
  from rankjax._src.measure import gradients as gr
  mean, _ = gr.rms_factor_stats(expected["hidden_states"][1:-1, None, :11], 1e-5)
  np.testing.assert_allclose(layers[0]["gradients"]["rms_factor_mean_2"], float(mean[0]),
                             rtol=1e-4)
  assert set(layers[1]["gradients"]) >= {"alpha_1", "alpha_2", "contraction_1", "grad_norm"}


def test_llama_family_text_with_its_tokenizer_and_the_byte_fallback(tmp_path, capsys):
  tokenizers = pytest.importorskip("tokenizers")
  import shutil
  folder = tmp_path / "qwen2"
  shutil.copytree(FIXTURES / "qwen2", folder)
  text = tmp_path / "text.txt"
  text.write_text("the cat sat on the mat and the dog sat on the log " * 4)
  out = tmp_path / "bytes"
  # no tokenizer: UTF-8 bytes (ids up to 116 here) exceed Qwen2's 71 ids: one line, exit 2
  assert cli.main(["analyze", str(folder), "--out", str(out), "--text", str(text),
                   "--tokens", "8", "--measures", "stream"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "UTF-8 bytes" in err[0] and "token ids must lie in [0, 71)" in err[0]
  # a tokenizer.json in the folder (a word-level vocabulary written with `tokenizers`)
  words = sorted(set(text.read_text().split()))
  model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0])
  tok = tokenizers.Tokenizer(model)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(str(folder / "tokenizer.json"))
  out = tmp_path / "words"
  assert cli.main(["analyze", str(folder), "--out", str(out), "--text", str(text),
                   "--tokens", "8", "--sequences", "2", "--measures", "stream"]) == 0
  r = json.loads((out / "analysis.json").read_text())
  assert r["tokenizer"] == "tokenizers:tokenizer.json" and r["tokens"] == 16
  assert r["family"] == "decoder" and r["model"]["num_kv_heads"] == 2
  assert "attention" not in r["layers"][1] and "through_depth" not in r


@pytest.mark.parametrize("args, message", [
    (["--tokens", "99"], "exceeds the model's 16 positions"),
    (["--positions=12"], "outside a sequence"),
    (["--measures", "spectra"], "--measures"),
    (["--step", "3"], "--step reads a rankjax run"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
  ids = _ids_file(tmp_path, range(40))
  code = cli.main(["analyze", str(FIXTURES / "gpt2"), "--out", str(tmp_path / "o"),
                   "--token-ids", ids, "--tokens", "8", *args])
  err = capsys.readouterr().err
  assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_fewer_tokens_than_asked_are_analyzed_as_given(tmp_path, capsys):
  few = _ids_file(tmp_path, range(3, 13))
  out = tmp_path / "few"        # the defaults (2 x 64): one sequence of the 10 given
  assert cli.main(["analyze", str(FIXTURES / "gpt2"), "--out", str(out), "--token-ids", few,
                   "--measures", "stream"]) == 0
  err = capsys.readouterr().err
  assert "the input has 10 tokens, fewer than 2 sequences of 64; analyzing 1 sequence(s) " \
         "of 10 tokens" in err
  r = json.loads((out / "analysis.json").read_text())
  assert (r["sequences"], r["sequence_length"]) == (1, 10)
  more = _ids_file(tmp_path, range(20))          # whole sequences of --tokens, as many as fit
  assert cli.main(["analyze", str(FIXTURES / "gpt2"), "--out", str(tmp_path / "more"),
                   "--token-ids", more, "--tokens", "8", "--sequences", "9",
                   "--measures", "stream"]) == 0
  assert "analyzing 2 sequence(s) of 8 tokens" in capsys.readouterr().err
  assert cli.main(["analyze", str(FIXTURES / "gpt2"), "--out", str(tmp_path / "one"),
                   "--token-ids", _ids_file(tmp_path, [5])]) == 2
  err = capsys.readouterr().err
  assert "the input has 1 token(s); rankjax analyze needs at least 2" in err
  assert len(err.strip().splitlines()) == 1


def test_a_sliding_window_is_named_as_such(tmp_path, capsys):
  from rankjax._src.models import hf
  folder = hf.write_random_checkpoint(
      tmp_path / "mistral", hidden_size=16, num_layers=1, intermediate_size=24, num_heads=2,
      num_kv_heads=1, vocab_size=40, model_type="mistral", max_position_embeddings=128)
  hf = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**hf, "sliding_window": 32}))
  ids = _ids_file(tmp_path, np.arange(80) % 40)
  assert cli.main(["analyze", str(folder), "--out", str(tmp_path / "o"), "--token-ids", ids,
                   "--tokens", "64", "--sequences", "1"]) == 2
  err = capsys.readouterr().err
  assert "--tokens 64 exceeds the model's sliding window of 32 tokens (it has 128 " \
         "positions" in err and len(err.strip().splitlines()) == 1, err


def test_a_step_the_run_did_not_save_lists_those_it_did(tmp_path, capsys):
  run = tmp_path / "run"                    # only the step folders are read before refusing
  for step in (100, 200):
    (run / "checkpoints" / str(step)).mkdir(parents=True)
  ids = _ids_file(tmp_path, range(16))
  for flag in ("--steps", "--step"):
    assert cli.main(["analyze", str(run), "--out", str(tmp_path / "o"), "--token-ids", ids,
                     flag, "999"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint at step 999; the run has steps 100, 200" in err, err
    assert len(err.strip().splitlines()) == 1


def test_several_checkpoints_make_a_trajectory(tmp_path):
  ids = _ids_file(tmp_path, range(3, 43))
  out = tmp_path / "t"
  assert cli.main(["analyze", str(FIXTURES / "gpt2"), str(FIXTURES / "qwen2"), "--out",
                   str(out), "--token-ids", ids, "--tokens", "10", "--sequences", "2",
                   "--measures", "stream"]) == 0
  traj = json.loads((out / "trajectory.json").read_text())
  assert traj["labels"] == ["gpt2", "qwen2"] and traj["steps"] == [None, None]
  one = json.loads((out / "qwen2" / "analysis.json").read_text())
  assert len(one["layers"]) == one["model"]["num_layers"] == len(traj["token_similarity"][1])
  assert traj["token_similarity"][1] == [l["token_similarity"]["mean"] for l in one["layers"]]
  assert traj["embeddings"]["token_similarity"][1] == one["embeddings"]["token_similarity"]["mean"]
  assert "alpha_1" not in traj and (out / "trajectory.png").is_file()


def test_the_trajectory_has_a_column_per_layer_erank_over_d_and_the_embeddings_apart():
  from rankjax._src.analyze import trajectory

  def result(erank, embeddings):
    return {"model": {"d_model": 4}, "through_depth": {"3": {}}, "loss": 1.0,
            "embeddings": {"token_similarity": {"mean": embeddings}, "mean_spike": 0.5},
            "layers": [{"layer": l, "token_similarity": {"mean": 0.5 + l},
                        "jacobian": {"3": {"block": {"erank": erank + l}}}} for l in range(2)]}
  traj = trajectory.collect([("a", 1, result(2.0, 0.1)), ("b", 2, result(3.0, 0.2))])
  assert traj["token_similarity"] == [[0.5, 1.5], [0.5, 1.5]]
  assert traj["block_erank_over_d"] == [[0.5, 0.75], [0.75, 1.0]] and "block_erank" not in traj
  assert traj["embeddings"] == {"token_similarity": [0.1, 0.2], "mean_spike": [0.5, 0.5]}


def test_unsupported_or_missing_checkpoints(tmp_path, capsys):
  import shutil
  ids = _ids_file(tmp_path, range(8))
  wrong = tmp_path / "gpt2_wrong_dtype"
  shutil.copytree(FIXTURES / "gpt2", wrong)
  hf = json.loads((wrong / "config.json").read_text())
  (wrong / "config.json").write_text(json.dumps({**hf, "dtype": "bfloat16"}))
  assert cli.main(["analyze", str(wrong), "--out", str(tmp_path / "o"), "--token-ids", ids,
                   "--tokens", "8", "--sequences", "1"]) == 2
  assert "states dtype bfloat16; the safetensors files hold float32" in capsys.readouterr().err
  (tmp_path / "falcon").mkdir()
  (tmp_path / "falcon" / "config.json").write_text('{"model_type": "falcon"}')
  for folder, message in [(tmp_path / "falcon", "model_type='falcon' is not supported"),
                          (tmp_path / "nothing", "not found")]:
    assert cli.main(["analyze", str(folder), "--out", str(tmp_path / "o"), "--token-ids",
                     ids, "--tokens", "8", "--sequences", "1"]) == 2
    assert message in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_rankjax_run_is_analyzed_at_its_newest_checkpoint(tmp_path):
  from rankjax._src.train.loop import train
  from tests.train.conftest import tiny_lm
  cfg = tiny_lm(total_steps=4, checkpoint_every=2, max_to_keep=2, eval_every=0, diag_every=0)
  workdir = tmp_path / "run"
  train(cfg, str(workdir), progress_bar=False)
  ids = _ids_file(tmp_path, range(32, 96))
  traj_out = tmp_path / "traj"
  assert cli.main(["analyze", str(workdir), "--out", str(traj_out), "--token-ids", ids,
                   "--tokens", "16", "--sequences", "2", "--steps", "all",
                   "--measures", "stream,gradients"]) == 0
  traj = json.loads((traj_out / "trajectory.json").read_text())
  assert traj["steps"] == [2, 4] and len(traj["token_similarity"][0]) == 1   # one layer
  assert len(traj["embeddings"]["token_similarity"]) == 2
  assert len(traj["alpha_1"]) == 2 and traj["alpha_1"][0][0] is not None   # layer 0: a block
  assert (traj_out / "trajectory.png").is_file() and (traj_out / "step_4" / "analysis.html").is_file()
  for step in (None, 2):
    out = tmp_path / f"out{step}"
    argv = ["analyze", str(workdir), "--out", str(out), "--token-ids", ids, "--tokens", "16",
            "--sequences", "2"] + ([] if step is None else ["--step", str(step)])
    assert cli.main(argv) == 0
    r = json.loads((out / "analysis.json").read_text())
    assert r["model"]["step"] == (4 if step is None else 2)
    assert r["model"]["norm_position"] == "pre" and len(r["layers"]) == 1


def test_attention_theta_compares_like_with_like_and_stays_in_0_1(tmp_path, capsys):
  """theta_exact covers the rows of at most 16 keys, theta_cert every row: their
  percentiles compared different rows (GPT-2's certificate mean 0.957 above the exact
  0.953) and theta_exact's p95 read 1.0000002. The certificate over theta_exact's rows
  sits beside it, at or below it percentile by percentile; every value is in [0, 1];
  analysis.json and the page say which rows each covers."""
  out = tmp_path / "out"
  ids = _ids_file(tmp_path, np.arange(2, 26))
  assert cli.main(["analyze", str(FIXTURES / "llama_gqa"), "--out", str(out), "--token-ids",
                   ids, "--tokens", "24", "--sequences", "1", "--measures", "attention"]) == 0
  r = json.loads((out / "analysis.json").read_text())
  assert r["attention_rows"]["theta_exact, theta_cert_exact_rows"].startswith(
      "the queries t = 1 .. 15")
  assert r["attention_rows"]["entropy_norm, p_max, theta_cert"].startswith(
      "every query t = 1 .. 23")
  for layer in r["layers"]:
    for h in layer["attention"]:
      for name in ("theta_cert", "theta_exact", "theta_cert_exact_rows"):
        assert all(0 <= v <= 1 for v in h[name].values()), (name, h[name])
      for stat, exact in h["theta_exact"].items():
        assert h["theta_cert_exact_rows"][stat] <= exact + 1e-6, (stat, h)
  page = (out / "analysis.html").read_text()
  assert "median theta_cert (short rows)" in page and "the queries t = 1 .. 15" in page
