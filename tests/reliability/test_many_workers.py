"""Many `tether worker` processes on one database: every task runs exactly once at a
time, and every op reaches the service once.

The workers are real processes (`tether worker --once`) against the ticket API (its own
process, counting every POST with its Idempotency-Key, the op id). What the event log
must show, task by task:

- the events are numbered 1..n without a gap;
- every `lease.claimed` has a higher token than the one before (no two workers ever
  held the task under the same token), and every event written under a lease carries
  that lease's token: no event of an earlier holder after a later claim (no
  interleaved rounds from two owners);
- each op is POSTed once, and the service holds one ticket per item;
- no task is starved: a task is first claimed before any task queued after it is
  delivered (claims go oldest first).

Also: two workers starting together on an empty database both migrate it (one does the
work, neither fails), and a worker refuses a database written by a newer tether.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
from tests.services.flaky_tools import TOOL_NAME
from tests.support.procs import wait_for
from tests.support.services import TicketAPI
from tests.support.workers import Workers, add_tasks, in_store

from tether.spec import parse_spec
from tether.store import Store
from tether.store.base import StoredEvent

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def ticket_spec(name: str, items: list[str], tool: str = TOOL_NAME) -> Any:
    return parse_spec(
        {
            "name": name,
            "objective": f"file tickets {', '.join(items)}",
            "items": [
                {"id": i, "title": f"ticket {i}",
                 "done_when": {"kind": "op", "tool": tool, "args": {"title": i}}}
                for i in items
            ],
            "tools": [tool],
            "models": {"judge": "rules"},
        }
    )  # fmt: skip


def all_events(url: str, tids: list[str]) -> dict[str, list[StoredEvent]]:
    async def go(store: Store) -> dict[str, list[StoredEvent]]:
        return {t: list(await store.read_events(t)) for t in tids}

    return in_store(url, go)


def statuses(url: str, tids: list[str]) -> list[tuple[str, str | None]]:
    async def go(store: Store) -> list[tuple[str, str | None]]:
        return [((t := await store.get_task(tid)).status, t.stop_reason) for tid in tids]

    return in_store(url, go)


def check_one_holder_at_a_time(tid: str, evs: list[StoredEvent]) -> list[str]:
    """The log's invariants of exclusive ownership (see the module docstring); the
    owners of the task's claims, in order."""
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1)), f"{tid}: gaps in the log"
    owners: list[str] = []
    token = 0
    for e in evs:
        if e.type == "lease.claimed":
            assert e.data["token"] > token, f"{tid}: token {e.data['token']} after {token}"
            token = e.data["token"]
            owners.append(e.data["worker_id"])
            assert e.fencing_token in (None, token), f"{tid}: claim written under another token"
        elif e.fencing_token is not None:
            # Written under a lease: the latest claim's, never an earlier holder's.
            assert e.fencing_token == token, (
                f"{tid}: event {e.seq} ({e.type}) under token {e.fencing_token}, "
                f"the lease is {token}'s"
            )
    return owners


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with closing(Workers(tmp_path)) as w:
        yield w


@pytest.fixture
def api() -> Iterator[TicketAPI]:
    with TicketAPI() as service:
        yield service


def db_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "postgres":
        return str(request.getfixturevalue("pg_schema_url")())
    return f"sqlite:///{tmp_path / 'tether.db'}"


BACKENDS = [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite"]


async def raw(store: Store, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One SQL statement on the store's own connection (the test reaching under the API)."""

    def go() -> list[dict[str, Any]]:
        with store._auto() as conn:  # type: ignore[attr-defined]
            cur = store._x(conn, sql, params or {})  # type: ignore[attr-defined]
            return [dict(r) for r in cur.fetchall()] if cur.description else []

    return await store._run(go)  # type: ignore[attr-defined,no-any-return]


# ---------------------------------------------------------------- exactly once


@pytest.mark.parametrize(
    ("kind", "n_workers", "n_tasks", "concurrency"),
    [
        pytest.param("postgres", 5, 24, 1, marks=pytest.mark.postgres),
        ("sqlite", 3, 12, 1),
        # Several runs at once in each process (`--concurrency`), same invariants.
        pytest.param("postgres", 3, 24, 4, marks=pytest.mark.postgres),
        ("sqlite", 2, 12, 3),
    ],
    ids=["postgres-5x24", "sqlite-3x12", "postgres-3x24-c4", "sqlite-2x12-c3"],
)
def test_many_workers_run_every_task_once_at_a_time(
    kind: str,
    n_workers: int,
    n_tasks: int,
    concurrency: int,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    api: TicketAPI,
    workers: Workers,
) -> None:
    url = db_url(kind, tmp_path, request)
    names = [[f"t{t}a", f"t{t}b"] for t in range(n_tasks)]
    tids = add_tasks(url, [ticket_spec(f"task{t}", n) for t, n in enumerate(names)])
    procs = workers.start(
        url, n_workers, "--once", "--concurrency", str(concurrency), TICKETS_URL=api.url
    )
    workers.wait(procs)

    assert statuses(url, tids) == [("satisfied", "delivered")] * n_tasks
    evs = all_events(url, tids)
    owners = {tid: check_one_holder_at_a_time(tid, evs[tid]) for tid in tids}
    pids = {int(o.rsplit(":", 1)[1]) for os_ in owners.values() for o in os_}
    assert pids <= {p.pid for p in procs}, pids
    if concurrency == 1:
        # The work was shared (more than one process claimed tasks).
        assert len(pids) >= 2, pids
    else:
        # A process ran several tasks at once: two runs of one owner overlap (from a
        # claim to the task's delivery). Which processes got work is the start race's:
        # one may take it all before another is up, and at several runs a process
        # that often does.
        spans: dict[str, list[tuple[float, float]]] = {}
        for tid in tids:
            claim = next(e for e in evs[tid] if e.type == "lease.claimed")
            end = next(
                e.at for e in evs[tid] if e.type == "task.status" and e.data["dst"] == "satisfied"
            )
            spans.setdefault(claim.data["worker_id"], []).append((claim.at, end))
        overlapping = [
            owner
            for owner, runs in spans.items()
            if any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(runs) for b0, b1 in runs[:i])
        ]
        assert overlapping, spans

    # Each op reached the service once; one ticket per item, from a succeeded op.
    stats = api.stats()
    posts = Counter(p["key"] for p in stats["posts"])
    assert all(n == 1 for n in posts.values()), posts.most_common(3)
    tickets = api.tickets()
    assert sorted(t["title"] for t in tickets) == sorted(i for n in names for i in n)
    ok = sorted(
        e.data["op_id"]
        for tid in tids
        for e in evs[tid]
        if e.type == "op.result" and e.data["status"] == "succeeded"
    )
    assert sorted(t["key"] for t in tickets) == ok

    # No task starved: claims go oldest first. A claim's own time is its expiry less the
    # lease (60 s): the `lease.claimed` event is written later, by a process the CPU may
    # leave waiting. Processes and slots race each other for the next task, so a task
    # may be claimed after a few younger ones, never after more than one per slot; and
    # a task is claimed before any task queued more than two slot counts after it is
    # delivered (a delivery is a whole run later than its claim).
    slots = n_workers * concurrency
    first_claim = {
        tid: next(e.data["expires_at"] - 60 for e in evs[tid] if e.type == "lease.claimed")
        for tid in tids
    }
    order = sorted(range(n_tasks), key=lambda i: first_claim[tids[i]])
    displaced = {i: pos for pos, i in enumerate(order) if pos - i > slots}
    assert not displaced, f"claimed after more than {slots} younger tasks: {displaced}"
    delivered = {
        tid: next(
            e.at for e in evs[tid] if e.type == "task.status" and e.data["dst"] == "satisfied"
        )
        for tid in tids
    }
    for i, tid in enumerate(tids):
        later = range(i + 2 * slots, n_tasks)
        overtaken = [j for j in later if delivered[tids[j]] < first_claim[tid]]
        assert not overtaken, f"task {i} waited while later tasks {overtaken} were delivered"


# ---------------------------------------------------------------- migrations


def _migrate_script(tmp_path: Path) -> Path:
    script = tmp_path / "open.py"
    script.write_text(
        "import asyncio, sys\n"
        "from tether.store import open_store\n"
        "async def main(url):\n"
        "    store = await open_store(url)\n"
        "    print(await store.schema_version(), flush=True)\n"
        "    await store.close()\n"
        "asyncio.run(main(sys.argv[1]))\n"
    )
    return script


@pytest.mark.parametrize("kind", BACKENDS)
def test_workers_starting_together_migrate_an_empty_database_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from tether.store.base import SCHEMA_VERSION

    url = db_url(kind, tmp_path, request)
    script = _migrate_script(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, str(script), url]
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=PIPE, stderr=PIPE)
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        assert out.strip() == str(SCHEMA_VERSION)

    versions = in_store(url, lambda s: raw(s, "SELECT version FROM tether_schema ORDER BY 1"))
    assert versions == [{"version": v} for v in range(1, SCHEMA_VERSION + 1)]


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_worker_refuses_a_database_of_a_newer_tether(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, workers: Workers
) -> None:
    from tether.store.base import SCHEMA_VERSION

    url = db_url(kind, tmp_path, request)

    in_store(
        url,
        lambda s: raw(
            s,
            "INSERT INTO tether_schema (version, name, applied_at) VALUES (:v, 'future', 0)",
            {"v": SCHEMA_VERSION + 1},
        ),
    )
    (proc,) = workers.start(url, 1, "--once")
    assert proc.wait(timeout=60) != 0
    out = workers.log(proc)
    assert "Traceback" not in out, out
    assert f"version {SCHEMA_VERSION + 1}" in out and "upgrade tether" in out, out


# ---------------------------------------------------------------- a dead worker's task


@pytest.fixture
def slow_api() -> Iterator[TicketAPI]:
    """The ticket API taking 0.5 s per POST (a worker is killed mid-task)."""
    with TicketAPI("--delay", "0.5") as service:
        yield service


@pytest.mark.timeout(300)  # a minute of silence to wait for (see the docstring)
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_killed_workers_task_is_taken_over_at_once(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    slow_api: TicketAPI,
    workers: Workers,
) -> None:
    """A worker SIGKILLed mid-task leaves a live lease (`--lease 90`). Its pid is gone
    from this machine: once it missed two renewals (a live worker renews every third
    of the lease), the workers started next take the task over instead of waiting
    out the lease. Three start together; one takes it, the log
    shows one holder at a time, and every item gets exactly one ticket.

    The lease is long so that the takers, started after 60 s of silence, claim well
    before it would run out (30 s later) even on a loaded machine: with 45 s (15 s
    to spare) three workers starting at load 20 once claimed 3 s after it had."""
    url = db_url(kind, tmp_path, request)
    items = [f"d{i}" for i in range(5)]
    (tid,) = add_tasks(url, [ticket_spec("dead", items)])
    (a,) = workers.start(url, 1, "--lease", "90", TICKETS_URL=slow_api.url)

    def a_mid_task() -> Any:
        async def go(store: Store) -> Any:
            task = await store.get_task(tid)
            posts = len(slow_api.stats()["posts"])
            if (task.lease_owner or "").endswith(f":{a.pid}") and posts >= 2:
                return task
            return None

        return in_store(url, go)

    wait_for(a_mid_task, "worker A to be mid-task")
    a.kill()
    a.wait(timeout=30)

    def silent_enough() -> Any:
        async def go(store: Store) -> Any:
            task = await store.get_task(tid)
            period = (task.lease_expiry or 0.0) - (task.heartbeat_at or 0.0)
            silent = time.time() - (task.heartbeat_at or 0.0)
            return task if silent >= period * 2 / 3 else None

        return in_store(url, go)

    held = wait_for(silent_enough, "the dead lease to miss two renewals", timeout=120)
    assert held.lease_expiry > time.time() + 5  # the lease would stand a while yet

    takers = workers.start(url, 3, "--once", TICKETS_URL=slow_api.url)
    workers.wait(takers)

    assert statuses(url, [tid]) == [("satisfied", "delivered")]
    evs = all_events(url, [tid])[tid]
    owners = check_one_holder_at_a_time(tid, evs)
    taker = owners[-1]
    assert owners[0].endswith(f":{a.pid}") and int(taker.rsplit(":", 1)[1]) in {
        p.pid for p in takers
    }, owners
    claimed = [e for e in evs if e.type == "lease.claimed"]
    assert claimed[-1].at < held.lease_expiry  # before A's lease ran out
    started = [e.data for e in evs if e.type == "recovery.started"]
    assert started[-1]["previous_owner"] == owners[0]
    assert sorted(t["title"] for t in slow_api.tickets()) == items
    logs = "".join(workers.log(p) for p in takers)
    assert logs.count("taken over") == 1, logs


# ---------------------------------------------------------------- workers with other tools


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_worker_without_a_tasks_tool_leaves_it_to_one_that_has_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, api: TicketAPI, workers: Workers
) -> None:
    """Workers may register different tools (`TETHER_TOOLS`). One that lacks a task's
    tool hands the task back at once, untouched, and passes it over: it neither holds
    it back from a worker that has the tool nor counts it as a failed run."""
    url = db_url(kind, tmp_path, request)
    (bare,) = workers.start(url, 1, TICKETS_URL=api.url, TETHER_TOOLS="")
    tids = add_tasks(url, [ticket_spec(f"tool{t}", [f"x{t}"]) for t in range(3)])
    wait_for(lambda: "create_ticket" in workers.log(bare), "the bare worker to meet a task")
    able = workers.start(url, 1, "--once", TICKETS_URL=api.url)
    workers.wait(able, timeout=25)  # well within the 30 s a failed task is held back
    assert statuses(url, tids) == [("satisfied", "delivered")] * 3, workers.log(able[0])
    evs = all_events(url, tids)
    for tid in tids:
        owners = check_one_holder_at_a_time(tid, evs[tid])
        assert all(not o.endswith(f":{bare.pid}") for o in owners), owners
    assert bare.poll() is None  # still serving
    bare.terminate()
    assert bare.wait(timeout=30) == 0, workers.log(bare)
    assert "could not run" not in workers.log(bare)


# ---------------------------------------------------------------- a frozen worker


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_frozen_workers_task_is_finished_by_another_and_its_late_writes_refused(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    slow_api: TicketAPI,
    workers: Workers,
) -> None:
    """Four workers with a 3 s lease; one is frozen (SIGSTOP) mid-task. Once its lease
    expires the others take its task over and finish everything. Thawed (SIGCONT), the
    frozen worker's writes are refused: every task's log still shows one holder at a
    time, and each item has exactly one ticket (an op the frozen worker had in flight
    may reach the service again, under the same Idempotency-Key)."""
    url = db_url(kind, tmp_path, request)
    names = [[f"f{t}a", f"f{t}b"] for t in range(6)]
    tids = add_tasks(url, [ticket_spec(f"frozen{t}", n) for t, n in enumerate(names)])
    procs = workers.start(url, 4, "--lease", "3", TICKETS_URL=slow_api.url)
    pids = {p.pid: p for p in procs}

    def someone_mid_task() -> Any:
        async def go(store: Store) -> Any:
            for tid in tids:
                task = await store.get_task(tid)
                owner = task.lease_owner or ""
                pid = int(owner.rsplit(":", 1)[1]) if ":" in owner else 0
                if pid in pids and task.status == "running" and task.last_seq > 6:
                    return tid, pids[pid]
            return None

        return in_store(url, go)

    tid, frozen = wait_for(someone_mid_task, "a worker mid-task")
    os.kill(frozen.pid, signal.SIGSTOP)
    try:

        def all_done() -> bool:
            return statuses(url, tids) == [("satisfied", "delivered")] * len(tids)

        wait_for(all_done, "the other workers to finish every task", timeout=120)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    before = all_events(url, tids)
    for p in procs:
        p.terminate()
    for p in procs:
        assert p.wait(timeout=60) in (0, 1), workers.log(p)

    evs = all_events(url, tids)
    assert evs == before, "a write landed after every task was delivered"
    for t in tids:
        check_one_holder_at_a_time(t, evs[t])
    owners = check_one_holder_at_a_time(tid, evs[tid])
    assert owners[-1] != f"{owners[0].rsplit(':', 1)[0]}:{frozen.pid}", owners
    tickets = slow_api.tickets()
    assert sorted(t["title"] for t in tickets) == sorted(i for n in names for i in n)
