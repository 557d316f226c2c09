"""One query layer for SQLite and PostgreSQL.

The query code is synchronous and runs in worker threads (`_run`), the way DBOS runs
its SQL: one body of queries, with the SQLite and PostgreSQL classes overriding only a
handful of dialect hooks (connecting, transactions and row locks, JSON and boolean
columns, error translation). SQL is written with `:name` placeholders; the PostgreSQL
dialect rewrites them to `%(name)s`.

What a commit may do is decided by `tether.store._rules`, as in the memory store. The
commit here (SQLite's) reads the task row inside a write transaction, plans with the
rules, and writes with one `executemany` per table; the PostgreSQL store overrides it
with a single statement that carries the same rules as SQL conditions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from tether import errors, failpoints, lifecycle
from tether.clock import Clock, SystemClock
from tether.store import _ledger_rows as ledger_rows
from tether.store import _marks as marks
from tether.store import _rows, schema_policy
from tether.store import _rules as rules
from tether.store import _search as search
from tether.store import base as b
from tether.store._latest import Latest
from tether.store._rows import data_dumps, stored_events
from tether.store._rows import dumps as _dumps
from tether.store._rows import dumps_no_nul as _dumps_no_nul  # noqa: F401 (its old home)
from tether.store.base import SCHEMA_VERSION, ApprovalRecord, ArtifactRecord, OpRecord, TaskRecord
from tether.store.schema_policy import migrations

if TYPE_CHECKING:  # the event models load where a commit encodes them, not to read
    from tether import events as ev

T = TypeVar("T")
R = TypeVar("R")
Row = Mapping[str, Any]

_TASK_COLS = (
    "task_id, name, status, stop_reason, version, current_milestone, workspace, "
    "waiting, usage, cancel_requested, wake_at, created_at, updated_at, heartbeat_at, "
    "lease_owner, lease_expiry, fencing_token, last_seq"
)
#: A task as `TaskRecord` reads it: its row in `tasks` (`t`) and its contract, kept in
#: `task_specs` (`s`) since schema 6 so that a commit, which rewrites the task's row,
#: does not rewrite the contract (megabytes for a long checklist) with it.
_TASK_SELECT = (
    "SELECT " + ", ".join(f"t.{c.strip()}" for c in _TASK_COLS.split(",")) + ", s.spec"
    " FROM tasks t JOIN task_specs s ON s.task_id = t.task_id"
)
_SPEC_UPDATE = "UPDATE task_specs SET spec = :spec WHERE task_id = :task_id"
_OP_COLS = (
    "op_id, task_id, round, call_index, tool, args, args_hash, effect, status, attempts, "
    "next_attempt_at, result, error, task_version, created_at, updated_at"
)
_ART_COLS = (
    "artifact_id, task_id, kind, name, blob_hash, size, source, task_version, deps, valid, "
    "meta, created_at"
)
#: The artifact columns of `artifacts a` in a join.
_ART_COLS_A = ", ".join(f"a.{c.strip()}" for c in _ART_COLS.split(","))

#: The columns of ops, artifacts and approvals that hold JSON.
_JSON_RECORD_COLS = frozenset({"args", "result", "error", "deps", "meta", "request", "decision"})
_APPROVAL_COLS = (
    "request_id, task_id, op_id, status, request, decision, decided_by, created_at, decided_at"
)


def _upsert(
    table: str, cols: str, key: str, mutable: Sequence[str], positional: bool = False
) -> str:
    """`INSERT ... ON CONFLICT (key) DO UPDATE` of the columns the rules let change; its
    values named as the columns (`:col`), or `positional` (`?`, in the order of `cols`)."""
    names = [c.strip() for c in cols.split(",")]
    sets = ", ".join(f"{c} = excluded.{c}" for c in mutable)
    values = ", ".join("?" if positional else f":{n}" for n in names)
    return (
        f"INSERT INTO {table} ({cols}) VALUES ({values}) ON CONFLICT ({key}) DO UPDATE SET {sets}"
    )


#: The tables of the records a commit upserts: key column and the columns the rules
#: let change.
RECORD_TABLES: dict[str, tuple[str, Sequence[str]]] = {
    "ops": ("op_id", (*rules.OP_OUTCOME, "updated_at")),
    "artifacts": ("artifact_id", rules.ARTIFACT_MUTABLE),
    "approvals": ("request_id", rules.APPROVAL_MUTABLE),
}
#: The columns of each record table, in the order its upsert names them.
RECORD_COLS = {"ops": _OP_COLS, "artifacts": _ART_COLS, "approvals": _APPROVAL_COLS}
_UPSERTS = {
    table: _upsert(table, cols, *RECORD_TABLES[table]) for table, cols in RECORD_COLS.items()
}
_BLOB_INSERT = (
    "INSERT INTO blobs (hash, size, data, created_at) VALUES (:h, :s, :d, :t)"
    " ON CONFLICT (hash) DO NOTHING"
)


class SqlStore(b.Store):
    """The shared query layer; see `SQLiteStore` and `PostgresStore` (the methods'
    documentation: `Store`)."""

    dialect = "base"
    #: Suffix that locks the selected task row for the rest of the transaction.
    FOR_UPDATE = ""
    #: Suffix for the claim query so that concurrent claimers skip each other's rows.
    SKIP_LOCKED = ""
    #: The names (`name`) of the tables in the store's database (schema).
    TABLES = ""
    _ops = "ops"  # where `get_ops` reads ops from (PostgreSQL's join their results)

    def __init__(self, url: str, clock: Clock | None = None) -> None:
        self.url = url
        self.clock: Clock = clock or SystemClock()
        self.latest = Latest()  # the judge's `judge.rules.own.OwnCommits.later`

    # --- dialect hooks ------------------------------------------------------------------

    def _tx(self, write: bool) -> AbstractContextManager[Any]:
        """A connection inside a transaction (write: takes the write lock at once)."""
        raise NotImplementedError

    def _auto(self) -> AbstractContextManager[Any]:
        """A connection outside any transaction block: each statement is a transaction
        of its own (reads of one statement, writes that check in their WHERE)."""
        raise NotImplementedError

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a synchronous query function off the event loop."""
        raise NotImplementedError

    def _sql(self, query: str) -> str:
        return query

    def _json_out(self, value: Any) -> Any:
        return _rows.json_out(value)

    def _bool_in(self, value: bool) -> Any:
        return value

    def _lock_migrations(self, conn: Any) -> None:
        """Serialize concurrent migrators (the SQLite write lock already does)."""

    def _existing_tables(self, conn: Any) -> set[str]:
        return {r["name"] for r in conn.execute(self.TABLES).fetchall()}

    def _run_script(self, conn: Any, sql: str) -> None:
        raise NotImplementedError

    # --- helpers ------------------------------------------------------------------------

    def _x(self, conn: Any, query: str, params: Mapping[str, Any] | None = None) -> Any:
        return conn.execute(self._sql(query), params or {})

    def _xmany(self, conn: Any, query: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            conn.executemany(self._sql(query), rows)

    def _record(self, cls: type[R], row: Row) -> R:
        """A record from its row: each field from the column of its name, read as its
        annotation says (`_rows.reader`)."""
        return _rows.reader(cls)(row)

    def _task_query(self, where: str) -> str:
        """The query of tasks (`_TASK_SELECT`, then `where`) with their progress marks."""
        return (
            _TASK_SELECT.replace(" FROM", f", {marks.SELECT[self.dialect]} FROM", 1) + " " + where
        )

    def _task(self, row: Row) -> TaskRecord:
        """A task from its row of `_task_query`: its run state with its marks read back."""
        rec = self._record(TaskRecord, row)
        usage = marks.with_seen(rec.usage, self._json_out(row["marks"]))
        return rec if usage is rec.usage else dataclasses.replace(rec, usage=usage)

    def _read_all(self, cls: type[R], query: str, params: Mapping[str, Any]) -> list[R]:
        """The records one statement reads, outside a transaction block."""
        with self._auto() as conn:
            rows = self._x(conn, query, params).fetchall()
        return [self._record(cls, r) for r in rows]

    def _insert_events(
        self,
        conn: Any,
        task_id: str,
        start_seq: int,
        items: Sequence[ev.Event],
        task_version: int,
        token: int | None,
        now: float,
    ) -> None:
        rows = [
            {
                "task_id": task_id,
                "seq": seq,
                "type": type_name,
                "schema_version": schema,
                "data": data,
                "task_version": task_version,
                "fencing_token": token,
                "at": now,
            }
            for seq, (type_name, schema, data) in enumerate(stored_events(items, _dumps), start_seq)
        ]
        self._add_events(conn, task_id, rows)

    def _add_events(self, conn: Any, task_id: str, rows: list[dict[str, Any]]) -> None:
        """Write a commit's event rows (by column; none: nothing), in `seq` order."""
        self._xmany(
            conn,
            "INSERT INTO events (task_id, seq, type, schema_version, data, task_version,"
            " fencing_token, at) VALUES (:task_id, :seq, :type, :schema_version, :data,"
            " :task_version, :fencing_token, :at)",
            rows,
        )

    def _events_query(self, cols: str, where: str, lim: str) -> str:
        """One SELECT of `cols`: task `:id`'s events after `:after` and `where`, in order."""
        query = f"SELECT {cols} FROM events WHERE task_id = :id AND seq > :after{where}"
        return f"{query} ORDER BY seq{lim}"

    # --- migrations ---------------------------------------------------------------------

    def _refuse_foreign(self, tables: set[str]) -> None:
        """`CorruptDatabase` if the database holds tables but is not tether's."""
        if tables and "tether_schema" not in tables:
            raise errors.CorruptDatabase(
                f"{self.url} holds tables {sorted(tables)[:5]} but is not a tether database;"
                " it was left untouched — point --db at a new file or an empty database"
            )

    def _current_schema(self, conn: Any) -> tuple[set[str], int]:
        """The tables and the schema version (0: none yet); refuses a foreign database
        and one written by a newer tether."""
        tables = self._existing_tables(conn)
        self._refuse_foreign(tables)
        current = 0
        if "tether_schema" in tables:
            row = self._x(conn, "SELECT MAX(version) AS v FROM tether_schema").fetchone()
            current = int(row["v"] or 0)
        schema_policy.check_database(self, conn, current)  # newer: as the policy says
        return tables, current

    def _check_schema_sync(self, read_only: bool = True) -> int:
        """The schema version, read without the write lock; `SchemaOutdated` when it is
        below this tether's (a read-only or `--no-migrate` open migrates nothing)."""
        with self._tx(write=False) as conn:
            _, current = self._current_schema(conn)
        if current < schema_policy.code_schema():
            raise schema_policy.behind(
                self.url, current, schema_policy.code_schema(), read_only=read_only
            )
        return current

    def _migrate_sync(self, target: int = SCHEMA_VERSION) -> int:
        # Most opens find the schema current: say so without taking the write lock, so
        # an open never waits behind a writer (or a frozen one) when nothing is to do.
        with self._tx(write=False) as conn:
            _, current = self._current_schema(conn)
        if current >= target:
            return current
        with self._tx(write=True) as conn:
            self._lock_migrations(conn)
            tables, current = self._current_schema(conn)
            if current >= target:
                return current
            schema_policy.prepare_table(self, conn, "tether_schema" in tables)
            for version, name, sql in migrations(self.dialect):
                if current < version <= target:
                    self._run_script(conn, sql)
                    if version == 4:
                        search.backfill(lambda q, p: self._x(conn, q, p), self._index_rows, conn)
                    schema_policy.record(self, conn, version, name)
                    current = version
            return current

    def _index_rows(self, conn: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Add search index rows (`artifact_id`, `task_id`, `body`); an artifact
        indexed already, or with nothing to index, is left as it is (an artifact's blob,
        hence its text, never changes)."""
        raise NotImplementedError

    def _schema_version_sync(self) -> int:
        with self._auto() as conn:
            row = self._x(conn, "SELECT MAX(version) AS v FROM tether_schema").fetchone()
            return int(row["v"] or 0)

    async def schema_version(self) -> int:
        return await self._run(self._schema_version_sync)

    # --- tasks --------------------------------------------------------------------------

    def _create_task_sync(self, new: b.NewTask) -> TaskRecord:
        now = self.clock.now()
        task_id, ledger, items = new["task_id"], new["ledger"], new.get("events", ())
        with self._tx(write=True) as conn:
            exists = self._x(
                conn, "SELECT 1 AS x FROM tasks WHERE task_id = :id", {"id": task_id}
            ).fetchone()
            if exists:
                raise errors.ConcurrentUpdate(f"task {task_id!r} already exists")
            self._x(
                conn,
                "INSERT INTO tasks (task_id, name, status, version, workspace, usage,"
                " cancel_requested, created_at, updated_at, fencing_token, last_seq)"
                " VALUES (:id, :name, 'queued', 1, :ws, '{}', :f, :now, :now, 0, :last)",
                {
                    "id": task_id,
                    "name": new["name"],
                    "ws": new.get("workspace"),
                    "f": self._bool_in(False),
                    "now": now,
                    "last": len(items),
                },
            )
            self._x(
                conn,
                "INSERT INTO task_specs (task_id, spec) VALUES (:id, :spec)",
                {"id": task_id, "spec": _dumps(dict(new["spec"]))},
            )
            ledger_rows.create(self._x, conn, self.dialect, _dumps, task_id, ledger, now)
            self._insert_events(conn, task_id, 1, items, 1, None, now)
            return self._task(
                self._x(conn, self._task_query("WHERE t.task_id = :id"), {"id": task_id}).fetchone()
            )

    async def create_task(self, **new: Unpack[b.NewTask]) -> TaskRecord:
        b.refuse_unknown(new, b.NewTask)
        return await self._run(self._create_task_sync, new)

    def _get_task_sync(self, task_id: str) -> TaskRecord:
        with self._auto() as conn:
            row = self._x(
                conn, self._task_query("WHERE t.task_id = :id"), {"id": task_id}
            ).fetchone()
        if row is None:
            raise errors.TaskNotFound(task_id)
        return self._task(row)

    async def get_task(self, task_id: str) -> TaskRecord:
        return await self._run(self._get_task_sync, task_id)

    def _fencing_token_sync(self, task_id: str) -> int:
        with self._auto() as conn:
            row = self._x(
                conn, "SELECT fencing_token FROM tasks WHERE task_id = :id", {"id": task_id}
            ).fetchone()
        if row is None:
            raise errors.TaskNotFound(task_id)
        return int(row["fencing_token"])

    async def fencing_token(self, task_id: str) -> int:
        """The task's fencing token alone (`get_task(task_id).fencing_token` without
        reading the contract: a long checklist's is megabytes, and a tool checks the
        token before every side effect); `TaskNotFound` if absent."""
        return await self._run(self._fencing_token_sync, task_id)

    def _list_tasks_sync(self, statuses: Collection[str] | None, limit: int) -> list[TaskRecord]:
        params: dict[str, Any] = {"limit": limit}
        where = "WHERE TRUE" + self._in(params, "t.status", "s", statuses) if statuses else ""
        query = self._task_query(f"{where} ORDER BY t.created_at DESC, t.task_id LIMIT :limit")
        with self._auto() as conn:
            return [self._task(r) for r in self._x(conn, query, params).fetchall()]

    async def list_tasks(
        self, statuses: Collection[str] | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        return await self._run(self._list_tasks_sync, statuses, limit)

    # --- events and ledger --------------------------------------------------------------

    def _read_events_sync(
        self, task_id: str, after: int, limit: int | None, types: Collection[str] | None
    ) -> list[b.StoredEvent]:
        if limit is not None and limit <= 0:
            self._get_task_sync(task_id)  # TaskNotFound if absent
            return []
        params: dict[str, Any] = {"id": task_id, "after": after}
        where = self._in(params, "type", "t", types) if types else ""
        lim = ""
        if limit is not None:
            params["limit"] = limit
            lim = " LIMIT :limit"
        cols = "task_id, seq, type, schema_version, data, task_version, fencing_token, at"
        # One query: a row of NULLs if the task exists (none: no such task), then the
        # events read in index order.
        with self._auto() as conn:
            rows = self._x(
                conn,
                "SELECT task_id, NULL AS seq, NULL AS type, NULL AS schema_version,"
                " NULL AS data, NULL AS task_version, NULL AS fencing_token, NULL AS at"
                " FROM tasks WHERE task_id = :id UNION ALL"
                f" SELECT * FROM ({self._events_query(cols, where, lim)}) e",
                params,
            ).fetchall()
        if not any(r["seq"] is None for r in rows):
            raise errors.TaskNotFound(task_id)
        rows = sorted((r for r in rows if r["seq"] is not None), key=lambda r: int(r["seq"]))
        return [self._record(b.StoredEvent, r) for r in rows]

    async def read_events(
        self, task_id: str, after: int = 0, **filters: Unpack[b.EventFilters]
    ) -> list[b.StoredEvent]:
        b.refuse_unknown(filters, b.EventFilters)
        limit, types = filters.get("limit"), filters.get("types")
        return await self._run(self._read_events_sync, task_id, after, limit, types)

    def _get_ledger_sync(self, task_id: str) -> b.LedgerRecord:
        with self._auto() as conn:
            query = ledger_rows.select(self.dialect)
            row = self._x(conn, query, {"id": task_id}).fetchone()
        if row is None:
            raise errors.TaskNotFound(task_id)
        return b.LedgerRecord(
            task_id=row["task_id"],
            skeleton=self._json_out(row["skeleton"]),
            state=self._json_out(row["state"]) or {},
            version=int(row["version"]),
            updated_at=row["updated_at"],
        )

    async def get_ledger(self, task_id: str) -> b.LedgerRecord:
        return await self._run(self._get_ledger_sync, task_id)

    # --- the one write path -------------------------------------------------------------

    def _commit_sync(self, c: b.Commit) -> b.CommitResult:
        """Read the task under the write lock, check the rules, write (SQLite's way; the
        PostgreSQL store sends one statement instead)."""
        now = self.clock.now()
        task_id, token, task, ledger = c.task_id, c.token, c.task, c.ledger
        cond = rules.CommitCondition.of(task_id, token, task, ledger)
        with self._tx(write=True) as conn:
            row = self._commit_read(conn, task_id)
            if row is None:
                raise errors.TaskNotFound(task_id)
            state = self._state(row)
            cond.check_task(state)  # its refusal comes before a request's
            items, approvals = self._settle_requests(
                conn, task_id, task, c.events, c.approvals, now
            )
            plan = rules.plan_commit(cond, state, task, len(items), now)
            if ledger is not None:
                # Check and write in one statement: the version condition is in the WHERE.
                cur = self._x(
                    conn,
                    "UPDATE ledgers SET version = :v, updated_at = :now"
                    " WHERE task_id = :id AND version = :ev",
                    {"id": task_id, "v": ledger.version, "ev": ledger.expected_version, "now": now},
                )
                if cur.rowcount != 1:
                    lrow = self._x(
                        conn, "SELECT version FROM ledgers WHERE task_id = :id", {"id": task_id}
                    ).fetchone()
                    cond.check_ledger(None if lrow is None else int(lrow["version"]))
                    raise cond.refusal(state, ledger.expected_version)
                ledger_rows.write(self._x, conn, self.dialect, _dumps, task_id, ledger)
            if items:
                self._insert_events(
                    conn, task_id, plan.first_seq, items, plan.events_version, token, now
                )
            if len(approvals) != len(c.approvals):  # closings added (`settle_requests`)
                c = dataclasses.replace(c, approvals=approvals)
            self._write_records(conn, c, now)
            # Crash tests stop the process here: events written, projection not yet.
            failpoints.hit("during_commit")
            sets = self._encode_changes(plan.changes)
            if "spec" in sets:  # the contract edited: its own row (see `_TASK_SELECT`)
                self._x(conn, _SPEC_UPDATE, {"spec": sets.pop("spec"), "task_id": task_id})
            self._update_task(conn, task_id, sets)
            marks.write(self._x, conn, self.dialect, _dumps, task_id, task)
        return b.CommitResult(plan.first_seq, plan.last_seq, state.cancel_requested, state.version)

    def _commit_read(self, conn: Any, task_id: str) -> Row | None:
        """The task's row as a commit reads it first (locked), None if absent."""
        query = "SELECT status, version, fencing_token, last_seq, cancel_requested FROM tasks"
        cur = self._x(conn, f"{query} WHERE task_id = :id{self.FOR_UPDATE}", {"id": task_id})
        row: Row | None = cur.fetchone()
        return row

    def _settle_requests(
        self,
        conn: Any,
        task_id: str,
        task: b.TaskPatch | None,
        items: Sequence[ev.Event],
        approvals: Sequence[ApprovalRecord],
        now: float,
    ) -> tuple[list[ev.Event], list[ApprovalRecord]]:
        """Inside the commit's transaction, with the task row locked (every request write
        takes that lock first): refuse a request write the stored request forbids, and
        add the closing of the task's open requests when the commit ends it."""
        ends = rules.closes_requests(task)
        if not approvals and not ends:
            return list(items), list(approvals)
        stored = self._requests_in(conn, task_id)
        approved = {a.op_id for a in stored if a.status == "approved" and a.op_id}
        status = self._op_statuses(conn, approved) if ends else {}
        return rules.settle_requests(task_id, task, items, approvals, stored, status, now)

    def _requests_in(self, conn: Any, task_id: str) -> list[ApprovalRecord]:
        rows = self._x(
            conn,
            "SELECT request_id, task_id, op_id, status, request, decision, decided_by,"
            " created_at, decided_at FROM approvals WHERE task_id = :id"
            " ORDER BY created_at, request_id",
            {"id": task_id},
        ).fetchall()
        return [self._record(ApprovalRecord, r) for r in rows]

    def _op_statuses(self, conn: Any, op_ids: Collection[str]) -> dict[str, str]:
        if not op_ids:
            return {}
        params: dict[str, Any] = {}
        where = self._in(params, "op_id", "o", op_ids)
        rows = self._x(conn, f"SELECT op_id, status FROM ops WHERE TRUE{where}", params)
        return {r["op_id"]: r["status"] for r in rows.fetchall()}

    @staticmethod
    def _state(row: Row) -> rules.TaskState:
        try:  # rows of other queries (claim, renew) may not carry it (psycopg, sqlite3)
            cancel = bool(row["cancel_requested"])
        except (KeyError, IndexError):
            cancel = False
        return rules.TaskState(
            row["status"],
            int(row["version"]),
            int(row["fencing_token"]),
            int(row["last_seq"]),
            cancel,
        )

    def _encode_changes(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Task column values as the database takes them (JSON text, booleans)."""
        out = {}
        for k, v in changes.items():
            if k in rules.JSON_COLUMNS:  # the marks are rows of their own (`_marks`)
                # JSON data (a run state, a contract, a wait): see `_rows.data_dumps`.
                v = None if v is None else data_dumps(marks.stub(v) if k == "usage" else v)
            elif k in rules.BOOL_COLUMNS:
                v = self._bool_in(v)
            out[k] = v
        return out

    def _update_task(self, conn: Any, task_id: str, sets: Mapping[str, Any]) -> None:
        """Write a commit's task columns (`_encode_changes`) to the task's row."""
        assignments = ", ".join(f"{k} = :{k}" for k in sets)
        query = f"UPDATE tasks SET {assignments} WHERE task_id = :task_id"
        self._x(conn, query, {**sets, "task_id": task_id})

    def _upsert_records(self, conn: Any, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Upsert rows (`_params`) of a record table (`RECORD_COLS`), one `executemany`."""
        self._xmany(conn, _UPSERTS[table], rows)

    def _write_records(self, conn: Any, c: b.Commit, now: float) -> None:
        """Upsert a commit's ops, artifacts and approvals and add its blobs, one
        `executemany` per table."""
        for table, records in rules.record_writes(c, now):
            self._upsert_records(conn, table, [self._params(r) for r in records])
            if table == "artifacts":
                self._index_artifacts(conn, records, c.blobs)
        if c.blobs:
            self._xmany(
                conn,
                _BLOB_INSERT,
                [
                    {"h": h, "s": len(d), "d": d, "t": now}
                    for h, d in rules.unique_blobs(c.blobs).items()
                ],
            )

    def _index_artifacts(
        self, conn: Any, arts: Sequence[ArtifactRecord], blobs: Sequence[bytes]
    ) -> None:
        """Index a commit's artifacts in its transaction: the text of each not indexed
        yet, from this commit's blobs or, failing that, the stored blob."""
        params: dict[str, Any] = {}
        ids = self._in(params, "artifact_id", "a", {a.artifact_id for a in arts})
        done = {
            r["artifact_id"]
            for r in self._x(
                conn, f"SELECT artifact_id FROM artifact_text WHERE TRUE{ids}", params
            ).fetchall()
        }
        todo = [a for a in arts if a.artifact_id not in done]
        if not todo:
            return
        staged = rules.unique_blobs(blobs)
        rows = []
        for art in todo:
            data = staged.get(art.blob_hash)
            if data is None:
                found = self._x(
                    conn,
                    "SELECT substr(data, 1, :cap) AS data FROM blobs WHERE hash = :h",
                    {"cap": search.MAX_INDEXED_BYTES, "h": art.blob_hash},
                ).fetchone()
                data = None if found is None else bytes(found["data"])
            rows.append(
                {
                    "artifact_id": art.artifact_id,
                    "task_id": art.task_id,
                    "body": search.indexed_text(art.name, data),
                }
            )
        self._index_rows(conn, rows)

    def _params(self, rec: OpRecord | ArtifactRecord | ApprovalRecord) -> dict[str, Any]:
        """A record's row: its fields by column name, the JSON and boolean columns
        encoded for the database."""
        try:
            return self._encoded(rec, dict(vars(rec)))
        except TypeError:  # a value that is a dataclass: `record_json`
            return self._encoded(rec, dataclasses.asdict(rec))

    def _encoded(
        self, rec: OpRecord | ArtifactRecord | ApprovalRecord, row: dict[str, Any]
    ) -> dict[str, Any]:
        if isinstance(rec, OpRecord):
            row["result"] = rules.op_result_stored(row["result"])
        for col in _JSON_RECORD_COLS & row.keys():
            value = row[col]
            if value is not None:
                row[col] = data_dumps(value) if _rows.flat(value) else _dumps(value)
        if "valid" in row:
            row["valid"] = self._bool_in(row["valid"])
        return row

    async def commit(
        self, task_id: str, token: int | None, events: b.Events, **parts: Unpack[b.CommitParts]
    ) -> b.CommitResult:
        commit = b.Commit(task_id, token, events, **parts)
        with self.latest.committing(task_id) as done:
            return done(await self._run(self._commit_sync, commit))

    def _get_approvals_sync(
        self, task_id: str, statuses: Collection[str] | None
    ) -> list[ApprovalRecord]:
        with self._auto() as conn:
            out = self._requests_in(conn, task_id)
        return [a for a in out if statuses is None or a.status in statuses]

    async def get_approvals(
        self, task_id: str, statuses: Collection[str] | None = None
    ) -> list[ApprovalRecord]:
        """A task's approval requests, oldest first."""
        if rules.nothing(statuses):
            return []
        return await self._run(self._get_approvals_sync, task_id, statuses)

    # --- leases -------------------------------------------------------------------------

    def _claim_sync(
        self,
        worker_id: str,
        ttl: float,
        task_id: str | None,
        force: bool = False,
        from_token: int | None = None,
        exclude: Collection[str] = (),
    ) -> b.Lease | None:
        now = self.clock.now()
        with self._tx(write=True) as conn:
            if task_id is not None:
                free = "" if force else f" AND {rules.LEASE_FREE_SQL}"
                if force and from_token is not None:
                    # Only the lease found dead is taken over, under the row's lock.
                    free = " AND fencing_token = :held"
                row = self._x(
                    conn,
                    "SELECT task_id, status, fencing_token FROM tasks WHERE task_id = :id"
                    f"{free}{self.FOR_UPDATE}",
                    {"id": task_id, "now": now, "held": from_token},
                ).fetchone()
                if row is None:
                    self._get_task_in(conn, task_id)  # raises TaskNotFound if absent
                    return None
                if lifecycle.is_terminal(row["status"]):
                    return None
            else:
                params: dict[str, Any] = {"now": now, "f": self._bool_in(False)}
                skip = self._in(params, "task_id", "x", exclude, negate=True) if exclude else ""
                row = self._x(
                    conn,
                    f"SELECT task_id, status, fencing_token FROM tasks WHERE {rules.CLAIMABLE_SQL}"
                    f" AND {rules.LEASE_FREE_SQL}{skip}"
                    f" ORDER BY updated_at, task_id LIMIT 1{self.SKIP_LOCKED}",
                    params,
                ).fetchone()
                if row is None:
                    return None
            failpoints.hit("during_claim")  # the row is locked here (PostgreSQL)
            token = int(row["fencing_token"]) + 1
            expires = now + ttl
            self._x(
                conn,
                "UPDATE tasks SET lease_owner = :w, lease_expiry = :exp, fencing_token = :tok,"
                " heartbeat_at = :now WHERE task_id = :id",
                {"w": worker_id, "exp": expires, "tok": token, "now": now, "id": row["task_id"]},
            )
            return b.Lease(row["task_id"], worker_id, token, expires)

    def _get_task_in(self, conn: Any, task_id: str) -> Row:
        row = self._x(conn, f"{_TASK_SELECT} WHERE t.task_id = :id", {"id": task_id}).fetchone()
        if row is None:
            raise errors.TaskNotFound(task_id)
        return row  # type: ignore[no-any-return]

    async def claim(
        self, worker_id: str, ttl: float, **options: Unpack[b.ClaimOptions]
    ) -> b.Lease | None:
        b.refuse_unknown(options, b.ClaimOptions)
        return await self._run(
            self._claim_sync,
            worker_id,
            ttl,
            options.get("task_id"),
            options.get("force", False),
            options.get("from_token"),
            frozenset(options.get("exclude", ())),
        )

    def _list_live_leases_sync(self, owner_prefix: str) -> list[b.Lease]:
        # LIKE would need its wildcards escaped in a host name; a prefix compare is exact.
        with self._auto() as conn:
            rows = self._x(
                conn,
                "SELECT task_id, lease_owner, fencing_token, lease_expiry FROM tasks"
                f" WHERE {rules.CLAIMABLE_SQL} AND NOT {rules.LEASE_FREE_SQL}"
                " AND substr(lease_owner, 1, :n) = :prefix ORDER BY updated_at, task_id",
                {"now": self.clock.now(), "f": self._bool_in(False), "n": len(owner_prefix),
                 "prefix": owner_prefix},
            ).fetchall()  # fmt: skip
        return [
            b.Lease(r["task_id"], r["lease_owner"], int(r["fencing_token"]), r["lease_expiry"])
            for r in rows
        ]

    async def live_leases(self, owner_prefix: str) -> list[b.Lease]:
        return await self._run(self._list_live_leases_sync, owner_prefix)

    def _lease_write(
        self, task_id: str, token: int, *, renew: bool, sets: str, params: dict[str, Any]
    ) -> None:
        """One guarded UPDATE of the lease columns; `StaleLease` (or `TaskNotFound`) if
        it matched nothing."""
        with self._auto() as conn:
            cur = self._x(
                conn,
                f"UPDATE tasks SET {sets} WHERE task_id = :id AND {rules.lease_held_sql(renew)}",
                {**params, "id": task_id, "tok": token},
            )
            if cur.rowcount == 1:
                return
            rows = self._x(
                conn,
                "SELECT fencing_token, lease_owner FROM tasks WHERE task_id = :id",
                {"id": task_id},
            ).fetchall()
        if not rows:
            raise errors.TaskNotFound(task_id)
        current = int(rows[0]["fencing_token"])
        rules.check_lease(task_id, token, current, rows[0]["lease_owner"], renew=renew)
        raise errors.StaleLease(task_id, token, current)  # it moved in between

    def _renew_sync(self, task_id: str, token: int, ttl: float) -> float:
        now = self.clock.now()
        self._lease_write(
            task_id,
            token,
            renew=True,
            sets="lease_expiry = :exp, heartbeat_at = :now",
            params={"exp": now + ttl, "now": now},
        )
        return now + ttl

    async def renew(self, task_id: str, token: int, ttl: float) -> float:
        return await self._run(self._renew_sync, task_id, token, ttl)

    def _release_sync(self, task_id: str, token: int) -> None:
        self._lease_write(
            task_id, token, renew=False, sets="lease_owner = NULL, lease_expiry = NULL", params={}
        )

    async def release(self, task_id: str, token: int) -> None:
        await self._run(self._release_sync, task_id, token)

    # --- blobs, ops, artifacts ----------------------------------------------------------

    def _put_blob_sync(self, data: bytes) -> str:
        ref = b.blob_hash(data)
        with self._auto() as conn:
            self._x(
                conn, _BLOB_INSERT, {"h": ref, "s": len(data), "d": data, "t": self.clock.now()}
            )
        return ref

    async def put_blob(self, data: bytes) -> str:
        return await self._run(self._put_blob_sync, bytes(data))

    def _get_blob_sync(self, ref: str) -> bytes:
        with self._auto() as conn:
            row = self._x(conn, "SELECT data FROM blobs WHERE hash = :h", {"h": ref}).fetchone()
        if row is None:
            raise KeyError(ref)
        return bytes(row["data"])

    async def get_blob(self, ref: str) -> bytes:
        return await self._run(self._get_blob_sync, ref)

    def _in(
        self,
        params: dict[str, Any],
        column: str,
        prefix: str,
        values: Collection[Any] | None,
        *,
        negate: bool = False,
    ) -> str:
        """` AND column IN values` (`NOT IN` with `negate`), the values bound in `params`
        under names that start with `prefix`; nothing if `values` is None (no filter).
        The callers pass no empty filter (it matches nothing: they answer without a
        query)."""
        if values is None:
            return ""
        return f" AND {'NOT ' if negate else ''}({column} {self._member(params, prefix, values)})"

    @staticmethod
    def _member(params: dict[str, Any], prefix: str, values: Collection[Any]) -> str:
        """`IN (...)` of `values`, bound in `params` (the dialect's way)."""
        names = []
        for n, v in enumerate(sorted(values)):
            params[f"{prefix}{n}"] = v
            names.append(f":{prefix}{n}")
        return f"IN ({', '.join(names)})"

    def _get_ops_sync(
        self, task_id: str, statuses: Collection[str] | None, f: b.OpFilters
    ) -> list[OpRecord]:
        params: dict[str, Any] = {"id": task_id}
        where = "task_id = :id"
        where += self._in(params, "status", "s", statuses)
        where += self._in(params, "op_id", "o", f.get("op_ids"))
        where += self._in(params, "tool", "t", f.get("tools"))
        if f.get("round") is not None:
            where += " AND round = :round"
            params["round"] = f.get("round")
        # `round + 0`: with an ORDER BY that the task's index serves, SQLite's planner walked
        # every op of the task instead of looking ids up by key (asked every round). Pages
        # follow the index (a sort of every matching op per page would be quadratic).
        order, limit = "round + 0, call_index", ""
        if f.get("limit"):
            order, limit = "round, call_index, op_id", f" LIMIT {int(f.get('limit') or 0)}"
        if (after := f.get("after")) is not None:
            where += " AND (round, call_index, op_id) > (:ar, :ac, :ao)"
            params.update(ar=after[0], ac=after[1], ao=after[2])
        query = f"SELECT {_OP_COLS} FROM {self._ops} WHERE {where} ORDER BY {order}{limit}"
        return self._read_all(OpRecord, query, params)

    async def get_ops(
        self, task_id: str, statuses: Collection[str] | None = None, **filters: Unpack[b.OpFilters]
    ) -> list[OpRecord]:
        b.refuse_unknown(filters, b.OpFilters)
        op_ids, tools = filters.get("op_ids"), filters.get("tools")
        if rules.nothing(statuses, op_ids, tools):
            return []  # an empty filter matches nothing: no query, no thread
        return await self._run(self._get_ops_sync, task_id, statuses, filters)

    def _get_artifacts_sync(
        self, task_id: str, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        params: dict[str, Any] = {"id": task_id}
        where = "task_id = :id" + self._in(params, "artifact_id", "a", artifact_ids)
        order = "created_at + 0, artifact_id"  # ids by key: see `_get_ops_sync`
        query = f"SELECT {_ART_COLS} FROM artifacts WHERE {where} ORDER BY {order}"
        return self._read_all(ArtifactRecord, query, params)

    async def get_artifacts(
        self, task_id: str, *, artifact_ids: Collection[str] | None = None
    ) -> list[ArtifactRecord]:
        if rules.nothing(artifact_ids):
            return []
        return await self._run(self._get_artifacts_sync, task_id, artifact_ids)

    def _get_artifact_sync(self, artifact_id: str) -> ArtifactRecord:
        with self._auto() as conn:
            row = self._x(
                conn,
                f"SELECT {_ART_COLS} FROM artifacts WHERE artifact_id = :id",
                {"id": artifact_id},
            ).fetchone()
        if row is None:
            raise KeyError(artifact_id)
        return self._record(ArtifactRecord, row)

    async def get_artifact(self, artifact_id: str) -> ArtifactRecord:
        return await self._run(self._get_artifact_sync, artifact_id)

    # --- search ------------------------------------------------------------------------

    def _search_query(self, where: str) -> str:
        """The dialect's ranked search: rows of `_ART_COLS_A`, `score` and `excerpt`,
        best first, for `:q` (the dialect's query text), `:id`, `:limit`, `where`."""
        raise NotImplementedError

    def _search_text(self, words: list[str]) -> str:
        """The query text the dialect's search takes for `words`."""
        raise NotImplementedError

    def _read_search_sync(
        self,
        task_id: str,
        words: list[str],
        kinds: Collection[str] | None,
        limit: int,
        include_invalid: bool,
    ) -> list[b.ArtifactHit]:
        params: dict[str, Any] = {"id": task_id, "q": self._search_text(words), "limit": limit}
        where = ""
        if kinds is not None:
            where += self._in(params, "a.kind", "k", kinds)
        if not include_invalid:
            where += " AND a.valid = :valid"
            params["valid"] = self._bool_in(True)
        with self._auto() as conn:
            rows = self._x(conn, self._search_query(where), params).fetchall()
        return [
            b.ArtifactHit(
                self._record(ArtifactRecord, r), float(r["score"]), str(r["excerpt"] or "")
            )
            for r in rows
        ]

    async def search_artifacts(
        self, task_id: str, query: str, **options: Unpack[b.SearchOptions]
    ) -> list[b.ArtifactHit]:
        b.refuse_unknown(options, b.SearchOptions)
        words, kinds = search.terms(query), options.get("kinds")
        if not words or rules.nothing(kinds):
            return []
        return await self._run(
            self._read_search_sync,
            task_id,
            words,
            kinds,
            search.bounded(options.get("limit", 10)),
            options.get("include_invalid", False),
        )

    # --- shared state -------------------------------------------------------------------

    def _update_shared_sync(self, key: str, fn: b.SharedUpdate[T]) -> T:
        now = self.clock.now()
        with self._tx(write=True) as conn:
            # Lock the key's row, creating it first (as JSON null, i.e. "absent") so there
            # is a row to lock; the insert waits for a concurrent inserter of the same key.
            # A row a concurrent updater deleted meanwhile is not returned: insert again.
            row = None
            for _ in range(100):
                self._x(
                    conn,
                    "INSERT INTO shared_state (key, value, updated_at) VALUES (:k, 'null', :now)"
                    " ON CONFLICT (key) DO NOTHING",
                    {"k": key, "now": now},
                )
                row = self._x(
                    conn,
                    f"SELECT value FROM shared_state WHERE key = :k{self.FOR_UPDATE}",
                    {"k": key},
                ).fetchone()
                if row is not None:
                    break
            if row is None:
                raise errors.ConcurrentUpdate(f"shared state {key!r}: cannot lock its row")
            doc, value = fn(self._json_out(row["value"]), now)
            if doc is None:
                self._x(conn, "DELETE FROM shared_state WHERE key = :k", {"k": key})
            else:
                self._x(
                    conn,
                    "UPDATE shared_state SET value = :v, updated_at = :now WHERE key = :k",
                    {"k": key, "v": _dumps(doc), "now": now},
                )
            return value

    async def update_shared(self, key: str, fn: b.SharedUpdate[T]) -> T:
        return await self._run(self._update_shared_sync, key, fn)

    def _get_shared_sync(self, key: str) -> dict[str, Any] | None:
        with self._auto() as conn:
            row = self._x(
                conn, "SELECT value FROM shared_state WHERE key = :k", {"k": key}
            ).fetchone()
        if row is None:
            return None
        doc: dict[str, Any] | None = self._json_out(row["value"])
        return doc

    async def get_shared(self, key: str) -> dict[str, Any] | None:
        return await self._run(self._get_shared_sync, key)
