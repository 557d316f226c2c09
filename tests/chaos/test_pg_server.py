"""Real `tether` processes against a PostgreSQL server that is restarted and killed.

The test starts a server of its own (`initdb` into a temporary folder, another port:
see `_pg_server`), so it can do to it what an operator or a crash does:

- **several workers**: three `tether worker` processes run three tasks whose every item
  is one `create_ticket` call to a real ticket service (`tests/services/ticket_api.py`).
  Mid-run the server gets a fast restart (`pg_ctl restart -m fast`: sessions ended, the
  clients told), and once the workers are back at work it is killed outright (SIGKILL to
  the postmaster and every backend: a commit on its way gets no answer) and started
  again. Every task finishes; each task's events are numbered without a gap; the
  service created exactly one ticket per item and received exactly one request per op
  (it counts them itself, outside tether's database), and tether's journal agrees; the
  workers are still there and stop cleanly (a worker that exited 4 instead would be
  started again, and the work would still finish).
- **`tether run` across a crash in the middle of its commit**: the run is frozen at a
  commit with its connection in hand (fail point `during_commit=N:stop`), and the server
  is killed either before the commit reaches it (`commit-lost`) or after the commit was
  written and flushed but before the answer was sent (`answer-lost`: the server holds
  commits back waiting for a synchronous standby that does not exist, see
  `PgServer.hold_commits`); the test checks which of the two the database then holds.
  Either way the run's commit fails without an answer (did it happen?). The run does not
  send it again, nor exit: it reconnects, takes the task up from what the database
  holds, and finishes it — exit 0, one ticket per item, one request per op.
- **past `--reconnect-for`** with the server still down: exit 4 saying so; a resume
  finishes the task once the server is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import yaml

from tests.chaos._pg_server import PgServer, pg_server
from tests.conftest import pg_connect
from tests.support.cli import assert_ok, cli_env, popen_tether, tether, tether_command
from tests.support.procs import reap, wait_for, wait_stopped
from tests.support.services import TicketAPI

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

POLICY = "scripted:tests.chaos._pg_server:paced_actor"
FAST_POLICY = "scripted:tests.services.policies:actor"
TOOLS = "tests.services.tools:TICKET_TOOLS"
#: Generous bounds: the stress pass runs this with every CPU kept busy (a wait that
#: runs out fails with what it waited for, before the test's own timeout).
LONG = 100.0


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    """One server for the module; each test has schemas of its own on it."""
    srv = pg_server()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def tickets() -> Iterator[TicketAPI]:
    with TicketAPI() as service:
        yield service


def fresh_db(server: PgServer) -> str:
    server.start()  # if a test before this one left it down
    schema = f"tt_{uuid.uuid4().hex[:12]}"
    return server.url(schema, app=f"tt-{schema}")


def env_for(tickets: TicketAPI, **extra: str) -> dict[str, str]:
    # A slow answer under CPU stress is no lost answer: one request per op stays exact.
    return cli_env(TETHER_TOOLS=TOOLS, TICKETS_URL=tickets.url, TICKETS_TIMEOUT="30", **extra)


def write_task_spec(folder: Path, name: str, n_items: int) -> Path:
    """Items `<name>1..N`, each done once one `create_ticket` call for it succeeded."""
    data = {
        "name": name,
        "objective": f"one ticket per item of {name}",
        "items": [
            {"id": f"{name}{k}", "title": f"ticket {name}{k}",
             "done_when": {"kind": "op", "tool": "create_ticket",
                           "args": {"title": f"{name}{k}"}}}
            for k in range(1, n_items + 1)
        ],
        "tools": ["create_ticket"],
        "models": {"judge": "rules"},
    }  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


# ------------------------------------------------------------------ reading the database


def query(db: str, sql: str, *args: Any) -> list[dict[str, Any]] | None:
    """Rows, or None while the server (or the schema) is not there."""
    import psycopg

    try:
        with pg_connect(db) as conn:
            return list(conn.execute(sql, args).fetchall())
    except psycopg.Error:
        return None


def rounds_done(db: str) -> dict[str, int]:
    rows = query(
        db,
        "SELECT task_id, count(*) AS n FROM events WHERE type = 'round.committed' GROUP BY task_id",
    )
    return {r["task_id"]: int(r["n"]) for r in rows or []}


def event_count(db: str) -> int:
    rows = query(db, "SELECT count(*) AS n FROM events")
    assert rows is not None
    return int(rows[0]["n"])


def statuses(db: str) -> dict[str, str]:
    rows = query(db, "SELECT task_id, status FROM tasks")
    return {r["task_id"]: r["status"] for r in rows or []}


def assert_journal_sound(db: str, task_id: str, titles: list[str]) -> None:
    """Events numbered 1..N without a gap or a repeat; one succeeded op per item."""
    events = query(db, "SELECT seq FROM events WHERE task_id = %s ORDER BY seq", task_id)
    assert events is not None
    seqs = [int(e["seq"]) for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), f"task {task_id}: event gap or repeat"
    ops = query(
        db, "SELECT args, status FROM ops WHERE task_id = %s AND tool = 'create_ticket'", task_id
    )
    assert ops is not None
    done = sorted(str(o["args"]["title"]) for o in ops if o["status"] == "succeeded")
    assert done == sorted(titles), ops


def assert_one_effect_per_op(tickets: TicketAPI, titles: list[str]) -> None:
    """The service's own count: one ticket per item, one request per op (key)."""
    stats = tickets.stats()
    assert stats["created"] == len(titles), stats
    keys = Counter(p["key"] for p in stats["posts"])
    assert all(n == 1 for n in keys.values()), f"an op was sent twice: {keys}"
    assert sorted(p["title"] for p in stats["posts"]) == sorted(titles), stats["posts"]


# ------------------------------------------------------------------------------ tests


@pytest.mark.timeout(600)
def test_workers_ride_out_a_fast_restart_and_a_kill_of_the_server(
    tmp_path: Path, server: PgServer, tickets: TicketAPI
) -> None:
    db = fresh_db(server)
    env = env_for(tickets)
    n_tasks, n_items = 3, 8
    titles: dict[str, list[str]] = {}
    for name in ("a", "b", "c")[:n_tasks]:
        ws = tmp_path / f"ws-{name}"
        ws.mkdir()
        spec = write_task_spec(tmp_path, name, n_items)
        sub = tether("submit", spec, "--workspace", ws, "--db", db, cwd=tmp_path, env=env)
        assert_ok(sub)
        titles[sub.stdout.strip().split()[-1]] = [f"{name}{k}" for k in range(1, n_items + 1)]

    logs: list[Path] = []

    def start_worker() -> subprocess.Popen[str]:
        # Its stderr to a file: a pipe nobody reads during the outages could fill up
        # with reconnect warnings and block the worker.
        log = tmp_path / f"worker-{len(logs)}.log"
        logs.append(log)
        with open(log, "w", encoding="utf-8") as err:
            return subprocess.Popen(
                [*tether_command(), "worker", "--db", db, "--model", POLICY,
                 "--poll", "0.1", "--quiet"],
                cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, text=True,
            )  # fmt: skip

    workers = [start_worker() for _ in range(3)]
    log_of = {w.pid: logs[i] for i, w in enumerate(workers)}

    def err_of(w: subprocess.Popen[str]) -> str:
        return log_of[w.pid].read_text(errors="replace")

    def check_workers() -> None:
        """A worker that exited must have said "infrastructure" (4): start it again."""
        for i, w in enumerate(workers):
            if w.poll() is not None:
                assert w.returncode == 4 and "Traceback" not in err_of(w), (
                    w.returncode,
                    err_of(w),
                )
                workers[i] = start_worker()
                log_of[workers[i].pid] = logs[-1]

    def all_at_work() -> bool:
        check_workers()
        done = rounds_done(db)
        return len(done) == n_tasks and all(n >= 1 for n in done.values())

    try:
        wait_for(all_at_work, "every task to commit a round", LONG)
        server.restart()
        after_restart = sum(rounds_done(db).values())

        def progressed() -> bool:
            check_workers()
            return sum(rounds_done(db).values()) >= after_restart + n_tasks

        wait_for(progressed, "the workers to commit rounds after the restart", LONG)
        left = [t for t, s in statuses(db).items() if s != "satisfied"]
        assert left, "every task finished before the kill: the test proved nothing"
        server.kill()
        server.start()

        def finished() -> bool:
            check_workers()
            st = statuses(db)
            return len(st) == n_tasks and all(s == "satisfied" for s in st.values())

        wait_for(finished, "every task to finish after the kill", LONG)
        # Still there, and they stop cleanly.
        for w in workers:
            assert w.poll() is None, f"exit {w.returncode}: {err_of(w)}"
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=LONG)
            assert w.returncode == 0, err_of(w)
            assert "Traceback" not in err_of(w), err_of(w)
    finally:
        for w in workers:
            reap(w)
    for task_id, item_titles in titles.items():
        assert_journal_sound(db, task_id, item_titles)
    assert_one_effect_per_op(tickets, [t for ts in titles.values() for t in ts])


@pytest.mark.parametrize("landed", [False, True], ids=["commit-lost", "answer-lost"])
@pytest.mark.parametrize("nth_commit", [3, 6])
def test_run_goes_on_after_its_commit_is_cut_off_by_a_server_crash(
    tmp_path: Path, server: PgServer, tickets: TicketAPI, nth_commit: int, landed: bool
) -> None:
    db = fresh_db(server)
    app = app_of(db)
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = write_task_spec(tmp_path, "r", 3)
    env = env_for(tickets, TETHER_FAILPOINTS=f"during_commit={nth_commit}:stop")
    run = popen_tether(
        "run", spec, "--workspace", ws, "--db", db, "--model", FAST_POLICY, "--json",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        wait_stopped(run, LONG)
        before = event_count(db)
        if landed:
            # The commit is written and flushed, then waits for a standby: the server
            # dies with the commit in its log and the answer not sent.
            server.hold_commits()
            os.kill(run.pid, signal.SIGCONT)
            wait_for(lambda: server.waiting_commits(app), "the run's commit to be held", LONG)
            os.kill(run.pid, signal.SIGSTOP)  # while the test looks (not needed by the run)
            wait_stopped(run, LONG)
            server.kill()
            server.unhold_commits()
        else:
            # The commit's connection is in the run's hand; the server dies without a
            # word before the commit is sent.
            server.kill()
        server.start()
        # What the run will find: its commit there (landed) or not.
        after = event_count(db)
        assert after > before if landed else after == before, (before, after)
        os.kill(run.pid, signal.SIGCONT)
        out, err = run.communicate(timeout=LONG)
    finally:
        reap(run)
        if landed and server.postmaster_pid() is None:
            server.unhold_commits()
            server.start()
    assert run.returncode == 0, f"exit {run.returncode}\n{err}"
    assert "Traceback" not in err
    assert "reconnecting" in err, err  # it did lose the database on the way
    (task_id,) = statuses(db)
    assert statuses(db)[task_id] == "satisfied"
    assert_journal_sound(db, task_id, ["r1", "r2", "r3"])
    assert_one_effect_per_op(tickets, ["r1", "r2", "r3"])
    # And the CLI reads it back like any task.
    assert_ok(tether("status", task_id, "--db", db, cwd=tmp_path, env=env_for(tickets)))
    assert '"satisfied"' in out


def app_of(db: str) -> str:
    return dict(parse_qsl(urlsplit(db).query))["application_name"]


def test_run_exits_4_once_the_server_stays_away_past_reconnect_for(
    tmp_path: Path, server: PgServer, tickets: TicketAPI
) -> None:
    """After `--reconnect-for` seconds without the database: exit 4, one clear
    paragraph, and a resume finishes the task once the server is back."""
    db = fresh_db(server)
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = write_task_spec(tmp_path, "q", 2)
    env = env_for(tickets, TETHER_FAILPOINTS="during_commit=3:stop")
    run = popen_tether(
        "run", spec, "--workspace", ws, "--db", db, "--model", FAST_POLICY,
        "--reconnect-for", "1", cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        wait_stopped(run, LONG)
        server.kill()
        os.kill(run.pid, signal.SIGCONT)
        _, err = run.communicate(timeout=LONG)
    finally:
        reap(run)
        server.start()
    assert run.returncode == 4, err
    assert "Traceback" not in err
    assert "did not come back in 1 s" in err and "tether resume" in err, err
    (task_id,) = statuses(db)
    resumed = tether(
        "resume", task_id, "--db", db, "--model", FAST_POLICY, cwd=tmp_path,
        env=env_for(tickets), timeout=LONG,
    )  # fmt: skip
    assert_ok(resumed)
    assert statuses(db)[task_id] == "satisfied"
    assert_journal_sound(db, task_id, ["q1", "q2"])
    assert_one_effect_per_op(tickets, ["q1", "q2"])
