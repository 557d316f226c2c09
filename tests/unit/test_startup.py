"""Start-up does only what the command needs: `import tether` and `tether --help` load no
runtime, no SDK, no HTTP client and no extra; `tether status` reads the database without
the engine or the contract models. Behaviour, not time: each case runs in a fresh
interpreter and looks at `sys.modules` (the figures are `benchmarks/startup_bench.py`'s).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.cli import COMMANDS
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store import open_store

#: Never needed to print help or read a task: the runtime, the SDKs, HTTP, the extras.
HEAVY = (
    "tether.runtime.engine",
    "tether.tools.builtin.files",
    "tether.runtime.wiring",
    "tether.models.registry",
    "httpx",
    "httpx2",
    "openai",
    "anthropic",
    "mcp",
    "fastapi",
    "uvicorn",
    "psycopg",
    "matplotlib",
    "opentelemetry",
    "prometheus_client",
    "jsonschema",
)
#: Not even these for `--help`: the contract models, YAML, the store, an event loop.
HELP_ALSO_NOT = ("tether.spec", "tether.events", "tether.store", "yaml", "asyncio")

_PROBE = """
import json, sys
sys.argv = ["tether", *json.loads(sys.argv[1])]
code = None
try:
    {call}
except SystemExit as exc:
    code = exc.code
print("\\n@@" + json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


def probe(call: str, args: Sequence[str] = ()) -> tuple[object, set[str]]:
    """Run `call` (Python) in a fresh interpreter with `sys.argv = ["tether", *args]`;
    its exit code and the modules it loaded."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(call=call), json.dumps(list(args))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "@@" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout.rsplit("@@", 1)[1])
    return doc["code"], set(doc["modules"])


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of `names` (or their submodules) are in `modules`."""
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_import_tether_loads_no_runtime() -> None:
    _, modules = probe("import tether")
    assert loaded(modules, HEAVY + HELP_ALSO_NOT) == []
    assert "pydantic.main" not in modules


def test_the_public_names_load_on_first_use() -> None:
    code, modules = probe("import tether; tether.Engine; tether.parse_spec")
    assert code is None
    assert "tether.runtime.engine" in modules and "tether.spec" in modules  # the probe sees


def test_every_public_name_resolves() -> None:
    for name in tether.__all__:
        assert getattr(tether, name) is not None, name
    assert set(tether.__all__) <= set(dir(tether))
    with pytest.raises(AttributeError):
        _ = tether.no_such_name  # type: ignore[attr-defined]


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["status", "--help"], []])
def test_help_and_version_load_nothing_heavy(args: list[str]) -> None:
    code, modules = probe("from tether.cli import main; main()", args)
    assert code in (0, 2)  # bare `tether` shows the help and exits 2
    assert loaded(modules, HEAVY + HELP_ALSO_NOT) == []


def test_version_alone_loads_no_command() -> None:
    code, modules = probe("from tether.cli import main; main()", ["--version"])
    assert code == 0
    assert {m for m in modules if m.startswith("tether.cli.")} <= {
        f"tether.cli.{m}" for m in ("_app", "_help", "_logging", "views")
    }


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    proc = subprocess.run(
        [sys.executable, "-m", "tether.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"tether {version('tether')}\n"
    assert proc.stdout.strip() == f"tether {tether.__version__}"


@pytest.fixture
def db(tmp_path: Path) -> tuple[str, str]:
    """A SQLite database with one queued task: (URL, task id)."""
    url = f"sqlite:///{tmp_path / 'tether.db'}"

    async def make() -> str:
        store = await open_store(url)
        try:
            spec = parse_spec({"objective": "x", "items": [{"id": "a", "title": "A"}]})
            return (await create_task(store, spec, workspace=tmp_path)).task_id
        finally:
            await store.close()

    return url, asyncio.run(make())


@pytest.mark.parametrize(
    "command",
    [
        ["status", "{task}"],
        ["status", "{task}", "--json"],
        ["list"],
        ["events", "{task}"],
        ["timeline", "{task}"],
        ["artifacts", "{task}"],
        ["rebuild", "{task}"],
    ],
)
def test_reading_commands_load_no_runtime(db: tuple[str, str], command: list[str]) -> None:
    url, task = db
    args = [a.replace("{task}", task) for a in command] + ["--db", url]
    code, modules = probe("from tether.cli import main; main()", args)
    assert code in (None, 0)
    assert loaded(modules, HEAVY) == []
    assert "tether.store.sqlite" in modules  # it did read the database
    if command[0] == "status":  # the task as stored: no contract or event models
        assert loaded(modules, ("tether.spec", "tether.events", "yaml")) == []


def test_the_command_table_names_every_command_where_it_is_defined() -> None:
    from typer.main import get_command

    import tether.cli

    group = get_command(tether.cli.app)  # `tether.cli.app` has every command registered

    def module_of(cmd: Any) -> str:
        # A group of sub-commands (`tether schedule ...`) is defined where they are.
        callback = cmd.callback or next(iter(cmd.commands.values())).callback
        return str(callback.__module__).rsplit(".", 1)[1]

    defined = {
        name: module_of(cmd)
        for name, cmd in group.commands.items()  # type: ignore[attr-defined]
    }
    assert defined == COMMANDS
    assert list(defined) == list(COMMANDS)  # --help lists them in table order


def test_a_command_loads_its_own_module_only(db: tuple[str, str]) -> None:
    url, task = db
    code, modules = probe("from tether.cli import main; main()", ["status", task, "--db", url])
    assert code in (None, 0)
    commands = {m for m in modules if m.startswith("tether.cli.")}
    assert commands == {
        "tether.cli._app",
        "tether.cli._help",
        "tether.cli._logging",
        "tether.cli.views",
        "tether.cli.tasks",
    }
    # Anything else (help, an unknown command) sees them all.
    _, modules = probe("from tether.cli import main; main()", ["bogus"])
    assert {f"tether.cli.{m}" for m in COMMANDS.values()} <= modules


#: What a resumed run does not load before its first event (issue 27): YAML (the stored
#: contract is JSON), the webhook client, the price list, the live view and tables (not
#: on a terminal), the worker and its sweeps, and the SDKs (a scripted model here), the
#: web and the database drivers it does not use. OpenTelemetry, installed, does load.
RESUME_NOT = (
    *(m for m in HEAVY if not m.startswith(("tether.", "opentelemetry"))),
    "yaml",
    "tether.spec_yaml",
    "urllib.request",
    "genai_prices",
    "rich.live",
    "rich.table",
    "tether.runtime.worker",
    "tether.runtime.watch.schedules",
    "tether.runtime.watch.sweep",
    "tether.web",
    # The LLM judge and the completion check (its reviewer): after the first round.
    "tether.runtime.judge.llm",
    "tether.runtime.judge.completion",
    "tether.runtime.judge.judges",
)

_FIRST_EVENT = """
import json, os, sys
import tether.store._sql as sql
commit = sql.SqlStore.commit
async def first(self, task_id, token, events, **parts):
    result = await commit(self, task_id, token, events, **parts)
    if events:  # the run's first event is stored: what is loaded by now
        print("\\n@@" + json.dumps([e.TYPE for e in events] + ["|"] + sorted(sys.modules)))
        sys.stdout.flush()
        os._exit(0)
    return result
sql.SqlStore.commit = first
sys.argv = ["tether", *json.loads(sys.argv[1])]
from tether.cli import main
main()
"""


def test_a_resume_loads_only_what_its_run_needs(db: tuple[str, str]) -> None:
    url, task = db
    args = ["resume", task, "--model", "scripted:tests.e2e.policies:done_policy", "--db", url]
    proc = subprocess.run(
        [sys.executable, "-c", _FIRST_EVENT, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],  # `tests.e2e.policies` is importable
        check=False,
    )
    assert "@@" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout.rsplit("@@", 1)[1])
    types, modules = doc[: doc.index("|")], set(doc[doc.index("|") + 1 :])
    assert types[0] == "lease.claimed"
    assert "tether.runtime.engine" in modules  # the probe sees the run's modules
    assert loaded(modules, RESUME_NOT) == []


def test_the_collector_is_paused_while_a_command_loads_and_back_for_its_run() -> None:
    import gc

    from tether.cli import _app

    async def body() -> bool:
        return gc.isenabled()

    assert gc.isenabled()
    try:
        _app.pause_gc()
        assert not gc.isenabled()
        assert _app.run_async(body) is True  # the command's work runs collected
        assert gc.isenabled()
        _app.resume_gc()  # once only: nothing left to turn on
        assert gc.isenabled()
    finally:
        gc.unfreeze()  # this process's objects go back to the generations
        gc.enable()
