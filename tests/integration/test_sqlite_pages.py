"""SQLite's events in runs (schema 9): a commit's events go to one b-tree, a task's
events read back whole and in order however the tasks' commits interleave, a schema-8
database with events migrates to it, and a steady round's commits write few pages
(counted in the WAL: frames per b-tree, not a timing)."""

from __future__ import annotations

import random
import sqlite3
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import tether
from tests.conftest import create_small_task
from tether import events as ev
from tether.store import SCHEMA_VERSION, TaskPatch
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore

TASKS = ("ta", "tb", "tc")


def _rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute(sql, params).fetchall())


async def _interleave(stores: list[Store], seed: int, commits: int) -> None:
    """The same commits on each store: events of the tasks in a random interleaving,
    with runs of one task alone between."""
    rng = random.Random(seed)
    for n in range(commits):
        task = TASKS[0] if n % 20 < 8 else rng.choice(TASKS)
        items = [ev.UserMessage(text=f"{task} {n} {k}" * rng.randint(1, 40)) for k in range(3)]
        items = items[: rng.randint(0, 3)]
        for store in stores:
            await store.commit(task, None, items)


async def _same_reads(lite: Store, mem: Store) -> None:
    """Every task's events, whole and in pieces (after, limit, types), as the memory
    store reads them."""

    def shown(events: list[Any]) -> list[tuple[Any, ...]]:
        return [(e.task_id, e.seq, e.type, e.data) for e in events]

    for task in TASKS:
        whole = await mem.read_events(task)
        assert shown(await lite.read_events(task)) == shown(whole)
        last = whole[-1].seq
        for after in (-5, 0, 1, 2, last // 3, last // 2, last - 1, last, last + 3):
            for limit in (None, 1, 7):
                for types in (None, {"user.message"}, {"task.created"}):
                    got = await lite.read_events(task, after, limit=limit, types=types)
                    want = await mem.read_events(task, after, limit=limit, types=types)
                    assert shown(got) == shown(want), (task, after, limit, types)


async def test_interleaved_tasks_read_back_their_own_events(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    lite, mem = await SQLiteStore.open(db), MemoryStore()
    try:
        for task in TASKS:
            for store in (lite, mem):
                await create_small_task(store, task)
        await _interleave([lite, mem], seed=7, commits=300)
        await _same_reads(lite, mem)
        # A commit whose task wrote the table's last events goes on with their run:
        # far fewer runs than commits.
        runs = Counter(t for (t,) in _rows(db, "SELECT task_id FROM event_runs"))
        assert set(runs) == set(TASKS) and sum(runs.values()) < 200, runs
        # The rows of each run are its task's, at `first_id + (seq - first_seq)`.
        stray = _rows(
            db,
            "SELECT e.id FROM events e JOIN event_runs r ON r.task_id = e.task_id"
            " AND r.first_seq = (SELECT MAX(x.first_seq) FROM event_runs x"
            " WHERE x.task_id = e.task_id AND x.first_seq <= e.seq)"
            " WHERE e.id != r.first_id + e.seq - r.first_seq",
        )
        assert stray == []
    finally:
        await lite.close()


async def test_a_task_that_runs_alone_writes_no_run_rows(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = await SQLiteStore.open(db)
    try:
        await create_small_task(store, "ta")
        await create_small_task(store, "tb")  # after it: the next commit of ta starts a run
        for n in range(50):
            await store.commit("ta", None, [ev.UserMessage(text=f"m{n}")] * 2)
        assert _rows(db, "SELECT task_id, first_seq FROM event_runs ORDER BY 1, 2") == [
            ("ta", 1),
            ("ta", 2),
            ("tb", 1),
        ]
        assert [e.seq for e in await store.read_events("ta")] == list(range(1, 102))
    finally:
        await store.close()


async def test_a_schema_8_database_with_events_migrates(tmp_path: Path) -> None:
    """The events of a schema-8 database (rowid table keyed by (task_id, seq), the
    tasks' commits interleaved) move to runs, one per task; every task reads back the
    same task and events, and its commits go on from there."""
    db = tmp_path / "t.db"
    old, mem = await SQLiteStore.open(db, migrate_to=8), MemoryStore()
    try:
        assert await old.schema_version() == 8
        for task in TASKS:
            for store in (old, mem):
                await create_small_task(store, task)
        await _interleave([old, mem], seed=3, commits=120)
        lease = await old.claim("w", 60, task_id="tb")
        assert lease is not None
        await old.commit("tb", lease.token, [ev.UserMessage(text="held")])
        await mem.commit("tb", None, [ev.UserMessage(text="held")])
        before = {t: await old.read_events(t) for t in TASKS}
        tasks = {t: await old.get_task(t) for t in TASKS}
    finally:
        await old.close()
    assert "event_runs" not in {n for (n,) in _rows(db, "SELECT name FROM sqlite_master")}

    new = await SQLiteStore.open(db)
    try:
        assert await new.schema_version() == SCHEMA_VERSION
        assert _rows(db, "SELECT task_id, first_seq FROM event_runs ORDER BY 1") == [
            (t, 1) for t in TASKS
        ]
        for task in TASKS:
            assert await new.read_events(task) == before[task]
            assert await new.get_task(task) == tasks[task]
        await _same_reads(new, mem)
        # Usable: the lease held goes on, and the tasks' commits continue their seqs.
        await new.commit(
            "tb", lease.token, [ev.UserMessage(text="after")], task=TaskPatch(status="running")
        )
        await mem.commit(
            "tb", None, [ev.UserMessage(text="after")], task=TaskPatch(status="running")
        )
        await _interleave([new, mem], seed=5, commits=60)
        await _same_reads(new, mem)
    finally:
        await new.close()


def _frames(db: Path) -> tuple[int, Counter[str]]:
    """The commits in the WAL and its frames by b-tree (`dbstat`'s name of the page)."""
    data = (db.parent / (db.name + "-wal")).read_bytes()
    size = struct.unpack(">I", data[8:12])[0]
    pages, commits, off = [], 0, 32
    while off + 24 <= len(data):
        page, db_size = struct.unpack(">II", data[off : off + 8])
        pages.append(page)
        commits += db_size != 0
        off += 24 + size
    owner = dict(_rows(db, "SELECT pageno, name FROM dbstat"))
    return commits, Counter(owner.get(p, "?") for p in pages)


class _Steps:
    """A model that calls `step` once each round."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, request: Any) -> tether.ModelResponse:
        usage = tether.Usage(input_tokens=100, output_tokens=20)
        if request.purpose == "act":
            self.n += 1
            call = tether.tool_call("step", n=self.n)
            return tether.ModelResponse(f"Step {self.n}.", (call,), usage, "m", 0.0)
        return tether.ModelResponse("Going on.", (), usage, "m", 0.0, "stop")


@tether.tool(effect="read")
def step(n: int) -> str:
    """Do step n."""
    return f"step {n} done. " + "word " * 200


async def _run_rounds(db: Path, schema: int, rounds: int) -> tuple[int, Counter[str]]:
    """Run one task `rounds` rounds on a new database at `schema`, checkpoints off:
    the commits and their WAL frames by b-tree."""
    store = await SQLiteStore.open(db, migrate_to=schema)
    try:
        spec = tether.parse_spec(
            {
                "name": "steps",
                "objective": "Do the steps",
                "items": [{"id": "work", "title": "Every step"}],
                "tools": ["step"],
                "models": {"judge": "rules"},
                "limits": {"max_rounds": rounds, "no_progress_rounds": 10**9,
                           "max_attempts_per_item": 10**9, "max_rounds_per_item": None},
            }
        )  # fmt: skip
        task = await tether.create_task(store, spec)
        model = tether.ScriptedModel(policy=_Steps(), name="m")
        engine = tether.Engine(store, tether.ModelSet(model), registry=tether.ToolRegistry([step]))
        assert store._conn is not None
        conn = store._conn
        await store._run(lambda: conn.execute("PRAGMA wal_autocheckpoint=0").fetchall())
        await store._run(lambda: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        result = await engine.run(task.task_id)
        assert result.rounds == rounds
        return _frames(db)
    finally:
        await store.close()


async def test_a_steady_round_writes_its_events_to_one_b_tree(tmp_path: Path) -> None:
    """The same rounds on schema 8 (events keyed by (task_id, seq) beside their rowid)
    and on 9: the events' pages per commit drop by most of a page, the index's."""
    commits, frames = await _run_rounds(tmp_path / "9.db", SCHEMA_VERSION, 120)
    old_commits, old = await _run_rounds(tmp_path / "8.db", 8, 120)
    assert commits == old_commits >= 120
    # One task alone: its events extend one run, and a commit writes the table's last
    # page (and, one commit in a few, a new one and its parent), and no index.
    assert frames["event_runs"] == 0, frames
    assert not any(name.startswith("sqlite_autoindex_events") for name in frames), frames
    was = old["events"] + old["sqlite_autoindex_events_1"]
    assert frames["events"] <= was - 0.8 * commits, (frames, old)
    assert frames.total() <= old.total() - 0.8 * commits, (frames, old)


async def test_a_read_of_events_walks_the_runs_in_order_without_a_sort(tmp_path: Path) -> None:
    """Each run by its key, its rows by rowid range: a LIMIT stops the scan (a read of a
    task's first `task.created` does not read the whole log)."""
    db = tmp_path / "t.db"
    store = await SQLiteStore.open(db)
    try:
        query = store._events_query("task_id, seq", " AND (type IN (:t0))", " LIMIT :limit")
    finally:
        await store.close()
    with sqlite3.connect(db) as conn:
        params = {"id": "t", "after": 3, "t0": "task.created", "limit": 1}
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + query, params)]
    assert "SEARCH e USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in plan, plan
    assert plan[0].startswith("SEARCH r USING PRIMARY KEY"), plan
    assert not any("TEMP B-TREE" in step or "SCAN" in step for step in plan), plan
