"""The package's layers, checked from the source: who may import whom, and no import circles.

Layers, lowest first (a module imports only its own layer or a lower one; imports inside
functions count too):

    graft.errors  <  graft.core  <  graft.models  <  graft.results, graft.remote  <  graft.study

``graft/__init__.py`` (the notebook API) and ``experiments/`` (the commands) sit on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import graft

PACKAGE = Path(graft.__file__).parent

#: layer -> the layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "core": {"errors"},
    "models": {"errors", "core"},
    "results": {"errors", "core", "models"},
    "remote": {"errors", "core", "models"},
    "study": {"errors", "core", "models", "results", "remote"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every ``graft.*`` module or name ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "graft":
                found |= {f"graft.{a.name}" for a in node.names}
            elif node.module.startswith("graft."):
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("graft.")}
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = {t for t in _imports(path) if t in files}
        # a parent package's __init__ is imported on the way to its children: not an edge
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_imports_only_its_layer_or_below():
    bad = []
    for module, targets in _graph().items():
        layer = _layer(module)
        if layer not in ALLOWED:
            continue  # graft/__init__.py: the public API on top of everything
        for target in targets:
            other = _layer(target)
            if other != layer and other not in ALLOWED[layer]:
                bad.append(f"{module} imports {target}")
    assert not bad, "layer rule broken:\n" + "\n".join(sorted(bad))


def test_every_module_belongs_to_a_layer():
    unplaced = [m for m in _graph() if m != "graft" and _layer(m) not in ALLOWED]
    assert not unplaced, f"modules outside the layers: {unplaced}"


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_check_sees_a_broken_rule(tmp_path, monkeypatch):
    """The checker itself: a core module importing the study layer is caught."""
    (tmp_path / "graft" / "core").mkdir(parents=True)
    (tmp_path / "graft" / "study").mkdir()
    (tmp_path / "graft" / "__init__.py").write_text("")
    (tmp_path / "graft" / "core" / "__init__.py").write_text("")
    (tmp_path / "graft" / "study" / "__init__.py").write_text("")
    (tmp_path / "graft" / "core" / "a.py").write_text("def f():\n    from graft.study import b\n")
    (tmp_path / "graft" / "study" / "b.py").write_text("from graft.core import a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", tmp_path / "graft")
    graph = _graph()
    assert "graft.study.b" in graph["graft.core.a"]  # an import inside a function counts
    assert "graft.core.a" in graph["graft.study.b"]
