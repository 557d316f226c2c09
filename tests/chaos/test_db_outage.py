"""Workers ride out a lost database connection.

The server ends every session of the test's schema (`pg_terminate_backend`, as a
restart or a failover does to the clients) while a real `tether worker` runs a task and
while a real `tether run` drives one. The worker reconnects, finishes its task and then
takes a task queued after the outage; the run reconnects too and finishes (exit 0) —
also when the connection was lost in the middle of a commit: it then waits for the
database (`--reconnect-for`), takes the task up from what was recorded and goes on
(`test_pg_server` makes that case certain by killing a server of its own in the middle
of a commit). Nothing is journaled twice: each item is done by exactly one `write_file`
op.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from tests.conftest import pg_base_url, pg_connect
from tests.support.cli import SLOW, assert_ok, json_out, popen_tether, tether, write_spec
from tests.support.procs import reap, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def app_name(url: str) -> str:
    return dict(parse_qsl(urlsplit(url).query))["application_name"]


def end_sessions(url: str) -> int:
    """End every server session of `url`'s clients; how many there were."""
    base = pg_base_url()
    assert base is not None
    with pg_connect(base) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND application_name = %s",
            (app_name(url),),
        ).fetchall()
    return len(rows)


def events_of(url: str, task_id: str) -> list[dict[str, Any]]:
    with pg_connect(url) as conn:
        return list(
            conn.execute(
                "SELECT seq, type, data FROM events WHERE task_id = %s ORDER BY seq", (task_id,)
            ).fetchall()
        )


def rounds_done(url: str, task_id: str) -> int:
    return sum(1 for e in events_of(url, task_id) if e["type"] == "round.committed")


def status(url: str, task_id: str) -> str:
    with pg_connect(url) as conn:
        row = conn.execute("SELECT status FROM tasks WHERE task_id = %s", (task_id,)).fetchone()
    return str(row["status"]) if row else ""


def assert_each_item_written_once(url: str, task_id: str, n_items: int) -> None:
    with pg_connect(url) as conn:
        rows = conn.execute(
            "SELECT args, status FROM ops WHERE task_id = %s AND tool = 'write_file'", (task_id,)
        ).fetchall()
    paths = [
        json.loads(r["args"])["path"] if isinstance(r["args"], str) else r["args"]["path"]
        for r in rows
        if r["status"] == "succeeded"
    ]
    assert sorted(paths) == [f"out/i{n}.txt" for n in range(1, n_items + 1)], rows


def submit(cwd: Path, db: str, name: str, n_items: int) -> str:
    spec = write_spec(cwd / f"{name}.yaml", n_items, name=name)
    ws = cwd / f"ws-{name}"
    ws.mkdir()
    proc = tether("submit", spec, "--workspace", ws, "--db", db, cwd=cwd)
    assert_ok(proc)
    return proc.stdout.strip().split()[-1]


def test_worker_reconnects_after_its_sessions_are_ended(
    tmp_path: Path, pg_schema_url: Callable[[], str]
) -> None:
    db = pg_schema_url()
    first = submit(tmp_path, db, "first", 6)
    worker = popen_tether("worker", "--db", db, "--model", SLOW, "--poll", "0.1", cwd=tmp_path)
    try:
        wait_for(lambda: rounds_done(db, first) >= 2, "two rounds of the first task")
        assert end_sessions(db) >= 1
        wait_for(lambda: status(db, first) == "satisfied", "the first task to finish", 120)
        assert worker.poll() is None, "the worker died with its connections"
        second = submit(tmp_path, db, "second", 2)
        wait_for(lambda: status(db, second) == "satisfied", "the queued task to finish", 120)
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert "Traceback" not in err
    finally:
        reap(worker)
    assert_each_item_written_once(db, first, 6)
    assert_each_item_written_once(db, second, 2)


def test_run_reconnects_after_its_sessions_are_ended(
    tmp_path: Path, pg_schema_url: Callable[[], str]
) -> None:
    db = pg_schema_url()
    spec = write_spec(tmp_path / "spec.yaml", 6)
    ws = tmp_path / "ws"
    ws.mkdir()
    run = popen_tether("run", spec, "--workspace", ws, "--db", db, "--model", SLOW, cwd=tmp_path)
    try:

        def started() -> str | None:
            import psycopg

            with pg_connect(db) as conn:
                try:
                    row = conn.execute("SELECT task_id FROM tasks").fetchone()
                except psycopg.errors.UndefinedTable:  # not migrated yet
                    return None
            return row["task_id"] if row and rounds_done(db, row["task_id"]) >= 2 else None

        task_id = wait_for(started, "two rounds of the run")
        assert end_sessions(db) >= 1
        _, err = run.communicate(timeout=120)
        assert "Traceback" not in err
        # Whatever step the connection was lost in (a commit included), the run waits
        # for the database and goes on: no exit 4, no resume needed.
        assert run.returncode == 0, err
    finally:
        reap(run)
    doc = json_out(tether("status", task_id, "--json", "--db", db, cwd=tmp_path))
    assert doc["status"] == "satisfied"
    assert_each_item_written_once(db, task_id, 6)
