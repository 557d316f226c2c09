"""The judge package stays in small modules that import one another one way, and only
by public names (issue 21)."""

from __future__ import annotations

import ast
from pathlib import Path

import tether.runtime.judge as judge_pkg

PKG = Path(judge_pkg.__file__).parent
PREFIX = "tether.runtime.judge"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """`(module, names)` for every import in the file (TYPE_CHECKING ones included)."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [a.name for a in node.names]
            if node.module == PREFIX:  # `from tether.runtime.judge import audit`
                found += [(f"{PREFIX}.{n}", []) for n in names]
            else:
                found.append((node.module, names))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def _name(path: Path) -> str:
    """`rules.index` for `judge/rules/index.py`, `rules` for `judge/rules/__init__.py`."""
    parts = path.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    paths = {_name(p): p for p in PKG.rglob("*.py") if p != PKG / "__init__.py"}
    return {
        m: {
            dep.removeprefix(f"{PREFIX}.")
            for dep, _ in _imports(path)
            if dep.startswith(f"{PREFIX}.") and dep.removeprefix(f"{PREFIX}.") in paths
        }
        for m, path in paths.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing
    itself (Tarjan)."""
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
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_check_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_inside_the_judge_package() -> None:
    graph = _graph()
    assert {"audit", "llm", "rules", "rules.commands", "verdicts", "completion"} <= set(graph)
    assert _cycles(graph) == []


def test_no_private_names_imported_across_modules() -> None:
    bad = [
        (p.name, mod, name)
        for p in PKG.rglob("*.py")
        for mod, names in _imports(p)
        if mod.startswith("tether.")
        for name in names
        if name.startswith("_") and name != "__future__"
    ]
    assert bad == []


_PURE = {
    "__future__",
    "collections.abc",
    "dataclasses",
    "typing",
    "tether",
    "tether.ledger_tally",
    "tether.runtime.judge.facts",
    "tether.runtime.round",
    "tether.spec",
}


def test_the_audit_is_pure() -> None:
    deps = {m for m, _ in _imports(PKG / "audit.py")}
    assert deps <= _PURE, deps


def test_modules_stay_small() -> None:
    sizes = {_name(p): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}
    assert max(sizes.values()) <= 400, sizes
