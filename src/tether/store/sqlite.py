"""The embedded SQLite store: WAL, `synchronous=FULL` by default, one writer.

All access goes through one connection owned by one thread, so the store is safe for
many asyncio tasks in a process; `BEGIN IMMEDIATE` and a busy timeout make it safe for
several processes on one machine. Each call is one hop to that thread; a commit is one
transaction there (events, blobs, ops, artifacts and approvals each one `executemany`).

The synchronous level is a URL parameter: `sqlite:///path/to/tether.db?synchronous=normal`
(`off`, `normal`, `full`, `extra`; any case; `open_store(url, synchronous=...)` and the
`TETHER_SQLITE_SYNCHRONOUS` variable also set it, see `tether.store`). The default FULL
syncs the WAL at every commit: a commit that returned survives a power loss. NORMAL
syncs only at checkpoints: much cheaper commits, still never a corrupt or partial
database after any crash, but a power loss or OS crash may undo the last commits (a
process crash loses nothing). Anything else is refused with `StoreConfigError`.

A write waits for another process's write lock up to the busy timeout (30 s; the URL's
`?busy_timeout=SECONDS`), then fails with `StoreBusy` ("another process holds the write
lock"): a process frozen inside a transaction is reported, not waited for forever.
`read_only=True` opens the file for reading only (no migration, no WAL switch, no write
lock; also on read-only media), as the commands that only show things do.
"""

from __future__ import annotations

import asyncio
import operator
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, Unpack

from tether import errors
from tether.clock import Clock
from tether.store import _search as search
from tether.store import schema_policy
from tether.store._rows import stored_events
from tether.store._sql import (
    _ART_COLS_A,
    RECORD_COLS,
    RECORD_TABLES,
    SqlStore,
    _upsert,
)
from tether.store._sqlite_thread import StoreThread
from tether.store.base import SCHEMA_VERSION
from tether.store.schema_policy import iter_statements

if TYPE_CHECKING:
    from tether import events as ev

T = TypeVar("T")
#: Files up to this size are checked page by page when opened (about 0.1 s per 64 MiB).
QUICK_CHECK_MAX_BYTES = 64 * 1024 * 1024
Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
#: How long a write waits for another process's write lock by default.
DEFAULT_BUSY_TIMEOUT_MS = 30_000
#: The schema that keeps a task's events in runs (`event_runs`).
EVENT_RUNS_SCHEMA = 9
#: A commit's events (schema 9): each at its rowid, in one b-tree (`event_runs`).
_EVENT_INSERT = (
    "INSERT INTO events (id, task_id, seq, type, schema_version, data, task_version,"
    " fencing_token, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_LAST_RUN = (
    "SELECT r.first_seq, r.first_id, (SELECT MAX(id) FROM events) FROM (SELECT 1)"
    " LEFT JOIN (SELECT first_seq, first_id FROM event_runs WHERE task_id = ?"
    " ORDER BY first_seq DESC LIMIT 1) r"
)
#: A commit's first read (`SqlStore._commit_read`) with `_LAST_RUN`'s columns: the task
#: row, its last run (NULLs if none) and the table's end, one statement.
_COMMIT_READ = (
    "SELECT t.status, t.version, t.fencing_token, t.last_seq, t.cancel_requested,"
    " r.first_seq, r.first_id, (SELECT MAX(id) FROM events) AS end_id FROM tasks t"
    " LEFT JOIN (SELECT first_seq, first_id FROM event_runs WHERE task_id = ?"
    " ORDER BY first_seq DESC LIMIT 1) r ON TRUE WHERE t.task_id = ?"
)
#: The events of task `:id` after `:after`, run by run (see migration 9): from the last
#: run that starts at or before `:after + 1` on, in the order of their key, each run's
#: rows by rowid up to the next run's first `seq` (the last run's: the task's
#: `last_seq`). Both orders are the loops' own: no sort, and a LIMIT stops the scan.
_RUN_EVENTS = (
    " FROM event_runs r JOIN events e"
    " ON e.id >= r.first_id - r.first_seq + MAX(r.first_seq, :after + 1)"
    " AND e.id < r.first_id - r.first_seq + COALESCE((SELECT MIN(n.first_seq)"
    " FROM event_runs n WHERE n.task_id = r.task_id AND n.first_seq > r.first_seq),"
    " (SELECT last_seq FROM tasks WHERE task_id = :id) + 1)"
    " WHERE r.task_id = :id AND r.first_seq >= COALESCE((SELECT MAX(first_seq)"
    " FROM event_runs WHERE task_id = :id AND first_seq <= :after + 1), 0)"
    " AND e.task_id = :id AND e.seq > :after"
)


#: Per record table (`RECORD_COLS`): its upsert with its values by position, and what
#: takes them from a row (`SqlStore._params`), in that order.
_RECORD_UPSERTS = {
    table: _upsert(table, cols, *RECORD_TABLES[table], positional=True)
    for table, cols in RECORD_COLS.items()
}
_RECORD_VALUES = {
    table: operator.itemgetter(*(c.strip() for c in cols.split(",")))
    for table, cols in RECORD_COLS.items()
}


def _translate(exc: sqlite3.Error, path: str, busy_ms: int = 0) -> errors.TetherError:
    text = str(exc)
    low = text.lower()
    if "database is locked" in low or "database table is locked" in low:
        return errors.StoreBusy(
            f"another process holds the write lock of {path} and did not let go within"
            f" {busy_ms / 1000:g} s (a tether process that is frozen, stopped or very slow"
            " inside a transaction, or another program); nothing was written — end or"
            " resume that process, then try again"
        )
    if "not a database" in low or "malformed" in low or "file is encrypted" in low:
        return errors.CorruptDatabase(
            f"{path} is not a readable SQLite database ({text}); it was left untouched —"
            " point --db at another file or restore a backup"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if "unable to open" in low:
        return errors.StoreConfigError(
            f"cannot open the database file {path} ({text}): the file and its folder must "
            f"be ones you may write to (SQLite also writes {os.path.basename(path)}-wal "
            f"and -shm in {folder}); run from another folder or point --db at another file"
        )
    if "readonly" in low or "read-only" in low:
        return errors.StoreConfigError(
            f"the database file {path} is read-only ({text}): make it and its folder "
            f"{folder} writable, or point --db at another file"
        )
    return errors.StoreError(f"SQLite error on {path}: {text}")


def _check_path(p: Path, create: bool) -> None:
    if not create and not p.exists():
        raise errors.StoreConfigError(f"no tether database at {p}")
    if p.exists() and p.is_dir():
        raise errors.StoreConfigError(f"{p} is a folder, not a database file")
    if create:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.StoreConfigError(f"cannot create the folder {p.parent}: {exc}") from exc


class SQLiteOptions(TypedDict, total=False):
    """How `SQLiteStore` opens its file: the `synchronous` level (FULL), the store's
    clock, how long a write waits for another process's lock (`busy_timeout_ms`), and
    `read_only` (see the module)."""

    synchronous: Synchronous
    clock: Clock | None
    busy_timeout_ms: int
    read_only: bool


class SQLiteStore(SqlStore):
    """The embedded default store."""

    dialect = "sqlite"
    TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"

    def __init__(self, path: str | Path, **options: Unpack[SQLiteOptions]) -> None:
        from tether.store._sqlite_level import sqlite_synchronous

        self.path = str(path)
        level = sqlite_synchronous(options.get("synchronous", "FULL"))
        self.synchronous: Synchronous = level  # type: ignore[assignment]
        query = "" if self.synchronous == "FULL" else f"?synchronous={self.synchronous.lower()}"
        super().__init__(f"sqlite:///{self.path}{query}", options.get("clock"))
        self.busy_timeout_ms = options.get("busy_timeout_ms", DEFAULT_BUSY_TIMEOUT_MS)
        self.read_only = options.get("read_only", False)
        # One thread owns the connection; sqlite3 connections are not thread-safe.
        self._thread = StoreThread("tether-sqlite")
        self._conn: sqlite3.Connection | None = None
        # Events in runs (schema 9); a store migrated only part of the way (`migrate_to`,
        # as tests make older databases) writes and reads them as its schema has them.
        self._event_runs = True
        #: `_LAST_RUN`'s row as this transaction's commit read it (`_commit_read`), for
        #: its events (`_insert_events`); dropped when a transaction begins.
        self._last_run: tuple[str, Any, Any, Any] | None = None

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        create: bool = True,
        migrate_to: int = SCHEMA_VERSION,
        migrate: bool = True,
        **options: Unpack[SQLiteOptions],
    ) -> SQLiteStore:
        """Open (and migrate) a database file; `create=False` refuses a missing file;
        `read_only` opens an existing file for reading only (see the module);
        `migrate=False` refuses a schema below this tether's instead of migrating it."""
        from tether.store._sqlite_level import sqlite_synchronous

        # Refuse a bad level before touching the disk.
        sqlite_synchronous(options.get("synchronous", "FULL"))
        read_only = options.get("read_only", False)
        p = Path(path)
        await asyncio.to_thread(_check_path, p, create and not read_only)
        store = cls(p, **options)
        connect = store._connect_read_only_sync if read_only else store._connect_sync
        await schema_policy.open_schema(
            store,
            lambda: store._run(connect),
            migrate_to=migrate_to if migrate and not read_only else None,
            read_only=read_only,
        )
        return store

    def _connect_sync(self, switch: bool = True) -> None:
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=self.busy_timeout_ms / 1000
            )
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            # Check the header, and that the file is ours, before anything writes to it
            # (switching to WAL rewrites the header of someone else's database).
            self._refuse_foreign(self._existing_tables(conn))
            self._refuse_damaged(conn)
            if switch:
                mode = self._to_wal(conn)
                if str(mode).lower() != "wal":
                    raise errors.StoreConfigError(
                        f"cannot switch {self.path} to WAL mode (got {mode})"
                    )
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from exc
            raise
        self._conn = conn

    def _connect_read_only_sync(self) -> None:
        """A connection for reading only: no WAL switch, no migration, no write
        transaction (reads in WAL mode never wait for a writer). A writable file is
        opened as usual, so that closing the last connection tidies the `-wal` and
        `-shm` files away; a file we may not write is opened with `mode=ro`, and on
        read-only media (no `-shm` can be made) as immutable: nobody writes it there."""
        folder = os.path.dirname(os.path.abspath(self.path))
        if os.access(self.path, os.W_OK) and os.access(folder, os.W_OK):
            self._connect_sync(switch=False)
            return
        uri = Path(self.path).resolve().as_uri()
        attempts = [f"{uri}?mode=ro"]
        if not os.access(folder, os.W_OK):
            attempts.append(f"{uri}?immutable=1")
        last: sqlite3.Error | None = None
        for target in attempts:
            conn: sqlite3.Connection | None = None
            try:
                conn = sqlite3.connect(
                    target, uri=True, isolation_level=None, timeout=self.busy_timeout_ms / 1000
                )
                conn.row_factory = sqlite3.Row
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.Error as exc:
                if conn is not None:
                    conn.close()
                last = exc
                continue
            self._conn = conn
            return
        assert last is not None
        raise self._error(last) from last

    def _error(self, exc: sqlite3.Error) -> errors.TetherError:
        return _translate(exc, self.path, self.busy_timeout_ms)

    def _to_wal(self, conn: sqlite3.Connection) -> str:
        """Switch to WAL. SQLite answers "database is locked" at once, without its busy
        handler, when another connection opening the same new file holds a lock at that
        moment: try again within the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        delay = 0.005
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower() or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(0.2, delay * 2)

    def _refuse_damaged(self, conn: sqlite3.Connection) -> None:
        """A damaged page is found before anything is written (a task written into a
        damaged file could be lost with it). `quick_check` reads the whole file, so it
        runs on files up to `QUICK_CHECK_MAX_BYTES`; a larger one is checked by SQLite as
        its pages are read."""
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return
        if size == 0 or size > QUICK_CHECK_MAX_BYTES:
            return
        row = conn.execute("PRAGMA quick_check(1)").fetchone()
        if row is not None and str(row[0]).lower() != "ok":
            raise errors.CorruptDatabase(
                f"{self.path} is damaged ({row[0]}); it was left untouched — point --db at "
                "another file or restore a backup"
            )

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # The cheapest hop there and back (`_sqlite_thread`): two per round of a run.
        return await self._thread.call(fn, *args)

    @contextmanager
    def _auto(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        if conn is None:
            raise errors.StoreError("the store is closed")
        try:
            yield conn
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    @contextmanager
    def _tx(self, write: bool) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        if conn is None:
            raise errors.StoreError("the store is closed")
        self._last_run = None
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            yield conn
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise self._error(exc) from exc
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise self._error(exc) from exc

    def _migrate_sync(self, target: int = SCHEMA_VERSION) -> int:
        current = super()._migrate_sync(target)
        self._event_runs = current >= EVENT_RUNS_SCHEMA
        return current

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
        if not self._event_runs or not items:
            super()._insert_events(conn, task_id, start_seq, items, task_version, token, now)
            return
        # Appended at the end of the table (see migration 9): the task's last run goes
        # on when its next rowid lies past the end, else a run starts at the end.
        # The task's last run (NULLs if none) and the table's end, in one statement (or
        # as the commit read them with the task's row, in this transaction).
        hint, self._last_run = self._last_run, None
        if hint is not None and hint[0] == task_id:
            first_seq, first_id, end = hint[1:]
        else:
            first_seq, first_id, end = conn.execute(_LAST_RUN, (task_id,)).fetchone()
        end = int(end or 0)
        if first_seq is not None and start_seq <= first_seq:
            raise errors.StoreError(f"events of {task_id!r} from {start_seq} written twice")
        if first_seq is not None and first_id + start_seq - first_seq > end:
            base = first_id - first_seq
        else:
            base = end + 1 - start_seq
            conn.execute(
                "INSERT INTO event_runs (task_id, first_seq, first_id) VALUES (?, ?, ?)",
                (task_id, start_seq, end + 1),
            )
        # Each row as a tuple by position (binding by name looks each name up anew).
        rows = [
            (base + seq, task_id, seq, type_name, schema, data, task_version, token, now)
            for seq, (type_name, schema, data) in enumerate(stored_events(items), start_seq)
        ]
        conn.executemany(_EVENT_INSERT, rows)

    def _commit_read(self, conn: Any, task_id: str) -> Any:
        if not self._event_runs:
            return super()._commit_read(conn, task_id)
        row = conn.execute(_COMMIT_READ, (task_id, task_id)).fetchone()
        if row is not None:
            self._last_run = (task_id, row["first_seq"], row["first_id"], row["end_id"])
        return row

    def _update_task(self, conn: Any, task_id: str, sets: Mapping[str, Any]) -> None:
        # By position: SQLite's module looks each named parameter up anew, per call.
        conn.execute(
            f"UPDATE tasks SET {' = ?, '.join(sets)} = ? WHERE task_id = ?",
            (*sets.values(), task_id),
        )

    def _upsert_records(self, conn: Any, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:  # by position, as `_update_task`
            values = _RECORD_VALUES[table]
            conn.executemany(_RECORD_UPSERTS[table], [values(row) for row in rows])

    def _events_query(self, cols: str, where: str, lim: str) -> str:
        if not self._event_runs:
            return super()._events_query(cols, where, lim)
        # `task_id` and `seq` are checked on each row as well.
        picked = ", ".join(f"e.{c.strip()}" for c in cols.split(","))
        return f"SELECT {picked}{_RUN_EVENTS}{where} ORDER BY r.first_seq, e.id{lim}"

    def _run_script(self, conn: Any, sql: str) -> None:
        for stmt in iter_statements(sql):
            conn.execute(stmt)

    def _bool_in(self, value: bool) -> Any:
        return 1 if value else 0

    def _index_rows(self, conn: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        # The FTS5 table has external content (`artifact_text`): its rows are added
        # here, with the content row's id, in the same transaction.
        for row in rows:
            if not row["body"]:
                continue
            cur = conn.execute(
                "INSERT INTO artifact_text (artifact_id, task_id, body)"
                " VALUES (:artifact_id, :task_id, :body) ON CONFLICT (artifact_id) DO NOTHING",
                row,
            )
            if cur.rowcount == 1:
                conn.execute(
                    "INSERT INTO artifact_search (rowid, body) VALUES (?, ?)",
                    (cur.lastrowid, row["body"]),
                )

    def _search_text(self, words: list[str]) -> str:
        return search.fts5_match(words)

    def _search_query(self, where: str) -> str:
        # bm25 is lower for better matches; the score is turned so that higher is better.
        return (
            f"SELECT {_ART_COLS_A}, -bm25(artifact_search) AS score,"
            " snippet(artifact_search, 0, '[', ']', '…', 32) AS excerpt"
            " FROM artifact_search JOIN artifact_text t ON t.id = artifact_search.rowid"
            " JOIN artifacts a ON a.artifact_id = t.artifact_id"
            f" WHERE artifact_search MATCH :q AND t.task_id = :id{where}"
            " ORDER BY bm25(artifact_search), a.created_at, a.artifact_id LIMIT :limit"
        )

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        """Close the connection and its thread."""
        try:
            await self._run(self._close_sync)
        finally:
            self._thread.shutdown()
