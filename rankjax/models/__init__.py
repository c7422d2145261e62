"""Models: the papers' Transformer decoder and residual MLP, as flax modules.

The public face of ``rankjax.models`` (the implementation is ``rankjax._src.models``).

- ``DecoderLM``: the decoder-only LM of the Post-Norm and softmax-sensitivity papers
  (Pre-/Post-Norm, GPT-2 and Llama forms); ``CausalSelfAttention``: its attention;
  ``intermediate_grads``: the gradients at each layer's output (postnorm Fig 5);
- ``ResidualMLP``: ``h = R(h + beta * B(f(P(h))))`` (Transforming Rank Eq. 17), and
  its pieces as pure functions for the Jacobian studies: ``block_fn``, ``branch_out``,
  ``stack_forward``, ``skip_flags``, ``gain_names``, ``matrix_shapes``;
- ``NORM``: the logical axis that marks a norm's gain or bias where a parameter is
  created (``nn.with_logical_partitioning(init, (NORM,))``): it keeps its own dtype under
  mixed precision and is no matmul in the FLOP count;
- ``normalize``: the norms (LayerNorm, RMSNorm) as one function;
- ``load_hf``, ``gpt2_config``: a Hugging Face checkpoint (GPT-2, the Llama family) as
  a ``DecoderLM`` and its parameters, from local files.
"""
from rankjax._src.models.attention import CausalSelfAttention
from rankjax._src.models.blocks import (
    block_fn,
    branch_out,
    gain_names,
    matrix_shapes,
    skip_flags,
    stack_forward,
)
from rankjax._src.models.hf import gpt2_config, load_hf
from rankjax._src.models.mlp import ResidualMLP
from rankjax._src.models.norms import normalize
from rankjax._src.models.transformer import DecoderLM, intermediate_grads
from rankjax._src.numerics import NORM

__all__ = [
    "NORM",
    "CausalSelfAttention",
    "DecoderLM",
    "ResidualMLP",
    "block_fn",
    "branch_out",
    "gain_names",
    "gpt2_config",
    "intermediate_grads",
    "load_hf",
    "matrix_shapes",
    "normalize",
    "skip_flags",
    "stack_forward",
]
