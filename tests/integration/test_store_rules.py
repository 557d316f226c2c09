"""The commit rules every store shares (`tether.store._rules`), and what they cost.

The rules are pure; the conformance suite checks that memory, SQLite and PostgreSQL
obey them alike. Here: the rules themselves, that their SQL forms say the same as their
Python forms, and that a PostgreSQL commit (and a read) is one round trip (two for the
rare commit that writes approval requests or ends the task: it locks the task and reads
its requests first).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tether import errors, lifecycle
from tether import events as ev
from tether.store import LedgerWrite, Store, TaskPatch
from tether.store import _rules as rules
from tether.store.base import UNSET, ApprovalRecord, ArtifactRecord, OpRecord, blob_hash

AddTask = Callable[..., Awaitable[Any]]
REASONS = (None, *lifecycle.STOP_REASONS)


def state(status: str = "running", version: int = 2, token: int = 5, last: int = 9) -> Any:
    return rules.TaskState(status=status, version=version, fencing_token=token, last_seq=last)


def test_allowed_sources_say_what_check_transition_says() -> None:
    for dst, reason in itertools.product(lifecycle.STATUSES, REASONS):
        sources = rules.allowed_sources(dst, reason)
        for src in lifecycle.STATUSES:
            try:
                lifecycle.check_transition(src, dst, reason)
                allowed = True
            except errors.IllegalTransition:
                allowed = False
            assert (src in sources) == allowed, (src, dst, reason)


def test_guard_checks_fence_then_transition_then_version_then_ledger() -> None:
    cond = rules.CommitCondition(
        "t", token=4, status="satisfied", stop_reason="delivered", version=1, ledger_expected=3
    )
    with pytest.raises(errors.StaleLease) as stale:
        cond.check_task(state(status="queued"))
    assert (stale.value.token, stale.value.current) == (4, 5)
    cond = rules.CommitCondition(
        "t", token=5, status="satisfied", stop_reason="delivered", version=1, ledger_expected=3
    )
    with pytest.raises(errors.IllegalTransition):
        cond.check_task(state(status="queued"))
    with pytest.raises(errors.ConcurrentUpdate, match="version cannot go back from 2 to 1"):
        cond.check_task(state(status="running"))
    ok = rules.CommitCondition("t", token=5, status="satisfied", stop_reason="delivered", version=2)
    ok.check_task(state())
    with pytest.raises(errors.ConcurrentUpdate, match="ledger version is 2, expected 3"):
        cond.check_ledger(2)
    cond.check_ledger(3)
    # Out of band: no token, any status change the lifecycle allows.
    rules.CommitCondition(
        "t", token=None, status="cancelled", stop_reason="cancelled_by_user"
    ).check_task(state(token=77))


def test_refusal_names_the_first_broken_rule() -> None:
    cond = rules.CommitCondition("t", token=5, status="running", ledger_expected=3)
    assert isinstance(cond.refusal(state(token=6), 3), errors.StaleLease)
    assert isinstance(cond.refusal(state(status="cancelled"), 3), errors.IllegalTransition)
    found = cond.refusal(state(), 7)
    assert isinstance(found, errors.ConcurrentUpdate) and "ledger version is 7" in str(found)
    # Nothing broken as read: the ledger moved in between.
    assert isinstance(cond.refusal(state(), 3), errors.ConcurrentUpdate)


def test_guard_of_a_commit() -> None:
    patch = TaskPatch(status="failed", stop_reason="environment_unrecoverable", version=3)
    led = LedgerWrite(state={}, version=8, expected_version=7)
    cond = rules.CommitCondition.of("t", 2, patch, led)
    assert cond == rules.CommitCondition("t", 2, "failed", "environment_unrecoverable", 3, 7)
    assert cond.sources == rules.allowed_sources("failed", "environment_unrecoverable")
    assert rules.CommitCondition.of("t", None).sources is None


def test_task_changes_and_plan() -> None:
    assert rules.task_changes(None, None, 5.0) == {"updated_at": 5.0}
    assert rules.task_changes(None, 3, 5.0) == {"updated_at": 5.0, "heartbeat_at": 5.0}
    patch = TaskPatch(
        status="waiting",
        version=4,
        current_milestone=None,
        waiting={"for": "human"},
        usage={"rounds": 2},
        cancel_requested=False,
        wake_at=9.5,
        spec={"objective": "x"},
    )
    assert rules.task_changes(patch, None, 1.0) == {
        "updated_at": 1.0,
        "status": "waiting",
        "stop_reason": None,
        "version": 4,
        "current_milestone": None,
        "waiting": {"for": "human"},
        "usage": {"rounds": 2},
        "cancel_requested": False,
        "wake_at": 9.5,
        "spec": {"objective": "x"},
    }
    assert TaskPatch().current_milestone is UNSET
    assert rules.task_changes(TaskPatch(), None, 1.0) == {"updated_at": 1.0}

    cond = rules.CommitCondition.of("t", 5, patch)
    plan = rules.plan_commit(cond, state(), patch, 3, 1.0)
    assert (plan.first_seq, plan.last_seq, plan.events_version) == (10, 12, 4)
    assert plan.changes["last_seq"] == 12
    empty = rules.plan_commit(rules.CommitCondition.of("t", 5), state(), None, 0, 1.0)
    assert (empty.first_seq, empty.last_seq, empty.events_version) == (10, 9, 2)
    assert "last_seq" not in empty.changes
    with pytest.raises(errors.StaleLease):
        rules.plan_commit(rules.CommitCondition.of("t", 1), state(), None, 1, 1.0)


def test_upserts_merge_in_order() -> None:
    def op(**kw: Any) -> OpRecord:
        base: dict[str, Any] = dict(
            op_id="o", task_id="t", round=1, call_index=0, tool="fetch", args={"v": 1},
            args_hash="h", effect="read", status="intended",
        )  # fmt: skip
        base.update(kw)
        return OpRecord(**base)

    first = rules.merge_op(None, op(created_at=99.0), 1.0)
    assert (first.created_at, first.updated_at) == (1.0, 1.0)
    later = rules.merge_op(first, op(args={"v": 2}, tool="x", status="succeeded", attempts=2), 2.0)
    assert (later.args, later.tool, later.status, later.attempts) == (
        {"v": 1},
        "fetch",
        "succeeded",
        2,
    )
    assert (later.created_at, later.updated_at) == (1.0, 2.0)
    assert set(rules.OP_OUTCOME) < {f for f in OpRecord.__dataclass_fields__}

    art = ArtifactRecord("a", "t", "evidence", "n", "sha256:x", 1)
    a1 = rules.merge_artifact(None, art, 3.0)
    a2 = rules.merge_artifact(a1, ArtifactRecord("a", "t", "k", "m", "h", 2, valid=False), 4.0)
    assert (a2.kind, a2.name, a2.valid, a2.created_at) == ("evidence", "n", False, 3.0)

    ap = ApprovalRecord("r", "t", "pending", {"q": 1}, op_id="o")
    p1 = rules.merge_approval(None, ap, 5.0)
    assert p1.created_at == 5.0
    assert (
        rules.merge_approval(
            None, ApprovalRecord("r", "t", "pending", {}, created_at=2.0), 5.0
        ).created_at
        == 2.0
    )
    p2 = rules.merge_approval(
        p1, ApprovalRecord("r", "x", "approved", {"q": 2}, decided_by="ana"), 6.0
    )
    assert (p2.task_id, p2.request, p2.op_id, p2.status, p2.decided_by, p2.created_at) == (
        "t", {"q": 1}, "o", "approved", "ana", 5.0,
    )  # fmt: skip

    got = rules.collapse(
        [op(), op(op_id="p"), op(status="failed")], lambda o: o.op_id, rules.merge_op, 7.0
    )
    assert [(o.op_id, o.status) for o in got] == [("o", "failed"), ("p", "intended")]
    assert list(rules.unique_blobs([b"a", bytearray(b"a"), b"b"]).values()) == [b"a", b"b"]  # type: ignore[list-item]


def test_lease_rules_and_their_sql_agree() -> None:
    import sqlite3

    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE tasks (status TEXT, wake_at REAL, cancel_requested INTEGER,"
        " lease_owner TEXT, lease_expiry REAL, fencing_token INTEGER)"
    )
    now = 100.0
    cases = list(
        itertools.product(
            lifecycle.STATUSES, (None, 50.0, 150.0), (0, 1), (None, "w"), (None, 50.0, 150.0), (3,)
        )
    )
    conn.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?)", cases)
    params = {"now": now, "f": 0, "tok": 3}

    def where(cond: str) -> set[tuple[Any, ...]]:
        return set(conn.execute(f"SELECT * FROM tasks WHERE {cond}", params).fetchall())

    free = {c for c in cases if rules.lease_free(c[3], c[4], now)}
    assert where(rules.LEASE_FREE_SQL) == free
    claimable = {c for c in cases if rules.claimable(c[0], c[1], bool(c[2]), now)}
    assert where(rules.CLAIMABLE_SQL) == claimable
    for renew in (True, False):
        held = set()
        for c in cases:
            try:
                rules.check_lease("t", 3, c[5], c[3], renew=renew)
                held.add(c)
            except errors.StaleLease:
                pass
        assert where(rules.lease_held_sql(renew)) == held


# --- PostgreSQL: round trips ------------------------------------------------------------------


def _count_round_trips(store: Store) -> Callable[[Callable[[], Awaitable[Any]]], Awaitable[int]]:
    """`await count(fn)`: the Sync and simple Query messages `fn` sends (each one is a
    wait for the server) on a store whose pool holds a single connection."""
    pool: Any = store._pool

    async def count(fn: Callable[[], Awaitable[Any]]) -> int:
        r, w = os.pipe()
        with pool.connection() as conn:
            conn.pgconn.trace(w)
        try:
            await fn()
        finally:
            with pool.connection() as conn:
                conn.pgconn.untrace()
            os.close(w)
        with os.fdopen(r, "r", encoding="utf-8", errors="replace") as f:
            lines = [line.split("\t") for line in f.read().splitlines()]
        sent = collections.Counter(
            p[3].split()[0] for p in lines if len(p) > 3 and p[1] == "F" and p[3].split()
        )
        return sent["Sync"] + sent["Query"]

    return count


@pytest.mark.postgres
async def test_postgres_round_trips(pg_url: str, add_task: AddTask) -> None:
    from tether.store.postgres import PostgresStore

    store = await PostgresStore.open(pg_url, max_size=1)
    try:
        await add_task(store, "t")
        lease = await store.claim("w", 60, task_id="t")
        assert lease is not None
        count = _count_round_trips(store)
        led = (await store.get_ledger("t")).to_ledger()

        async def commit() -> None:
            await store.commit(
                "t",
                lease.token,
                [ev.RoundStarted(round=1, turn=1), ev.UserMessage(text="x")],
                task=TaskPatch(status="running", usage={"rounds": 1}),
                ledger=LedgerWrite.of(led, expected_version=led.version, skeleton=True),
                ops=[OpRecord("o", "t", 1, 0, "fetch", {}, "h", "read", "intended")],
                artifacts=[ArtifactRecord("a", "t", "evidence", "a.txt", "sha256:x", 1)],
                blobs=[b"blob", b"blob"],
            )

        assert await count(commit) == 1

        async def ask() -> None:
            await store.commit(
                "t",
                lease.token,
                [],
                approvals=[ApprovalRecord("r", "t", "pending", {"q": 1})],
            )

        assert await count(ask) == 2

        async def refused() -> None:
            with pytest.raises(errors.StaleLease):
                await store.commit("t", lease.token + 1, [ev.UserMessage(text="no")])

        assert await count(refused) == 1
        assert await count(lambda: store.get_task("t")) == 1
        assert await count(lambda: store.read_events("t", after=3)) == 1
        assert await count(lambda: store.get_ops("t", op_ids={"o"})) == 1
        assert await count(lambda: store.get_ops("t", op_ids=set())) == 0
        assert await count(lambda: store.get_artifacts("t", artifact_ids=())) == 0
        assert await count(lambda: store.renew("t", lease.token, 60)) == 1

        def bump(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], int]:
            n = (doc or {}).get("n", 0) + 1
            return {"n": n}, n

        def boom(doc: dict[str, Any] | None, now: float) -> tuple[None, None]:
            raise ValueError("no")

        assert await count(lambda: store.update_shared("k", bump)) == 2
        with pytest.raises(ValueError):
            await store.update_shared("k", boom)  # rolled back on the pool's only connection
        assert await count(lambda: store.update_shared("k", bump)) == 2
        assert await store.get_shared("k") == {"n": 2}
        assert [e.seq for e in await store.read_events("t")] == [1, 2, 3]
        assert await store.get_blob(blob_hash(b"blob")) == b"blob"
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_concurrent_commits_stay_gapless_and_fenced(
    pg_url: str, add_task: AddTask
) -> None:
    # Many commits at once on one task through a pool of connections: every one lands
    # whole, in some order, with gapless numbers; a stale token among them is refused.
    from tether.store.postgres import PostgresStore

    store = await PostgresStore.open(pg_url, max_size=6)
    try:
        await add_task(store, "t")
        lease = await store.claim("w", 60, task_id="t")
        assert lease is not None

        async def one(n: int) -> Any:
            token = lease.token if n % 5 else lease.token - 1
            return await store.commit(
                "t", token if n else None, [ev.UserMessage(text=f"{n}-{k}") for k in range(3)]
            )

        results = await asyncio.gather(*(one(n) for n in range(40)), return_exceptions=True)
        stale = [r for r in results if isinstance(r, errors.StaleLease)]
        done = [r for r in results if not isinstance(r, BaseException)]
        assert len(stale) == 7 and len(done) == 33
        events = await store.read_events("t")
        assert [e.seq for e in events] == list(range(1, 1 + 1 + 3 * 33))
        by_commit = collections.defaultdict(list)
        for e in events[1:]:
            by_commit[e.data["text"].split("-")[0]].append(e.seq)
        assert all(s == list(range(s[0], s[0] + 3)) for s in by_commit.values())
        assert sorted((r.first_seq, r.last_seq) for r in done) == sorted(
            (s[0], s[-1]) for s in by_commit.values()
        )
        assert (await store.get_task("t")).last_seq == len(events)
    finally:
        await store.close()


def test_sqlite_url_keeps_its_path(tmp_path: Path) -> None:
    from tether.store import sqlite_path

    assert sqlite_path("sqlite:///rel/x.db?synchronous=normal") == Path("rel/x.db")
    assert sqlite_path(f"sqlite:///{tmp_path}/x.db") == tmp_path / "x.db"
    with pytest.raises(errors.StoreConfigError, match="names no file"):
        sqlite_path("sqlite:///?synchronous=normal")
