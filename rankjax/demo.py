"""``rankjax demo``: a first look at rank collapse at initialization, in about a minute.

The placeholder main job until the tour lands. For each normalization placement it
measures, at initialization:

* the residual MLP of Transforming Rank (ReLU, 4x expansion, alpha = beta = 1): the
  effective rank of the input-output Jacobian dh_l/dh_0 divided by d, per depth
  (paper Eq. 3, Fig 4a) -- Post-Norm collapses, Pre-Norm and Output-Norm keep a floor;
* the decoder LM of the Post-Norm collapse paper (RMSNorm, SwiGLU, its init): the
  token similarity of each layer's residual sum Y_2^l on random tokens (Def 2.1,
  Fig 1) -- Post-Norm similarity climbs faster with depth than Pre-Norm.

Results go to ``OUT/demo.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from rankjax.config import MLPConfig, TransformerConfig
from rankjax.measure.jacobians import mlp_jacobian_study
from rankjax.measure.similarity import token_similarity
from rankjax.models.transformer import DecoderLM


def mlp_erank_by_placement(depth: int, width: int, seeds: int, key: jax.Array) -> dict:
  out = {}
  for position in ("pre", "post", "output", "none"):
    cfg = MLPConfig(depth=depth, width=width, norm_position=position)
    study = mlp_jacobian_study(cfg, key, num_inputs=1, num_seeds=seeds, path_sums=False)
    out[position] = np.asarray(study.erank).tolist()
  return out


def lm_similarity_by_placement(num_layers: int, d_model: int, seq_len: int,
                               key: jax.Array) -> dict:
  out = {}
  tokens = jax.random.randint(key, (2, seq_len), 0, 257)
  for position in ("pre", "post"):
    cfg = TransformerConfig(num_layers=num_layers, d_model=d_model, num_heads=4,
                            d_ff=3 * d_model, max_seq_len=seq_len, norm_position=position)
    model = DecoderLM(cfg)
    variables = jax.jit(model.init)(jax.random.key(1), tokens)

    @jax.jit
    def similarity(params):
      _, state = model.apply({"params": params}, tokens, capture=True,
                             mutable=["intermediates"])
      y2_LxBxTxD = state["intermediates"]["layers"]["y2"][0]
      return jnp.mean(token_similarity(y2_LxBxTxD), axis=-1)

    out[position] = np.asarray(similarity(variables["params"])).tolist()
  return out


def run(out_dir: str, *, small: bool = False) -> dict:
  key = jax.random.key(0)
  depth, width, seeds = (8, 32, 2) if small else (48, 128, 4)
  layers, d_model, seq_len = (4, 32, 32) if small else (24, 128, 128)
  print(f"residual MLP: L={depth}, d={width}, {seeds} seeds; effective rank of dh_l/dh_0 / d")
  erank = mlp_erank_by_placement(depth, width, seeds, key)
  for position, values in erank.items():
    print(f"  {position:7s} l=1: {values[0]:.3f}  l={depth}: {values[-1]:.3f}")
  print(f"decoder LM: {layers} layers, d={d_model}, n={seq_len}; token similarity of Y_2^l")
  sim = lm_similarity_by_placement(layers, d_model, seq_len, key)
  for position, values in sim.items():
    print(f"  {position:7s} l=1: {values[0]:.3f}  l={layers}: {values[-1]:.3f}")
  result = {"mlp_erank_over_d": erank, "lm_token_similarity_y2": sim,
            "settings": {"mlp": [depth, width, seeds], "lm": [layers, d_model, seq_len]}}
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / "demo.json").write_text(json.dumps(result, indent=2))
  print(f"wrote {out / 'demo.json'}")
  return result


def add_parser(sub) -> None:
  p = sub.add_parser("demo", help="rank collapse at initialization: MLP Jacobian rank and "
                                  "LM token similarity per placement (about a minute)")
  p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
  p.add_argument("--small", action="store_true", help="a smaller, seconds-long version")
  p.set_defaults(func=lambda args: run(args.out, small=args.small) and 0)
