"""Versioned migrations on SQLite and PostgreSQL: from empty, from the previous version,
refusal of a newer schema, and one schema whichever way it was reached."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tether import errors
from tether import events as ev
from tether import ledger as L
from tether.store import SCHEMA_VERSION, LedgerWrite, TaskPatch
from tether.store._sql import migrations
from tether.store.base import ArtifactRecord, LedgerRecord, OpRecord, TaskRecord, blob_hash
from tether.store.memory import MemoryStore
from tether.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from conftest import Backend

AddTask = Callable[..., Awaitable[Any]]
V2_TABLES = {"ops", "artifacts", "approvals"}
V1_TABLES = {"tasks", "events", "ledgers", "blobs"}
V3_TABLES = {"shared_state"}
V4_TABLES = {"artifact_text"}
V6_TABLES = {"task_specs"}
V7_TABLES = {"ledger_items", "ledger_skeletons"}
V8_TABLES = {"task_marks"}
#: SQLite's FTS5 index over `artifact_text` (a virtual table and its shadow tables); the
#: PostgreSQL index is a column (`tsv`) and a GIN index of `artifact_text`.
FTS5 = "artifact_search"
#: SQLite's map of where each task's events are (schema 9; PostgreSQL has none).
V9_SQLITE_TABLES = {"event_runs"}
#: PostgreSQL's events a row per commit (schema 11; `events` is a view of them there).
V11_PG_TABLES = {"event_batches"}
#: PostgreSQL's op results a row per op (schema 12; SQLite keeps them in `ops`).
V12_PG_TABLES = {"op_results"}
ALL_TABLES = (
    V1_TABLES
    | V2_TABLES
    | V3_TABLES
    | V4_TABLES
    | V6_TABLES
    | V7_TABLES
    | V8_TABLES
    | {"tether_schema"}
)


async def add_old_task(
    backend: Backend, task_id: str, spec: dict[str, Any] | None = None
) -> TaskRecord:
    """A queued task written as schemas 1 to 5 held it (its spec in its `tasks` row),
    with the ledger and events `create_task` gives it (made by a memory store): the
    current store's `create_task` writes the spec where schema 6 keeps it."""
    from tests.conftest import create_small_task

    mem = MemoryStore()
    rec = await create_small_task(mem, task_id, **({} if spec is None else {"spec": spec}))
    led = await mem.get_ledger(task_id)
    events = await mem.read_events(task_id)
    conn = backend.raw()
    ph = "?" if backend.kind == "sqlite" else "%s"
    try:
        conn.execute(
            "INSERT INTO tasks (task_id, name, status, version, spec, workspace, usage,"
            " cancel_requested, created_at, updated_at, fencing_token, last_seq)"
            f" VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, NULL, '{{}}', {ph}, {ph}, {ph}, 0, {ph})",
            (rec.task_id, rec.name, rec.status, rec.version, json.dumps(rec.spec),
             0 if backend.kind == "sqlite" else False, rec.created_at, rec.updated_at,
             rec.last_seq),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO ledgers (task_id, skeleton, state, version, updated_at)"
            f" VALUES ({ph}, {ph}, {ph}, {ph}, {ph})",
            (task_id, json.dumps(led.skeleton), json.dumps(led.state), led.version,
             led.updated_at),
        )  # fmt: skip
        for e in events:
            conn.execute(
                "INSERT INTO events (task_id, seq, type, schema_version, data, task_version,"
                f" fencing_token, at) VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, {ph}, NULL, {ph})",
                (task_id, e.seq, e.type, e.schema_version, json.dumps(e.data),
                 e.task_version, e.at),
            )  # fmt: skip
    finally:
        conn.close()
    return rec


def _raw(backend: Backend, sql: str, *params: Any) -> list[Any]:
    """One statement on a raw connection (`?` placeholders, `%s` on PostgreSQL),
    committed: the rows it read, if any."""
    conn = backend.raw()
    try:
        cur = conn.execute(sql if backend.kind == "sqlite" else sql.replace("?", "%s"), params)
        rows = cur.fetchall() if cur.description else []
        if backend.kind == "postgres":
            conn.commit()
        return list(rows)
    finally:
        conn.close()


def _old_ledger(backend: Backend, task_id: str) -> LedgerRecord:
    """A ledger as schemas 1 to 6 held it (its state in its `ledgers` row), read raw: this
    version's store reads the schema it migrates to."""
    (r,) = _raw(
        backend,
        "SELECT skeleton, state, version, updated_at FROM ledgers WHERE task_id = ?",
        task_id,
    )

    def doc(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    return LedgerRecord(
        task_id, doc(r["skeleton"]), doc(r["state"]), int(r["version"]), r["updated_at"]
    )


def tables(backend: Backend) -> set[str]:
    conn = backend.raw()
    try:
        if backend.kind == "sqlite":
            rows = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
            names = {r["name"] for r in rows if not r["name"].startswith(FTS5)}
            return names - V9_SQLITE_TABLES
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        return {r["table_name"] for r in rows} - V11_PG_TABLES - V12_PG_TABLES
    finally:
        conn.close()


def schema_rows(backend: Backend) -> list[tuple[int, str]]:
    conn = backend.raw()
    try:
        rows = conn.execute("SELECT version, name FROM tether_schema ORDER BY version").fetchall()
        return [(int(r["version"]), r["name"]) for r in rows]
    finally:
        conn.close()


def schema_shape(backend: Backend) -> dict[str, Any]:
    """Tables, columns (with types, nullability, defaults, keys) and indexes."""
    conn = backend.raw()
    try:
        if backend.kind == "sqlite":
            out: dict[str, Any] = {}
            for r in conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master"
                " WHERE name NOT LIKE 'sqlite_%' AND name <> 'tether_schema' ORDER BY name"
            ).fetchall():
                entry: dict[str, Any] = {"type": r["type"], "table": r["tbl_name"], "sql": r["sql"]}
                if r["type"] == "table":
                    entry["columns"] = [
                        tuple(c) for c in conn.execute(f"PRAGMA table_xinfo({r['name']})")
                    ]
                    entry["fks"] = [
                        tuple(c) for c in conn.execute(f"PRAGMA foreign_key_list({r['name']})")
                    ]
                out[r["name"]] = entry
            return out
        cols = conn.execute(
            "SELECT table_name, column_name, ordinal_position, data_type, is_nullable,"
            " column_default FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name <> 'tether_schema'"
            " ORDER BY table_name, ordinal_position"
        ).fetchall()
        idx = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = current_schema() ORDER BY indexname"
        ).fetchall()
        cons = conn.execute(
            "SELECT tc.table_name, tc.constraint_type, kcu.column_name"
            " FROM information_schema.table_constraints tc"
            " JOIN information_schema.key_column_usage kcu"
            "   ON tc.constraint_name = kcu.constraint_name"
            "  AND tc.table_schema = kcu.table_schema"
            " WHERE tc.table_schema = current_schema()"
            " ORDER BY 1, 2, 3"
        ).fetchall()
        schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]
        return {
            "columns": [tuple(r.values()) for r in cols],
            "indexes": [
                (r["tablename"], r["indexname"], r["indexdef"].replace(f"{schema}.", ""))
                for r in idx
            ],
            "constraints": [tuple(r.values()) for r in cons],
        }
    finally:
        conn.close()


def test_migration_files_are_numbered_alike_for_both_dialects() -> None:
    for dialect in ("sqlite", "postgres"):
        found = migrations(dialect)
        assert [v for v, _, _ in found] == list(range(1, SCHEMA_VERSION + 1)), dialect
    assert [n for _, n, _ in migrations("sqlite")] == [n for _, n, _ in migrations("postgres")]


async def test_migrate_from_empty(sql_backend: Backend, add_task: AddTask) -> None:
    store = await sql_backend.open()
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        assert tables(sql_backend) == ALL_TABLES
        assert schema_rows(sql_backend) == [(v, n) for v, n, _ in migrations(sql_backend.kind)]
        await add_task(store, "t")
        assert (await store.get_task("t")).status == "queued"
    finally:
        await store.close()
    # Opening again migrates nothing.
    again = await sql_backend.open()
    try:
        assert await again.schema_version() == SCHEMA_VERSION
        assert len(schema_rows(sql_backend)) == SCHEMA_VERSION
        assert (await again.get_task("t")).last_seq == 1
    finally:
        await again.close()


async def test_migrate_from_previous_version(sql_backend: Backend, add_task: AddTask) -> None:
    old = await sql_backend.open(migrate_to=1)
    try:
        assert await old.schema_version() == 1
        assert tables(sql_backend) == V1_TABLES | {"tether_schema"}
        created = await add_old_task(sql_backend, "t")
        lease = await old.claim("w", 60, task_id="t")
        assert lease is not None
        await old.commit(
            "t", lease.token, [ev.UserMessage(text="before")], task=TaskPatch(status="running")
        )
        ref = await old.put_blob(b"old blob")
        events_before = await old.read_events("t")
        ledger_before = _old_ledger(sql_backend, "t")
    finally:
        await old.close()

    new = await sql_backend.open()
    try:
        assert await new.schema_version() == SCHEMA_VERSION
        assert tables(sql_backend) == ALL_TABLES
        assert [v for v, _ in schema_rows(sql_backend)] == list(range(1, SCHEMA_VERSION + 1))
        task_before = await new.get_task("t")
        assert task_before.spec == created.spec
        assert (task_before.status, task_before.last_seq) == ("running", created.last_seq + 1)
        assert (task_before.lease_owner, task_before.fencing_token) == ("w", lease.token)
        assert await new.read_events("t") == events_before
        assert await new.get_ledger("t") == ledger_before
        assert await new.get_blob(ref) == b"old blob"
        # Usable, including the tables the new version added, and the lease carried over.
        op = OpRecord(
            op_id="o1", task_id="t", round=1, call_index=0, tool="fetch", args={},
            args_hash="h", effect="read", status="intended",
        )  # fmt: skip
        art = ArtifactRecord(
            artifact_id="a1", task_id="t", kind="evidence", name="n", blob_hash=ref, size=8
        )
        res = await new.commit(
            "t", lease.token, [ev.UserMessage(text="after")], ops=[op], artifacts=[art]
        )
        assert res.first_seq == task_before.last_seq + 1
        assert [o.op_id for o in await new.get_ops("t")] == ["o1"]
        assert (await new.get_artifact("a1")).blob_hash == blob_hash(b"old blob")
        assert await new.update_shared("k", lambda doc, now: ({"n": 1}, doc)) is None
        assert await new.get_shared("k") == {"n": 1}
    finally:
        await new.close()


def _dump(backend: Backend) -> list[Any]:
    conn = backend.raw()
    try:
        out: list[Any] = []
        for table in sorted(tables(backend)):
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()
            out.append((table, sorted(repr(tuple(dict(r).values())) for r in rows)))
        return out
    finally:
        conn.close()


async def test_newer_schema_is_refused_and_nothing_is_written(
    sql_backend: Backend, add_task: AddTask
) -> None:
    store = await sql_backend.open(migrate_to=1)
    await store.close()
    await add_old_task(sql_backend, "t")
    conn = sql_backend.raw()
    try:
        conn.execute(
            "INSERT INTO tether_schema (version, name, applied_at) VALUES (99, 'future', 0)"
        )
    finally:
        conn.close()
    before = _dump(sql_backend)
    file_before = sql_backend.path.read_bytes() if sql_backend.path else None

    with pytest.raises(errors.SchemaTooNew) as exc:
        await sql_backend.open()
    assert isinstance(exc.value, errors.UserError) and exc.value.exit_code == 2
    assert (exc.value.fields["found"], exc.value.fields["supported"]) == (99, SCHEMA_VERSION)
    assert "version 99" in str(exc.value) and "upgrade tether" in str(exc.value)

    # Not migrated to 2 or 3 on the way, not touched at all.
    assert _dump(sql_backend) == before
    assert not tables(sql_backend) & (V2_TABLES | V3_TABLES | V4_TABLES)
    if sql_backend.path is not None:
        assert sql_backend.path.read_bytes() == file_before


async def test_migrating_gives_the_same_schema_as_a_fresh_database(
    sql_backend: Backend, backend_factory: Callable[[str], Backend]
) -> None:
    fresh = backend_factory(sql_backend.kind)

    old = await sql_backend.open(migrate_to=1)
    await old.close()
    migrated = await sql_backend.open()
    await migrated.close()
    new = await fresh.open()
    await new.close()

    shape = schema_shape(fresh)
    assert shape == schema_shape(sql_backend)
    # The comparison sees what matters: every table of every migration is in it.
    names = {c[0] for c in shape["columns"]} if fresh.kind == "postgres" else set(shape)
    assert names >= V1_TABLES | V2_TABLES | V3_TABLES | V4_TABLES


@pytest.mark.postgres
async def test_both_dialects_define_the_same_columns(
    backend_factory: Callable[[str], Backend],
) -> None:
    lite = backend_factory("sqlite")
    pg = backend_factory("postgres")
    for b in (lite, pg):
        s = await b.open()
        await s.close()
    lite_shape = schema_shape(lite)
    lite_cols = {
        (name, col[1])
        for name, entry in lite_shape.items()
        if entry["type"] == "table" and not name.startswith(FTS5)
        for col in entry["columns"]
    }
    pg_cols = {(c[0], c[1]) for c in schema_shape(pg)["columns"]}
    # Each dialect's own search machinery: FTS5's rowid link, PostgreSQL's tsvector;
    # SQLite's events by rowid, in the runs `event_runs` maps (schema 9).
    lite_own = {("artifact_text", "id"), ("events", "id")}
    lite_own |= {(t, c) for t, c in lite_cols if t in V9_SQLITE_TABLES}
    # PostgreSQL's events a row per commit (schema 11), `events` their view; its ops'
    # results a row per op (schema 12), where SQLite's are in `ops`.
    pg_own = {("artifact_text", "tsv")} | {
        (t, c) for t, c in pg_cols if t in V11_PG_TABLES | V12_PG_TABLES
    }
    lite_own |= {("ops", "result")}
    assert lite_cols - lite_own == pg_cols - pg_own
    lite_idx = {n for n, e in lite_shape.items() if e["type"] == "index"}
    pg_idx = {i[1] for i in schema_shape(pg)["indexes"] if not i[1].endswith("_pkey")}
    assert lite_idx == pg_idx - {"artifact_text_tsv"}


async def test_concurrent_first_opens_migrate_once(sql_backend: Backend) -> None:
    stores = await asyncio.gather(*(sql_backend.open() for _ in range(4)))
    try:
        for s in stores:
            assert await s.schema_version() == SCHEMA_VERSION
    finally:
        for s in stores:
            await s.close()
    assert [v for v, _ in schema_rows(sql_backend)] == list(range(1, SCHEMA_VERSION + 1))


async def test_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(errors.CorruptDatabase, match="not a tether database"):
        await SQLiteStore.open(path)
    assert path.read_bytes() == before

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all\n" * 200)
    with pytest.raises(errors.CorruptDatabase) as exc:
        await SQLiteStore.open(junk)
    assert junk.read_bytes() == b"this is not sqlite at all\n" * 200
    assert "\n" not in str(exc.value)


@pytest.mark.postgres
async def test_foreign_postgres_schema_is_refused_untouched(
    backend_factory: Callable[[str], Backend],
) -> None:
    pg = backend_factory("postgres")
    schema = re.search(r"schema=(\w+)", pg.url)
    assert schema is not None
    # The schema holds another application's table.
    conn = pg.raw()
    try:
        conn.execute(f'CREATE SCHEMA "{schema.group(1)}"')
        conn.execute("CREATE TABLE customers (id INT)")
    finally:
        conn.close()
    with pytest.raises(errors.CorruptDatabase, match="not a tether database"):
        await pg.open()
    assert tables(pg) == {"customers"}


async def test_migration_to_4_indexes_the_artifacts_already_stored(
    sql_backend: Backend, add_task: AddTask
) -> None:
    """Artifacts written before the search index existed are found after migrating:
    textual blobs by their text (JSON by its values), binary ones by their name only."""
    old = await sql_backend.open(migrate_to=3)
    await old.close()
    await add_old_task(sql_backend, "t")
    texts = {
        "a0": b'{"excerpt": "the pump delivers 40 litres a minute", "location": "p3"}',
        "a1": "vermessungsingenieur notes: \u00fcberpr\u00fcft".encode(),
        "a2": b"\x00\x01binary tapir",
        "a3": None,  # its blob is missing: indexed by its name
    }
    names = {"a0": "doc0", "a1": "doc1", "a2": "doc2", "a3": "orphan report"}
    conn = sql_backend.raw()
    ph = "?" if sql_backend.kind == "sqlite" else "%s"
    try:
        for aid, data in texts.items():
            ref = blob_hash(data or b"gone")
            if data is not None:
                conn.execute(
                    "INSERT INTO blobs (hash, size, data, created_at)"
                    f" VALUES ({ph}, {ph}, {ph}, 0)",
                    (ref, len(data), data),
                )
            conn.execute(
                "INSERT INTO artifacts (artifact_id, task_id, kind, name, blob_hash, size,"
                f" task_version, created_at) VALUES ({ph}, 't', 'evidence', {ph}, {ph}, 1, 1, 0)",
                (aid, names[aid], ref),
            )
    finally:
        conn.close()
    new = await sql_backend.open()
    try:

        async def found(query: str) -> list[str]:
            return [h.artifact.artifact_id for h in await new.search_artifacts("t", query)]

        assert await found("pump litres") == ["a0"]
        assert await found("excerpt location") == []
        assert await found("vermessungsingenieur") == ["a1"]
        assert await found("tapir") == []
        assert await found("doc2") == ["a2"]
        assert await found("orphan") == ["a3"]
    finally:
        await new.close()


def _hot_row_settings(backend: Backend) -> dict[str, Any]:
    """The PostgreSQL storage settings of the rows each round rewrites."""
    conn = backend.raw()
    try:
        rel = conn.execute(
            "SELECT relname, reloptions FROM pg_class"
            " WHERE relnamespace = current_schema()::regnamespace"
            " AND relname IN ('tasks', 'ledgers', 'shared_state') ORDER BY relname"
        ).fetchall()
        cols = conn.execute(
            "SELECT c.relname, a.attname, a.attstorage FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid"
            " WHERE c.relnamespace = current_schema()::regnamespace"
            " AND (c.relname, a.attname) IN (('tasks', 'usage'), ('tasks', 'waiting'),"
            " ('task_specs', 'spec'), ('ledgers', 'state'), ('shared_state', 'value'))"
            " ORDER BY 1, 2"
        ).fetchall()
        return {
            "reloptions": {r["relname"]: r["reloptions"] for r in rel},
            "storage": {f"{r['relname']}.{r['attname']}": r["attstorage"] for r in cols},
        }
    finally:
        conn.close()


HOT_ROWS = {
    "reloptions": {n: ["fillfactor=25"] for n in ("ledgers", "shared_state", "tasks")},
    # m: in the row, compressed (MAIN); x: compressed, out of line if large (EXTENDED)
    "storage": {
        "shared_state.value": "m",
        "task_specs.spec": "x",
        "tasks.usage": "m",
        "tasks.waiting": "m",
    },
}


@pytest.mark.postgres
async def test_rows_rewritten_every_round_suit_hot_updates(
    backend_factory: Callable[[str], Backend], add_task: AddTask
) -> None:
    """Schema 5 on PostgreSQL: room for HOT updates on the pages of `tasks`, `ledgers`
    and `shared_state`, and their per-round JSON kept in the row, on a fresh database and on one
    upgraded from schema 4 (its task still readable)."""
    fresh = backend_factory("postgres")
    store = await fresh.open()
    await store.close()
    assert _hot_row_settings(fresh) == HOT_ROWS
    old = backend_factory("postgres")
    store = await old.open(migrate_to=4)
    await store.close()
    await add_old_task(old, "t")
    assert _hot_row_settings(old)["reloptions"] == dict.fromkeys(HOT_ROWS["reloptions"])
    store = await old.open()
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        assert (await store.get_task("t")).status == "queued"
    finally:
        await store.close()
    assert _hot_row_settings(old) == HOT_ROWS


async def test_migration_to_6_moves_the_spec_out_of_the_task_row(sql_backend: Backend) -> None:
    """Schema 6: a schema-5 task's contract moves to `task_specs` (the `tasks` row, which
    every commit rewrites, no longer holds it) and reads back whole; a contract edit
    writes it there, a commit without one leaves it alone."""
    store = await sql_backend.open(migrate_to=5)
    await store.close()
    spec = {"objective": "migrate", "items": [{"id": f"f-{k:05d}"} for k in range(500)]}
    created = await add_old_task(sql_backend, "t", spec)
    new = await sql_backend.open()
    try:
        assert await new.schema_version() == SCHEMA_VERSION
        task = await new.get_task("t")
        assert task.spec == spec
        assert dataclasses.replace(task, spec=created.spec) == dataclasses.replace(
            created, updated_at=task.updated_at, usage=task.usage
        )
        assert [t.spec for t in await new.list_tasks()] == [spec]
        lease = await new.claim("w", 60, task_id="t")
        assert lease is not None
        usage = TaskPatch(usage={"n": 1})
        await new.commit("t", lease.token, [ev.UserMessage(text="a")], task=usage)
        assert (await new.get_task("t")).spec == spec
        edited = {**spec, "objective": "migrate, then check"}
        await new.commit("t", lease.token, [], task=TaskPatch(spec=edited, usage={"n": 2}))
        after = await new.get_task("t")
        assert (after.spec, after.usage) == (edited, {"n": 2})
    finally:
        await new.close()
    conn = sql_backend.raw()
    try:
        if sql_backend.kind == "sqlite":
            cols = {r["name"] for r in conn.execute("PRAGMA table_info(tasks)").fetchall()}
        else:
            cols = {
                r["column_name"]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_schema = current_schema() AND table_name = 'tasks'"
                ).fetchall()
            }
        assert "spec" not in cols and "usage" in cols
        rows = conn.execute("SELECT task_id FROM task_specs").fetchall()
        assert [r["task_id"] for r in rows] == ["t"]
    finally:
        conn.close()


def _columns(backend: Backend, table: str) -> set[str]:
    conn = backend.raw()
    try:
        if backend.kind == "sqlite":
            return {r["name"] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}
        return {
            r["column_name"]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = %s",
                (table,),
            ).fetchall()
        }
    finally:
        conn.close()


def _item_rows(backend: Backend, task_id: str) -> list[tuple[str, int, str, int]]:
    """`(item, position, status, version)` of a task's ledger rows, in contract order."""
    rows = _raw(
        backend,
        "SELECT item_id, position, status, version FROM ledger_items"
        " WHERE task_id = ? ORDER BY position",
        task_id,
    )
    return [(r["item_id"], r["position"], r["status"], r["version"]) for r in rows]


async def test_migration_to_7_moves_a_ledger_to_one_row_per_item(sql_backend: Backend) -> None:
    """Schema 7: a schema-6 ledger's state moves to `ledger_items` (one row per item, in
    contract order) and its skeleton to `ledger_skeletons`, and both read back equal;
    then a commit that changes one item rewrites that item's row only, and a new
    contract drops the rows of the items it removed."""
    store = await sql_backend.open(migrate_to=5)
    await store.close()
    await add_old_task(sql_backend, "t")
    store = await sql_backend.open(migrate_to=6)
    await store.close()
    state = {
        "i1": {"status": "done", "evidence": ["op:1"], "attempts": 2, "breaker": 0,
               "note": 'said "ok" \u2713'},
        "i2": {"status": "in_progress", "evidence": [], "attempts": 1, "breaker": 1,
               "note": ""},
        "i3": {"status": "pending", "evidence": [], "attempts": 0, "breaker": 0, "note": ""},
    }  # fmt: skip
    _raw(
        sql_backend,
        "UPDATE ledgers SET state = ?, version = 4 WHERE task_id = ?",
        json.dumps(state, ensure_ascii=False),  # as the store wrote it
        "t",
    )
    new = await sql_backend.open()
    try:
        assert await new.schema_version() == SCHEMA_VERSION
        stored = await new.get_ledger("t")
        assert (stored.state, stored.version) == (state, 4)
        assert _columns(sql_backend, "ledgers") == {"task_id", "version", "updated_at"}
        assert _item_rows(sql_backend, "t") == [
            ("i1", 0, "done", 4),
            ("i2", 1, "in_progress", 4),
            ("i3", 2, "pending", 4),
        ]
        ledger = stored.to_ledger()
        started = L.start(ledger, "i3").ledger
        await new.commit("t", None, [], ledger=LedgerWrite.of(started, 4))
        assert _item_rows(sql_backend, "t") == [
            ("i1", 0, "done", 4),
            ("i2", 1, "in_progress", 4),
            ("i3", 2, "in_progress", 5),
        ]
        assert (await new.get_ledger("t")).to_ledger() == started
        # A new contract without i2: its row goes, i3 moves up.
        edited = L.from_spec("Write the report", [("i1", "Item 1", None), ("i3", "Item 3", None)])
        moved = dataclasses.replace(
            edited, states=(started.item("i1"), started.item("i3")), version=6
        )
        await new.commit("t", None, [], ledger=LedgerWrite.of(moved, 5, skeleton=True))
        assert _item_rows(sql_backend, "t") == [("i1", 0, "done", 4), ("i3", 1, "in_progress", 6)]
        assert (await new.get_ledger("t")).to_ledger() == moved
    finally:
        await new.close()


def _mark_rows(backend: Backend, task_id: str) -> list[tuple[str, int, str]]:
    """`(item, n, mark)` of a task's progress marks, by item and number."""
    sql = "SELECT item_id, n, mark FROM task_marks WHERE task_id = ? ORDER BY item_id, n"
    return [(r["item_id"], r["n"], r["mark"]) for r in _raw(backend, sql, task_id)]


async def test_migration_to_8_moves_the_progress_marks_out_of_the_task_row(
    sql_backend: Backend,
) -> None:
    """Schema 8: the marks a schema-7 run state holds (`usage.seen`, item -> marks)
    move to `task_marks`, one row each in their order, the row keeping item -> count;
    the task reads back the same run state, and a commit's `MarksWrite` adds and
    removes rows from there."""
    from tether.store.base import MarksWrite

    store = await sql_backend.open(migrate_to=5)
    await store.close()
    await add_old_task(sql_backend, "t")
    store = await sql_backend.open(migrate_to=7)
    await store.close()
    usage = {
        "rounds": 7,
        "seen": {"i2": ["b2", "a1", "c3"], "i1": ["z9"], "i3": []},
        "item_rounds": {"i2": 3, "i1": 1, "i3": 1},
    }
    _raw(sql_backend, "UPDATE tasks SET usage = ? WHERE task_id = ?", json.dumps(usage), "t")
    new = await sql_backend.open()
    try:
        assert await new.schema_version() == SCHEMA_VERSION
        assert (await new.get_task("t")).usage == usage
        assert _mark_rows(sql_backend, "t") == [
            ("i1", 1, "z9"),
            ("i2", 1, "b2"),
            ("i2", 2, "a1"),
            ("i2", 3, "c3"),
        ]
        (row,) = _raw(sql_backend, "SELECT usage FROM tasks WHERE task_id = ?", "t")
        held = row["usage"] if sql_backend.kind == "postgres" else json.loads(row["usage"])
        assert held["seen"] == {"i2": 3, "i1": 1, "i3": 0}
        # A run's commit: i2 loses its oldest mark and gains one, i1 is forgotten.
        after = {**usage, "seen": {"i2": ["a1", "c3", "d4"], "i3": []}}
        marks = MarksWrite.between(usage["seen"], after["seen"])
        assert marks.items == {"i1": (None, ()), "i2": (1, ("d4",))}
        await new.commit("t", None, [], task=TaskPatch(usage=after, marks=marks))
        assert (await new.get_task("t")).usage == after
        assert _mark_rows(sql_backend, "t") == [("i2", 2, "a1"), ("i2", 3, "c3"), ("i2", 4, "d4")]
    finally:
        await new.close()
