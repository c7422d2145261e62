"""experiments/benchmarks/analyze_memory.py: with the weights read one layer at a time,
``rankjax analyze``'s peak host memory stays far below the model's (fresh processes,
VmHWM); resident weights show up in full."""
import pytest

from experiments.benchmarks import analyze_memory
from rankjax._src.models import hf

SHAPE = dict(hidden_size=1024, num_layers=16, intermediate_size=2816, num_heads=8,
             num_kv_heads=2, vocab_size=2000)


@pytest.mark.slow
def test_one_layer_at_a_time_holds_a_fraction_of_the_model(tmp_path):
  folder = hf.write_random_checkpoint(tmp_path / "llama", seed=0, **SHAPE)
  n = analyze_memory.sizes(SHAPE)
  layers = 4 * (n["model"] - n["top"])                     # float32 bytes of all layers
  r = analyze_memory.measure(folder, tokens=32, sequences=2)
  floor, on, off = r["floor"][0], r["on"][0], r["off"][0]
  assert off - floor > 0.9 * layers                         # resident: every layer held
  assert on - floor < 4 * n["top"] + 0.5 * layers           # per layer: a few of 16
  assert off - on > 0.6 * layers


def test_sizes_count_the_written_parameters(tmp_path):
  shape = dict(hidden_size=32, num_layers=2, intermediate_size=40, num_heads=4,
               num_kv_heads=2, vocab_size=50)
  files = hf.open_hf(hf.write_random_checkpoint(tmp_path / "c", **shape))
  import numpy as np
  assert analyze_memory.sizes(shape)["model"] == sum(int(np.prod(s))
                                                     for s in files.shapes.values())
