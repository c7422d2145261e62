"""``init_scale`` / ``init_scale_to``: which matrices Fig 1's variance sweep scales."""
import jax
import jax.numpy as jnp
import pytest

from rankjax._src.config import TransformerConfig
from rankjax._src.models.attention import matrix_init
from rankjax._src.models.transformer import DecoderLM

NAMES = ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2", "w_3", "lm_head")
SCALED = ("w_v", "w_o", "w_2", "w_3")
EXTRA = {"all": NAMES, "value_ffn": (), "value_ffn_qk": ("w_q", "w_k"),
         "value_ffn_gate": ("w_1",)}


@pytest.mark.parametrize("init", ["paper_collapse", "gpt2"])
def test_matrix_init_scales_what_init_scale_to_names(init):
  base = TransformerConfig(num_layers=2, init=init)
  key, shape = jax.random.PRNGKey(0), (4, 8)
  for name in NAMES:
    plain = matrix_init(base, name, 64)(key, shape)
    for to, extra in EXTRA.items():
      cfg = TransformerConfig(num_layers=2, init=init, init_scale=4.0, init_scale_to=to)
      got = matrix_init(cfg, name, 64)(key, shape)
      factor = 2.0 if name in SCALED or name in extra else 1.0   # sqrt of the variance x4
      assert jnp.allclose(got, factor * plain, rtol=1e-6), (init, to, name)


def test_the_model_passes_each_matrix_its_name():
  d, f = 64, 192
  cfg = TransformerConfig(vocab_size=64, num_layers=1, d_model=d, num_heads=4, d_ff=f,
                          max_seq_len=8, init="paper_collapse", ffn="swiglu",
                          init_scale=4.0, init_scale_to="value_ffn")
  params = jax.jit(DecoderLM(cfg).init)(jax.random.PRNGKey(0),
                                        jnp.zeros((1, 4), jnp.int32))["params"]
  fan_in = {"w_2": f}
  for mod, name in [("attn", "w_q"), ("attn", "w_k"), ("attn", "w_v"), ("attn", "w_o"),
                    ("ffn", "w_1"), ("ffn", "w_2"), ("ffn", "w_3")]:
    want = (4.0 if name in SCALED else 1.0) / (3 * fan_in.get(name, d))
    var = float(jnp.var(params["layers"][mod][name]))
    assert abs(var / want - 1) < 0.15, (name, var, want)   # 4096+ entries: sd ~2-3%
  assert abs(float(jnp.var(params["lm_head"])) * 3 * d - 1) < 0.15


def test_init_scale_to_is_checked():
  with pytest.raises(ValueError, match="init_scale_to"):
    TransformerConfig(init_scale_to="qk")
