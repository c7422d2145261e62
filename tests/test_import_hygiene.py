"""What ``import rankjax`` does not do, and which way models and measure import."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

_PROBE = """
import sys
import rankjax, rankjax.cli, rankjax.report, rankjax.measure.summary, rankjax.fast_paths
from rankjax import _host_lapack
assert "matplotlib" not in sys.modules, "matplotlib imported"
assert _host_lapack._gesdd == {}, "ctypes LAPACK functions created at import"
assert _host_lapack._one_thread_fn is None, "OpenBLAS library opened at import"
import numpy as np
a = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
np.testing.assert_allclose(_host_lapack.host_singular_values(a),
                           np.linalg.svd(a, compute_uv=False), rtol=1e-5)
assert set(_host_lapack._gesdd) == {np.dtype(np.float32), np.dtype(np.float64)}
print("ok")
"""


def test_import_loads_neither_matplotlib_nor_ctypes_lapack():
  env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
  out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       env=env, timeout=120, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().endswith("ok")


def test_first_figure_keeps_a_backend_the_user_chose():
  probe = ("import matplotlib; matplotlib.use('svg'); import matplotlib.pyplot\n"
           "from rankjax import plotting\n"
           "assert plotting.pyplot().get_backend().lower() == 'svg'\nprint('ok')")
  env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       env=env, timeout=60, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]


def _rankjax_imports(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
    elif isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
  return {n for n in names if n.startswith("rankjax")}


def test_models_never_import_measure():
  offenders = {str(p.relative_to(ROOT)): sorted(n for n in _rankjax_imports(p)
                                                if n.startswith("rankjax.measure"))
               for p in sorted((ROOT / "rankjax" / "models").glob("*.py"))}
  assert {k: v for k, v in offenders.items() if v} == {}
