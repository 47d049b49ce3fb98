"""The package's shape: no import cycle among the project's modules (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "tasks")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for file in (ROOT / package).rglob("*.py"):
            parts = list(file.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def runtime_nodes(tree: ast.AST):
    """Every node that runs: the bodies of ``if TYPE_CHECKING:`` (annotations only) left out."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                yield other
                yield from runtime_nodes(other)
            continue
        yield node
        yield from runtime_nodes(node)


def imports(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file at run time (a package's own submodules
    left out: an ``__init__`` that re-exports them is not a cycle)."""
    package = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in runtime_nodes(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""])
            else:
                base = node.module
            targets = [f"{base.rstrip('.')}.{a.name}" for a in node.names] + [base.rstrip(".")]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not target.startswith(name + "."):
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(name, file, known) for name, file in known.items()}
    assert "pipeline.models.resolve" in graph["pipeline.cli"] or "pipeline.models" in graph["pipeline.cli"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
