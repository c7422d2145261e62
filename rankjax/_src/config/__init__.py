"""Frozen dataclass configs with validation, JSON round trips and ``key=value`` overrides.

Every model is configured by one of these. Bad input raises ``ValueError`` naming the
field and, where the field takes one of a set of values, the allowed values. Split by
concern: ``models`` (the model configs and the registry of kinds), ``training``
(``TrainConfig``), ``io`` (dicts, JSON, ``--set``, diffs, the JSON format),
``validation`` (``check``, the one validation helper) and ``fields`` (``run_field``: a
field's run-control metadata, the per-run scalars of one program among them).
"""

from rankjax._src.config.io import (FORMAT, FormatError, JsonConfig, convert_file, diff,
                               from_dict, from_json, override, to_dict, to_json)
from rankjax._src.config.models import (MLP_ACTIVATIONS, MODEL_CONFIGS, NORM_LOCATIONS,
                                   NORM_OPS, NORM_POSITIONS, AttentionImpl, AttnDropoutMask,
                                   AttnDropoutKernel, BranchMatrices,
                                   DType, GradReduceDType, InitScaleTo, KernelConfig,
                                   LMFFN, LMInit,
                                   MLPActivation, MLPConfig, ModelConfig, NormOp,
                                   NormPosition, PosEmbedding, PRNGImpl, RematPolicy,
                                   RopeConfig, RopeScaling, TransformerConfig, norm_ops_of,
                                   norm_position_of, register_model_config)
from rankjax._src.config.fields import (fields_with, get_path, per_run_paths, run_field,
                                   step_shape)
from rankjax._src.config.training import ComputeDType, LRSchedule, Optimizer, TrainConfig
from rankjax._src.config.validation import check

__all__ = [
    "FORMAT", "FormatError", "JsonConfig", "convert_file", "diff", "from_dict", "from_json",
    "override", "to_dict", "to_json", "MLP_ACTIVATIONS", "MODEL_CONFIGS", "NORM_LOCATIONS",
    "NORM_OPS", "NORM_POSITIONS", "AttentionImpl", "AttnDropoutMask", "AttnDropoutKernel",
    "BranchMatrices", "DType",
    "GradReduceDType", "InitScaleTo", "KernelConfig", "LMFFN", "LMInit", "MLPActivation",
    "MLPConfig",
    "ModelConfig", "NormOp", "NormPosition", "PosEmbedding", "PRNGImpl", "RematPolicy",
    "RopeConfig", "RopeScaling", "TransformerConfig", "norm_ops_of", "norm_position_of",
    "register_model_config", "ComputeDType", "LRSchedule", "Optimizer", "TrainConfig",
    "fields_with", "get_path", "per_run_paths", "run_field", "step_shape", "check",
]
