"""The paper configs' models: exact parameter counts and what each paper config names."""

import json

import jax
import pytest

from rankjax._src import config as config_lib
from rankjax._src.config import TrainConfig
from rankjax._src.train.tasks import count_params, make_task
from tests.train.conftest import ROOT

CONFIGS = ROOT / "experiments" / "configs"


def _count(cfg: TrainConfig) -> int:
  task = make_task(cfg)
  return count_params(jax.eval_shape(task.init, jax.random.key(0)))


def _closed_form(lm, vocab_rows: int) -> int:
  """Embedding (+ untied head) + positions + L layers (4 d^2 attention, 2 or 3 d d_ff
  FFN, the layer's norms) + embed/final norms; no linear biases (softmax App D)."""
  d, f = lm.d_model, lm.d_ff
  per_norm = d * (2 if lm.bias_of(lm.norm_op) else 1)
  layer_norms = sum(1 for op in lm.norm_ops for _ in range(2) if op != "none")
  layer = 4 * d * d + (3 if lm.ffn == "swiglu" else 2) * d * f + layer_norms * per_norm
  n = vocab_rows * d * (1 if lm.tie_embeddings else 2) + lm.num_layers * layer
  n += lm.max_seq_len * d if lm.pos_embedding == "learned" else 0
  n += per_norm * (int(lm.uses_embed_norm) + int(lm.uses_final_norm))
  return n


def test_gpt2_774m_parameter_count_is_exact():
  cfg = config_lib.from_json(TrainConfig, CONFIGS / "gpt2_774m.json")
  lm = cfg.model
  assert (lm.num_layers, lm.d_model, lm.num_heads, lm.d_head, lm.d_ff, lm.max_seq_len) == (
      36, 1280, 20, 64, 5120, 1024)                     # softmax paper App D
  assert lm.norm_bias and lm.norm_op == "layer" and lm.tie_embeddings
  n = _count(cfg)
  assert n == _closed_form(lm, lm.padded_vocab_size) == 773_675_520
  # without the 47 pad rows of the table (50257 -> 50304): 773.6M, the paper's "774M"
  real = _closed_form(lm, lm.vocab_size)
  assert real == 773_615_360 and round(real / 1e6) == 774


def test_postnorm_48l_parameter_count_is_exact():
  cfg = config_lib.from_json(TrainConfig, CONFIGS / "postnorm_48l_d512_c4.json")
  lm = cfg.model
  assert lm.padded_vocab_size == lm.vocab_size == 32000
  n = _count(cfg)
  assert n == _closed_form(lm, 32000) == 196_395_520
  # tied input/output embeddings would give the paper's "about 180M" (Sec 4)
  assert round((n - 32000 * 512) / 1e6) == 180


@pytest.mark.parametrize("name,suffix", [("postnorm_48l_d512_c4", ".model"),
                                         ("gpt2_774m", ".tiktoken")])
def test_paper_configs_name_their_tokenizer(name, suffix):
  """Llama-2's sentencepiece model (V = 32000) and GPT-2's BPE (V = 50257)."""
  data = json.loads((CONFIGS / f"{name}.json").read_text())
  assert data["tokenizer"].endswith(suffix)
