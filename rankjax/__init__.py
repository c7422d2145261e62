"""rankjax: rank collapse in deep residual networks and Transformers, in JAX/Flax.

The public API is this package and its packages' faces, each a short documented list
(``__all__``): ``rankjax.config``, ``rankjax.data``, ``rankjax.models``,
``rankjax.measure``, ``rankjax.train``, ``rankjax.studies`` (map: docs/architecture.md,
"The public face"). Everything else is ``rankjax._src``: private, free to change. A
study imports only the faces (tests/studies/test_study_imports.py).

Here, the names of the README's first look (the same objects as the faces'):
``MLPConfig``, ``TransformerConfig``, ``ResidualMLP``, ``DecoderLM``,
``mlp_jacobian_study``, ``token_similarity``, ``theta_exact``, ``frequency_loss``,
``load_run``.
"""
import importlib

from rankjax._src.config import MLPConfig, TransformerConfig
from rankjax._src.measure.jacobians import mlp_jacobian_study
from rankjax._src.measure.losses import frequency_loss
from rankjax._src.measure.sensitivity import theta_exact
from rankjax._src.measure.similarity import token_similarity
from rankjax._src.models.mlp import ResidualMLP
from rankjax._src.models.transformer import DecoderLM

from rankjax._src import __version__  # noqa: E402  (one place: rankjax._src)

FACES = ("config", "data", "measure", "models", "studies", "train")


def __getattr__(name: str):
  """The faces on first use (``rankjax.train`` brings Orbax and grain, which
  ``import rankjax`` does not load), and ``load_run``."""
  if name in FACES:
    return importlib.import_module(f"rankjax.{name}")
  if name == "load_run":
    from rankjax._src.train.run_reader import load_run
    return load_run
  raise AttributeError(f"module 'rankjax' has no attribute {name!r}")


__all__ = [
    # the faces (imported on first use)
    "config",
    "data",
    "measure",
    "models",
    "studies",
    "train",
    # the README's first look
    "DecoderLM",
    "MLPConfig",
    "ResidualMLP",
    "TransformerConfig",
    "__version__",
    "frequency_loss",
    "load_run",
    "mlp_jacobian_study",
    "theta_exact",
    "token_similarity",
]
