"""The package's import graph: no cycles (type-only imports included), one direction
inside `runtime/`, the interfaces apart from each other, size budgets that only shrink,
and `import tether` on the core dependencies alone.

The graph is read from the source with `ast` (every `import` and `from … import`,
including those under `if TYPE_CHECKING:` and inside functions), so a lazy import does not
hide a dependency."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "tether"


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_of(p): p for p in PKG.rglob("*.py")}


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The tether modules `path` imports (a `from pkg import name` counts as pkg.name when
    that is a module, else pkg)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_of(path)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                if not is_pkg:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for name in names:
            # the nearest known module at or above the imported name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("tether") and name != here:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = all_modules()
    g = {m: imported(p, known) for m, p in known.items()}
    # A package's __init__ is imported with any module under it; it is not an edge of
    # its own for cycle purposes unless it imports something itself.
    return g


def tarjan(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        # iterative DFS: the graph is small, but recursion depth stays bounded anyway
        work: list[tuple[str, Iterator[str]]] = [(v, iter(sorted(g.get(v, ()))))]
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_tarjan_finds_a_cycle_it_is_shown() -> None:
    # The check can fail: a made-up graph with one loop is caught, a chain is not.
    assert tarjan({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert tarjan({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles_anywhere_in_src() -> None:
    g = graph()
    # __init__ modules that only hand names on would make every sub-module "import" its
    # package; packages' own imports are edges like any other
    assert tarjan(g) == []


def test_the_graph_sees_lazy_and_type_only_imports() -> None:
    g = graph()
    assert "tether.store.base" in g["tether.runtime.engine"]
    assert g["tether"], "tether/__init__ imports lazily inside __getattr__; still edges"


#: Inside runtime/, imports go one way: a module may import only modules of its own
#: level or below. The order is written down in docs/architecture.md.
RUNTIME_ORDER = [
    (
        "run.state",
        "ops.ports",
        "run.ports",
        "run.outcome",
        "round.context",
        "round.history",
        "round.progress",
        "hints",
        "launch",
    ),
    ("ops",),
    ("recovery",),
    ("judge",),
    ("round",),
    ("run",),
    ("watch", "tasks", "takeover"),
    ("engine",),
    ("worker",),
    ("wiring", "builtins"),
]


def runtime_level(module: str) -> int | None:
    if not module.startswith("tether.runtime."):
        return None
    rest = module.removeprefix("tether.runtime.")
    best: tuple[int, int] | None = None  # (prefix length, level)
    for level, prefixes in enumerate(RUNTIME_ORDER):
        for p in prefixes:
            within = rest == p or rest.startswith(p + ".")
            if within and (best is None or len(p) > best[0]):
                best = (len(p), level)
    return None if best is None else best[1]


def test_every_runtime_module_has_a_level() -> None:
    missing = [
        m for m in all_modules() if m.startswith("tether.runtime.") and runtime_level(m) is None
    ]
    assert missing == []


def test_runtime_imports_go_one_way() -> None:
    upward = []
    for mod, deps in graph().items():
        lv = runtime_level(mod)
        if lv is None:
            continue
        for d in deps:
            dl = runtime_level(d)
            if dl is not None and dl > lv:
                upward.append(f"{mod} (level {lv}) imports {d} (level {dl})")
    assert upward == []


def offenders(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{m} imports {d}"
        for m, deps in graph().items()
        if m == prefix or m.startswith(prefix + ".")
        for d in deps
        if d.startswith(forbidden)
    )


def test_tools_never_import_the_runtime() -> None:
    assert offenders("tether.tools", ("tether.runtime",)) == []


def test_web_never_imports_the_cli_and_the_cli_only_starts_the_web() -> None:
    assert offenders("tether.web", ("tether.cli",)) == []
    # `tether serve` starts the dashboard: the CLI imports web/ there and nowhere else (a
    # worker's /metrics needs no web/).
    starters = {"tether.cli.serve"}
    others = [o for o in offenders("tether.cli", ("tether.web",)) if o.split()[0] not in starters]
    assert others == []


def test_store_imports_none_of_runtime_models_tools_web() -> None:
    forbidden = ("tether.runtime", "tether.models", "tether.tools", "tether.web", "tether.cli")
    assert offenders("tether.store", forbidden) == []


#: Modules over the size budget today, none of them in runtime/. The budget: no module
#: over 600 lines; this list may only shrink (a module that gets under 600 must leave it;
#: none may be added, and none may grow past the figure written here).
OVERSIZE_BASELINE: dict[str, int] = {
    "tether.ledger": 636,
    "tether.report.replay": 841,
    "tether.spec": 694,
    "tether.store._sql": 1014,
    "tether.tools.builtin.sources": 778,
    "tether.tools.mcp": 681,
}
MODULE_BUDGET = 600
CLASS_BUDGET = 400


def test_modules_stay_within_the_size_budget() -> None:
    over = {}
    for mod, path in all_modules().items():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MODULE_BUDGET:
            over[mod] = n
    grown = {m: n for m, n in over.items() if n > OVERSIZE_BASELINE.get(m, MODULE_BUDGET)}
    assert grown == {}, "modules over 600 lines (split them) or over their baseline"
    shrunk = sorted(m for m in OVERSIZE_BASELINE if m not in over)
    assert shrunk == [], "these are within budget now: take them off OVERSIZE_BASELINE"


def test_runtime_classes_stay_within_the_size_budget() -> None:
    big = []
    for path in (PKG / "runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if n > CLASS_BUDGET:
                    big.append(f"{module_of(path)}.{node.name}: {n} lines")
    assert big == []


#: A folder per concept, each readable on its own: no folder of `runtime/` holds more
#: than this many modules (a concept that outgrows it gets sub-folders of its own).
FOLDER_BUDGET = 8


def test_runtime_folders_stay_small() -> None:
    crowded = {}
    runtime = PKG / "runtime"
    for folder in [runtime, *(d for d in runtime.rglob("*") if d.is_dir())]:
        if folder.name == "__pycache__":
            continue
        n = len(list(folder.glob("*.py")))
        if n > FOLDER_BUDGET:
            crowded[str(folder.relative_to(PKG))] = n
    assert crowded == {}
    # The check sees the folders: runtime/ itself holds several modules.
    assert len(list((PKG / "runtime").glob("*.py"))) > 1


BLOCKED = ("httpx", "httpx2", "openai", "anthropic", "mcp", "fastapi", "starlette", "psycopg")


def test_import_tether_needs_only_the_core_dependencies() -> None:
    """`import tether` and the runtime's modules load with the optional SDKs, the web
    stack, psycopg and even the HTTP client blocked: each is imported where it is used."""
    code = textwrap.dedent(
        f"""
        import importlib.abc, sys
        BLOCKED = {BLOCKED!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked: " + name)
                return None
        sys.meta_path.insert(0, Block())
        import tether
        from tether import Engine, TaskSpec, tool
        import tether.runtime.engine, tether.runtime.worker, tether.runtime.wiring
        import tether.tools.builtin.files, tether.tools.builtin.sources
        import tether.store.sqlite, tether.report.replay, tether.cli
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not loaded, loaded
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
