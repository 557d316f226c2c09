"""One conformance suite for every store: memory, SQLite and PostgreSQL.

Each test gets its own database (a file in `tmp_path`, or a PostgreSQL schema) and a
`FakeClock`, so leases expire in no time.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tether import errors, lifecycle
from tether import events as ev
from tether import ledger as ledger_mod
from tether.clock import FakeClock
from tether.store import (
    SCHEMA_VERSION,
    ApprovalRecord,
    ArtifactRecord,
    LedgerWrite,
    OpRecord,
    Store,
    StoredEvent,
    TaskPatch,
    open_store,
    sqlite_path,
)
from tether.store.base import blob_hash

if TYPE_CHECKING:
    from conftest import Backend, MakeTask

AddTask = Callable[..., Awaitable[Any]]
MakeLedger = Callable[..., ledger_mod.Ledger]

# --- helpers ------------------------------------------------------------------------------


async def snapshot(store: Store, task_id: str) -> dict[str, Any]:
    """Everything the store holds about a task."""
    return {
        "task": await store.get_task(task_id),
        "ledger": await store.get_ledger(task_id),
        "events": await store.read_events(task_id),
        "ops": await store.get_ops(task_id),
        "artifacts": await store.get_artifacts(task_id),
    }


def op_record(task_id: str, op_id: str, rnd: int = 1, idx: int = 0, **kw: Any) -> OpRecord:
    base: dict[str, Any] = {
        "op_id": op_id,
        "task_id": task_id,
        "round": rnd,
        "call_index": idx,
        "tool": "fetch",
        "args": {"url": f"https://example.org/{op_id}", "n": [1, 2]},
        "args_hash": f"h-{op_id}",
        "effect": "read",
        "status": "intended",
    }
    base.update(kw)
    return OpRecord(**base)


def artifact_record(task_id: str, artifact_id: str, **kw: Any) -> ArtifactRecord:
    base: dict[str, Any] = {
        "artifact_id": artifact_id,
        "task_id": task_id,
        "kind": "evidence",
        "name": f"{artifact_id}.txt",
        "blob_hash": blob_hash(artifact_id.encode()),
        "size": len(artifact_id),
        "source": "fetch",
        "deps": ("d1", "d2"),
        "meta": {"lang": "en"},
    }
    base.update(kw)
    return ArtifactRecord(**base)


def msg(text: str) -> ev.UserMessage:
    return ev.UserMessage(text=text)


def inject_event(
    backend: Backend, store: Store, task_id: str, seq: int, type_name: str, data: dict[str, Any]
) -> None:
    """Write an event row the way a newer tether would (bypassing our encoder)."""
    if backend.kind == "memory":
        mem: Any = store
        mem._events[task_id].append(StoredEvent(task_id, seq, type_name, 7, data, 1, None, 0.0))
        mem._tasks[task_id] = replace(mem._tasks[task_id], last_seq=seq)
        return
    conn = backend.raw()
    ph = "?" if backend.kind == "sqlite" else "%s"
    try:
        if backend.kind == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
        if backend.kind == "sqlite":
            conn.execute(
                "INSERT INTO events (task_id, seq, type, schema_version, data, task_version,"
                " fencing_token, at) VALUES (?, ?, ?, 7, ?, 1, NULL, 0.0)",
                (task_id, seq, type_name, json.dumps(data)),
            )
        else:  # a commit's events are one row of `event_batches` (schema 11)
            conn.execute(
                "INSERT INTO event_batches (last_seq, at, fencing_token, task_version,"
                " task_id, events) VALUES (%s, 0.0, NULL, 1, %s, %s::json)",
                (seq, task_id, json.dumps([[type_name, 7, data]])),
            )
        conn.execute(f"UPDATE tasks SET last_seq = {ph} WHERE task_id = {ph}", (seq, task_id))
        if backend.kind == "sqlite":
            conn.execute("COMMIT")
    finally:
        conn.close()


# --- tasks --------------------------------------------------------------------------------


async def test_schema_version_is_current(store: Store) -> None:
    assert await store.schema_version() == SCHEMA_VERSION


async def test_a_keyword_no_operation_declares_is_refused(
    store: Store, add_task: AddTask, make_ledger: MakeLedger
) -> None:
    """The stores take their keyword groups as one declaration each (`base.OpFilters`...):
    a misspelt keyword is still a `TypeError`, never a filter silently left out."""
    await add_task(store, "t")
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.get_ops("t", tool={"x"}),  # type: ignore[call-arg]
        lambda: store.read_events("t", type={"x"}),  # type: ignore[call-arg]
        lambda: store.search_artifacts("t", "x", kind={"x"}),  # type: ignore[call-arg]
        lambda: store.claim("w", 60, taskid="t"),  # type: ignore[call-arg]
        lambda: store.commit("t", None, [], ledgers=None),  # type: ignore[call-arg]
        lambda: store.create_task(  # type: ignore[call-arg]
            task_id="u", name="u", spec={}, ledger=make_ledger(1), workspaces="/"
        ),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="unexpected keyword"):
            await call()
    assert [t.task_id for t in await store.list_tasks()] == ["t"]


async def test_create_get_and_list_tasks(
    store: Store, clock: FakeClock, add_task: AddTask, make_ledger: MakeLedger
) -> None:
    led = make_ledger(3)
    rec = await store.create_task(
        task_id="a",
        name="first",
        spec={"objective": "x", "nested": {"k": [1, "two", None]}},
        ledger=led,
        workspace="/tmp/ws",
        events=[ev.TaskCreated(name="first", objective="x", items=3)],
    )
    assert rec.task_id == "a"
    assert rec.status == "queued"
    assert rec.stop_reason is None
    assert rec.version == 1
    assert rec.fencing_token == 0
    assert rec.last_seq == 1
    assert rec.lease_owner is None
    assert rec.cancel_requested is False
    assert rec.created_at == clock.now()
    got = await store.get_task("a")
    assert got == rec
    assert got.spec == {"objective": "x", "nested": {"k": [1, "two", None]}}
    assert got.workspace == "/tmp/ws"
    assert got.usage == {}

    stored = await store.get_ledger("a")
    assert stored.version == 0
    assert stored.to_ledger() == led

    clock.advance(1)
    await add_task(store, "b")
    clock.advance(1)
    await add_task(store, "c")
    await store.commit("c", None, [], task=TaskPatch(status="running"))

    assert [t.task_id for t in await store.list_tasks()] == ["c", "b", "a"]
    assert [t.task_id for t in await store.list_tasks(limit=2)] == ["c", "b"]
    assert [t.task_id for t in await store.list_tasks(statuses={"queued"})] == ["b", "a"]
    assert [t.task_id for t in await store.list_tasks(statuses=["running", "failed"])] == ["c"]
    assert await store.list_tasks(statuses={"satisfied"}) == []


async def test_create_duplicate_task_is_refused_and_changes_nothing(
    store: Store, make_task: MakeTask, add_task: AddTask
) -> None:
    await make_task("dup")
    before = await snapshot(store, "dup")
    with pytest.raises(errors.ConcurrentUpdate):
        await add_task(store, "dup", name="other", events=[msg("again")])
    assert await snapshot(store, "dup") == before


async def test_unknown_task_raises_task_not_found(store: Store) -> None:
    with pytest.raises(errors.TaskNotFound) as exc:
        await store.get_task("nope")
    assert exc.value.task_id == "nope"
    assert exc.value.exit_code == 3
    with pytest.raises(errors.TaskNotFound):
        await store.read_events("nope")
    with pytest.raises(errors.TaskNotFound):
        await store.get_ledger("nope")
    with pytest.raises(errors.TaskNotFound):
        await store.commit("nope", None, [msg("hi")])
    with pytest.raises(errors.TaskNotFound):
        await store.claim("w", 10, task_id="nope")
    with pytest.raises(errors.TaskNotFound):
        await store.renew("nope", 1, 10)
    with pytest.raises(errors.TaskNotFound):
        await store.release("nope", 1)
    assert await store.list_tasks() == []


# --- events -------------------------------------------------------------------------------


async def test_append_and_read_events(store: Store, make_task: MakeTask, clock: FakeClock) -> None:
    await make_task("t")
    clock.advance(5)
    r1 = await store.commit("t", None, [msg(f"m{n}") for n in range(2, 6)])
    assert (r1.first_seq, r1.last_seq) == (2, 5)
    r2 = await store.commit(
        "t", None, [ev.RoundStarted(round=1, turn=1), ev.RoundCommitted(round=1, turn=1)]
    )
    assert (r2.first_seq, r2.last_seq) == (6, 7)

    events = await store.read_events("t")
    assert [e.seq for e in events] == list(range(1, 8))
    assert [e.type for e in events] == ["task.created"] + ["user.message"] * 4 + [
        "round.started",
        "round.committed",
    ]
    assert all(e.task_id == "t" for e in events)
    assert all(e.schema_version == ev.EVENT_SCHEMA_VERSION for e in events)
    assert all(e.task_version == 1 for e in events)
    assert all(e.fencing_token is None for e in events)
    assert events[1].at == clock.now()
    assert events[1].data == {"text": "m2", "by": "user"}
    assert (await store.get_task("t")).last_seq == 7

    assert [e.seq for e in await store.read_events("t", after=3)] == [4, 5, 6, 7]
    assert [e.seq for e in await store.read_events("t", limit=2)] == [1, 2]
    assert [e.seq for e in await store.read_events("t", after=3, limit=2)] == [4, 5]
    assert await store.read_events("t", after=7) == []
    assert await store.read_events("t", limit=0) == []
    got = await store.read_events("t", types={"round.started", "task.created"})
    assert [(e.seq, e.type) for e in got] == [(1, "task.created"), (6, "round.started")]
    got = await store.read_events("t", after=1, types=["user.message"], limit=3)
    assert [e.seq for e in got] == [2, 3, 4]


async def test_empty_commit_appends_nothing(store: Store, make_task: MakeTask) -> None:
    await make_task("t")
    res = await store.commit("t", None, [])
    assert res.last_seq == res.first_seq - 1 == 1
    assert [e.seq for e in await store.read_events("t")] == [1]
    assert (await store.get_task("t")).last_seq == 1


async def test_events_of_tasks_are_separate(store: Store, make_task: MakeTask) -> None:
    await make_task("a")
    await make_task("b")
    await store.commit("a", None, [msg("a2")])
    await store.commit("b", None, [msg("b2"), msg("b3")])
    await store.commit("a", None, [msg("a3")])
    assert [(e.seq, e.data["text"]) for e in (await store.read_events("a"))[1:]] == [
        (2, "a2"),
        (3, "a3"),
    ]
    assert [(e.seq, e.data["text"]) for e in (await store.read_events("b"))[1:]] == [
        (2, "b2"),
        (3, "b3"),
    ]


ALL_KINDS: list[ev.Event] = [
    ev.TaskCreated(name="n", objective="o", items=2, workspace="/w"),
    ev.TaskStatusChanged(src="queued", dst="running", reason="claimed"),
    ev.TaskEdited(
        old_version=1, new_version=2, changes={"budget": {"rounds": 5}}, invalidated=["x"]
    ),
    ev.CancelRequested(by="alice", reason="enough"),
    ev.LeaseClaimed(worker_id="w1", token=3, expires_at=1.5),
    ev.UserMessage(text='héllo ✓ "quoted" \n newline', by="bob"),
    ev.TurnStarted(turn=1, kind="start", epoch=True, system_blob="sha256:00", system_chars=10),
    ev.RoundStarted(round=1, turn=1, item="i1"),
    ev.RoundCommitted(round=1, turn=1, ops=2, text="done"),
    ev.ModelCalled(call_id="c1", purpose="act", model="m", round=1, input_tokens=10, cost_usd=0.25),
    ev.ModelFailed(call_id="c2", purpose="judge", model="m", error="boom", transient=True),
    ev.OpIntended(op_id="o1", tool="fetch", args={"u": [1, {"a": None}]}, round=1),
    ev.OpDispatched(op_id="o1", attempt=2),
    ev.OpResult(op_id="o1", tool="fetch", status="succeeded", summary="ok", duration_ms=1.5),
    ev.OpCommitted(op_id="o1", round=1),
    ev.ArtifactStored(artifact_id="a1", kind="evidence", name="n", blob="sha256:11", size=3),
    ev.JudgeVerdict(round=1, decision="continue", changes=[{"item": "i1"}], judges=["rule"]),
    ev.LedgerUpdated(version=1, diff=[{"item_id": "i1", "field": "status"}]),
    ev.AuditWarning(code="c", message="m", details={"k": 1}),
    ev.CompletionChecked(passed=False, gaps=["i2"]),
    ev.ContextCompacted(
        summary_blob="sha256:22", rounds_compacted=3, upto_round=3, tokens_before=9, tokens_after=2
    ),
    ev.BudgetThreshold(scope="task", resource="tokens", percent=80, used=8.0, limit=10.0),
    ev.RecoveryStarted(worker_id="w2", previous_owner="w1"),
    ev.RecoveryStep(step="ops", details={"reconciled": 2}),
    ev.ApprovalRequested(request_id="r1", what="delete", op_id="o2"),
    ev.ApprovalDecided(request_id="r1", decision="modify", modified_args={"x": 1}),
]


async def test_every_event_type_round_trips_typed(store: Store, make_task: MakeTask) -> None:
    # Every type defined when this test was written (later ones may add theirs here).
    assert {type(e) for e in ALL_KINDS} <= set(ev.EVENT_TYPES.values())
    assert len({type(e) for e in ALL_KINDS}) >= 26
    await make_task("t", events=[])
    await store.commit("t", None, ALL_KINDS)
    stored = await store.read_events("t")
    assert [s.type for s in stored] == [e.TYPE for e in ALL_KINDS]
    assert [s.typed() for s in stored] == ALL_KINDS


async def test_events_from_a_newer_writer_decode(
    backend: Backend, store: Store, make_task: MakeTask
) -> None:
    await make_task("t")
    # An event type this tether does not know, and a known one with a new field.
    inject_event(backend, store, "t", 2, "future.thing", {"alpha": 1, "beta": ["x", {"y": 2}]})
    inject_event(
        backend, store, "t", 3, "round.started", {"round": 4, "turn": 2, "new_field": "ignored"}
    )
    # An event from an older writer that lacks a field which now has a default.
    inject_event(backend, store, "t", 4, "round.started", {"round": 5, "turn": 2})

    events = await store.read_events("t")
    unknown = events[1].typed()
    assert isinstance(unknown, ev.UnknownEvent)
    assert events[1].type == "future.thing"
    assert events[1].schema_version == 7
    assert unknown.model_extra == {"alpha": 1, "beta": ["x", {"y": 2}]}
    known = events[2].typed()
    assert known == ev.RoundStarted(round=4, turn=2)
    assert "new_field" not in known.model_dump()
    assert events[3].typed() == ev.RoundStarted(round=5, turn=2, item=None)
    # Our own writes continue after the foreign rows.
    res = await store.commit("t", None, [msg("after")])
    assert res.first_seq == 5
    with pytest.raises(TypeError):
        await store.commit("t", None, [unknown])
    assert [e.seq for e in await store.read_events("t")] == [1, 2, 3, 4, 5]


async def test_seq_is_gapless_under_concurrent_asyncio_appenders(
    backend: Backend, store: Store, make_task: MakeTask
) -> None:
    await make_task("t")
    # Several handles on the same database where the backend has them.
    handles = [store]
    if backend.durable:
        handles += [await backend.open(), await backend.open()]
    try:
        writers, rounds = 12, 8

        async def writer(w: int) -> list[tuple[int, int]]:
            got = []
            for r in range(rounds):
                n = 1 + (w + r) % 3
                events = [msg(f"{w}:{r}:{k}") for k in range(n)]
                res = await handles[w % len(handles)].commit("t", None, events)
                assert res.last_seq - res.first_seq + 1 == n
                got.append((res.first_seq, res.last_seq))
            return got

        results = await asyncio.gather(*(writer(w) for w in range(writers)))
    finally:
        for h in handles[1:]:
            await h.close()

    events = await store.read_events("t")
    total = 1 + sum(1 + (w + r) % 3 for w in range(writers) for r in range(rounds))
    assert [e.seq for e in events] == list(range(1, total + 1))
    assert (await store.get_task("t")).last_seq == total
    # Each commit got exactly the seqs its events are stored under, contiguously.
    by_seq = {e.seq: e.data.get("text") for e in events}
    for w, ranges in enumerate(results):
        for r, (first, last) in enumerate(ranges):
            assert [by_seq[s] for s in range(first, last + 1)] == [
                f"{w}:{r}:{k}" for k in range(last - first + 1)
            ]


APPENDER = textwrap.dedent(
    """
    import asyncio, sys
    from tether import events as ev
    from tether.store import open_store

    async def main(url, task_id, proc, n):
        store = await open_store(url)
        try:
            print("ready", flush=True)
            sys.stdin.readline()
            for i in range(n):
                await store.commit(task_id, None, [
                    ev.UserMessage(text=f"{proc}:{i}:0", by=proc),
                    ev.UserMessage(text=f"{proc}:{i}:1", by=proc),
                ])
        finally:
            await store.close()
        print("done", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


async def test_seq_is_gapless_under_concurrent_processes(
    sql_backend: Backend, tmp_path: Path, add_task: AddTask
) -> None:
    store = await sql_backend.open()
    try:
        await add_task(store, "t")
        script = tmp_path / "appender.py"
        script.write_text(APPENDER)
        nproc, n = 4, 25

        def run_all() -> list[tuple[int, str, str]]:
            procs = [
                subprocess.Popen(
                    [sys.executable, str(script), sql_backend.url, "t", f"p{k}", str(n)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for k in range(nproc)
            ]
            try:
                for p in procs:
                    assert p.stdout is not None
                    assert p.stdout.readline().strip() == "ready"
                for p in procs:  # all at once
                    assert p.stdin is not None
                    p.stdin.write("go\n")
                    p.stdin.flush()
                out = []
                for p in procs:
                    o, e = p.communicate(timeout=90)
                    out.append((p.returncode, o, e))
                return out
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()

        for rc, out, err in await asyncio.to_thread(run_all):
            assert rc == 0, err
            assert out.strip() == "done"

        events = await store.read_events("t")
        total = 1 + nproc * n * 2
        assert [e.seq for e in events] == list(range(1, total + 1))
        assert (await store.get_task("t")).last_seq == total
        texts = [e.data["text"] for e in events[1:]]
        assert sorted(texts) == sorted(
            f"p{k}:{i}:{j}" for k in range(nproc) for i in range(n) for j in (0, 1)
        )
        # Each commit's two events are adjacent, and each process's commits are in order.
        for a, b in zip(texts[::2], texts[1::2], strict=True):
            assert a[:-1] == b[:-1] and a.endswith(":0") and b.endswith(":1")
        for k in range(nproc):
            mine = [int(t.split(":")[1]) for t in texts[::2] if t.startswith(f"p{k}:")]
            assert mine == list(range(n))
    finally:
        await store.close()


# --- commits and projections ----------------------------------------------------------------


async def test_a_write_of_the_changed_items_only_keeps_the_others(
    store: Store, make_task: MakeTask, make_ledger: MakeLedger
) -> None:
    # The runtime sends only the items that moved since the stored ledger
    # (`LedgerWrite.of(..., since=...)`): the store keeps every other item as it was.
    led = make_ledger(5)
    await make_task("t", ledger=led)
    lease = await store.claim("w1", 60, task_id="t")
    assert lease is not None
    stored = (await store.get_ledger("t")).to_ledger()
    assert stored == led
    for step in (
        lambda x: ledger_mod.start(x, "i4"),
        lambda x: ledger_mod.block(x, "i2", "no access"),
        lambda x: ledger_mod.complete(x, "i4", ["op:o1"]),
    ):
        new = step(stored).ledger
        write = LedgerWrite.of(new, stored.version, since=stored)
        assert write.positions is not None and len(write.state) == 1  # one item sent
        await store.commit("t", lease.token, [], ledger=write)
        stored = new
        back = await store.get_ledger("t")
        assert back.version == new.version
        assert back.to_ledger() == new
        assert list(back.to_ledger().skeleton.items) == list(new.skeleton.items)
    # An unchanged skeleton is all it takes: a new one (a contract edit) sends every item.
    assert LedgerWrite.of(stored, stored.version, since=stored, skeleton=True).positions is None


async def test_commit_updates_projections_with_events(
    store: Store, make_task: MakeTask, clock: FakeClock, make_ledger: MakeLedger
) -> None:
    await make_task("t")
    lease = await store.claim("w1", 60, task_id="t")
    assert lease is not None
    led = (await store.get_ledger("t")).to_ledger()
    upd = ledger_mod.start(led, "i1")
    clock.advance(2)
    res = await store.commit(
        "t",
        lease.token,
        [ev.TaskStatusChanged(src="queued", dst="running"), ev.RoundStarted(round=1, turn=1)],
        task=TaskPatch(
            status="running",
            current_milestone="m1",
            usage={"tokens": 12, "rounds": 1},
            waiting={"on": "nothing"},
            wake_at=123.5,
            cancel_requested=False,
        ),
        ledger=LedgerWrite.of(upd.ledger, expected_version=led.version),
        ops=[op_record("t", "o1"), op_record("t", "o2", idx=1)],
        artifacts=[artifact_record("t", "art1")],
    )
    assert (res.first_seq, res.last_seq) == (2, 3)
    task = await store.get_task("t")
    assert task.status == "running"
    assert task.current_milestone == "m1"
    assert task.usage == {"tokens": 12, "rounds": 1}
    assert task.waiting == {"on": "nothing"}
    assert task.wake_at == 123.5
    assert task.last_seq == 3
    assert task.heartbeat_at == clock.now()
    assert task.updated_at == clock.now()
    assert task.lease_owner == "w1"
    assert task.fencing_token == lease.token
    stored_ledger = await store.get_ledger("t")
    assert stored_ledger.version == upd.ledger.version == 1
    assert stored_ledger.to_ledger() == upd.ledger
    assert stored_ledger.skeleton == led.skeleton.to_dict()
    events = await store.read_events("t", after=1)
    assert [e.fencing_token for e in events] == [lease.token, lease.token]
    assert [o.op_id for o in await store.get_ops("t")] == ["o1", "o2"]
    assert [a.artifact_id for a in await store.get_artifacts("t")] == ["art1"]

    # Fields left unset stay; explicit None clears.
    await store.commit("t", lease.token, [], task=TaskPatch(waiting=None, wake_at=None))
    task = await store.get_task("t")
    assert task.waiting is None and task.wake_at is None
    assert task.current_milestone == "m1" and task.usage == {"tokens": 12, "rounds": 1}

    # A version raise stamps the following events; the skeleton can be rewritten.
    new_ledger = make_ledger(2, objective="Write a shorter report")
    await store.commit(
        "t",
        lease.token,
        [ev.TaskEdited(old_version=1, new_version=2)],
        task=TaskPatch(version=2, spec={"objective": "Write a shorter report"}),
        ledger=LedgerWrite.of(replace(new_ledger, version=2), expected_version=1, skeleton=True),
    )
    task = await store.get_task("t")
    assert task.version == 2
    assert task.spec == {"objective": "Write a shorter report"}
    last = (await store.read_events("t"))[-1]
    assert last.type == "task.edited" and last.task_version == 2
    stored_ledger = await store.get_ledger("t")
    assert stored_ledger.skeleton["objective"] == "Write a shorter report"
    assert stored_ledger.to_ledger() == replace(new_ledger, version=2)


async def test_every_commit_of_the_lease_holder_refreshes_the_heartbeat(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    # The watchdog reads `heartbeat_at`: a round that commits is alive, whether or not
    # it renews its lease in between (the column is set by the commit's own statement).
    await make_task("t")
    lease = await store.claim("w1", 60, task_id="t")
    assert lease is not None
    claimed = (await store.get_task("t")).heartbeat_at
    clock.advance(5)
    await store.commit("t", lease.token, [ev.RoundStarted(round=1, turn=1)])
    after_events = await store.get_task("t")
    assert after_events.heartbeat_at == clock.now() == (claimed or 0) + 5
    clock.advance(5)
    await store.commit("t", lease.token, [], task=TaskPatch(usage={"rounds": 1}))
    assert (await store.get_task("t")).heartbeat_at == clock.now()
    # The lease's expiry is the renewal's business, not a commit's.
    assert (await store.get_task("t")).lease_expiry == after_events.lease_expiry


async def test_out_of_band_commit_needs_no_lease(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    await make_task("t")
    lease = await store.claim("w1", 60, task_id="t")
    assert lease is not None
    heartbeat = (await store.get_task("t")).heartbeat_at
    clock.advance(3)
    await store.commit("t", None, [ev.CancelRequested()], task=TaskPatch(cancel_requested=True))
    task = await store.get_task("t")
    assert task.cancel_requested is True
    assert task.heartbeat_at == heartbeat  # only the lease holder beats
    assert task.fencing_token == lease.token and task.lease_owner == "w1"
    assert (await store.read_events("t"))[-1].fencing_token is None


FAILURES = [
    "illegal_transition",
    "stale_token",
    "ledger_version",
    "version_back",
    "terminal_reason",
]


@pytest.mark.parametrize("failure", FAILURES)
async def test_failed_commit_writes_nothing(
    store: Store, make_task: MakeTask, clock: FakeClock, failure: str
) -> None:
    await make_task("t")
    first = await store.claim("w1", 10, task_id="t")
    assert first is not None
    led = (await store.get_ledger("t")).to_ledger()
    upd = ledger_mod.start(led, "i1")
    await store.commit(
        "t",
        first.token,
        [ev.RoundStarted(round=1, turn=1)],
        task=TaskPatch(status="running", version=2),
        ledger=LedgerWrite.of(upd.ledger, expected_version=0),
        ops=[op_record("t", "o1")],
    )
    await store.commit("t", first.token, [], task=TaskPatch(status="stalled"))
    clock.advance(11)
    lease = await store.claim("w2", 10, task_id="t")
    assert lease is not None and lease.token == first.token + 1
    clock.advance(1)
    before = await snapshot(store, "t")

    token = lease.token
    patch = TaskPatch(status="running", usage={"rounds": 2}, current_milestone="m2")
    nxt = ledger_mod.complete(upd.ledger, "i1", ["op:o1"]).ledger
    expected = upd.ledger.version
    expected_error: type[Exception] = errors.IllegalTransition
    if failure == "illegal_transition":
        patch = TaskPatch(status="waiting", usage={"rounds": 2})  # stalled -> waiting
    elif failure == "terminal_reason":
        patch = TaskPatch(status="failed", stop_reason="delivered")
    elif failure == "stale_token":
        token = first.token
        expected_error = errors.StaleLease
    elif failure == "ledger_version":
        expected = upd.ledger.version - 1
        expected_error = errors.ConcurrentUpdate
    elif failure == "version_back":
        patch = TaskPatch(status="running", version=1)
        expected_error = errors.ConcurrentUpdate

    with pytest.raises(expected_error):
        await store.commit(
            "t",
            token,
            [ev.RoundStarted(round=2, turn=1), msg("never"), ev.RoundCommitted(round=2, turn=1)],
            task=patch,
            ledger=LedgerWrite.of(nxt, expected_version=expected),
            ops=[
                op_record("t", "o1", status="succeeded", result={"ok": True}),
                op_record("t", "o9"),
            ],
            artifacts=[artifact_record("t", "never")],
        )
    assert await snapshot(store, "t") == before
    with pytest.raises(KeyError):
        await store.get_artifact("never")
    # The task is still usable: the same commit with the right inputs goes through.
    res = await store.commit(
        "t",
        lease.token,
        [ev.RoundStarted(round=2, turn=1)],
        task=TaskPatch(status="running"),
        ledger=LedgerWrite.of(nxt, expected_version=upd.ledger.version),
    )
    assert res.first_seq == before["task"].last_seq + 1


async def test_stale_token_error_names_tokens(store: Store, make_task: MakeTask) -> None:
    await make_task("t")
    a = await store.claim("w1", 10, task_id="t")
    assert a is not None
    await store.release("t", a.token)
    b = await store.claim("w2", 10, task_id="t")
    assert b is not None
    with pytest.raises(errors.StaleLease) as exc:
        await store.commit("t", a.token, [msg("late")])
    assert (exc.value.task_id, exc.value.token, exc.value.current) == ("t", a.token, b.token)
    # A token from the future is just as stale.
    with pytest.raises(errors.StaleLease):
        await store.commit("t", b.token + 1, [msg("future")])
    assert len(await store.read_events("t")) == 1


async def test_failure_inside_the_transaction_rolls_back_written_events(
    sql_backend: Backend, add_task: AddTask
) -> None:
    # An op row that breaks a foreign key fails after the events were inserted.
    store = await sql_backend.open()
    try:
        await add_task(store, "t")
        before = await snapshot(store, "t")
        with pytest.raises(errors.StoreError):
            await store.commit(
                "t",
                None,
                [msg("one"), msg("two")],
                task=TaskPatch(status="running", usage={"x": 1}),
                ops=[op_record("t", "ok"), op_record("no-such-task", "bad")],
            )
        assert await snapshot(store, "t") == before
        assert (await store.commit("t", None, [msg("one")])).first_seq == 2
    finally:
        await store.close()


# --- lifecycle ------------------------------------------------------------------------------


def _path_to(status: str) -> list[tuple[str, str | None]]:
    """Shortest chain of `(status, stop_reason)` steps from `queued` to `status`."""
    seen = {"queued"}
    todo: deque[tuple[str, list[tuple[str, str | None]]]] = deque([("queued", [])])
    while todo:
        cur, path = todo.popleft()
        if cur == status:
            return path
        for nxt in sorted(lifecycle.TRANSITIONS[cur]):
            if nxt not in seen:
                seen.add(nxt)
                reason = min(lifecycle.TERMINAL_REASONS[nxt]) if nxt in lifecycle.TERMINAL else None
                todo.append((nxt, [*path, (nxt, reason)]))
    raise AssertionError(f"{status} is unreachable")


async def test_commit_enforces_every_lifecycle_transition(
    store: Store, add_task: AddTask, make_ledger: MakeLedger
) -> None:
    led = make_ledger(1)
    n = 0
    for src in lifecycle.STATUSES:
        for dst in lifecycle.STATUSES:
            n += 1
            tid = f"t{n}"
            await add_task(store, tid, ledger=led)
            for status, reason in _path_to(src):
                await store.commit(tid, None, [], task=TaskPatch(status=status, stop_reason=reason))
            assert (await store.get_task(tid)).status == src
            reason = min(lifecycle.TERMINAL_REASONS[dst]) if dst in lifecycle.TERMINAL else None
            try:
                lifecycle.check_transition(src, dst, reason)
                allowed = True
            except errors.IllegalTransition:
                allowed = False
            before = await snapshot(store, tid)
            change = ev.TaskStatusChanged(src=src, dst=dst, stop_reason=reason)
            patch = TaskPatch(status=dst, stop_reason=reason)
            if allowed:
                await store.commit(tid, None, [change], task=patch)
                task = await store.get_task(tid)
                assert (task.status, task.stop_reason) == (dst, reason), (src, dst)
            else:
                with pytest.raises(errors.IllegalTransition):
                    await store.commit(tid, None, [change], task=patch)
                assert await snapshot(store, tid) == before, (src, dst)


async def test_terminal_states_need_a_fitting_stop_reason(
    store: Store, make_task: MakeTask
) -> None:
    await make_task("t")
    await store.commit("t", None, [], task=TaskPatch(status="running"))
    for patch in (
        TaskPatch(status="satisfied"),
        TaskPatch(status="cancelled", stop_reason="delivered"),
        TaskPatch(status="running", stop_reason="delivered"),
        TaskPatch(status="no-such-state"),
    ):
        with pytest.raises(errors.IllegalTransition):
            await store.commit("t", None, [msg("x")], task=patch)
    await store.commit(
        "t", None, [], task=TaskPatch(status="failed", stop_reason="environment_unrecoverable")
    )
    task = await store.get_task("t")
    assert (task.status, task.stop_reason) == ("failed", "environment_unrecoverable")
    assert len(await store.read_events("t")) == 1
    # Re-opening a terminal task clears its stop reason.
    await store.commit("t", None, [], task=TaskPatch(status="queued"))
    task = await store.get_task("t")
    assert (task.status, task.stop_reason) == ("queued", None)


# --- leases -------------------------------------------------------------------------------


async def test_lease_claim_expiry_renew_release(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    await make_task("t")
    t0 = clock.now()
    a = await store.claim("w1", 30, task_id="t")
    assert a is not None
    assert (a.task_id, a.worker_id, a.token, a.expires_at) == ("t", "w1", 1, t0 + 30)
    task = await store.get_task("t")
    assert (task.lease_owner, task.lease_expiry, task.fencing_token) == ("w1", t0 + 30, 1)

    # Live lease: nobody else gets it, not even the same worker.
    assert await store.claim("w2", 30, task_id="t") is None
    assert await store.claim("w2", 30) is None
    assert await store.claim("w1", 30, task_id="t") is None
    clock.advance(29.9)
    assert await store.claim("w2", 30, task_id="t") is None

    # Renewing extends it.
    new_expiry = await store.renew("t", a.token, 30)
    assert new_expiry == clock.now() + 30
    assert (await store.get_task("t")).lease_expiry == new_expiry
    clock.advance(29)
    assert await store.claim("w2", 30, task_id="t") is None
    await store.commit("t", a.token, [msg("still mine")])

    # Expired: another worker claims, with a higher token.
    clock.advance(1.5)
    b = await store.claim("w2", 10, task_id="t")
    assert b is not None and b.token == 2 and b.worker_id == "w2"
    before = await snapshot(store, "t")
    with pytest.raises(errors.StaleLease):
        await store.commit("t", a.token, [msg("too late")], task=TaskPatch(status="running"))
    with pytest.raises(errors.StaleLease):
        await store.renew("t", a.token, 30)
    with pytest.raises(errors.StaleLease):
        await store.release("t", a.token)
    assert await snapshot(store, "t") == before

    # Release frees it at once; the next claim raises the token again.
    await store.release("t", b.token)
    task = await store.get_task("t")
    assert task.lease_owner is None and task.lease_expiry is None
    assert task.fencing_token == 2
    with pytest.raises(errors.StaleLease):
        await store.renew("t", b.token, 10)  # released: nothing to renew
    c = await store.claim("w1", 10)
    assert c is not None and c.task_id == "t" and c.token == 3


async def test_forced_claim_takes_a_live_lease_and_fences_the_old_owner(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    await make_task("t")
    a = await store.claim("w1", 60, task_id="t")
    assert a is not None
    assert await store.claim("w2", 60, task_id="t") is None
    b = await store.claim("w2", 60, task_id="t", force=True)
    assert b is not None and b.token == a.token + 1 and b.worker_id == "w2"
    before = await snapshot(store, "t")
    with pytest.raises(errors.StaleLease):
        await store.commit("t", a.token, [msg("ghost")])
    assert await snapshot(store, "t") == before
    await store.commit("t", b.token, [msg("new owner")])
    # A terminal task is never claimed, forced or not.
    await store.commit(
        "t", b.token, [], task=TaskPatch(status="cancelled", stop_reason="cancelled_by_user")
    )
    assert await store.claim("w3", 60, task_id="t", force=True) is None


async def test_claim_any_picks_only_claimable_tasks(
    store: Store, clock: FakeClock, add_task: AddTask, make_ledger: MakeLedger
) -> None:
    led = make_ledger(1)
    for tid in ("queued", "done", "cancelme", "waiting-later", "waiting-now", "suspended"):
        await add_task(store, tid, ledger=led)
        clock.advance(1)
    await store.commit("done", None, [], task=TaskPatch(status="running"))
    await store.commit(
        "done", None, [], task=TaskPatch(status="satisfied", stop_reason="delivered")
    )
    await store.commit("cancelme", None, [], task=TaskPatch(cancel_requested=True))
    for tid, wake in (("waiting-later", clock.now() + 100), ("waiting-now", clock.now() - 1)):
        await store.commit(tid, None, [], task=TaskPatch(status="running"))
        await store.commit(tid, None, [], task=TaskPatch(status="waiting", wake_at=wake))
    await store.commit("suspended", None, [], task=TaskPatch(status="suspended"))

    got = set()
    while (lease := await store.claim("w", 60)) is not None:
        got.add(lease.task_id)
    assert got == {"queued", "waiting-now"}
    assert await store.claim("w", 60, task_id="done") is None  # terminal


async def test_concurrent_claims_have_one_winner(
    backend: Backend, store: Store, add_task: AddTask
) -> None:
    await add_task(store, "t")
    handles = [store]
    if backend.durable:
        handles += [await backend.open() for _ in range(2)]
    try:
        leases = await asyncio.gather(
            *(handles[n % len(handles)].claim(f"w{n}", 60, task_id="t") for n in range(12))
        )
    finally:
        for h in handles[1:]:
            await h.close()
    winners = [x for x in leases if x is not None]
    assert len(winners) == 1
    task = await store.get_task("t")
    assert (task.lease_owner, task.fencing_token) == (winners[0].worker_id, 1)


async def test_concurrent_claim_any_hands_out_each_task_once(
    backend: Backend, store: Store, add_task: AddTask, make_ledger: MakeLedger
) -> None:
    for n in range(5):
        await add_task(store, f"t{n}", ledger=make_ledger(1))
    handles = [store]
    if backend.durable:
        handles += [await backend.open() for _ in range(2)]
    try:
        leases = await asyncio.gather(
            *(handles[n % len(handles)].claim(f"w{n}", 60) for n in range(9))
        )
    finally:
        for h in handles[1:]:
            await h.close()
    winners = [x for x in leases if x is not None]
    assert sorted(x.task_id for x in winners) == [f"t{n}" for n in range(5)]
    assert all(x.token == 1 for x in winners)


# --- blobs, ops, artifacts -------------------------------------------------------------------


async def test_blobs_are_content_addressed_and_idempotent(store: Store) -> None:
    data = b"\x00\x01binary\xff" * 1000
    ref = await store.put_blob(data)
    assert ref == blob_hash(data) and ref.startswith("sha256:")
    assert await store.put_blob(data) == ref
    assert await store.put_blob(bytearray(data)) == ref  # type: ignore[arg-type]
    assert await store.get_blob(ref) == data
    empty = await store.put_blob(b"")
    assert await store.get_blob(empty) == b""
    other = await store.put_blob(b"other")
    assert other != ref and await store.get_blob(other) == b"other"
    with pytest.raises(KeyError):
        await store.get_blob(blob_hash(b"never stored"))


async def test_ops_upsert_and_read(store: Store, make_task: MakeTask, clock: FakeClock) -> None:
    await make_task("t")
    await make_task("u")
    t_created = clock.now()
    await store.commit(
        "t",
        None,
        [ev.OpIntended(op_id="b", tool="fetch")],
        ops=[
            op_record("t", "b", rnd=2, idx=0),
            op_record("t", "a", rnd=1, idx=1),
            op_record("t", "c", rnd=1, idx=0, effect="write"),
        ],
    )
    await store.commit("u", None, [], ops=[op_record("u", "u1")])
    ops = await store.get_ops("t")
    assert [o.op_id for o in ops] == ["c", "a", "b"]
    assert ops[0] == op_record(
        "t", "c", rnd=1, idx=0, effect="write", created_at=t_created, updated_at=t_created
    )

    clock.advance(5)
    done = op_record(
        "t",
        "a",
        rnd=1,
        idx=1,
        status="succeeded",
        attempts=2,
        next_attempt_at=99.0,
        result={"text": "ok", "n": [1]},
        error=None,
    )
    await store.commit("t", None, [], ops=[done])
    a = next(o for o in await store.get_ops("t") if o.op_id == "a")
    assert a == replace(done, created_at=t_created, updated_at=clock.now())
    failed = op_record("t", "b", rnd=2, status="failed", error={"class": "Timeout"})
    await store.commit("t", None, [], ops=[failed])
    assert [o.op_id for o in await store.get_ops("t", statuses={"succeeded", "failed"})] == [
        "a",
        "b",
    ]
    assert [o.op_id for o in await store.get_ops("t", statuses={"intended"})] == ["c"]
    assert await store.get_ops("t", statuses=set()) == []
    assert [o.op_id for o in await store.get_ops("u")] == ["u1"]
    assert await store.get_ops("nobody") == []


async def test_op_identity_is_fixed_at_first_write(store: Store, make_task: MakeTask) -> None:
    # Upserts change the outcome of an op, never what was intended.
    await make_task("t")
    await store.commit("t", None, [], ops=[op_record("t", "o", args={"v": 1}, args_hash="h1")])
    await store.commit(
        "t",
        None,
        [],
        ops=[op_record("t", "o", args={"v": 2}, args_hash="h2", tool="other", status="succeeded")],
    )
    (op,) = await store.get_ops("t")
    assert (op.args, op.args_hash, op.tool, op.status) == ({"v": 1}, "h1", "fetch", "succeeded")


async def test_artifacts_upsert_and_read(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    await make_task("t")
    t1 = clock.now()
    await store.commit("t", None, [], artifacts=[artifact_record("t", "b")])
    clock.advance(1)
    await store.commit(
        "t", None, [], artifacts=[artifact_record("t", "a", task_version=1, deps=())]
    )
    arts = await store.get_artifacts("t")
    assert [a.artifact_id for a in arts] == ["b", "a"]
    assert arts[0] == artifact_record("t", "b", created_at=t1)
    assert await store.get_artifact("a") == artifact_record("t", "a", deps=(), created_at=t1 + 1)

    # Invalidation updates validity and meta only.
    clock.advance(1)
    await store.commit(
        "t",
        None,
        [],
        artifacts=[artifact_record("t", "b", valid=False, meta={"why": "stale"}, name="renamed")],
    )
    b = await store.get_artifact("b")
    assert b == artifact_record("t", "b", valid=False, meta={"why": "stale"}, created_at=t1)
    assert await store.get_artifacts("nobody") == []
    with pytest.raises(KeyError):
        await store.get_artifact("missing")


async def test_data_survive_reopening(sql_backend: Backend, add_task: AddTask) -> None:
    store = await sql_backend.open()
    try:
        await add_task(store, "t")
        lease = await store.claim("w", 60, task_id="t")
        assert lease is not None
        await store.commit(
            "t",
            lease.token,
            [msg("kept")],
            ops=[op_record("t", "o")],
            task=TaskPatch(status="running"),
        )
        ref = await store.put_blob(b"blob")
        before = await snapshot(store, "t")
    finally:
        await store.close()
    again = await sql_backend.open()
    try:
        assert await snapshot(again, "t") == before
        assert await again.get_blob(ref) == b"blob"
        with pytest.raises(errors.StaleLease):
            await again.commit("t", lease.token - 1, [msg("old")])
        await again.commit("t", lease.token, [msg("more")])
    finally:
        await again.close()


# --- the commit rules every store shares (store/_rules.py) ----------------------------------


def approval_record(task_id: str, request_id: str, **kw: Any) -> ApprovalRecord:
    base: dict[str, Any] = {
        "request_id": request_id,
        "task_id": task_id,
        "status": "pending",
        "request": {"question": f"may I {request_id}?", "n": [1, 2]},
        "op_id": f"op-{request_id}",
    }
    base.update(kw)
    return ApprovalRecord(**base)


async def test_approvals_upsert_decides_and_keeps_the_request(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    await make_task("t")
    t1 = clock.now()
    await store.commit("t", None, [], approvals=[approval_record("t", "b")])
    clock.advance(1)
    await store.commit("t", None, [], approvals=[approval_record("t", "a", created_at=t1 - 5)])
    got = await store.get_approvals("t")
    assert [a.request_id for a in got] == ["a", "b"]  # oldest first
    assert got[0] == approval_record("t", "a", created_at=t1 - 5)
    assert got[1] == approval_record("t", "b", created_at=t1)

    # A decision changes status and decision only: the request, its op and its time stay.
    clock.advance(1)
    decided = approval_record(
        "t",
        "b",
        status="approved",
        request={"question": "rewritten"},
        op_id="other",
        decision={"ok": True},
        decided_by="ana",
        decided_at=clock.now(),
        created_at=clock.now(),
    )
    await store.commit("t", None, [], approvals=[decided])
    (b,) = await store.get_approvals("t", statuses={"approved"})
    assert b == approval_record(
        "t",
        "b",
        status="approved",
        decision={"ok": True},
        decided_by="ana",
        decided_at=clock.now(),
        created_at=t1,
    )
    assert [a.request_id for a in await store.get_approvals("t", statuses={"pending"})] == ["a"]
    assert await store.get_approvals("t", statuses=()) == []
    assert await store.get_approvals("nobody") == []


async def test_repeated_ids_in_one_commit_are_written_in_order(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    # One commit naming an op, artifact or approval twice leaves what two commits in a
    # row would (the SQL stores write a commit's records in one statement per table).
    await make_task("t")
    now = clock.now()
    first = op_record("t", "o", args={"v": 1}, args_hash="h1")
    last = op_record("t", "o", args={"v": 2}, tool="x", status="succeeded", result={"r": 1})
    blob = b"the same bytes"
    await store.commit(
        "t",
        None,
        [msg("one")],
        ops=[first, op_record("t", "p"), last],
        artifacts=[artifact_record("t", "a"), artifact_record("t", "a", valid=False, meta={})],
        approvals=[approval_record("t", "r"), approval_record("t", "r", status="rejected")],
        blobs=[blob, blob, b"other"],
    )
    ops = {o.op_id: o for o in await store.get_ops("t")}
    assert ops["o"] == replace(
        first, status="succeeded", result={"r": 1}, created_at=now, updated_at=now
    )
    assert ops["p"] == op_record("t", "p", created_at=now, updated_at=now)
    (art,) = await store.get_artifacts("t")
    assert art == artifact_record("t", "a", valid=False, meta={}, created_at=now)
    (appr,) = await store.get_approvals("t")
    assert appr == approval_record("t", "r", status="rejected", created_at=now)
    assert await store.get_blob(blob_hash(blob)) == blob
    assert await store.get_blob(blob_hash(b"other")) == b"other"


@pytest.mark.parametrize("failure", ["stale_token", "illegal_transition", "ledger_version"])
async def test_refused_commit_writes_no_record_and_no_blob(
    store: Store, make_task: MakeTask, failure: str
) -> None:
    await make_task("t")
    lease = await store.claim("w", 60, task_id="t")
    assert lease is not None
    led = (await store.get_ledger("t")).to_ledger()
    nxt = ledger_mod.start(led, "i1").ledger
    token, patch, expected = lease.token, TaskPatch(status="running"), led.version
    error: type[Exception] = errors.ConcurrentUpdate
    if failure == "stale_token":
        token, error = lease.token + 1, errors.StaleLease
    elif failure == "illegal_transition":
        patch, error = (
            TaskPatch(status="satisfied", stop_reason="delivered"),
            errors.IllegalTransition,
        )
    else:
        expected = led.version + 1
    before = await snapshot(store, "t")
    with pytest.raises(error):
        await store.commit(
            "t",
            token,
            [msg("never")],
            task=patch,
            ledger=LedgerWrite.of(nxt, expected_version=expected, skeleton=True),
            ops=[op_record("t", "o")],
            artifacts=[artifact_record("t", "a")],
            approvals=[approval_record("t", "r")],
            blobs=[b"never stored"],
        )
    assert await snapshot(store, "t") == before
    assert await store.get_approvals("t") == []
    with pytest.raises(KeyError):
        await store.get_blob(blob_hash(b"never stored"))


async def test_refusals_name_what_the_store_found(store: Store, make_task: MakeTask) -> None:
    await make_task("t")
    lease = await store.claim("w", 60, task_id="t")
    assert lease is not None
    await store.commit("t", lease.token, [], task=TaskPatch(status="running", version=3))
    with pytest.raises(errors.ConcurrentUpdate, match="version cannot go back from 3 to 2"):
        await store.commit("t", lease.token, [], task=TaskPatch(version=2))
    with pytest.raises(errors.ConcurrentUpdate, match="ledger version is 0, expected 4"):
        led = (await store.get_ledger("t")).to_ledger()
        await store.commit("t", None, [], ledger=LedgerWrite.of(led, expected_version=4))
    with pytest.raises(errors.IllegalTransition, match="running -> cancelled"):
        await store.commit("t", None, [], task=TaskPatch(status="cancelled"))
    # Fencing is judged first, then the transition, then the version, then the ledger.
    with pytest.raises(errors.StaleLease):
        await store.commit("t", 99, [], task=TaskPatch(status="cancelled", version=1))
    with pytest.raises(errors.IllegalTransition):
        await store.commit("t", lease.token, [], task=TaskPatch(status="cancelled", version=1))


async def test_events_carry_the_version_their_commit_sets(
    store: Store, make_task: MakeTask
) -> None:
    await make_task("t")
    await store.commit("t", None, [msg("a")], task=TaskPatch(version=4))
    await store.commit("t", None, [msg("b")])
    await store.commit("t", None, [msg("c"), msg("d")], task=TaskPatch(version=5))
    events = await store.read_events("t")
    assert [e.task_version for e in events] == [1, 4, 4, 5, 5]
    assert (await store.get_task("t")).version == 5


async def test_empty_id_filters_answer_without_a_query_or_a_thread(
    store: Store, make_task: MakeTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_task("t")
    await store.commit(
        "t", None, [], ops=[op_record("t", "o")], artifacts=[artifact_record("t", "a")]
    )

    def no_thread(*args: Any) -> Any:
        raise AssertionError("an empty filter went to the database")

    if hasattr(store, "_run"):
        monkeypatch.setattr(store, "_run", no_thread)
    assert await store.get_ops("t", op_ids=set()) == []
    assert await store.get_ops("t", op_ids=[], statuses={"intended"}) == []
    assert await store.get_ops("t", tools=()) == []
    assert await store.get_ops("t", statuses=frozenset()) == []
    assert await store.get_artifacts("t", artifact_ids=set()) == []
    assert await store.get_artifacts("t", artifact_ids=[]) == []
    assert await store.get_approvals("t", statuses=set()) == []
    monkeypatch.undo()
    assert [o.op_id for o in await store.get_ops("t", op_ids={"o", "x"})] == ["o"]
    assert [a.artifact_id for a in await store.get_artifacts("t", artifact_ids=["a"])] == ["a"]


async def test_read_events_of_a_task_without_events(store: Store, add_task: AddTask) -> None:
    await add_task(store, "t", events=[])
    assert await store.read_events("t") == []
    assert await store.read_events("t", limit=0) == []
    assert await store.read_events("t", types={"task.created"}) == []
    await store.commit("t", None, [msg("x")])
    assert [e.seq for e in await store.read_events("t")] == [1]
    with pytest.raises(errors.TaskNotFound):
        await store.read_events("nope", limit=0)
    with pytest.raises(errors.TaskNotFound):
        await store.read_events("nope", types={"user.message"})


# --- SQLite's synchronous level ---------------------------------------------------------------


def _level(store: Store) -> str:
    from tether.store.sqlite import SQLiteStore

    assert isinstance(store, SQLiteStore)
    return store.synchronous


async def _store_synchronous(store: Store) -> int:
    sqlite_store: Any = store

    def read() -> int:
        assert sqlite_store._conn is not None
        return int(sqlite_store._conn.execute("PRAGMA synchronous").fetchone()[0])

    return await sqlite_store._run(read)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("query", "level", "code"),
    [
        ("", "FULL", 2),
        ("?synchronous=normal", "NORMAL", 1),
        ("?synchronous=NORMAL", "NORMAL", 1),
        ("?synchronous=full", "FULL", 2),
        ("?synchronous=Extra", "EXTRA", 3),
        ("?synchronous=off", "OFF", 0),
    ],
)
async def test_sqlite_synchronous_url_parameter(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    add_task: AddTask,
    query: str,
    level: str,
    code: int,
) -> None:
    monkeypatch.delenv("TETHER_SQLITE_SYNCHRONOUS", raising=False)
    path = tmp_path / "db" / "tether.db"
    url = f"sqlite:///{path}{query}"
    assert sqlite_path(url) == path
    store = await open_store(url)
    try:
        assert _level(store) == level
        assert await _store_synchronous(store) == code
        await add_task(store, "t")
        await store.commit("t", None, [msg("kept")])
        # The store's URL opens the same database at the same level.
        assert sqlite_path(store.url) == path
        assert ("synchronous=" in store.url) == (level != "FULL")
    finally:
        await store.close()
    again = await open_store(store.url)
    try:
        assert _level(again) == level
        assert len(await again.read_events("t")) == 2
    finally:
        await again.close()


async def test_sqlite_synchronous_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The argument beats the URL, the URL beats the environment, FULL is the default.
    url = f"sqlite:///{tmp_path / 'a.db'}"
    monkeypatch.setenv("TETHER_SQLITE_SYNCHRONOUS", "normal")
    for target, kwargs, want in [
        (url, {}, "NORMAL"),
        (url + "?synchronous=extra", {}, "EXTRA"),
        (url + "?synchronous=extra", {"synchronous": "full"}, "FULL"),
    ]:
        store = await open_store(target, **kwargs)
        try:
            assert _level(store) == want
        finally:
            await store.close()
    monkeypatch.delenv("TETHER_SQLITE_SYNCHRONOUS")
    store = await open_store(url)
    try:
        assert _level(store) == "FULL"
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("query", "kwargs", "env", "words"),
    [
        ("?synchronous=fast", {}, None, "synchronous='fast' is not one of off, normal, full"),
        ("?synchronous=", {}, None, "synchronous='' is not one of"),
        ("?synchronous=1", {}, None, "is not one of"),
        ("?sync=normal", {}, None, "unknown parameter 'sync'"),
        ("?synchronous=normal&journal=delete", {}, None, "unknown parameter 'journal'"),
        ("", {"synchronous": "lazy"}, None, "synchronous='lazy' is not one of"),
        ("", {}, "sometimes", "TETHER_SQLITE_SYNCHRONOUS='sometimes' is not one of"),
    ],
)
async def test_sqlite_synchronous_invalid_is_refused_clearly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    query: str,
    kwargs: dict[str, Any],
    env: str | None,
    words: str,
) -> None:
    if env is None:
        monkeypatch.delenv("TETHER_SQLITE_SYNCHRONOUS", raising=False)
    else:
        monkeypatch.setenv("TETHER_SQLITE_SYNCHRONOUS", env)
    path = tmp_path / "never" / "tether.db"
    with pytest.raises(errors.StoreConfigError, match=re.escape(words)):
        await open_store(f"sqlite:///{path}{query}", **kwargs)
    assert not path.parent.exists()


async def test_sqlite_store_refuses_a_bad_level_itself(tmp_path: Path) -> None:
    from tether.store.sqlite import SQLiteStore

    with pytest.raises(errors.StoreConfigError, match="not one of"):
        await SQLiteStore.open(tmp_path / "x.db", synchronous="SOMETIMES")  # type: ignore[arg-type]
    assert not (tmp_path / "x.db").exists()


# --- artifact search ----------------------------------------------------------------------


def _doc(task_id: str, artifact_id: str, data: bytes, **kw: Any) -> ArtifactRecord:
    """An artifact with blob `data` (committed with it)."""
    return artifact_record(
        task_id, artifact_id, blob_hash=blob_hash(data), size=len(data), deps=(), **kw
    )


async def _searchable(store: Store, make_task: MakeTask) -> None:
    """Task `t`: evidence (JSON), a tool output (text), a binary blob; task `u`: one more."""
    await make_task("t")
    await make_task("u")
    ev_b = json.dumps({"excerpt": "The battery of product B lasts 12 hours.", "location": "p2"})
    out = "Search results: the warranty of product A is two years; shipping is free."
    binary = bytes(range(256)) * 4
    blobs = [ev_b.encode(), out.encode(), binary]
    arts = [
        _doc("t", "ev-b", blobs[0], kind="evidence", name="B"),
        _doc("t", "out-a", blobs[1], kind="tool_output", name="fetch output"),
        _doc("t", "bin", blobs[2], kind="tool_output", name="image"),
    ]
    await store.commit("t", None, [], artifacts=arts, blobs=blobs)
    other = b"The battery of product C lasts 3 hours."
    await store.commit("u", None, [], artifacts=[_doc("u", "ev-c", other)], blobs=[other])


async def test_search_artifacts_ranks_cites_and_excerpts(store: Store, make_task: MakeTask) -> None:
    await _searchable(store, make_task)
    hits = await store.search_artifacts("t", "battery life")
    assert [h.artifact.artifact_id for h in hits] == ["ev-b"]  # not task u's
    assert "[battery]" in hits[0].excerpt.lower() and "12 hours" in hits[0].excerpt
    assert hits[0].artifact == await store.get_artifact("ev-b")
    # Any word may match; the better match ranks first.
    hits = await store.search_artifacts("t", "warranty battery years")
    assert [h.artifact.artifact_id for h in hits] == ["out-a", "ev-b"]
    assert hits[0].score > hits[1].score
    assert [h.artifact.artifact_id for h in await store.search_artifacts("t", "battery", limit=1)]
    assert len(await store.search_artifacts("t", "product", limit=1)) == 1
    kinds = await store.search_artifacts("t", "product", kinds={"tool_output"})
    assert [h.artifact.artifact_id for h in kinds] == ["out-a"]
    assert await store.search_artifacts("t", "product", kinds=set()) == []
    # A binary blob adds only its name; JSON keys are not text.
    assert [h.artifact.artifact_id for h in await store.search_artifacts("t", "image")] == ["bin"]
    assert await store.search_artifacts("t", "excerpt location") == []
    assert await store.search_artifacts("nobody", "battery") == []


async def test_search_artifacts_leaves_invalid_ones_out_unless_asked(
    store: Store, make_task: MakeTask
) -> None:
    await _searchable(store, make_task)
    stale = replace(await store.get_artifact("ev-b"), valid=False, meta={"invalidated": {}})
    await store.commit("t", None, [], artifacts=[stale])
    assert await store.search_artifacts("t", "battery") == []
    hits = await store.search_artifacts("t", "battery", include_invalid=True)
    assert [(h.artifact.artifact_id, h.artifact.valid) for h in hits] == [("ev-b", False)]


@pytest.mark.parametrize(
    "query",
    [
        '"',
        'battery"',
        "NEAR(battery hours, 2)",
        "batt*",
        "body:battery",
        "-battery",
        "battery OR",
        "AND battery NOT",
        "'); DROP TABLE artifacts; --",
        "(((",
        "^battery",
        "battery & | ! <->",
        "\x00battery",
    ],
)
async def test_search_query_syntax_is_never_interpreted(
    store: Store, make_task: MakeTask, query: str
) -> None:
    await _searchable(store, make_task)
    hits = await store.search_artifacts("t", query)
    assert [h.artifact.artifact_id for h in hits] in (["ev-b"], [])
    assert len(await store.get_artifacts("t")) == 3


async def test_search_matches_no_artifact_for_a_query_without_words(
    store: Store, make_task: MakeTask
) -> None:
    await _searchable(store, make_task)
    for query in ("", "   ", "!!! ??? ***", "or and not"):
        assert await store.search_artifacts("t", query) == []


async def test_search_index_is_written_with_the_artifact_or_not_at_all(
    store: Store, make_task: MakeTask
) -> None:
    await make_task("t")
    lease = await store.claim("w", 60, task_id="t")
    assert lease is not None
    data = b"orchids need indirect light"
    with pytest.raises(errors.StaleLease):
        await store.commit("t", lease.token + 1, [], artifacts=[_doc("t", "x", data)], blobs=[data])
    assert await store.search_artifacts("t", "orchids") == []
    # A blob stored before the artifact is indexed from the store.
    await store.put_blob(data)
    await store.commit("t", lease.token, [], artifacts=[_doc("t", "x", data)])
    assert [h.artifact.artifact_id for h in await store.search_artifacts("t", "orchid")] in (
        ["x"],
        [],  # the memory store does not stem
    )
    assert [h.artifact.artifact_id for h in await store.search_artifacts("t", "orchids")] == ["x"]


async def test_search_index_keeps_a_bounded_part_of_a_large_output(
    store: Store, make_task: MakeTask
) -> None:
    from tether.store import _search

    await make_task("t")
    head = "alpha " * 1000
    data = (head + "filler " * (_search.MAX_INDEXED_BYTES // 7) + " omega").encode()
    await store.commit("t", None, [], artifacts=[_doc("t", "big", data)], blobs=[data])
    assert [h.artifact.artifact_id for h in await store.search_artifacts("t", "alpha")] == ["big"]
    assert await store.search_artifacts("t", "omega") == []
    assert len((await store.search_artifacts("t", "alpha"))[0].excerpt) < 2000
