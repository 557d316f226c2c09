"""A peer frozen inside a transaction (a GC pause, a stopped VM, a debugger) blocks no one
for long, and is never waited for in silence.

Each test freezes a real `tether` process with SIGSTOP at a fail point (`NAME=N:stop`)
while it holds what it holds at that step, then runs other real `tether` processes
against the same database:

- SQLite, frozen inside a commit (its write lock held): `list`, `status`, `events` and
  `approvals` still answer (they open read-only); a command that writes gives up after
  the busy timeout with exit 4 and "another process holds the write lock" (it wrote
  nothing); once the frozen process is gone the task is resumed and finishes.
- PostgreSQL, frozen inside a commit: the commit's transaction lives on the server only,
  so the task's row is free — a `cancel` on it answers at once.
- PostgreSQL, frozen inside a claim (the task's row locked by a client-driven
  transaction): the server ends that transaction (`idle_in_transaction_session_timeout`)
  and another process takes the task over and finishes it; the thawed process writes
  nothing.
- PostgreSQL, a worker's pick: a row locked by a frozen peer is passed over (`SKIP
  LOCKED`), and the worker runs the other task.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    cli_env,
    describe,
    json_out,
    popen_tether,
    tether,
    write_spec,
)
from tests.support.procs import reap, wait_stopped

pytestmark = pytest.mark.slow


def submit(cwd: Path, db: str, name: str = "frozen") -> str:
    spec = write_spec(cwd / f"{name}.yaml", 2, name=name)
    ws = cwd / f"ws-{name}"
    ws.mkdir()
    proc = tether("submit", spec, "--workspace", ws, "--db", db, cwd=cwd)
    assert_ok(proc)
    return proc.stdout.strip().split()[-1]


def frozen(cwd: Path, db: str, failpoint: str, *args: str) -> object:
    """A `tether ARGS` process, stopped at `failpoint` (waited for)."""
    proc = popen_tether(
        *args, "--db", db, "--model", DONE, cwd=cwd, env=cli_env(TETHER_FAILPOINTS=failpoint)
    )
    try:
        wait_stopped(proc)
    except BaseException:
        reap(proc)
        raise
    return proc


def status_of(cwd: Path, db: str, task_id: str) -> str:
    doc = json_out(tether("status", task_id, "--json", "--db", db, cwd=cwd))
    return str(doc["status"])


def write_lock_held(path: Path) -> bool:
    """True if another connection holds the SQLite file's write lock now."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc)
    else:
        conn.execute("ROLLBACK")
        return False
    finally:
        conn.close()


def test_sqlite_frozen_writer_is_reported_not_waited_for(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    short = f"{db}?busy_timeout=2"
    task_id = submit(tmp_path, db)
    # The second commit of the run is a round's: the write lock is held there.
    proc = frozen(tmp_path, db, "during_commit=2:stop", "resume", task_id)
    try:
        assert write_lock_held(tmp_path / "tether.db")
        # Read-only commands answer while the write lock is held.
        listed = tether("list", "--json", "--db", db, cwd=tmp_path, timeout=30)
        assert [t["task_id"] for t in json_out(listed)] == [task_id]
        for args in (("status", task_id), ("events", task_id), ("approvals", task_id)):
            assert_ok(tether(*args, "--db", db, cwd=tmp_path, timeout=30))
        # A writer waits the busy timeout, then says who is in the way: exit 4.
        start = time.monotonic()
        cancelled = tether("cancel", task_id, "--db", short, cwd=tmp_path, timeout=60)
        assert time.monotonic() - start < 30, describe(cancelled)
        assert_clean_error(cancelled, 4, "another process holds the write lock")
        worker = tether("worker", "--once", "--db", short, "--model", DONE, cwd=tmp_path)
        assert_clean_error(worker, 4, "another process holds the write lock")
    finally:
        reap(proc)
    # Nothing of the refused cancel was written, and the task goes on.
    assert status_of(tmp_path, db, task_id) == "running"
    resumed = tether("resume", task_id, "--db", db, "--model", DONE, cwd=tmp_path, timeout=90)
    assert_ok(resumed)
    assert status_of(tmp_path, db, task_id) == "satisfied"


def with_options(url: str, **settings: str) -> str:
    """`url` with libpq `options` setting these session parameters."""
    opts = " ".join(f"-c {k}={v}" for k, v in settings.items())
    return f"{url}&options={quote(opts)}"


@pytest.mark.postgres
def test_postgres_frozen_committer_holds_no_row_lock(
    tmp_path: Path, pg_schema_url: Callable[[], str]
) -> None:
    db = pg_schema_url()
    task_id = submit(tmp_path, db)
    proc = frozen(tmp_path, db, "during_commit=2:stop", "resume", task_id)
    try:
        start = time.monotonic()
        cancelled = tether("cancel", task_id, "--db", db, cwd=tmp_path, timeout=60)
        assert_ok(cancelled)
        # No lock to wait for: well under the 5 s lock timeout.
        assert time.monotonic() - start < 20, describe(cancelled)
    finally:
        reap(proc)


@pytest.mark.postgres
def test_postgres_frozen_claimer_is_ended_by_the_server(
    tmp_path: Path, pg_schema_url: Callable[[], str]
) -> None:
    db = pg_schema_url()
    task_id = submit(tmp_path, db)
    stuck = with_options(db, idle_in_transaction_session_timeout="2s")
    proc = frozen(tmp_path, stuck, "during_claim=1:stop", "resume", task_id)
    thawed = False
    try:
        # The server ends the frozen claim's transaction; this takeover then runs.
        resumed = tether("resume", task_id, "--db", db, "--model", DONE, cwd=tmp_path, timeout=90)
        assert resumed.returncode == 0, f"frozen pid {proc.pid}: {describe(resumed)}"
        assert status_of(tmp_path, db, task_id) == "satisfied"
        before = json_out(tether("events", task_id, "--json", "--db", db, cwd=tmp_path))
        proc.send_signal(18)  # SIGCONT: the frozen claimer wakes up to a dead session
        thawed = True
        _, err = proc.communicate(timeout=60)
        # Its claim was rolled back by the server. Told so, it tries again and finds the
        # task finished (exit 0); when the socket lost the server's last words, whether
        # the claim happened is unknown to it, and it stops (exit 4).
        assert proc.returncode in (0, 4), err
        assert "Traceback" not in err
        after = json_out(tether("events", task_id, "--json", "--db", db, cwd=tmp_path))
        assert after == before
    finally:
        if not thawed:
            reap(proc)


@pytest.mark.postgres
def test_postgres_worker_passes_over_a_row_a_frozen_peer_holds(
    tmp_path: Path, pg_schema_url: Callable[[], str]
) -> None:
    db = pg_schema_url()
    held = submit(tmp_path, db, "held")
    free = submit(tmp_path, db, "free")
    stuck = with_options(db, idle_in_transaction_session_timeout="300s")
    proc = frozen(tmp_path, stuck, "during_claim=1:stop", "resume", held)
    try:
        worker = tether("worker", "--once", "--db", db, "--model", DONE, cwd=tmp_path, timeout=90)
        assert_ok(worker)
        assert status_of(tmp_path, db, free) == "satisfied"
        assert status_of(tmp_path, db, held) == "queued"
    finally:
        reap(proc)
