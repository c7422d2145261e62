"""Branch Jacobians of GPT-2 checkpoints ("Transforming Rank", App B.3 Fig 12, App D.5
Fig 8c), on the forward pass of ``rankjax.models.gpt2``.

Convention (the library's, ``models.norms``): ``J[i, j] = d out_i / d in_j``, rows are
the branch output, columns the stream ``h`` it reads (``J = dB/dh``). GPT-2's Conv1D
weights are stored (in, out), so in the paper's column notation ``W_up = W_fc^T``
(m x d) and ``W_down = W_proj^T`` (d x m), and the FFN branch Jacobian of block l at
one token of the stream h entering its FFN sublayer is

    J_l = dFFN(LN_2(h))/dh = W_down diag(gelu'(z)) W_up J_LN(h),   z = LN_2(h) W_fc + b_fc

(Eq. 9 with the Pre-Norm input Jacobian, Table 2): one d x m x d GEMM, the LN Jacobian
applied by ``norms.jacobian_right``. ``ffn_block`` / ``attention_block`` are GPT-2's
adapters to the Jacobian engine (``measure.engine``). ``sublayer_jacobians`` adds the per-token
attention branch Jacobians (``jax.jacfwd``; no closed form), ``sequence_jacobians``
the whole-sequence attention Jacobians (small T). Every entry point runs at the
measurement precision (``rankjax.measure.precision``).
"""
from __future__ import annotations

import functools

import jax

from rankjax.measure import engine
from rankjax.measure import precision as precision_lib
from rankjax.models import blocks, gpt2, norms

Array = jax.Array


@precision_lib.measured
def ffn_jacobian(block: dict, h_D: Array) -> Array:
  """``J = dFFN(LN_2(h))/dh`` in closed form, (d, d) (module docstring; Eq. 9 with the
  LN Jacobian, Table 2): ``W_proj^T diag(gelu'(z)) W_fc^T J_LN(h)``."""
  x = gpt2.layer_norm(h_D, block["ln_2_scale"], block["ln_2_bias"])
  z = x @ block["fc_w"] + block["fc_b"]
  dgelu = blocks.derivative(lambda u: jax.nn.gelu(u, approximate=True), z)
  up_MxD = norms.jacobian_right(block["fc_w"].T, h_D, "layer", gpt2.LN_EPS,
                                scale_D=block["ln_2_scale"])
  return block["proj_w"].T @ (dgelu[:, None] * up_MxD)


def _heads(params: dict, num_heads: int | None) -> int:
  return gpt2.default_num_heads(params["wte"].shape[1]) if num_heads is None else num_heads


@functools.partial(jax.jit, static_argnames=("num_heads", "precision"))
@precision_lib.measured
def ffn_inputs(params: dict, tokens_T: Array, num_heads: int | None = None) -> Array:
  """The residual stream entering each block's FFN sublayer, ``(L, T, d)``:
  ``h + Attn(LN_1(h))`` with h the block input (token + position embeddings first)."""
  heads = _heads(params, num_heads)

  def step(h_TxD, block):
    mid, out = gpt2.block_forward(block, h_TxD, heads)
    return out, mid

  _, streams = jax.lax.scan(step, gpt2.embed(params, tokens_T), params["blocks"])
  return streams


@functools.partial(jax.jit, static_argnames=("precision",))
@precision_lib.measured
def ffn_jacobians(blocks: dict, h_LxD: Array) -> Array:
  """``J_l`` of every block at its stream ``h_l``, ``(L, d, d)``, jitted (``lax.map``:
  one block's d x m intermediate in memory at a time)."""
  return jax.lax.map(lambda a: ffn_jacobian(*a), (blocks, h_LxD))


def ffn_block() -> engine.ResidualBlock:
  """The engine's block of a GPT-2 FFN sublayer ``h + FFN(LN_2(h))`` (one token; Pre-LN:
  K = I), with its closed form (``ffn_jacobian``). Its parameters: one block's dict."""
  return engine.ResidualBlock(
      branch=gpt2.ffn_branch,
      branch_jacobian=lambda block, h_D: (gpt2.ffn_branch(block, h_D), ffn_jacobian(block, h_D)))


def attention_block(h_TxD: Array, position: Array | int, num_heads: int) -> engine.ResidualBlock:
  """The engine's block of a GPT-2 attention sublayer ``h + Attn(LN_1(h))`` at token
  ``position``, the other tokens of ``h_TxD`` held fixed (K = I; ``jax.jacfwd``)."""
  return engine.ResidualBlock(
      branch=lambda block, x_D: gpt2.attention_branch(
          block, h_TxD.at[position].set(x_D), num_heads)[position])


def layer_token_terms(block: dict, h_TxD: Array, position: Array | int, num_heads: int
                      ) -> tuple[Array, tuple]:
  """One block at token ``position`` of its input stream: ``(h_out, (attn, ffn, h_in_t,
  h_mid_t))``, the engine's ``BlockTerms`` of the attention (jacfwd) and FFN (closed
  form) sublayers and the token's stream entering the block and after its attention
  sublayer. ``token_block_jacobians`` scans it; ``rankjax analyze`` calls it a layer at a
  time."""
  attn = engine.block_terms(attention_block(h_TxD, position, num_heads), block,
                            h_TxD[position])
  mid, out = gpt2.block_forward(block, h_TxD, num_heads)
  ffn = engine.block_terms(ffn_block(), block, mid[position])
  return out, (attn, ffn, h_TxD[position], mid[position])


@functools.partial(jax.jit, static_argnames=("num_heads", "precision"))
@precision_lib.measured
def _token_terms(params, tokens_T, position, num_heads):
  heads = _heads(params, num_heads)

  def step(h_TxD, block):
    return layer_token_terms(block, h_TxD, position, heads)

  out, (attn, ffn, h_in, h_mid) = jax.lax.scan(step, gpt2.embed(params, tokens_T),
                                               params["blocks"])
  return attn, ffn, h_in, h_mid, out[position]


def sublayer_jacobians(params: dict, tokens_T: Array, position: Array | int,
                       num_heads: int | None = None, *, precision: str | None = None
                       ) -> dict[str, Array]:
  """Per-token branch Jacobians of every block at ``position`` (jitted; ``position``
  may be traced), ``(L, d, d)`` each:

    ``attention``: ``d Attn(LN_1(h))_t / d h_t``, the stream of the other tokens held
      fixed (the diagonal block of ``sequence_jacobians``), by ``jax.jacfwd`` (no closed
      form is used for attention);
    ``ffn``: ``d FFN(LN_2(h'))_t / d h'_t`` at the FFN input h' (closed form,
      ``ffn_jacobian``; the FFN acts on each token alone).
  """
  attn, ffn, *_ = _token_terms(params, tokens_T, position, num_heads, precision=precision)
  return {"attention": attn.branch, "ffn": ffn.branch}


def token_block_jacobians(params: dict, tokens_T: Array, position: Array | int,
                          num_heads: int | None = None, *, precision: str | None = None
                          ) -> engine.BlockJacobians:
  """The engine's ``BlockJacobians`` of the token at ``position`` through the 2L
  sublayers (attention, FFN of block 1, ...), other tokens held fixed; K = I (Pre-LN),
  the stream h_0 .. h_2L before ``ln_f``. For ``engine.measurements``."""
  attn, ffn, h_in, h_mid, last = _token_terms(params, tokens_T, position, num_heads,
                                              precision=precision)
  return engine.token_sublayers(attn, ffn, h_in, h_mid, last)


@functools.partial(jax.jit, static_argnames=("num_heads", "precision"))
@precision_lib.measured
def sequence_jacobians(params: dict, tokens_T: Array, num_heads: int | None = None) -> Array:
  """Whole-sequence Jacobian of every block's attention branch, ``(L, T, d, T, d)``:
  ``[l, t, :, s, :] = d Attn(LN_1(h))_t / d h_s`` (zero for s > t, causal), by
  ``jax.jacfwd`` over all T d inputs; for small T (memory L T^2 d^2)."""
  heads = _heads(params, num_heads)

  def step(h_TxD, block):
    jac = jax.jacfwd(lambda x: gpt2.attention_branch(block, x, heads))(h_TxD)
    _, out = gpt2.block_forward(block, h_TxD, heads)
    return out, jac

  _, jac = jax.lax.scan(step, gpt2.embed(params, tokens_T), params["blocks"])
  return jac
