"""The SQLite store binds a commit's hot statements by position (issue 22: its module
looks a named parameter up anew at every call): the task's columns, the record upserts
and the events. The rows must be those the statements with named parameters (the
shared query layer's, PostgreSQL's fallback) write."""

from __future__ import annotations

import functools
import json
import sqlite3
from pathlib import Path
from typing import Any

from tests.conftest import create_small_task
from tests.integration.test_store_conformance import (
    approval_record,
    artifact_record,
    op_record,
)
from tether import events as ev
from tether.clock import FakeClock
from tether.store import _rules as rules
from tether.store._sql import SqlStore
from tether.store.base import TaskPatch, blob_hash
from tether.store.sqlite import SQLiteStore

TABLES = ("tasks", "ops", "artifacts", "approvals", "events", "event_runs", "blobs")


async def _write(path: Path, named: bool) -> dict[str, list[dict[str, Any]]]:
    clock = FakeClock()
    store = await SQLiteStore.open(path, clock=clock)
    if named:  # the shared layer's statements, by name
        store._update_task = functools.partial(SqlStore._update_task, store)  # type: ignore[method-assign]
        store._upsert_records = functools.partial(SqlStore._upsert_records, store)  # type: ignore[method-assign]
        store._event_runs = False  # `SqlStore._insert_events`, then `_add_events`
    try:
        await create_small_task(store, "t")
        clock.advance(1.5)
        op = op_record(
            "t", "o1", rnd=7, idx=3, attempts=2, next_attempt_at=5.25, status="succeeded"
        )
        op = rules.replaced(op, result={"content": "done", "n": 1e-07}, error={"e": "x"})
        art = artifact_record("t", "a1", blob_hash=blob_hash(b"body"), size=4)
        called = ev.ModelCalled(call_id="c", purpose="act", model="m", latency_ms=1.5e-05)
        patch = TaskPatch(
            status="running",
            usage={"rounds": 3, "cost_usd": 1e-05, "seen": {"work": ["m1"]}},
            current_milestone="m",
            waiting={"on": "x"},
            cancel_requested=False,
        )
        await store.commit(
            "t",
            None,
            [ev.RoundStarted(round=1, turn=1, item="work"), called],
            task=patch,
            ops=[op],
            artifacts=[art],
            approvals=[approval_record("t", "r1")],
            blobs=[b"body"],
        )
        clock.advance(2)
        await store.commit("t", None, [ev.RoundStarted(round=2, turn=1)], ops=[op])
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return {
            t: [dict(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2")] for t in TABLES
        }
    finally:
        conn.close()


async def test_positional_writes_store_the_rows_named_ones_do(tmp_path: Path) -> None:
    fast = await _write(tmp_path / "positional.db", named=False)
    slow = await _write(tmp_path / "named.db", named=True)
    for table in ("tasks", "ops", "artifacts", "approvals", "blobs"):
        assert fast[table] == slow[table], table
    # The events: the same rows (ids as runs place them), data read back the same.
    assert len(fast["events"]) == len(slow["events"]) == 4
    assert [r["id"] for r in fast["events"]] == [1, 2, 3, 4]
    assert fast["event_runs"] == [{"task_id": "t", "first_seq": 1, "first_id": 1}]
    for mine, theirs in zip(fast["events"], slow["events"], strict=True):
        data = mine.pop("data"), theirs.pop("data")
        assert json.loads(data[0]) == json.loads(data[1])
        mine.pop("id"), theirs.pop("id")
        assert mine == theirs
