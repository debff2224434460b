"""The Python package's modules import each other without a circle: its import graph, read from the
source with `ast` (every `from .x import`, `from . import x` and `probe_sidecar.x` import,
function-local ones included), has no cycle. And the bottom modules load without torch."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "client" / "python" / "probe_sidecar"
ROOT = "probe_sidecar"


def _modules(package: pathlib.Path) -> dict[str, pathlib.Path]:
    """{dotted module name: file} of every module in the package (a package is its __init__)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = (ROOT, *path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]
             ) -> set[tuple[str, int]]:
    """(module of the package, line) for each import of one in `path`, wherever it stands.
    A submodule's implicit import of its parent package is not an edge: the parent is already
    being imported when it runs."""
    is_package = path.name == "__init__.py"
    found = set()

    def add(target: str, line: int) -> None:
        if target in modules and target != name:
            found.add((target, line))

    def add_package(package: str, line: int) -> None:
        """A package whose __init__ an import runs: not this module's own parent packages."""
        if not name.startswith(package + "."):
            add(package, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    parts = alias.name.split(".")
                    for i in range(1, len(parts)):
                        add_package(".".join(parts[:i]), node.lineno)
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + (node.module.split(".") if node.module else []))
            elif node.module and (node.module == ROOT or node.module.startswith(ROOT + ".")):
                target = node.module
            else:
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in modules:  # `from package import submodule`
                    add(submodule, node.lineno)
                    add_package(target, node.lineno)
                else:  # a name the module (or the package's __init__) defines
                    add(target, node.lineno)
    return found


def import_graph(package: pathlib.Path = PACKAGE) -> dict[str, dict[str, int]]:
    """{module: {module it imports: line of the first such import}}."""
    modules = _modules(package)
    graph = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in sorted(_imports(name, path, modules), key=lambda e: e[1]):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if state.get(target) is None and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state.get(node) is None and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_is_where_the_test_looks():
    graph = import_graph()
    for module in ("probe_sidecar", "probe_sidecar.client", "probe_sidecar.tap",
                   "probe_sidecar.pipeline", "probe_sidecar.torch", "probe_sidecar.vllm.install"):
        assert module in graph, f"{module} not found under {PACKAGE}"
    # The graph sees function-local imports too (vllm.install makes its client in a function).
    assert "probe_sidecar.torch" in graph["probe_sidecar.vllm.install"]


def test_the_package_imports_have_no_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    if cycle:
        steps = [f"{a} -> {b} (line {graph[a][b]} of {a})" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("an import cycle in the Python package:\n  " + "\n  ".join(steps))


def test_the_cycle_check_finds_cycles(tmp_path):
    package = tmp_path / "probe_sidecar"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import A\n")
    (package / "a.py").write_text("from .b import B\nA = 1\n")
    (package / "b.py").write_text("def f():\n    from .a import A\n    return A\nB = 2\n")
    assert find_cycle(import_graph(package)) == ["probe_sidecar.a", "probe_sidecar.b",
                                                 "probe_sidecar.a"]
    (package / "b.py").write_text("B = 2\n")
    assert find_cycle(import_graph(package)) is None


def test_the_bottom_modules_load_without_torch():
    """The dtype table's torch view is made on first use: importing the package's base (and the
    host tap) never imports torch."""
    code = ("import sys; import probe_sidecar, probe_sidecar.dtypes, probe_sidecar.tap; "
            "assert 'torch' not in sys.modules, 'torch was imported'; "
            "assert probe_sidecar.dtypes.BY_NAME['bfloat16'].size == 2")
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy(), timeout=120)
