"""What PostgreSQL's one-statement commit costs: the server does a round's work once,
whatever the task's history (no part of its plan runs once per stored mark: an item
past the cap of its marks drops its oldest with each new one), its estimated cost stays
far below `jit_above_cost` (JIT compiling the statement would cost milliseconds a
commit), and the client makes no new cursor per commit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tether import events as ev
from tether.runtime.round.progress import MAX_SEEN
from tether.runtime.run.state import RunState
from tether.store.base import TaskPatch
from tether.store.postgres import PostgresStore

from ..conftest import create_small_task, pg_connect

pytestmark = pytest.mark.postgres


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for sub in plan.get("Plans", ()):
        yield from _nodes(sub)


async def test_a_commit_past_the_cap_of_marks_does_no_work_per_mark(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url)
    plans: list[dict[str, Any]] = []
    statement = store._statement

    def explained(*args: Any) -> Any:
        # The statement as the store will send it, analysed first in a transaction
        # rolled back (nothing is sent yet: no lock is held).
        query, params = statement(*args)
        conn = pg_connect(pg_url)
        try:
            conn.execute("BEGIN")
            row = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        doc = row["QUERY PLAN"]
        plans.append((json.loads(doc) if isinstance(doc, str) else doc)[0])
        return query, params

    try:
        await create_small_task(store, "t")
        state = RunState.from_dict((await store.get_task("t")).usage)
        marks = [f"{n:016x}" for n in range(MAX_SEEN + 3)]
        state.seen = {"i1": marks[:MAX_SEEN]}
        await store.commit("t", None, [], task=TaskPatch(usage=state.to_dict()))
        state.marks_write()
        store._statement = explained  # type: ignore[method-assign]
        for k in (1, 2, 3):
            state.seen = {"i1": marks[k : MAX_SEEN + k]}
            write = state.marks_write()
            await store.commit("t", None, [], task=TaskPatch(usage=state.to_dict(), marks=write))
        assert RunState.from_dict((await store.get_task("t")).usage).seen == state.seen
    finally:
        await store.close()
    assert len(plans) == 3
    for plan in plans:
        loops = max(n.get("Actual Loops", 0) for n in _nodes(plan["Plan"]))
        assert loops <= 2, f"a plan node ran {loops} times"
        assert plan["Plan"]["Total Cost"] < 10_000
        assert "JIT" not in plan


async def test_commits_reuse_a_cursor_per_connection_and_shape(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []
    cursor = psycopg.Connection.cursor

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        cur = cursor(self, *args, **kwargs)
        if "row_factory" in kwargs:
            made.append(cur)
        return cur

    store = await PostgresStore.open(pg_url)
    try:
        await create_small_task(store, "t")
        monkeypatch.setattr(psycopg.Connection, "cursor", counted)
        for n in range(12):
            # Two shapes in turn, as a run's rounds commit them.
            if n % 2:
                await store.commit("t", None, [ev.UserMessage(text=f"note {n}")])
            else:
                await store.commit("t", None, [], task=TaskPatch(usage={"rounds": n}))
        assert (await store.get_task("t")).usage == {"rounds": 10}
    finally:
        await store.close()
    assert 2 <= len(made) <= 4
