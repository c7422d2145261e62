"""rankjax: rank collapse in deep residual networks and Transformers, in JAX/Flax.

Re-exports only; the code lives in the modules below (map: docs/architecture.md).
The public API is ``__all__`` here and in the sub-packages (``measure``, ``models``,
``train``, ``data``, ``studies``): the names and modules they list; what a study
imports comes from there (tests/studies/test_study_imports.py).
"""

from rankjax.config import MLPConfig, TrainConfig, TransformerConfig
from rankjax.measure.engine import BlockJacobianMethod, JacobianBlock
from rankjax.measure.jacobians import JacobianStudy, StudyOptions, mlp_jacobian_study
from rankjax.measure.losses import cross_entropy, frequency_loss
from rankjax.measure.paths import PathSums, path_sums
from rankjax.measure.sensitivity import (
    attention_statistics,
    gradient_spikes,
    softmax_jacobian_inf_to_one,
    theta_bracket,
    theta_certificate,
    theta_exact,
)
from rankjax.measure.similarity import prefix_average_matrix, token_similarity
from rankjax.measure.spectra import effective_rank, stable_rank
from rankjax.models.mlp import ResidualMLP
from rankjax.models.transformer import DecoderLM

__version__ = "0.1.0"


def __getattr__(name: str):
  """``load_run`` on first use: it brings Orbax and grain, which ``import rankjax`` does
  not load."""
  if name == "load_run":
    from rankjax.train.run_reader import load_run
    return load_run
  raise AttributeError(f"module 'rankjax' has no attribute {name!r}")

__all__ = [
    # public modules and sub-packages (imported by name, not loaded here)
    "config",
    "data",
    "fast_paths",
    "measure",
    "models",
    "plotting",
    "studies",
    "train",
    # names
    "BlockJacobianMethod",
    "DecoderLM",
    "JacobianStudy",
    "MLPConfig",
    "PathSums",
    "JacobianBlock",
    "ResidualMLP",
    "StudyOptions",
    "TrainConfig",
    "TransformerConfig",
    "__version__",
    "attention_statistics",
    "cross_entropy",
    "effective_rank",
    "frequency_loss",
    "gradient_spikes",
    "load_run",
    "mlp_jacobian_study",
    "path_sums",
    "prefix_average_matrix",
    "softmax_jacobian_inf_to_one",
    "stable_rank",
    "theta_bracket",
    "theta_certificate",
    "theta_exact",
    "token_similarity",
]
