"""Configs: what a model and a training run are, as frozen dataclasses read from JSON.

The public face of ``rankjax.config`` (the implementation is ``rankjax._src.config``,
private and free to change). A bad field raises ``ValueError`` naming the field and
its allowed values.

- ``TransformerConfig``, ``MLPConfig``: the two model families (``ModelConfig`` is the
  base a plug-in subclasses, ``register_model_config`` adds a ``model.kind``);
- ``TrainConfig``: a training run (its model, optimizer, data, diagnostics);
- ``from_json`` / ``to_json`` / ``to_dict``: the JSON form (format 3; older run folders
  are converted on read); ``override``: ``--set path=value`` applied to a config;
- ``check``: the one validation helper a plug-in's ``__post_init__`` calls;
  ``UserError`` (a ``ValueError``): the one class of bad input, which every command
  reports in one line (a plug-in's diagnostic raises it to refuse a model).
"""
from rankjax._src.config import (
    MLPConfig,
    ModelConfig,
    TrainConfig,
    TransformerConfig,
    check,
    from_json,
    override,
    register_model_config,
    to_dict,
    to_json,
)
from rankjax._src.errors import UserError

__all__ = [
    "MLPConfig",
    "ModelConfig",
    "TrainConfig",
    "TransformerConfig",
    "UserError",
    "check",
    "from_json",
    "override",
    "register_model_config",
    "to_dict",
    "to_json",
]
