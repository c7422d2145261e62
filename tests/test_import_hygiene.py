"""What ``import rankjax`` does not do, and which way models and measure import."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

_PROBE = """
import sys
import rankjax, rankjax._src.cli, rankjax._src.report, rankjax._src.measure.summary, rankjax._src.fast_paths
from rankjax._src import _host_lapack
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


def _probe(code: str) -> None:
  """Runs ``code`` in a fresh interpreter (nothing imported yet); it must print ok."""
  env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=120, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().endswith("ok")


def test_import_loads_neither_matplotlib_nor_ctypes_lapack():
  _probe(_PROBE)


_BARE = """
import logging, sys
import rankjax
heavy = sorted({m.split(".")[0] for m in sys.modules}
               & {"orbax", "grain", "tensorboardX", "tensorstore", "tensorflow_datasets"})
assert not heavy, heavy
assert not logging.getLogger("asyncio").filters, "a log filter installed at import"
from rankjax import load_run        # on first use
assert "orbax" in {m.split(".")[0] for m in sys.modules}
print("ok")
"""


def test_import_rankjax_loads_no_orbax_grain_or_tensorboard_and_installs_nothing():
  _probe(_BARE)


def test_first_figure_keeps_a_backend_the_user_chose():
  probe = ("import matplotlib; matplotlib.use('svg'); import matplotlib.pyplot\n"
           "from rankjax._src import plotting\n"
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
                                                if n.startswith("rankjax._src.measure"))
               for p in sorted((ROOT / "rankjax" / "_src" / "models").glob("*.py"))}
  assert {k: v for k, v in offenders.items() if v} == {}


def _import_graph() -> dict[str, set[str]]:
  """{module: the modules of rankjax/ and experiments/ it imports}, every import
  statement counted (function-level ones too: they hide a circle, they do not break it),
  relative imports resolved, ``from package import name`` resolved to the module
  ``package.name`` where there is one."""
  mods = {}
  for pkg in ("rankjax", "experiments"):
    for p in (ROOT / pkg).rglob("*.py"):
      parts = list(p.relative_to(ROOT).with_suffix("").parts)
      mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p

  def known(name: str) -> str | None:
    while name and name not in mods:
      name = name.rpartition(".")[0]
    return name or None

  graph: dict[str, set[str]] = {}
  for m, p in mods.items():
    package = m if p.name == "__init__.py" else m.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(p.read_text())):
      if isinstance(node, ast.Import):
        out |= {known(a.name) for a in node.names}
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
          base = ".".join(up + ([base] if base else []))
        out |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else known(base)
                for a in node.names}
    graph[m] = {t for t in out if t and t != m}
  return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        found.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_the_import_graph_has_no_circle_and_no_upward_edge():
  """No circle among the modules of rankjax/ and experiments/, function-level imports
  included; the configs import nothing of rankjax but themselves, ``storage`` (file
  paths) and ``errors`` (UserError), measure imports nothing of train, the report
  nothing of the tour, the checkpoints nothing of the data sets (the loop hands them
  the data's re-sharding), and the implementation (``rankjax._src``) imports no face
  (``rankjax`` and ``rankjax.<face>`` re-export it; never the other way).
  (The finder itself is checked on a planted circle below.)"""
  graph = _import_graph()
  assert len(graph) > 140           # the finder saw the packages (149 modules)
  assert _circles(graph) == []
  up = sorted((a, b) for a, targets in graph.items() for b in targets
              if (a.startswith("rankjax._src.config") and not b.startswith("rankjax._src.config")
                  and b not in ("rankjax._src.storage", "rankjax._src.errors"))
              or (a.startswith("rankjax._src.measure") and b.startswith("rankjax._src.train"))
              or (a.startswith("rankjax._src.report") and b == "rankjax._src.tour")
              or (a == "rankjax._src.train.checkpoint" and b.startswith("rankjax._src.data"))
              or (a.startswith("rankjax._src") and not b.startswith("rankjax._src")
                  and b.startswith("rankjax")))
  assert up == []


def test_the_circle_finder_finds_a_planted_circle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
  assert _circles(graph) == [["a", "b", "c"]]
  assert _circles({**graph, "c": {"d"}}) == []
