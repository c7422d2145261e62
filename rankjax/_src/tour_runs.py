"""The runs of ``rankjax tour`` (``rankjax._src.tour``): its two LMs and its residual MLPs,
full size and smoke size. Apart from the tour so that the report can tell a smoke tour's
runs (``report_story.smoke_sentence``) without importing the tour."""

from __future__ import annotations

import dataclasses

from rankjax._src.config import MLPConfig, TrainConfig, TransformerConfig

PLACEMENTS = ("pre", "post", "output", "none")


def lm_configs(smoke: bool = False) -> dict[str, TrainConfig]:
  """The two LM runs: identical but for ``norm_position``."""
  if smoke:
    lm = TransformerConfig(num_layers=4, d_model=32, num_heads=2, d_ff=96, max_seq_len=32,
                           norm_position="post")
    train = dict(total_steps=12, batch_size=4, seq_len=32, diag_every=4, log_every=4,
                 checkpoint_every=6, diag_examples=4)
  else:
    lm = TransformerConfig(num_layers=12, d_model=64, num_heads=4, d_ff=192, max_seq_len=64,
                           norm_position="post")
    train = dict(total_steps=150, batch_size=16, seq_len=64, diag_every=10, log_every=25,
                 checkpoint_every=50, diag_examples=8)
  # experiments/postnorm_collapse/configs/collapse_post_quick.json: at lr 1e-2 with no
  # warmup the Post-Norm model collapses (loss at the frequency loss, last-layer
  # similarity 1) while the Pre-Norm model at the same lr trains.
  base = TrainConfig(model=lm, learning_rate=1e-2, lr_schedule="constant",
                     warmup_steps=0, weight_decay=0.1, clip_norm=1.0, seed=0,
                     diagnostics=("basic", "postnorm", "attention"), max_to_keep=2,
                     **train)
  pre = dataclasses.replace(base, model=dataclasses.replace(lm, norm_position="pre"))
  return {"lm_post": base, "lm_pre": pre}


def mlp_config(position: str, smoke: bool = False) -> MLPConfig:
  depth, width = (6, 16) if smoke else (48, 64)
  return MLPConfig(depth=depth, width=width, norm_position=position)
