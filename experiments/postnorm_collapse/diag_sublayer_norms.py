"""Extra training diagnostic for App F.4's masking rule: sublayer gradient norms.

Registers ``"postnorm_sublayer_norms"`` (LM runs; shares the ``postnorm`` capture).
Keys (``L`` = layers; k = 1 attention, k = 2 FFN), read back as
``"postnorm_sublayer_norms/<key>"``:

  dx_norm_k   (L,) ||dL/dX_k^l||_F, the gradient at the sublayer input (numerator
              of alpha_k^l, Def 3.5)
  dy_norm_k   (L,) ||dL/dY_k^l||_F, the gradient at the residual sum = the
              sublayer's output side (denominator of alpha_k^l)

Both are Frobenius norms over the whole diagnostic batch, as ``alpha_k^l`` in
``rankjax.train.diagnostics_postnorm``. App F.4 masks alpha and c "when the
submodule's input and output gradient norm fall below 1e-10" (Figs 12-20); the
``postnorm`` diagnostic keeps only the ratio, so these norms are saved here.
Import this module before training (``collapse_study.train_run`` does).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rankjax.train import diagnostics

Array = jax.Array
NAME = "postnorm_sublayer_norms"


def _fro_norm_L(x_LxBxTxD: Array) -> Array:
  x = jnp.asarray(x_LxBxTxD, jnp.float32)
  return jnp.sqrt(jnp.sum(x * x, axis=(-3, -2, -1)))


@diagnostics.register(NAME, needs_capture=True)
def sublayer_norms(d: diagnostics.DiagInputs) -> dict[str, Array]:
  """||dL/dX_k^l||_F and ||dL/dY_k^l||_F per layer (the parts of Def 3.5's alpha)."""
  if d.kind != "lm" or d.activation_grads is None:
    raise ValueError(f"the {NAME!r} diagnostic needs an LM run (model='lm')")
  g = d.activation_grads
  return {f"d{s}_norm_{k}": _fro_norm_L(g[f"{s}{k}"]) for k in (1, 2) for s in ("x", "y")}
