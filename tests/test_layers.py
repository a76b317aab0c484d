"""The import layering of the package: no module imports another that (through any chain)
imports it back, and packages import only their own layer or the layers below.

Data flow one way (docs/architecture.md): hardware and cost models at the bottom, then the
scenario and the engine, then the cluster and its metrics, then the searches over runs,
then what draws and prints them, and the command line on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "simulator"
#: Bottom to top; a package may import its own layer and the ones below.
LAYERS = (
    ("errors", "paths", "files", "plaintext", "hashing", "registry"),
    ("hardware", "calibration", "topology", "parallel", "model"),
    ("io", "engine", "workload", "default_scenario", "arguments"),
    ("cluster", "metrics"),
    ("sweep", "planner"),
    ("plotting", "report", "printout"),
    ("cli", "__init__", "__main__"),
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "simulator" or m.startswith("simulator.")}


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    for name, path in modules.items():
        g.add_node(name)
        for target in _imports(path):
            # `from simulator.x import y` may name a module y or a name in x.
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name and target in modules and target != "simulator":
                g.add_edge(name, target)
    return g


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_module_imports_itself_back():
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, f"import cycles: {cycles[:3]}"


def test_every_package_has_a_layer():
    missing = {_package(m) for m in _graph()} - set(LAYER)
    assert not missing, f"packages without a layer in tests/test_layers.py: {missing}"


def test_packages_import_only_their_layer_or_below():
    bad = [(a, b) for a, b in _graph().edges
           if LAYER[_package(b)] > LAYER[_package(a)]]
    assert not bad, f"imports that climb a layer: {bad[:5]}"


def test_loading_a_scenario_never_reaches_the_engine():
    """Scenario loading flows one way (parse, fill the engine profile's defaults, validate,
    freeze): no module of ``simulator.io`` imports, through any chain, one of
    ``simulator.engine``; the profiles are the scenario's defaults and live in io."""
    g = _graph()
    bad = sorted((m, d) for m in g if _package(m) == "io"
                 for d in nx.descendants(g, m) if _package(d) == "engine")
    assert not bad, f"io modules reaching the engine: {bad[:5]}"


#: Private names imported from another module, outside the planner: (importer, module).
#: The planner has none; a new entry says the name should be public or move.
PRIVATE_IMPORTS = {
    ("simulator.calibration.moe_fit", "simulator.calibration.fit"),
    ("simulator.sweep", "simulator.io.scenario"),
}


def _private_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from simulator.x import _name`` in ``path``."""
    return [(node.module, a.name) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
            and node.module.startswith("simulator")
            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]


def test_no_module_imports_a_private_name_of_another():
    bad = [(_module(p), mod, name) for p in PACKAGE.rglob("*.py")
           for mod, name in _private_imports(p) if (_module(p), mod) not in PRIVATE_IMPORTS]
    assert not bad, f"private names imported across modules: {bad[:5]}"
    planner = [e for e in PRIVATE_IMPORTS if ".planner" in e[0] + e[1]]
    assert not planner, f"the planner must not import private names: {planner}"


def test_planner_tests_import_no_private_name():
    tests = Path(__file__).resolve().parent
    bad = [(p.name, mod, name) for p in tests.glob("test_*.py")
           for mod, name in _private_imports(p) if mod.startswith("simulator.planner")]
    assert not bad, f"tests importing the planner's private names: {bad[:5]}"
