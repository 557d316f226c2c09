"""The DBOS side of the peer benchmark.

One `@DBOS.workflow` loops N times: a `@DBOS.step` for the zero-latency fake model
(returns the tool call) and a `@DBOS.step` for the tool (the side effect, and 1 KB
returned). The conversation lives in the workflow's local variables; DBOS checkpoints
each step's output in its system database, SQLite (`sqlite:///file`, its default
engine settings: a rollback journal), SQLite in WAL mode (`sqlite-wal`: the file put in
WAL mode before DBOS opens it, as a DBOS user does — the mode is a property of the file
that every later connection keeps; DBOS itself sets no journal mode) or PostgreSQL (a
schema of this block's own, `dbos_system_schema`). After a crash, `DBOS.launch()` in
the new process finds the workflow (same id, same executor `local`) PENDING and
recovers it: it replays the recorded step outputs and runs the first step without one
again.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sqlite3
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import Probe, Setup, Storage, app_name, tool_output

SYSTEM = "dbos"
CONFIGS: dict[str, str | None] = {
    "sqlite": "sqlite",
    "sqlite-wal": "sqlite",
    "postgres": "postgres",
}
CRASH_CONFIGS = ("sqlite", "sqlite-wal", "postgres")
LABELS = {
    "sqlite": "SQLite system database (DBOS defaults)",
    "sqlite-wal": "SQLite system database in WAL mode (synchronous FULL)",
    "postgres": "PostgreSQL system database",
}
WORKFLOW_ID = "peers-agent-loop"
# What the workflow's steps see: set by `run` before the workflow starts or recovers.
_CURRENT: dict[str, Any] = {}
_WORKFLOW: list[Any] = []


def problem(config: str | None = None) -> str | None:
    """Why this system cannot run here (None: it can)."""
    try:
        found = importlib.util.find_spec("dbos") is not None
    except ModuleNotFoundError:
        found = False
    return None if found else "dbos is not installed (pip install -e '.[peers]')"


def versions() -> dict[str, str]:
    """Package versions to print beside the table."""
    out = {}
    for pkg in ("dbos", "SQLAlchemy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def _db_path(setup: Setup) -> Path:
    return setup.workdir / "dbos.sqlite"


def storage(setup: Setup) -> Storage | None:
    """Where this configuration keeps its data, with its settings."""
    if setup.config == "sqlite":
        # DBOS sets no journal mode or synchronous level: SQLite's defaults, a rollback
        # journal (DELETE) and FULL.
        return Storage("sqlite", path=_db_path(setup), journal="delete", synchronous="FULL")
    if setup.config == "sqlite-wal":
        # WAL with SQLite's default synchronous level (FULL), which DBOS leaves alone.
        return Storage("sqlite", path=_db_path(setup), journal="wal", synchronous="FULL")
    return Storage("postgres", url=setup.pg_url, schema=setup.schema)


def _register() -> Any:
    """Define the workflow and its steps once per process (names fixed for recovery)."""
    if _WORKFLOW:
        return _WORKFLOW[0]
    from dbos import DBOS

    @DBOS.step(name="peers_model")
    def model_step(step: int, history: int) -> dict[str, Any]:
        probe: Probe = _CURRENT["probe"]
        t0 = probe.model_start()
        call = {"name": "do_step", "args": {"step": step}, "id": f"call-{step}"}
        probe.model_done(t0)
        return call

    @DBOS.step(name="peers_tool")
    def tool_step(step: int) -> str:
        probe: Probe = _CURRENT["probe"]
        setup: Setup = _CURRENT["setup"]
        t0 = probe.tool_start()
        setup.effects.append(step)
        setup.after_effect(step)
        out = tool_output(step)
        probe.tool_done(t0)
        return out

    @DBOS.workflow(name="peers_agent_loop")
    def agent_loop(n: int) -> int:
        messages: list[Any] = [{"role": "user", "content": f"Do {n} steps with do_step."}]
        for step in range(1, n + 1):
            call = model_step(step, len(messages))
            messages.append({"role": "assistant", "tool_calls": [call]})
            out = tool_step(int(call["args"]["step"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
        return n

    _WORKFLOW.append(agent_loop)
    return agent_loop


def _config(setup: Setup) -> dict[str, Any]:
    cfg: dict[str, Any] = {"name": "peers-bench", "log_level": "WARNING"}
    if setup.config in ("sqlite", "sqlite-wal"):
        cfg["system_database_url"] = f"sqlite:///{_db_path(setup)}"
    else:
        assert setup.pg_url is not None and setup.schema is not None
        cfg["system_database_url"] = setup.pg_url
        cfg["dbos_system_schema"] = setup.schema
        # Tagged, so a killed process's connections can be found and ended.
        cfg["db_engine_kwargs"] = {"connect_args": {"application_name": app_name(setup.schema)}}
    return cfg


def _wal(path: Path) -> None:
    """Put the SQLite file in WAL mode (created if missing), as a DBOS user does once:
    the journal mode is stored in the file, so DBOS's own connections open it in WAL.
    Done before DBOS opens it; after a crash the file is in WAL mode already."""
    conn = sqlite3.connect(path)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    finally:
        conn.close()
    if str(mode).lower() != "wal":
        raise RuntimeError(f"{path}: SQLite refused WAL mode ({mode})")


def run(setup: Setup, probe: Probe, ready: Any) -> dict[str, Any]:
    """Run (or recover) N steps; `ready()` is called once the system database exists."""
    from dbos import DBOS, SetWorkflowID

    workflow = _register()
    _CURRENT.update(probe=probe, setup=setup)
    if setup.resume:
        setup.resume_called_at = time.perf_counter()
    if setup.config == "sqlite-wal":
        _wal(_db_path(setup))
    DBOS(config=_config(setup))  # type: ignore[arg-type]
    try:
        DBOS.launch()  # recovers a PENDING workflow of this executor, in the background
        if setup.resume:
            result = DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
        else:
            ready()
            with SetWorkflowID(WORKFLOW_ID):
                result = workflow(setup.n)
        probe.finish()
        info: dict[str, Any] = {"status": "done" if result == setup.n else "incomplete"}
        if setup.config != "postgres":  # the mode DBOS's file ran in, read back from it
            conn = sqlite3.connect(_db_path(setup))
            try:
                info["journal_mode"] = conn.execute("PRAGMA journal_mode").fetchone()[0]
            finally:
                conn.close()
        return info
    finally:
        DBOS.destroy()
