"""The models: the decoder (``transformer``), its blocks, attention and norms, the
residual MLP, the Hugging Face converter (GPT-2 and the Llama family as the decoder).

The implementation (private); the public names are ``rankjax.models``.
"""

__all__ = [
    "activations",
    "attention",
    "blocks",
    "hf",
    "mlp",
    "norms",
    "sites",
    "transformer",
]
