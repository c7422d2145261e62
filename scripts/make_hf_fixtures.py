"""Writes tiny random Hugging Face checkpoints and transformers' own outputs on them, the
fixtures that ``tests/models/test_hf_exact.py`` compares rankjax's forward pass with.

Needs ``transformers`` and the CPU build of torch (not in rankjax's install or test
extra): ``pip install torch==2.13.0 transformers`` in a separate environment, then

  python scripts/make_hf_fixtures.py OUT_DIR        (default tests/fixtures/hf)

For each model, ``OUT_DIR/<name>/`` gets ``config.json`` and ``model.safetensors``
(``save_pretrained(..., safe_serialization=True)``) and ``expected.npz``: the token ids,
every entry of ``output_hidden_states`` (``hidden_states``, (L+1, T, d); the last one
after the final norm, as transformers returns it) and the logits (T, V), float32, from
``model.eval()`` under ``torch.no_grad()``. Weights are drawn with a larger std than
the models' init (0.2, gains 1 + 0.1 N(0, 1), biases 0.1 N(0, 1)), so that every
parameter and every layer moves the outputs well above float32 rounding.
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import torch
import transformers

SEED, TOKENS = 0, 12


def _randomize(model: torch.nn.Module) -> None:
  gen = torch.Generator().manual_seed(SEED)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
      if name.endswith("bias"):
        p.copy_(0.1 * noise)
      elif p.ndim == 1:                       # LayerNorm / RMSNorm gains
        p.copy_(1.0 + 0.1 * noise)
      else:
        p.copy_(0.2 * noise)


def _save(name: str, model, out: pathlib.Path) -> None:
  _randomize(model)
  model.eval()
  folder = out / name
  model.save_pretrained(folder, safe_serialization=True)
  vocab = model.config.vocab_size
  ids = torch.tensor([[(7 * i + 3) % vocab for i in range(TOKENS)]])
  with torch.no_grad():
    res = model(ids, output_hidden_states=True)
  np.savez(folder / "expected.npz", token_ids=ids[0].numpy(),
           hidden_states=np.stack([h[0].numpy() for h in res.hidden_states]).astype(np.float32),
           logits=res.logits[0].numpy().astype(np.float32))
  meta = {"transformers": transformers.__version__, "torch": torch.__version__,
          "seed": SEED, "tokens": TOKENS}
  (folder / "versions.json").write_text(json.dumps(meta, indent=1) + "\n")
  print(f"{folder}: {sum(p.numel() for p in model.parameters())} parameters")


def main(out: str = "tests/fixtures/hf") -> None:
  out = pathlib.Path(out)
  torch.manual_seed(SEED)
  _save("gpt2", transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4,
      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)), out)
  _save("llama_gqa", transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)), out)
  # Llama 3.1's RoPE scaling, with a short original context so that at d_head = 8 one
  # frequency is kept, one interpolated and two divided by the factor
  _save("llama3_rope", transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=53, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
      rms_norm_eps=1e-5, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8},
      tie_word_embeddings=True)), out)
  _save("qwen2", transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      vocab_size=71, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)), out)
  # YaRN (Qwen2's long-context RoPE): at d_head = 16 the ramp runs over dimensions 1..5
  # of 8; attention factor 0.1 ln 4 + 1 (last: the fixtures above keep their draws)
  _save("qwen2_yarn", transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      vocab_size=59, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
      rope_scaling={"rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 1024})), out)


if __name__ == "__main__":
  main(*sys.argv[1:])
