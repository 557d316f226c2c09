"""Dependencies point one way: the store knows nothing of models, tools, the runtime or
the interfaces; the ledger knows nothing of the store; the parts of a round know the
engine only through the narrow protocols of `runtime/run/ports.py`."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tether"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            if node.module == "tether":
                out.update(f"tether.{a.name}" for a in node.names)
    return out


def offending(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for f in files:
        for mod in imports_of(f):
            if mod.startswith(forbidden):
                bad.append(f"{f.relative_to(SRC)} imports {mod}")
    return bad


def test_store_imports_no_runtime_models_tools_or_interfaces() -> None:
    files = sorted((SRC / "store").glob("*.py"))
    assert files
    forbidden = ("tether.runtime", "tether.models", "tether.tools", "tether.cli", "tether.web")
    assert offending(files, forbidden) == []


def test_domain_modules_do_not_reach_up() -> None:
    files = [SRC / f for f in ("ledger.py", "spec.py", "lifecycle.py", "events.py", "errors.py")]
    forbidden = ("tether.store", "tether.runtime", "tether.models", "tether.tools", "tether.cli")
    assert offending(files, forbidden) == []


def test_runtime_does_not_import_the_interfaces() -> None:
    files = sorted((SRC / "runtime").rglob("*.py"))
    assert offending(files, ("tether.cli", "tether.web")) == []


#: The parts of a round: they take their collaborators through `runtime.run.ports`.
ROUND_PARTS = (
    "round/phases",
    "ops/runner",
    "recovery/turn",
    "judge/verdicts",
    "round/checks",
    "round/claims/__init__",
    "round/claims/names",
    "round/claims/words",
    "round/compaction",
    "round/context",
    "judge/judges",
    "judge/completion",
    "round/history",
    "run/state",
    "run/ports",
    "run/outcome",
    "run/journal",
    "run/records",
    "run/model_calls",
    "run/liveness/heartbeat",
    "run/task_run",
)


def test_round_parts_do_not_import_the_engine() -> None:
    files = [SRC / "runtime" / f"{name}.py" for name in ROUND_PARTS]
    assert all(f.is_file() for f in files)
    assert offending(files, ("tether.runtime.engine", "tether.runtime.worker")) == []


ROUND = SRC / "runtime" / "round"


def test_round_modules_keep_their_size_budget() -> None:
    sizes = {
        str(p.relative_to(ROUND)): len(p.read_text().splitlines()) for p in ROUND.rglob("*.py")
    }
    assert "claims/__init__.py" in sizes and "compaction.py" in sizes
    assert {name: n for name, n in sizes.items() if n > 600} == {}


def test_round_modules_import_no_private_name_of_each_other() -> None:
    private = []
    for path in ROUND.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tether."):
                private += [f"{path.name}: {a.name}" for a in node.names if a.name[0] == "_"]
    assert private == []


def test_the_claim_reader_does_not_import_compaction() -> None:
    # One way: compaction uses the claim reader; the reader knows nothing of compaction.
    for name in ("claims/__init__", "claims/names", "claims/words"):
        mods = imports_of(ROUND / f"{name}.py")
        assert "tether.runtime.round.compaction" not in mods, name
    assert "tether.runtime.round.claims" in imports_of(ROUND / "compaction.py")


def test_the_check_sees_imports() -> None:
    # Guard against a check that cannot fail: it does see the engine's imports.
    assert "tether.store.base" in imports_of(SRC / "runtime" / "engine.py")


def test_a_round_ends_by_returning_its_outcome() -> None:
    """Status changes are decided from returned outcomes; the `Stop` exception is kept
    for the two ends that arise deep inside a phase (a failed or interrupted model call
    in the run's model port, a paused tool call in `ops`) and is caught only at the
    round's entry points."""
    import re

    raising, catching = set(), set()
    for path in (SRC / "runtime").rglob("*.py"):
        text = path.read_text()
        if re.search(r"raise (Stop|Pause)\(", text):
            raising.add(path.stem)
        if re.search(r"except \(?[\w., ]*\b(Stop|Pause)\b", text):
            catching.add(path.stem)
    assert raising == {"model_calls", "runner"}
    # ops saves a paused round's finished calls and re-raises; the run's model port
    # closes its call's bookkeeping and re-raises; only `round` turns a Stop into a result.
    assert catching == {"phases", "runner", "model_calls"}
    assert "except Stop as" in (SRC / "runtime" / "round" / "phases.py").read_text()


#: The status-change event and the names a call may give a status outside `lifecycle`.
STATUS_EVENT = "TaskStatusChanged"
STATUS_WRITERS = ("TaskPatch", "commit", "Commit", "write")


def status_builders(source: str) -> list[str]:
    """Where `source` builds a status change by hand: a call of the status event's
    class (or an import of it under another name), or a literal `status=` given to a
    task patch or a commit."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and any(a.name == STATUS_EVENT for a in node.names):
            out.append(f"line {node.lineno}: imports {STATUS_EVENT}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == STATUS_EVENT:
            out.append(f"line {node.lineno}: builds {STATUS_EVENT}")
        elif name in STATUS_WRITERS and any(
            k.arg == "status" and isinstance(k.value, ast.Constant) for k in node.keywords
        ):
            out.append(f"line {node.lineno}: {name}(status=...) by hand")
    return out


def test_only_lifecycle_builds_a_status_change() -> None:
    """`lifecycle.transition` is the one builder of a status change (its event and its
    task-row fields); everyone else asks it."""
    found = {
        str(path.relative_to(SRC)): status_builders(path.read_text(encoding="utf-8"))
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "lifecycle.py"
    }
    assert {path: where for path, where in found.items() if where} == {}


def test_the_status_check_sees_hand_built_changes() -> None:
    # Guard against a check that cannot fail: each hand-built form is seen.
    source = (
        "from tether.events import TaskStatusChanged as Moved\n"
        "e = ev.TaskStatusChanged(src='a', dst='b')\n"
        "p = TaskPatch(status='queued', waiting=None)\n"
        "await run.commit(events, status='running')\n"
        "q = TaskPatch(usage={})\n"
        "await run.commit(events, **patch)\n"
        "await journal.write(Commit(events, status='waiting'))\n"
        "await journal.write(Commit(events, **running))\n"
    )
    assert [w.split(":")[0] for w in status_builders(source)] == [
        "line 1",
        "line 2",
        "line 3",
        "line 4",
        "line 7",
    ]
    assert "lifecycle.transition" in (SRC / "runtime" / "run" / "journal.py").read_text()


def test_the_probe_does_not_know_the_engine() -> None:
    """The status probe reads its run through `probe.ProbedRun` (no import of the
    engine, type-only ones included: no `engine <-> probe` circle)."""
    (path,) = SRC.rglob("probe.py")
    assert "tether.runtime.run.state" in imports_of(path)  # the check sees its imports
    assert offending([path], ("tether.runtime.engine", "tether.runtime.worker")) == []


def test_the_dashboard_does_not_import_the_cli() -> None:
    # What both show (status colours, times, an event in words) is in `tether.report`.
    files = sorted((SRC / "web").glob("*.py"))
    assert files
    assert offending(files, ("tether.cli",)) == []


def test_the_dashboards_routers_do_not_import_its_app() -> None:
    # The app includes the routers; they reach its store and guard through `web.deps`.
    routers = [SRC / "web" / f"{name}.py" for name in ("api", "pages", "live", "metrics")]
    assert all(f.is_file() for f in routers)
    assert offending(routers, ("tether.web.app",)) == []
    assert "tether.web.deps" in imports_of(SRC / "web" / "pages.py")


#: The `getattr` calls runtime/ may make, by file and the object read: a run's own state
#: (its dataclass fields' defaults, by name).
GETATTR_ALLOWED = {
    ("run/state.py", "cls()"),
}


def getattr_calls(source: str) -> list[str]:
    """The objects `source` reads with `getattr(...)`, as written."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and node.args
        ):
            out.append(ast.unparse(node.args[0]))
    return out


def test_runtime_reads_protocol_objects_by_their_declared_members() -> None:
    """No `getattr` on a store, model or tool: what runtime/ needs of them is declared
    (`Store.clock`, `ClosableModel`, `StoreFile`, `McpTool`), so mypy checks it."""
    found = {
        (str(path.relative_to(SRC / "runtime")), obj)
        for path in sorted((SRC / "runtime").rglob("*.py"))
        for obj in getattr_calls(path.read_text(encoding="utf-8"))
    }
    assert found == GETATTR_ALLOWED


def test_the_getattr_check_sees_calls() -> None:
    # Guard against a check that cannot fail.
    source = 'c = getattr(store, "clock", None)\nf = getattr(m, "aclose")\nx = store.clock\n'
    assert getattr_calls(source) == ["store", "m"]


def test_the_worker_class_keeps_its_size_budget() -> None:
    """The worker's loop stays readable: its slots, held-back tasks and dead owners'
    tasks are parts of their own (`runtime/worker/`)."""
    path = SRC / "runtime" / "worker" / "__init__.py"
    (worker,) = [
        n
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "Worker"
    ]
    assert worker.end_lineno is not None
    assert worker.end_lineno - worker.lineno + 1 <= 400
