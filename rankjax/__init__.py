"""rankjax: rank collapse in deep residual networks and Transformers, in JAX/Flax.

Re-exports only; the code lives in the modules below (see ARCHITECTURE.md).
"""

from rankjax.config import MLPConfig, TrainConfig, TransformerConfig
from rankjax.models.mlp import ResidualMLP
from rankjax.models.transformer import DecoderLM

__version__ = "0.1.0"

__all__ = [
    "DecoderLM",
    "MLPConfig",
    "ResidualMLP",
    "TrainConfig",
    "TransformerConfig",
    "__version__",
]
