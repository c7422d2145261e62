"""Parameters that declare their logical axes where they are created.

Every ``self.param`` of the library's models wraps its initializer in
``flax.linen.with_logical_partitioning(init, names)``: ``names`` are the parameter's
logical axes (``"embed"`` the d_model axis of the residual stream, ``"mlp"`` the hidden
width, ``"heads"`` the H*d_head axis, ``"vocab"``, ``"length"``, ``"input"``,
``"classes"``; ``numerics.NORM`` marks a norm's gain or bias, the kind that stays in its
own dtype and is no matmul weight), and the layer stack adds ``"layers"`` in front
(``nn.scan``'s ``metadata_params`` / the MLP's stacked blocks). The training code reads
them from an abstract init (``rankjax._src.train.tasks.Task.param_axes``) and maps them to the
mesh (``rankjax._src.train.sharding``).

The arrays themselves stay plain: every module of the library that creates parameters
is a ``PlainInit``, whose ``init`` returns unboxed parameters (what the optimizer,
checkpoints and every caller see); ``init_annotated`` returns the boxed tree
(``nn.LogicallyPartitioned`` leaves). A plug-in model need not be one: ``Task.param_axes``
reads the boxes of ``init_annotated`` where there is one, else of ``init``.
"""

from __future__ import annotations

from typing import Any

import jax
from flax.core import meta
from jax.sharding import PartitionSpec as P

from rankjax._src.errors import UserError
from rankjax._src.numerics import NORM


class PlainInit:
  """Mixin for a top-level ``nn.Module``: ``init`` returns plain arrays, ``init_annotated``
  the parameters boxed with their logical axes (same arguments as ``nn.Module.init``)."""

  def init(self, *args, **kwargs):
    return meta.unbox(super().init(*args, **kwargs))

  def init_annotated(self, *args, **kwargs):
    return super().init(*args, **kwargs)


# The logical axis name of a parameter created without logical axes, under a plug-in's
# fallback (``logical_axes``): ``rankjax._src.train.sharding.param_spec`` shards such a one
# along its largest dimension ``fsdp`` divides.
UNANNOTATED = "unannotated"


def logical_axes(boxed: Any, stacked_roots: tuple[str, ...] = (), fallback: bool = False) -> Any:
  """The tree of ``PartitionSpec``s of logical names of ``boxed`` (``init_annotated``'s
  params, arrays or ShapeDtypeStructs). An unannotated leaf is a one-line UserError naming
  its path, unless ``fallback``: then a 1-D one is ``P(NORM)`` (replicated, kept in its
  dtype, no matmul), a scalar ``P()``, and a larger one ``P(UNANNOTATED, ...)`` (with
  ``"layers"`` first under one of ``stacked_roots``)."""

  def leaf(path, x):
    if isinstance(x, meta.AxisMetadata):
      names = tuple(x.names) if hasattr(x, "names") else ()
      if len(names) != len(x.unbox().shape):
        raise UserError(f"parameter {_path(path)}: {len(names)} logical axes {names} for "
                        f"shape {tuple(x.unbox().shape)}")
      return P(*names)
    if not fallback:
      raise UserError(f"parameter {_path(path)} declares no logical axes: create it with "
                      "flax.linen.with_logical_partitioning(init, names), or let the task "
                      "opt into the fallback (Task.unannotated_params='fallback')")
    ndim = len(x.shape)
    if ndim <= 1:
      return P(*(NORM,) * ndim)
    stacked = getattr(path[0], "key", None) in stacked_roots
    return P(*(("layers",) if stacked else ()), *(UNANNOTATED,) * (ndim - int(stacked)))

  return jax.tree_util.tree_map_with_path(
      leaf, boxed, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))


def _path(path: tuple[Any, ...]) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
