"""The models: the decoder (``transformer``), its blocks, attention and norms, the
residual MLP, GPT-2 and the Llama-family converter.

The public modules are listed in ``__all__``; the others are internals.
"""

__all__ = [
    "activations",
    "attention",
    "blocks",
    "gpt2",
    "hf_llama",
    "mlp",
    "norms",
    "transformer",
]
