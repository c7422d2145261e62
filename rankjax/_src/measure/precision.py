"""Matmul precision of every measurement, set in one place.

JAX's float32 dots run at the backend's default precision: TF32 (10-bit mantissa
operands) on recent NVIDIA GPUs and one bf16 pass (8-bit mantissa) on TPU. That rounding
noise is larger than the collapse the Jacobian studies measure, so every measurement
entry point (block and input-output Jacobians, path sums, spectra, the GPT-2 / Llama FFN
Jacobians, the representation traces) takes a ``precision`` keyword and traces its body
under ``jax.default_matmul_precision`` (``measured``): one mechanism, written once, that
sets the ``precision``/``algorithm`` attribute of every ``dot_general`` it traces.

Names (``PRECISIONS``; the value passed to ``jax.default_matmul_precision``):

  highest   ``Precision.HIGHEST``: full float32 on every backend (FP32 GEMMs on GPU,
            6 bf16 passes on TPU). The default of every measurement.
  high      ``Precision.HIGH``: 3 bf16 passes (bf16_3x) on TPU; TF32 on GPU.
  default   no attribute: the backend's default (TF32 on GPU, 1 bf16 pass on TPU), what
            plain JAX code gets.

XLA:CPU computes float32 dots in float32 whatever the attribute. The error of the faster
names is measured on CPU by ``emulate``, which re-evaluates a traced function with every
dot's operands rounded as an algorithm rounds them (``ALGORITHMS`` maps name and backend
to 'f32', 'bf16_3x', 'tf32' or 'bf16'; round to nearest even, float32 accumulation).
Measured (Pre-Norm ReLU MLP, L=48, d=256, 4x, one seed and input; every dot of the
forward pass, block Jacobians and running product emulated; against the float64 engine):

  algorithm   rel. error of dh_L/dh_0   max_l |erank_l/erank64_l - 1|
  f32         7.2e-7                     9.6e-7
  bf16_3x     1.1e-5                     1.0e-6
  tf32        3.3e-2                     1.2e-4
  bf16        9.3e-2                     9.3e-4

(the TF32/bf16 Jacobian errors include ReLU masks flipped by the rounded forward pass).
So 'high' is safe on TPU (bf16_3x) but not on GPU (TF32); 'highest' is the default.
float64 inputs stay float64 (precision does not apply).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

PRECISIONS = {"highest": "highest", "high": "high", "default": None}
DEFAULT_PRECISION = "highest"

# What each name does to a float32 dot, per backend (the algorithm ``emulate`` rounds as;
# HIGH is bf16_3x on TPU and TF32 on A100/H100, DEFAULT bf16 on TPU and TF32 on
# A100/H100: the lax.Precision docs and jax-ml/jax issue 18934).
ALGORITHMS = {
    "tpu": {"highest": "f32", "high": "bf16_3x", "default": "bf16"},
    "gpu": {"highest": "f32", "high": "tf32", "default": "tf32"},
    "cpu": {"highest": "f32", "high": "f32", "default": "f32"},
}

_state = threading.local()


def check_precision(name: str | None) -> str:
  """The validated precision name (None means ``DEFAULT_PRECISION``)."""
  name = DEFAULT_PRECISION if name is None else name
  if name not in PRECISIONS:
    raise ValueError(f"precision={name!r}; choose one of {sorted(PRECISIONS)}")
  return name


def active_precision() -> str | None:
  """The precision of the enclosing ``measured`` call (None outside any)."""
  return getattr(_state, "name", None)


@contextlib.contextmanager
def matmul_precision(name: str | None = None):
  """Traces (and runs) the enclosed code with measurement precision ``name``."""
  name = check_precision(name)
  previous = active_precision()
  _state.name = name
  try:
    with jax.default_matmul_precision(PRECISIONS[name]):
      yield name
  finally:
    _state.name = previous


def measured(fn):
  """Adds a ``precision`` keyword to a measurement entry point.

  ``precision=None`` (the default) inherits the enclosing measurement's precision, or
  ``DEFAULT_PRECISION`` ('highest') at the outermost call; a name sets it for the call.
  Scoped at trace time, so it composes with ``jit``/``vmap``/``scan`` around or inside.
  """
  @functools.wraps(fn)
  def wrapper(*args, precision: str | None = None, **kwargs):
    if precision is None and active_precision() is not None:
      return fn(*args, **kwargs)
    with matmul_precision(precision):
      return fn(*args, **kwargs)

  sig = inspect.signature(fn)
  params = list(sig.parameters.values())
  extra = inspect.Parameter("precision", inspect.Parameter.KEYWORD_ONLY, default=None)
  at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
            len(params))
  wrapper.__signature__ = sig.replace(parameters=params[:at] + [extra] + params[at:])
  wrapper.__doc__ = (fn.__doc__ or "") + (
      "\n\n  Keyword ``precision``: matmul precision (``rankjax._src.measure.precision``; "
      "default 'highest').")
  return wrapper


def measured_at(name: str | None, fn):
  """``fn`` traced and run at precision ``name`` (for bodies handed to ``jit``)."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    with matmul_precision(name):
      return fn(*args, **kwargs)
  return wrapper


# ---------------------------------------------------------------------------
# Emulation of the faster algorithms on CPU

# algorithm -> (operand mantissa bits kept, split terms per operand)
_ALGORITHMS = {"bf16": (7, 1), "bf16_3x": (7, 2), "tf32": (10, 1), "f32": (23, 1)}


def round_mantissa(x: jax.Array, bits: int) -> jax.Array:
  """float32 ``x`` rounded to ``bits`` explicit mantissa bits, to nearest even
  (bits=7: bfloat16, 10: TF32); exponents unchanged (no overflow handling needed for
  the magnitudes measured here)."""
  if bits >= 23:
    return x
  drop = 23 - bits
  u = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  half = jnp.uint32((1 << (drop - 1)) - 1)
  u = u + half + ((u >> drop) & jnp.uint32(1))
  u = u & jnp.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
  return lax.bitcast_convert_type(u, jnp.float32)


def emulated_dot_general(lhs, rhs, name: str, **params):
  """``dot_general`` with operands rounded as algorithm ``name`` does: ``terms`` split
  terms per operand (hi, lo = x - hi, ...), the products of total order < terms summed
  (bf16_3x: hi*hi + hi*lo + lo*hi), float32 accumulation."""
  bits, terms = _ALGORITHMS[name]
  params = dict(params, precision=(lax.Precision.HIGHEST, lax.Precision.HIGHEST),
                preferred_element_type=params.get("preferred_element_type"))
  params.pop("out_sharding", None)
  if lhs.dtype != jnp.float32 or rhs.dtype != jnp.float32:
    return lax.dot_general(lhs, rhs, **params)

  def split(x):
    parts, rest = [], x
    for _ in range(terms):
      p = round_mantissa(rest, bits)
      parts.append(p)
      rest = rest - p
    return parts

  ls, rs = split(lhs), split(rhs)
  out = None
  for i in range(terms):
    for j in range(terms - i):
      term = lax.dot_general(ls[i], rs[j], **params)
      out = term if out is None else out + term
  return out


def _emulate_closed(closed, name):
  fn = lambda *args: _eval_jaxpr(closed.jaxpr, closed.consts, args, name)
  return jax.make_jaxpr(fn)(*closed.in_avals)


def _transform_param(value, name):
  if isinstance(value, jex_core.ClosedJaxpr):
    return _emulate_closed(value, name)
  if isinstance(value, tuple) and value and all(isinstance(v, jex_core.ClosedJaxpr)
                                                for v in value):
    return tuple(_emulate_closed(v, name) for v in value)
  return value


def _eval_jaxpr(jaxpr, consts, args, name):
  env = {}
  read = lambda v: v.val if isinstance(v, jex_core.Literal) else env[v]
  for v, c in zip(jaxpr.constvars, consts):
    env[v] = c
  for v, a in zip(jaxpr.invars, args):
    env[v] = a
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    if eqn.primitive is lax.dot_general_p:
      p = eqn.params
      outs = [emulated_dot_general(*invals, name, dimension_numbers=p["dimension_numbers"],
                                   preferred_element_type=p.get("preferred_element_type"))]
    elif eqn.primitive.name in ("custom_jvp_call", "custom_vjp_call"):
      inner = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
      outs = _eval_jaxpr(inner.jaxpr, inner.consts, invals, name)
    else:
      params = {k: _transform_param(v, name) for k, v in eqn.params.items()}
      outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))
      if not eqn.primitive.multiple_results:
        outs = [outs]
    for v, o in zip(eqn.outvars, outs):
      env[v] = o
  return [read(v) for v in jaxpr.outvars]


def emulate(fn, name: str):
  """``fn`` re-evaluated with every float32 dot rounded as algorithm ``name`` ('f32',
  'bf16_3x', 'tf32', 'bf16'; ``ALGORITHMS`` maps a precision and backend to one) rounds
  (see ``emulated_dot_general``): the error of a faster precision, measured on CPU.

  ``fn`` is traced once (at 'highest'), then its jaxpr is interpreted with each
  ``dot_general`` replaced (inside scans, jits, conds and custom-derivative calls too).
  Forward evaluation only.
  """
  if name not in _ALGORITHMS:
    raise ValueError(f"algorithm {name!r}; choose one of {sorted(_ALGORITHMS)}")

  def emulated(*args):
    with matmul_precision("highest"):
      closed = jax.make_jaxpr(fn)(*args)
    flat = jax.tree.leaves(args)
    outs = _eval_jaxpr(closed.jaxpr, closed.consts, flat, name)
    out_tree = jax.tree.structure(jax.eval_shape(fn, *args))
    return jax.tree.unflatten(out_tree, outs)

  return emulated


def lowered_dot_precisions(text: str) -> list[str]:
  """The precision/algorithm of every dot in StableHLO text: 'HIGHEST',
  'DEFAULT', 'HIGH', or the algorithm's operand types ('bf16 x3', 'tf32 x1')."""
  out = []
  for line in text.splitlines():
    if "stablehlo.dot_general" not in line and "stablehlo.dot " not in line:
      continue
    alg = re.search(r"lhs_precision_type = (\w+).*?num_primitive_operations = (\d+)", line)
    prec = re.search(r"precision = \[(\w+), (\w+)\]", line)
    if alg:
      out.append(f"{alg.group(1)} x{alg.group(2)}")
    elif prec:
      out.append(prec.group(1))
    else:
      out.append("DEFAULT")
  return out


def relative_error(approx, exact) -> float:
  a, e = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
  return float(np.linalg.norm(a - e) / np.linalg.norm(e))
