"""Schema 10: PostgreSQL stores a round's rows as SQLite does — an event's data as `json`
text with the fields at their plain defaults left out, the run state (`usage`) and
`waiting` as `json` — while rows written before the migration (whole `jsonb` events)
read back as they were written. Schema 11: a commit's events one row there
(`event_batches`), the events written before moved into it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import create_small_task
from tether import events as ev
from tether.store import SCHEMA_VERSION, TaskPatch
from tether.store.base import OpRecord

if TYPE_CHECKING:
    from conftest import Backend

#: Events whose fields are mostly at their defaults (the ones a round writes).
ROUND = [
    ev.RoundStarted(item="i1", turn=1, round=1),
    ev.OpIntended(op_id="o1", tool="do_step", args={"step": 1}, round=1, effect="write"),
    ev.OpResult(op_id="o1", tool="do_step", status="succeeded", summary="done"),
    ev.JudgeVerdict(round=1, decision="continue", judges=["rules"]),
]


def _raw(backend: Backend, sql: str, *params: Any) -> list[Any]:
    conn = backend.raw()
    try:
        cur = conn.execute(sql.replace("?", "%s"), params)
        rows = cur.fetchall() if cur.description else []
        conn.commit()
        return list(rows)
    finally:
        conn.close()


def _same(stored: list[Any], written: list[ev.Event]) -> None:
    assert [(e.type, e.data) for e in stored] == [ev.encode(w)[::2] for w in written]


@pytest.mark.postgres
async def test_schema_10_keeps_old_rows_and_writes_compact_ones(
    backend_factory: Any,
) -> None:
    pg = backend_factory("postgres")
    store = await pg.open(migrate_to=9)
    try:
        rec = await create_small_task(store, "t")
    finally:
        await store.close()
    # Rows as schema 9 wrote them: every field, as jsonb; a result stored whole.
    first = rec.last_seq + 1
    for n, e in enumerate(ROUND):
        type_name, version, data = ev.encode(e)
        _raw(
            pg,
            "INSERT INTO events (task_id, seq, type, schema_version, data, task_version, at)"
            " VALUES ('t', ?, ?, ?, ?::jsonb, 1, 0)",
            first + n, type_name, version, json.dumps(data),
        )  # fmt: skip
    usage = {"rounds": 1, "seen": {}, "by_purpose": {"act": {"calls": 1}}}
    _raw(
        pg,
        "UPDATE tasks SET last_seq = ?, usage = ?::jsonb WHERE task_id = 't'",
        first + len(ROUND) - 1, json.dumps(usage),
    )  # fmt: skip
    store = await pg.open()
    try:
        assert await store.schema_version() == SCHEMA_VERSION >= 10
        _same(await store.read_events("t", after=rec.last_seq), ROUND)
        assert (await store.get_task("t")).usage == usage
        types = _raw(
            pg,
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name IN ('events', 'tasks')"
            " AND data_type IN ('json', 'jsonb') ORDER BY 1, 2",
        )
        assert [tuple(r.values()) for r in types] == [
            ("events", "data", "json"),
            ("tasks", "usage", "json"),
            ("tasks", "waiting", "json"),
        ]

        # A commit after the migration: its rows compact, read back whole.
        done = {**usage, "rounds": 2}
        result = {"summary": "step 2", "content": "step 2 done. " + "x" * 300}
        op = OpRecord(
            op_id="o2", task_id="t", round=2, call_index=0, tool="do_step",
            args={"step": 2}, args_hash="h", effect="write", status="succeeded",
            attempts=1, result=result, task_version=1,
        )  # fmt: skip
        got = await store.commit("t", None, ROUND, task=TaskPatch(usage=done), ops=[op])
        _same(await store.read_events("t", after=got.first_seq - 1), ROUND)
        assert (await store.get_task("t")).usage == done
        assert (await store.get_ops("t"))[0].result == result
        query = "SELECT data::text AS d FROM events WHERE seq >= ? ORDER BY seq"
        stored = [r["d"] for r in _raw(pg, query, got.first_seq)]
        # The fields at their defaults are left out, the text is as the store wrote it.
        assert stored[2] == '{"op_id":"o1","tool":"do_step","status":"succeeded","summary":"done"}'
        assert all('":null' not in s and ", " not in s for s in stored)
        (task_row,) = _raw(pg, "SELECT usage::text AS u FROM tasks WHERE task_id = 't'")
        assert json.loads(task_row["u"]) == done and ", " not in task_row["u"]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_schema_11_moves_the_events_a_row_per_commit(backend_factory: Any) -> None:
    """The events written at schema 10 (a row each) read back the same after the
    migration, by any reading (after a number, by type, at most some), a commit's
    events one row; the commits after it go on numbering."""
    pg = backend_factory("postgres")
    store = await pg.open(migrate_to=10)
    try:
        rec = await create_small_task(store, "t")
        # Each commit at its own time: the migration knows a commit's events by their
        # time, version and token (one row for commits alike in all three).
        for _ in range(3):
            pg.clock.advance(1)
            await store.commit("t", None, ROUND)
        pg.clock.advance(1)
        await store.commit("t", None, [ev.UserMessage(text="alone")])
        reads = [
            await store.read_events("t"),
            await store.read_events("t", after=rec.last_seq + 2),
            await store.read_events("t", types={"op.result", "user.message"}),
            await store.read_events("t", after=3, limit=5),
        ]
        rows = _raw(pg, "SELECT count(*) AS n FROM events")[0]["n"]
    finally:
        await store.close()
    store = await pg.open()
    try:
        assert await store.schema_version() == SCHEMA_VERSION >= 11
        assert [
            await store.read_events("t"),
            await store.read_events("t", after=rec.last_seq + 2),
            await store.read_events("t", types={"op.result", "user.message"}),
            await store.read_events("t", after=3, limit=5),
        ] == reads
        # The creation's events, then one row per commit; the view reads them all.
        batches = _raw(
            pg, "SELECT json_array_length(events) AS n FROM event_batches ORDER BY last_seq"
        )
        assert [r["n"] for r in batches] == [rec.last_seq, 4, 4, 4, 1]
        assert _raw(pg, "SELECT count(*) AS n FROM events")[0]["n"] == rows
        got = await store.commit("t", None, ROUND)
        assert got.first_seq == reads[0][-1].seq + 1
        _same(await store.read_events("t", after=got.first_seq - 1), ROUND)
        assert (await store.read_events("t"))[: len(reads[0])] == reads[0]
        by_view = _raw(pg, "SELECT seq, type FROM events ORDER BY seq")
        assert [(r["seq"], r["type"]) for r in by_view] == [
            (e.seq, e.type) for e in await store.read_events("t")
        ]
    finally:
        await store.close()


def _op(op_id: str, idx: int, status: str, result: dict[str, Any] | None) -> OpRecord:
    return OpRecord(
        op_id=op_id, task_id="t", round=idx, call_index=0, tool="do_step",
        args={"step": idx}, args_hash="h", effect="write", status=status,
        attempts=1, result=result, task_version=1,
    )  # fmt: skip


@pytest.mark.postgres
async def test_schema_12_moves_the_op_results_a_row_each(backend_factory: Any) -> None:
    """Ops written at schema 11 (a result in its op's row, whole) read back the same
    after the migration, by any reading, their results moved to `op_results` (a summary
    that starts the content as its length); an op written after it reads back as
    written at each of its writes, its result one row (none while it has none)."""
    pg = backend_factory("postgres")
    output = "step 1 done. " + "y" * 1000
    results: list[dict[str, Any] | None] = [
        {"summary": output[:200], "content": output, "artifact_id": None},
        {"summary": "not the start", "content": "x" * 300},
        {"error": "boom", "nested": {"a": [1, 2.5, None, "\u00e9"]}},
        None,
    ]
    store = await pg.open(migrate_to=11)
    try:
        await create_small_task(store, "t")
        status = ("succeeded", "succeeded", "failed", "dispatched")
        ops = [_op(f"o{i}", i, status[i], r) for i, r in enumerate(results)]
        await store.commit("t", None, [], ops=ops)
        before = [
            await store.get_ops("t"),
            await store.get_ops("t", {"succeeded"}),
            await store.get_ops("t", op_ids={"o0", "o3"}),
            await store.get_ops("t", limit=2, after=(0, 0, "o0")),
        ]
        (whole,) = _raw(pg, "SELECT result->>'summary' AS s FROM ops WHERE op_id = 'o0'")
        assert whole["s"] == output[:200]  # schema 11 stored it whole
    finally:
        await store.close()
    store = await pg.open()
    try:
        assert await store.schema_version() == SCHEMA_VERSION >= 12
        assert [
            await store.get_ops("t"),
            await store.get_ops("t", {"succeeded"}),
            await store.get_ops("t", op_ids={"o0", "o3"}),
            await store.get_ops("t", limit=2, after=(0, 0, "o0")),
        ] == before
        assert [o.result for o in before[0]] == results
        rows = _raw(pg, "SELECT op_id, result FROM op_results ORDER BY op_id")
        assert [r["op_id"] for r in rows] == ["o0", "o1", "o2"]
        assert rows[0]["result"]["summary"] == 200 and rows[1]["result"] == results[1]
        cols = _raw(
            pg,
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = 'ops'",
        )
        assert "result" not in {r["column_name"] for r in cols}

        # An op's course after it: no result row until it has one, then one row,
        # written again only if the result changes, dropped if the op loses it.
        def stored() -> list[Any]:
            return [
                r["result"] for r in _raw(pg, "SELECT result FROM op_results WHERE op_id = 'o9'")
            ]

        done = {"summary": "ok", "content": "ok, all of it"}
        versions: list[list[Any]] = []
        for state, result, rows_after in (
            ("intended", None, []),
            ("dispatched", None, []),
            ("succeeded", done, [{"summary": 2, "content": "ok, all of it"}]),
            ("succeeded", done, [{"summary": 2, "content": "ok, all of it"}]),
            ("failed", {"error": "later"}, [{"error": "later"}]),
            ("pending", None, []),
        ):
            await store.commit("t", None, [], ops=[_op("o9", 9, state, result)])
            (got,) = await store.get_ops("t", op_ids={"o9"})
            assert (got.status, got.result) == (state, result)
            assert stored() == rows_after
            versions.append(_raw(pg, "SELECT xmin::text AS x FROM op_results WHERE op_id = 'o9'"))
        # The same result written again left its row as it was (no new row version).
        assert versions[2] == versions[3] != versions[4]
        # Several ops in one commit, one of them written twice (the later write wins).
        await store.commit(
            "t",
            None,
            [],
            ops=[
                _op("o10", 10, "intended", None),
                _op("o10", 10, "succeeded", done),
                _op("o9", 9, "succeeded", results[1]),
            ],
        )
        got_ops = {o.op_id: o.result for o in await store.get_ops("t", op_ids={"o9", "o10"})}
        assert got_ops == {"o9": results[1], "o10": done}
    finally:
        await store.close()


@pytest.mark.postgres
async def test_schema_12_ops_written_without_the_one_statement(backend_factory: Any) -> None:
    """A commit that does not fit PostgreSQL's one statement (`_commit_requests` with a
    libpq without pipelines) writes its ops the same way: results read back as written,
    one row each, none for an op without one."""
    from tether.store._sql import SqlStore
    from tether.store.base import Commit

    pg = backend_factory("postgres")
    store = await pg.open()
    try:
        await create_small_task(store, "t")
        done = {"summary": "ok", "content": "ok, all of it"}
        for ops in (
            [_op("o1", 1, "intended", None), _op("o2", 2, "succeeded", done)],
            [_op("o1", 1, "succeeded", {"n": 1}), _op("o2", 2, "pending", None)],
        ):
            await store._run(SqlStore._commit_sync, store, Commit("t", None, [], ops=ops))
            got = {o.op_id: (o.status, o.result) for o in await store.get_ops("t")}
            assert got == {o.op_id: (o.status, o.result) for o in ops}
        rows = _raw(pg, "SELECT op_id, result FROM op_results")
        assert [(r["op_id"], r["result"]) for r in rows] == [("o1", {"n": 1})]
    finally:
        await store.close()
