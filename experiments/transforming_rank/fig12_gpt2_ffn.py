"""Fig 12 (App B.3) and Fig 8c (App D.5): GPT-2 FFN branch Jacobians and W_up/W_down
coherence, at GPT-2 initialization and, given checkpoints, with pretrained weights.

Fig 12: the FFN branch Jacobians ``J_l = dFFN(LN_2(h_l))/dh_l`` (closed form,
``rankjax.measure.ffn_jacobians``; GPT-2 is a ``DecoderLM``
configuration, ``rankjax.models.gpt2_config``) along the residual stream of a fixed
prompt, at one probe token; GPT-2 Small (L=12, d=768) and Medium (L=24, d=1024):
(a) pairwise block cosines <J_i, J_j>/(|J_i| |J_j|) (random baseline ~1/d; paper:
    off-diagonal mean 0.18 / 0.15 pretrained);
(b) accumulated branch ||sum_{l<=k} J_l||_F against the uncorrelated prediction
    (sum_{l<=k} ||J_l||^2)^{1/2}: 1.00x at init; 1.78x / 2.23x pretrained, against
    3.26x / 4.59x for fully coherent addition (sum_l ||J_l||);
(c) stream scale rms(h_l) and ratio r_l = ||J_l||_F/sqrt(d) (Eq. 4, 22).
Block 1 is left out of (b), (c) (its small incoming stream inflates ||J_1|| through
the LayerNorm Jacobian), as in the paper.
Fig 8c: coherence of the hidden-space singular bases of W_up = W_fc^T and
W_down = W_proj^T per block, ``m * mean_{i,j in S} <u_i, v_j>^2`` (free bases: 1), over
all d directions (paper, pretrained Medium: mean 0.96; blocks 1, 2: 1.6, 1.3; others
0.78..1.02) and over the top / bottom 20 by singular value (~5 / ~3).

At initialization (GPT-2's init, ``gpt2_init``) quick scale keeps the depths and
the 4x FFN and scales the width down (Small d=192, Medium d=256, heads of 64); paper
scale uses the real sizes; tiny scale GPT-2-shaped models of L=4, d=64 and L=8, d=128.
Pretrained weights are read from Hugging Face folders (``config.json`` and
``model.safetensors``; the file stands for its folder) given with ``--checkpoint``
(repeatable; ``rankjax.models.load_hf``); each is measured together with a GPT-2
initialization of the same shape. Nothing is downloaded.

  rankjax reproduce transforming_rank --only fig12
  rankjax reproduce transforming_rank --only fig12 \\
      --checkpoint ~/gpt2/model.safetensors --checkpoint ~/gpt2-medium/model.safetensors
"""
from __future__ import annotations

import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import common
from rankjax.config import TransformerConfig
from rankjax.measure import (accumulated_branch, block_cosines, effective_rank, ffn_inputs,
                             ffn_jacobians)
from rankjax.models import gpt2_config, load_hf
from rankjax.studies import claims, measured

NAME = "fig12_gpt2_ffn"
# The GPT-2 BPE ids of "The quick brown fox jumps over the lazy dog." (hard-coded: no
# tokenizer file offline); any fixed prompt serves, --prompt-ids overrides it.
PROMPT_IDS = (464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13)
SCALES = {
    "quick": dict(models=(("small", 12, 192), ("medium", 24, 256)), prompt_ids=PROMPT_IDS,
                  probe=-1, top_k=20, seeds=(0, 1, 2), checkpoints=()),
    "paper": dict(models=(("small", 12, 768), ("medium", 24, 1024)), prompt_ids=PROMPT_IDS,
                  probe=-1, top_k=20, seeds=(0, 1, 2), checkpoints=()),
    "tiny": dict(models=(("small", 4, 64), ("medium", 8, 128)), prompt_ids=PROMPT_IDS,
                 probe=-1, top_k=20, seeds=(0, 1), checkpoints=()),
}
KNOWN = {(12, 768): "small", (24, 1024): "medium", (36, 1280): "large", (48, 1600): "xl"}
PAPER = {   # App B.3 / D.5 (pretrained); at init every check is exact.
    "small": dict(offdiag=0.18, accumulated=1.78, coherent=3.26),
    "medium": dict(offdiag=0.15, accumulated=2.23, coherent=4.59),
}
_INIT = "App B.3: at initialization every assumption holds exactly"
CLAIMS = claims([
    *(c for size in ("small", "medium") for c in (
        common.claim(f"Fig 12 init {size}: off-diagonal block cosine", "mean off-diagonal "
                     "<J_i, J_j>/(|J_i| |J_j|)", 0.0, _INIT + "; the random baseline ~1/d"),
        common.claim(f"Fig 12 init {size}: accumulated / uncorrelated at k=L",
                     "||sum_l J_l||_F / (sum_l ||J_l||^2)^(1/2)", 1.00, _INIT + " (1.00x)"),
        common.bound(f"Fig 12 init {size}: the stream grows", "rms(h_L) / rms(h_2)", ">", 1.0,
                     "Fig 12c: the stream grows", every_seed=True),
        common.bound(f"Fig 12 init {size}: the ratio decays", "r_L / r_2, r_l = ||J_l||_F/sqrt(d)",
                     "<", 1.0, "Fig 12c: the ratio decays", every_seed=True))),
    *(c for size, p in PAPER.items() for c in (
        common.claim(f"Fig 12 pretrained {size}: off-diagonal block cosine", "mean "
                     "off-diagonal <J_i, J_j>/(|J_i| |J_j|)", p["offdiag"], "App B.3"),
        common.claim(f"Fig 12 pretrained {size}: accumulated / uncorrelated at k=L",
                     "||sum_l J_l||_F / (sum_l ||J_l||^2)^(1/2)", p["accumulated"], "App B.3"),
        common.claim(f"Fig 12 pretrained {size}: coherent / uncorrelated at k=L",
                     "sum_l ||J_l||_F / (sum_l ||J_l||^2)^(1/2)", p["coherent"], "App B.3"))),
    common.claim("Fig 8c pretrained medium: coherence, all directions", "m mean <u_i, v_j>^2, "
                 "mean over blocks", 0.96, "App D.5"),
    common.claim("Fig 8c pretrained medium: coherence, top 20", "m mean <u_i, v_j>^2 over the "
                 "top 20 directions, mean over blocks", 5.0, "App D.5: ~5"),
    common.claim("Fig 8c pretrained medium: coherence, bottom 20", "m mean <u_i, v_j>^2 over "
                 "the bottom 20 directions, mean over blocks", 3.0, "App D.5: ~3"),
])

WORDS = [
    ("init .*off-diagonal", "Fig 12", "the pairwise cosine similarities between blocks sit at "
     "the random-direction baseline of"),
    ("init .*accumulated", "Fig 12", "the accumulated branch norm equals the uncorrelated "
     "prediction"),
    ("init .*(grows|decays)", "Fig 12", "the stream grows and the ratio decays in both cases"),
    ("pretrained .*off-diagonal", "Fig 12", "Training induces weak, uniformly positive "
     "correlations between blocks (off-diagonal mean"),
    ("pretrained .*accumulated", "Fig 12", "The accumulated branch reaches ... the uncorrelated "
     "prediction"),
    ("pretrained .*coherent", "Fig 12", "for fully coherent addition"),
    ("all directions", "Fig 8c", "Averaged over all directions it stays close to free across "
     "the 24 FFN blocks, with a mean of"),
    ("(top|bottom) 20", "Fig 8c", "with coherence near ... at the top and ... at the bottom"),
]
CLAIMS = common.worded(CLAIMS, WORDS)


def singular_vector_coherence(fc_w_DxM: np.ndarray, proj_w_MxD: np.ndarray,
                              top_k: int) -> tuple[float, float, float]:
  """Coherence of W_up's and W_down's singular bases in the hidden space (App D.5).

  With u_i (W_up = fc_w^T, m x d) and v_j (W_down = proj_w^T, d x m) the hidden-space
  singular vectors sorted by singular value, returns ``m * mean <u_i, v_j>^2`` over all
  d x d pairs, the top-k x top-k and the bottom-k x bottom-k pairs: 1 in expectation for
  free (independent Haar) bases. From the d x d Gram eigenvectors, in float64.
  """
  a = np.asarray(fc_w_DxM, np.float64)
  b = np.asarray(proj_w_MxD, np.float64)
  m = a.shape[1]

  def hidden_basis(w_MxD):   # columns: hidden singular vectors, singular value descending
    ev, vec = np.linalg.eigh(w_MxD.T @ w_MxD)
    ev, vec = ev[::-1], vec[:, ::-1]
    return (w_MxD @ vec) / np.sqrt(np.maximum(ev, 1e-300))

  c = m * np.square(hidden_basis(a.T).T @ hidden_basis(b))
  k = min(top_k, c.shape[0])
  return float(c.mean()), float(c[:k, :k].mean()), float(c[-k:, -k:].mean())


INIT_STD = 0.02          # GPT-2 / HF GPT2Config.initializer_range


def _gpt2_draws(key, num_layers: int, d: int, m: int, vocab_size: int, positions: int
                ) -> dict:
  """GPT-2's initialization in GPT-2's tensor layout (HF ``GPT2PreTrainedModel.
  _init_weights``): every matrix and embedding N(0, 0.02^2), the two residual output
  projections (attention and FFN ``c_proj``) N(0, (0.02/sqrt(2L))^2) (GPT-2 paper Sec
  2.3), biases 0, LN gains 1; one key per tensor kind, stacked over the layers."""
  shapes = {"ln_1_scale": (d,), "ln_1_bias": (d,), "attn_w": (d, 3 * d), "attn_b": (3 * d,),
            "attn_proj_w": (d, d), "attn_proj_b": (d,), "ln_2_scale": (d,), "ln_2_bias": (d,),
            "fc_w": (d, m), "fc_b": (m,), "proj_w": (m, d), "proj_b": (d,)}
  keys = dict(zip(list(shapes) + ["wte", "wpe"], jax.random.split(key, len(shapes) + 2)))
  proj_std = INIT_STD / math.sqrt(2.0 * num_layers)
  out = {}
  for k, shape in shapes.items():
    if k.endswith("_scale"):
      out[k] = jnp.ones((num_layers,) + shape)
    elif len(shape) == 1:
      out[k] = jnp.zeros((num_layers,) + shape)
    else:
      std = proj_std if k in ("attn_proj_w", "proj_w") else INIT_STD
      out[k] = std * jax.random.normal(keys[k], (num_layers,) + shape)
  out["wte"] = INIT_STD * jax.random.normal(keys["wte"], (vocab_size, d))
  out["wpe"] = INIT_STD * jax.random.normal(keys["wpe"], (positions, d))
  return out


def gpt2_init(key, num_layers: int, d: int, m: int, vocab_size: int = 50257,
              positions: int = 1024) -> tuple[TransformerConfig, dict]:
  """``(cfg, params)``: a GPT-2 of L layers, width d (heads of 64), FFN width m as a
  ``DecoderLM`` (``rankjax.models.gpt2_config``) with GPT-2's initialization (``_gpt2_draws``;
  c_attn split into W_Q | W_K | W_V as ``rankjax.models.load_hf`` splits a checkpoint's)."""
  cfg = gpt2_config({"n_embd": d, "n_layer": num_layers, "n_head": max(1, d // 64),
                     "n_inner": m, "vocab_size": vocab_size, "n_positions": positions})
  t = jax.jit(_gpt2_draws, static_argnums=(1, 2, 3, 4, 5))(key, num_layers, d, m,
                                                           vocab_size, positions)
  q, k, v = jnp.split(t["attn_w"], 3, axis=-1)
  bq, bk, bv = jnp.split(t["attn_b"], 3, axis=-1)
  layers = {"norm_attn_p": {"scale": t["ln_1_scale"], "bias": t["ln_1_bias"]},
            "attn": {"w_q": q, "w_k": k, "w_v": v, "b_q": bq, "b_k": bk, "b_v": bv,
                     "w_o": t["attn_proj_w"], "b_o": t["attn_proj_b"]},
            "norm_ffn_p": {"scale": t["ln_2_scale"], "bias": t["ln_2_bias"]},
            "ffn": {"w_1": t["fc_w"], "b_1": t["fc_b"], "w_2": t["proj_w"], "b_2": t["proj_b"]}}
  return cfg, {"embed": {"embedding": t["wte"]}, "pos_embed": t["wpe"],
               "norm_final": {"scale": jnp.ones(d), "bias": jnp.zeros(d)}, "layers": layers}


def measure(cfg: TransformerConfig, params: dict, tokens_T: np.ndarray, probe: int,
            top_k: int) -> dict:
  """Every Fig 12 / Fig 8c quantity of one Pre-Norm ``DecoderLM`` (float32)."""
  ffn = params["layers"]["ffn"]
  d = cfg.d_model
  h_LxTxD = ffn_inputs(cfg, params, jnp.asarray(tokens_T))
  h_LxD = h_LxTxD[:, probe]
  jac_LxDxD = ffn_jacobians(cfg, params["layers"], h_LxD)
  norms = np.asarray(jnp.linalg.norm(jac_LxDxD, axis=(-2, -1)))
  cos_LxL = np.asarray(block_cosines(jac_LxDxD))
  accumulated, uncorrelated = (np.asarray(a) for a in accumulated_branch(jac_LxDxD[1:]))
  coherent = np.cumsum(norms[1:]) / np.sqrt(d)
  erank = np.asarray(effective_rank(jac_LxDxD)) / d
  coh = np.array([singular_vector_coherence(f, p, top_k)
                  for f, p in zip(np.asarray(ffn["w_1"]), np.asarray(ffn["w_2"]))])
  rms = np.asarray(jnp.sqrt(jnp.mean(jnp.square(h_LxD), axis=-1)))
  r2 = float("nan")   # how linear rms(h_l)^2 is in l over blocks 2..L (init: Theta(L))
  if len(norms) >= 4:
    layers = np.arange(2, len(norms) + 1)
    resid = rms[1:] ** 2 - np.polyval(np.polyfit(layers, rms[1:] ** 2, 1), layers)
    r2 = 1.0 - resid.var() / (rms[1:] ** 2).var()
  off = ~np.eye(len(norms), dtype=bool)
  return {
      "num_layers": len(norms), "d": d, "d_ff": cfg.d_ff, "num_heads": cfg.num_heads,
      "jac_norm": norms, "ratio": norms / np.sqrt(d), "stream_rms": rms, "erank": erank,
      "cosines": cos_LxL, "offdiag_mean": float(cos_LxL[off].mean()),
      "offdiag_abs_mean": float(np.abs(cos_LxL[off]).mean()),
      "accumulated": accumulated, "uncorrelated": uncorrelated, "coherent": coherent,
      "accumulated_over_uncorrelated": float(accumulated[-1] / uncorrelated[-1]),
      "coherent_over_uncorrelated": float(coherent[-1] / uncorrelated[-1]),
      "stream_rms2_linear_r2": float(r2),
      "coherence_all": coh[:, 0], "coherence_top": coh[:, 1], "coherence_bottom": coh[:, 2],
  }


def _plot(results: dict, top_k: int):
  fig, axes = common.plt.subplots(len(results), 4, figsize=(16, 3.4 * len(results)),
                                  squeeze=False)
  for row, (label, r) in zip(axes, results.items()):
    ls = np.arange(1, r["num_layers"] + 1)
    im = row[0].imshow(r["cosines"], cmap="RdBu_r", vmin=-1, vmax=1,
                       extent=(0.5, ls[-1] + 0.5, ls[-1] + 0.5, 0.5))
    fig.colorbar(im, ax=row[0], fraction=0.046)
    row[0].set_title(f"{label}: block cosines (off-diag {r['offdiag_mean']:.3f})", fontsize=9)
    row[1].plot(ls[1:], r["accumulated"], "o-", ms=3, label="||sum J_l||_F / sqrt(d)")
    row[1].plot(ls[1:], r["uncorrelated"], "k--", label="uncorrelated")
    row[1].plot(ls[1:], r["coherent"], ":", c="gray", label="fully coherent")
    row[1].set_xlabel("blocks summed k (from block 2)")
    row[1].legend(fontsize=7)
    row[2].plot(ls[1:], r["stream_rms"][1:], "o-", ms=3, label="rms(h_l)")
    row[2].set_ylabel("rms(h_l)")
    ax2 = row[2].twinx()
    ax2.plot(ls[1:], r["ratio"][1:], "s-", ms=3, c="C1", label="r_l")
    ax2.set_ylabel("r_l = ||J_l||_F / sqrt(d)", color="C1")
    row[2].set_xlabel("block l")
    for key, name in (("all", "all"), ("top", f"top {top_k}"), ("bottom", f"bottom {top_k}")):
      row[3].plot(ls, r[f"coherence_{key}"], "o-", ms=3, label=name)
    row[3].axhline(1.0, c="k", lw=0.8, ls="--")
    row[3].set_title("Fig 8c: W_up / W_down singular-basis coherence", fontsize=9)
    row[3].set_xlabel("block l")
    row[3].legend(fontsize=7)
  return fig


def _summary(results: dict, seeds: tuple[int, ...]) -> list[dict]:
  """The measured values: at initialization per model over ``seeds`` (labels
  ``size/init/seed``), pretrained from the one checkpoint per model."""
  rows = []
  sizes = dict.fromkeys(label.split("/")[0] for label in results)
  for size in sizes:
    init = [results[f"{size}/init/{sd}"] for sd in seeds if f"{size}/init/{sd}" in results]
    if init and f"Fig 12 init {size}: off-diagonal block cosine" in CLAIMS:
      # the paper's claims are about GPT-2 small / medium; another checkpoint's numbers
      # stay in the result (no claim judges them)
      r0 = init[0]
      tag = f"L={r0['num_layers']}, d={r0['d']}"
      j = lambda item, v, note="": measured(item,
          [float(x) for x in v], seeds=list(seeds[:len(init)]),
          note="; ".join(x for x in (tag, note) if x))
      rows += [
          j(f"Fig 12 init {size}: off-diagonal block cosine", [r["offdiag_mean"] for r in init],
            f"1/d = {1 / r0['d']:.4f}; mean |cos| {np.mean([r['offdiag_abs_mean'] for r in init]):.4f}"),
          j(f"Fig 12 init {size}: accumulated / uncorrelated at k=L",
            [r["accumulated_over_uncorrelated"] for r in init]),
          j(f"Fig 12 init {size}: the stream grows",
            [r["stream_rms"][-1] / r["stream_rms"][1] for r in init],
            "R^2 of rms^2 linear in l: " + " / ".join(f"{r['stream_rms2_linear_r2']:.3f}"
                                                      for r in init)),
          j(f"Fig 12 init {size}: the ratio decays", [r["ratio"][-1] / r["ratio"][1] for r in init]),
      ]
    trained = results.get(f"{size}/pretrained")
    if trained is not None and size in PAPER:
      rows += [measured(f"Fig 12 pretrained {size}: {k}", trained[f])
               for k, f in (("off-diagonal block cosine", "offdiag_mean"),
                            ("accumulated / uncorrelated at k=L", "accumulated_over_uncorrelated"),
                            ("coherent / uncorrelated at k=L", "coherent_over_uncorrelated"))]
      if size == "medium":
        rows += [measured(f"Fig 8c pretrained medium: coherence, {k}",
                     float(np.mean(trained[f]))) for k, f in
                 (("all directions", "coherence_all"), ("top 20", "coherence_top"),
                  ("bottom 20", "coherence_bottom"))]
  return rows


def run(out_dir: str, scale: str = "quick", **overrides) -> dict:
  """Measures the GPT-2 models of ``SCALES[scale]["models"]`` at initialization, or,
  when ``checkpoints`` (Hugging Face folders, or their ``model.safetensors``) are given,
  each checkpoint and a GPT-2 initialization of its shape."""
  s = common.settings(SCALES, scale, overrides)
  s["checkpoints"] = tuple(str(c) for c in ([s["checkpoints"]] if isinstance(
      s["checkpoints"], (str, pathlib.Path)) else s["checkpoints"]))
  tokens = np.asarray(s["prompt_ids"], np.int32)
  todo = []   # (label, (cfg, params) or shape, seed)
  if s["checkpoints"]:
    for i, path in enumerate(s["checkpoints"]):
      cfg, params = load_hf(path)
      L, d, m = cfg.num_layers, cfg.d_model, cfg.d_ff
      size = KNOWN.get((L, d), f"ckpt{i}")
      todo.append((f"{size}/pretrained", (cfg, params), None))
      todo += [(f"{size}/init/{sd}", (L, d, m), sd) for sd in s["seeds"]]
  else:
    todo = [(f"{size}/init/{sd}", (L, d, 4 * d), sd) for size, L, d in s["models"]
            for sd in s["seeds"]]
  results = {}
  with common.single_blas_thread():
    for label, spec, sd in todo:
      start = time.time()
      cfg, params = spec if sd is None else gpt2_init(
          jax.random.fold_in(jax.random.PRNGKey(sd), spec[0]), *spec)
      if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError(f"prompt ids must lie in [0, {cfg.vocab_size})")
      if len(tokens) > cfg.max_seq_len or not -len(tokens) <= s["probe"] < len(tokens):
        raise ValueError(f"prompt of {len(tokens)} tokens (at most {cfg.max_seq_len}) "
                         f"with probe position {s['probe']}")
      results[label] = measure(cfg, params, tokens, s["probe"], s["top_k"])
      results[label]["seconds"] = time.time() - start
      del params
  summary = _summary(results, tuple(s["seeds"]))
  # the figure: the pretrained models and the first seed's initialization
  shown = {k.replace(f"/init/{s['seeds'][0]}", "/init"): v for k, v in results.items()
           if "/init/" not in k or k.endswith(f"/init/{s['seeds'][0]}")}
  result = {"settings": s, "pretrained": bool(s["checkpoints"]), "models": results,
            "measured": summary}
  return common.write(out_dir, NAME, result, _plot(shown, s["top_k"]))
