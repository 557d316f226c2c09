"""The PostgreSQL store: many workers on many machines.

psycopg 3 with a `psycopg_pool` connection pool (autocommit connections; 8 at most, or
a worker's `pool_size`). A `schema=NAME` query parameter in the URL puts tether's tables
in their own schema (created if missing), which tests use for isolation.

Round trips are the cost here, so:

- a **commit is one statement**, hence one round trip and its own transaction: a chain
  of CTEs locks the task row (`FOR UPDATE`), keeps it only if the commit's condition holds
  (`_rules.CommitCondition` as SQL: the fencing token, the statuses the transition may
  start from, the version floor, and the ledger's expected version in the ledger's
  UPDATE), and hangs every write (task, events numbered from the locked `last_seq`,
  ledger, ops, artifacts, approvals, blobs) off that row, so a refused commit writes
  nothing. The statement returns the row it found, and the condition names the refusal
  (`StaleLease`, `IllegalTransition`, `ConcurrentUpdate`) from it. It is sent with
  its Sync, so its transaction begins and ends on the server: no client, crashed or
  frozen, is ever inside it. The exception is the rare commit that writes approval
  requests or ends the task: two pipelined round trips (as `update_shared`), the task
  row locked and its requests read first, so the requests it checks and closes are
  the latest (`_commit_requests`);
- single-statement reads, lease renewals and releases run outside a transaction block;
  `update_shared` is two pipelined round trips (lock and read, then write and commit);
  the rest (`create_task`, `claim`, migrations) runs in a plain transaction;
- id filters are one array parameter (`= ANY(...)`): one prepared statement for any count.

No frozen peer blocks the others (a GC pause, a stopped VM, a debugger):

- a commit's statement is sent with its Sync (above): it ends on the server;
- every session has a `lock_timeout` (5 s) and an `idle_in_transaction_session_timeout`
  (10 s) unless the URL (`?options=-c%20lock_timeout%3D2s`) or the server sets them: a
  process frozen inside a client-driven transaction (a claim, a task's creation,
  `update_shared`) loses its session and locks; a lock wait ends with `StoreBusy`;
- workers pick tasks with `FOR UPDATE SKIP LOCKED`, so a locked row is passed over.

A lost connection is transient: a step that failed without effect (no connection to be
had, a session the server ended: restart, `pg_terminate_backend`, a timeout), a read or
another step that may run twice is tried again on a new connection for up to 30 s, then
fails with `StoreUnavailable` (exit 4; a worker backs off and claims again). A commit cut
off in the middle is not sent again blindly (it may have happened): the run stops, and
its recovery reads what the store holds (`Engine.run`'s `reconnect_for` waits for it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from tether import errors, failpoints
from tether._extras import needs
from tether.clock import Clock
from tether.store import _pg_commit as pg_commit
from tether.store import _pg_events as pg_events
from tether.store import _rules as rules
from tether.store import _search as search
from tether.store import schema_policy
from tether.store._rows import dumps_no_nul as _dumps
from tether.store._sql import _ART_COLS_A, SqlStore
from tether.store._sqlite_thread import StoreThread
from tether.store.base import (
    SCHEMA_VERSION,
    ApprovalRecord,
    ArtifactRecord,
    Commit,
    CommitResult,
    SharedUpdate,
)

T = TypeVar("T")
_MIGRATION_LOCK = 0x7E7E_0001
#: SQLSTATEs of a session the server ended (administrator command, crash of another
#: backend, starting up or shutting down, idle in a transaction): whatever it was doing
#: was rolled back, so the same step may be sent again on a new connection.
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "25P03"})
log = logging.getLogger("tether.store.postgres")
#: Steps that may run twice with the effect of once, so that a connection lost in the
#: middle of one (did it happen?) is no reason to fail: reads, lease renewals and
#: releases, blobs (content-addressed), migrations (each checks the version first).
_IDEMPOTENT = re.compile(r"_(get|read|list|renew|release|put_blob|schema_version|migrate)\w*")


def _idempotent(fn: Callable[..., Any]) -> bool:
    return bool(_IDEMPOTENT.fullmatch(getattr(fn, "__name__", "")))


#: Session settings given to every connection whose URL or server leaves them unset.
SESSION_DEFAULTS: dict[str, str] = {
    "lock_timeout": "5s",
    "idle_in_transaction_session_timeout": "10s",
}
_SESSION_SQL = "SELECT " + ", ".join(
    f"set_config('{name}', CASE WHEN current_setting('{name}') = '0'"
    f" THEN '{value}' ELSE current_setting('{name}') END, false)"
    for name, value in SESSION_DEFAULTS.items()
)


@functools.cache
def _has_pipeline() -> bool:
    """True if the libpq under psycopg has pipeline mode (libpq 14+)."""
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


@contextmanager
def _begun(conn: Any) -> Iterator[Any]:
    """`conn` in pipeline mode inside a BEGIN, for a transaction of a few pipelined round
    trips (the body ends it with COMMIT; yields the pipeline, to `sync` within it). If
    the body or the pipeline's end fails, the transaction is rolled back."""
    from psycopg import pq

    try:
        with conn.pipeline() as pipe:
            conn.execute("BEGIN")
            yield pipe
    except BaseException:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.rollback()
        raise


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


#: A server's refusal of the login itself (libpq passes its words on; connection errors
#: carry no SQLSTATE), matched on its English messages (another locale falls back to
#: "unavailable", exit 4); and libpq refusing a URL parameter before it tries (a misspelt
#: name, `sslmode=bogus`). Waiting cannot fix either: the user corrects it (exit 2).
_REFUSED_LOGIN = re.compile(
    r'FATAL: +(database "[^"]*" does not exist|role "[^"]*" does not exist|'
    r"password authentication failed|no pg_hba\.conf entry)"
)
_BAD_PARAMETER = re.compile(r"^(connection is bad: )?(?=invalid )", re.IGNORECASE)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def split_schema(url: str) -> tuple[str, str | None]:
    """Remove tether's own `schema=` parameter from a libpq URL."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = None
    rest = []
    for k, v in query:
        if k == "schema":
            schema = v
        else:
            rest.append((k, v))
    if schema is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", schema):
        raise errors.StoreConfigError(f"schema {schema!r} is not a plain SQL identifier")
    # quote, not quote_plus: libpq does not read '+' as a space (options=-c%20x%3Dy).
    return urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote))), schema


class PostgresStore(SqlStore):
    """The multi-worker store."""

    dialect = "postgres"
    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    TABLES = (
        "SELECT table_name AS name FROM information_schema.tables"
        " WHERE table_schema = current_schema()"
    )

    def __init__(self, url: str, *, clock: Clock | None = None, max_size: int = 8) -> None:
        super().__init__(_redact(url), clock)
        self._conninfo, self.schema = split_schema(url)
        self._max_size = max_size
        self._pool: Any = None
        #: psycopg's `tuple_row`, for the rows read by position (set when opened).
        self._tuples: Any = None
        # A thread per pooled connection: a worker's runs share the pool, a step waits for
        # a thread only when every connection is busy, never behind the loop's other work.
        # Their calls hop as the SQLite store's (`_sqlite_thread`): no concurrent future, work
        # item or self-pipe write per call.
        self._executor = StoreThread("tether-pg", threads=max_size)
        #: How long a step that failed without effect is tried again (see `_run`).
        self.retry_window = 30.0
        #: Events one row per commit (`_pg_events`): the schema is 11 or later.
        self._batched = True
        #: Ops' results in rows of their own (`op_results`): the schema is 12 or later.
        self._op_results = True
        self._ops = pg_commit.OPS_JOINED

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        clock: Clock | None = None,
        max_size: int = 8,
        connect_timeout: float = 5.0,
        migrate_to: int = SCHEMA_VERSION,
        read_only: bool = False,
        migrate: bool = True,
    ) -> PostgresStore:
        """Connect and migrate (`read_only`, `migrate=False`: check the schema instead)."""
        store = cls(url, clock=clock, max_size=max_size)
        await schema_policy.open_schema(
            store,
            lambda: asyncio.to_thread(store._open_sync, connect_timeout, read_only),
            migrate_to=migrate_to if migrate and not read_only else None,
            read_only=read_only,
        )
        return store

    def resize_pool(self, size: int) -> None:
        """Hold `size` connections (and threads) open from now on: a worker's `pool_size`
        (grown on demand, at concurrency 64 with 16-32, 161-270 calls waited 1.3-1.6 s)."""
        self._max_size = size
        self._executor.resize(size)
        if self._pool is not None:
            self._pool.resize(min_size=size, max_size=size)

    def _open_sync(self, connect_timeout: float, read_only: bool = False) -> None:
        with needs("postgres", "a postgresql:// database"):
            import psycopg
            from psycopg.rows import dict_row, tuple_row
            from psycopg_pool import ConnectionPool
        try:
            # A direct first connection gives libpq's own words when the server is away.
            conn = psycopg.connect(
                self._conninfo, connect_timeout=max(1, int(connect_timeout)), autocommit=True
            )
        except psycopg.Error as exc:
            why = _first_line(exc)
            if isinstance(exc, psycopg.ProgrammingError) or _BAD_PARAMETER.match(why):
                raise errors.StoreConfigError(
                    f"the PostgreSQL URL {self.url} has a bad parameter: "
                    f"{_BAD_PARAMETER.sub('', why)} — correct it in TETHER_DB / --db"
                ) from exc
            if _REFUSED_LOGIN.search(str(exc)):
                raise errors.StoreConfigError(
                    f"PostgreSQL at {self.url} refused the connection: {why} — check the "
                    "database name, user and password in the URL (TETHER_DB / --db)"
                ) from exc
            raise errors.StoreUnavailable(
                f"cannot connect to PostgreSQL at {self.url}: {why}"
            ) from exc
        with conn:
            if self.schema and not read_only:
                self._create_schema(conn, psycopg)
        schema = self.schema

        def configure(conn: Any) -> None:
            if schema:
                conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(_SESSION_SQL)

        self._tuples = tuple_row
        self._pool = ConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=self._max_size,
            kwargs={"autocommit": True, "row_factory": dict_row},
            configure=configure,
            open=False,
            name="tether",
        )
        self._pool.open(wait=True, timeout=connect_timeout)

    def _create_schema(self, conn: Any, psycopg: Any) -> None:
        try:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema):
            # IF NOT EXISTS is not safe against a concurrent creator; it exists now.
            pass
        except psycopg.OperationalError as exc:
            raise errors.StoreUnavailable(
                f"PostgreSQL at {self.url} failed: {_first_line(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise errors.StoreConfigError(
                f"cannot create the schema {self.schema!r} at {self.url}: {_first_line(exc)}"
            ) from exc

    def _sql(self, query: str) -> str:
        return pg_commit.placeholders(query)

    @contextmanager
    def _translated(self) -> Iterator[Any]:
        """A pooled connection (autocommit); driver errors become tether's. A failure
        known to have changed nothing (no connection to be had, or a session the server
        ended, which rolls back whatever it was doing) is marked `retry_safe`."""
        import psycopg

        if self._pool is None:
            raise errors.StoreError("the store is closed")
        acquired = False
        try:
            with self._pool.connection() as conn:
                acquired = True
                yield conn
        except psycopg.errors.LockNotAvailable as exc:
            raise errors.StoreBusy(
                f"another process holds a lock on the same task or record at {self.url} and"
                f" did not let go in time (a tether process frozen or very slow inside a"
                f" transaction); nothing was written — try again: the server ends a frozen"
                f" transaction ({_first_line(exc)})"
            ) from exc
        except psycopg.Error as exc:
            ended = getattr(exc, "sqlstate", None) in _SESSION_ENDED
            if not (ended or isinstance(exc, psycopg.OperationalError)):
                raise errors.StoreError(f"PostgreSQL error at {self.url}: {exc}") from exc
            raise errors.StoreUnavailable(
                f"PostgreSQL at {self.url} failed: {_first_line(exc)}",
                retry_safe=ended or not acquired,
            ) from exc

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` in a thread (its result handed back to the loop in a batch with the
        others ready: `_sqlite_thread`); a failure that changed nothing (see `_translated`) is
        tried again on a new connection, with backoff, for up to `retry_window` seconds
        (a restarted server, ended sessions), then raised."""
        deadline: float | None = None
        delay = 0.0
        while True:
            try:
                return await self._executor.call(fn, *args)
            except errors.StoreUnavailable as exc:
                if not (exc.fields.get("retry_safe") or _idempotent(fn)):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.retry_window
                if now >= deadline:
                    raise
                log.warning("%s; trying again", exc)
                await asyncio.sleep(min(delay, deadline - now))
                delay = min(2.0, max(0.05, delay * 2))

    @contextmanager
    def _tx(self, write: bool) -> Iterator[Any]:
        with self._translated() as conn, conn.transaction():
            yield conn

    def _auto(self) -> AbstractContextManager[Any]:
        return self._translated()

    def _update_shared_sync(self, key: str, fn: SharedUpdate[T]) -> T:
        """Two round trips: BEGIN and an upsert that locks the key's row and returns its
        document (pipelined), then the write and COMMIT (pipelined)."""
        if not _has_pipeline():  # pragma: no cover - a libpq older than 14
            return super()._update_shared_sync(key, fn)
        now = self.clock.now()
        with self._translated() as conn, _begun(conn) as pipe:
            # The row is created as JSON null ("absent") if missing, so there is always a
            # row to lock; DO UPDATE locks it and returns its value.
            cur = conn.execute(
                "INSERT INTO shared_state (key, value, updated_at)"
                " VALUES (%(k)s, 'null', %(now)s)"
                " ON CONFLICT (key) DO UPDATE SET key = excluded.key RETURNING value",
                {"k": key, "now": now},
            )
            pipe.sync()
            row = cur.fetchone()
            doc, value = fn(self._json_out(row["value"]), now)
            if doc is None:
                conn.execute("DELETE FROM shared_state WHERE key = %(k)s", {"k": key})
            else:
                conn.execute(
                    "UPDATE shared_state SET value = %(v)s::jsonb, updated_at = %(now)s"
                    " WHERE key = %(k)s",
                    {"k": key, "v": _dumps(doc), "now": now},
                )
            conn.execute("COMMIT")
        return value

    @staticmethod
    def _member(params: dict[str, Any], prefix: str, values: Collection[Any]) -> str:
        # One parameter for any number of values: one statement text, prepared once.
        params[prefix] = sorted(values)
        return f"= ANY(:{prefix})"

    # --- the one write path: one statement, one round trip ------------------------------

    def _commit_sync(self, c: Commit) -> CommitResult:
        """The whole commit as ONE statement (its own transaction): the task row is
        locked, the rules' condition is its WHERE, and every write hangs off the guarded row,
        so a refused commit writes nothing. The condition's verdict on the returned row
        names the refusal."""
        now = self.clock.now()
        cond = rules.CommitCondition.of(c.task_id, c.token, c.task, c.ledger)
        if c.approvals or rules.closes_requests(c.task):
            return self._commit_requests(cond, c, now)
        query, params = self._statement(cond, c, now)
        with self._translated() as conn:
            failpoints.hit("during_commit")
            # Not in a pipeline: the statement goes out with its Sync, so the server
            # commits it even if this process freezes right after sending (a statement
            # waiting in a pipeline for its Sync would hold the task's row lock, and no
            # server timeout ends that state).
            row = pg_commit.cursor(conn, query, self._tuples).execute(query, params).fetchone()
        if row is None:
            raise errors.TaskNotFound(c.task_id)
        return self._commit_result(cond, row, len(c.events))

    def _commit_requests(self, cond: rules.CommitCondition, c: Commit, now: float) -> CommitResult:
        """A commit that writes requests or ends the task, in two round trips (as
        `update_shared`): BEGIN, the task row locked and the task's requests and waiting
        ops read (pipelined) — after the lock, so they are the latest, where one
        statement would read them as of its start, before it waited for the lock; then
        the request rules applied (`_rules.settle_requests`) and the commit's statement
        and COMMIT (pipelined; a statement its condition refused wrote nothing, so the
        COMMIT commits nothing). Rare: a request asked, decided or closed, a task's end."""
        if not _has_pipeline():  # pragma: no cover - a libpq older than 14
            return super()._commit_sync(c)
        with self._translated() as conn:
            # As in the one-statement commit: the connection in hand, nothing sent or
            # locked yet (a process frozen here holds up no one).
            failpoints.hit("during_commit")
            with _begun(conn) as pipe:
                cur_task = conn.execute(
                    "SELECT status, version, fencing_token, last_seq, cancel_requested"
                    " FROM tasks WHERE task_id = %(id)s FOR UPDATE",
                    {"id": cond.task_id},
                )
                cur_reqs = conn.execute(
                    "SELECT request_id, task_id, op_id, status, request, decision,"
                    " decided_by, created_at, decided_at FROM approvals"
                    " WHERE task_id = %(id)s ORDER BY created_at, request_id",
                    {"id": cond.task_id},
                )
                cur_ops = conn.execute(
                    "SELECT op_id, status FROM ops WHERE task_id = %(id)s"
                    " AND status = 'awaiting_approval'",
                    {"id": cond.task_id},
                )
                pipe.sync()
                row = cur_task.fetchone()
                if row is None:
                    raise errors.TaskNotFound(cond.task_id)
                cond.check_task(self._state(row))
                stored = [self._record(ApprovalRecord, r) for r in cur_reqs.fetchall()]
                status = {r["op_id"]: r["status"] for r in cur_ops.fetchall()}
                items, approvals = rules.settle_requests(
                    cond.task_id, c.task, c.events, c.approvals, stored, status, now
                )
                c = dataclasses.replace(c, events=items, approvals=approvals)
                query, params = self._statement(cond, c, now)
                cur = conn.cursor(row_factory=self._tuples).execute(query, params)
                conn.execute("COMMIT")
            row = cur.fetchone()  # the end of `_begun`'s pipeline sent the Sync
        return self._commit_result(cond, row, len(c.events))

    def _statement(
        self, cond: rules.CommitCondition, c: Commit, now: float
    ) -> tuple[bytes, dict[str, Any]]:
        """The commit's one statement and its parameters (`_pg_commit.statement`) in this
        database's schema: events batched (11), ops' results in rows of their own (12)."""
        texts = self._artifact_texts(c.artifacts, c.blobs)
        return pg_commit.statement(
            cond,
            c,
            now,
            texts,
            self._encode_changes,
            batched=self._batched,
            op_results=self._op_results,
        )

    def _commit_result(self, cond: rules.CommitCondition, row: Any, n_items: int) -> CommitResult:
        """The commit statement's returned row (a tuple: `_pg_commit.STATUS`...) read by
        the condition: the refusal it names, or the seqs the commit's events took."""
        state = rules.TaskState(
            status=row[pg_commit.STATUS],
            version=int(row[pg_commit.VERSION]),
            fencing_token=int(row[pg_commit.FENCING_TOKEN]),
            last_seq=int(row[pg_commit.LAST_SEQ]),
            cancel_requested=bool(row[pg_commit.CANCEL_REQUESTED]),
        )
        if not row[pg_commit.APPLIED]:
            lver = row[pg_commit.LEDGER_VERSION]
            raise cond.refusal(state, None if lver is None else int(lver))
        first, last = rules.seq_range(state.last_seq, n_items)
        return CommitResult(first, last, state.cancel_requested, state.version)

    @staticmethod
    def _artifact_texts(
        artifacts: Sequence[ArtifactRecord], blobs: Sequence[bytes]
    ) -> list[dict[str, Any]]:
        """The search index rows of a commit's valid artifacts. The text comes from the
        commit's blobs; for an artifact whose blob an earlier commit stored, `body` is
        None and the statement reads the stored blob (`tether_blob_text`), so the commit
        stays one round trip. An invalidation rewrites artifacts indexed already: its
        records are left out."""
        if not artifacts:
            return []
        staged = rules.unique_blobs(blobs)
        rows = []
        for art in artifacts:
            if not art.valid:
                continue
            data = staged.get(art.blob_hash)
            body = None if data is None else search.indexed_text(art.name, data)
            if body != "":
                rows.append(
                    {
                        "artifact_id": art.artifact_id,
                        "task_id": art.task_id,
                        "name": art.name,
                        "blob_hash": art.blob_hash,
                        "body": body,
                    }
                )
        return rows

    def _index_rows(self, conn: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        self._xmany(
            conn,
            "INSERT INTO artifact_text (artifact_id, task_id, body)"
            " VALUES (:artifact_id, :task_id, :body) ON CONFLICT (artifact_id) DO NOTHING",
            [r for r in rows if r["body"]],
        )

    def _search_text(self, words: list[str]) -> str:
        return search.websearch_query(words)

    def _search_query(self, where: str) -> str:
        # Ranked and cut to `limit` first; the excerpts (ts_headline reads the text
        # again) are made for the rows kept only.
        return (
            "WITH q AS (SELECT websearch_to_tsquery('english', :q) AS q),"
            f" hits AS (SELECT {_ART_COLS_A}, t.body, ts_rank_cd(t.tsv, q.q) AS score"
            " FROM artifact_text t CROSS JOIN q JOIN artifacts a ON a.artifact_id = t.artifact_id"
            f" WHERE t.task_id = :id AND t.tsv @@ q.q{where}"
            " ORDER BY score DESC, a.created_at, a.artifact_id LIMIT :limit)"
            " SELECT hits.*, ts_headline('english', hits.body, q.q,"
            " 'StartSel=[, StopSel=], MaxWords=40, MinWords=15, MaxFragments=2')"
            " AS excerpt FROM hits CROSS JOIN q ORDER BY hits.score DESC, hits.created_at,"
            " hits.artifact_id"
        )

    def _xmany(self, conn: Any, query: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            with conn.cursor() as cur:
                cur.executemany(self._sql(query), rows)

    def _migrate_sync(self, target: int = SCHEMA_VERSION) -> int:
        current = super()._migrate_sync(target)
        self._batched = current >= pg_events.BATCHED_SCHEMA
        self._op_results = current >= pg_commit.OP_RESULTS_SCHEMA
        # An op's result is the row of `op_results` that has its id, if any (schema 12).
        self._ops = pg_commit.OPS_JOINED if self._op_results else "ops"
        return current

    def _write_records(self, conn: Any, c: Commit, now: float) -> None:
        # Without a pipeline (`_commit_requests`): the ops as `_pg_commit` writes them.
        if not self._op_results or not c.ops:
            super()._write_records(conn, c, now)
            return
        super()._write_records(conn, dataclasses.replace(c, ops=()), now)
        ops = rules.collapse(c.ops, lambda o: o.op_id, rules.merge_op, now)
        pg_commit.write_ops(functools.partial(self._xmany, conn), [self._params(o) for o in ops])

    def _add_events(self, conn: Any, task_id: str, rows: list[dict[str, Any]]) -> None:
        if not self._batched or not rows:
            super()._add_events(conn, task_id, rows)
            return
        self._x(conn, pg_events.INSERT, pg_events.batch_row(rows, _dumps))

    def _events_query(self, cols: str, where: str, lim: str) -> str:
        if not self._batched:
            return super()._events_query(cols, where, lim)
        return pg_events.events_query(cols, where, lim)

    def _lock_migrations(self, conn: Any) -> None:
        # Another process may be migrating: wait for it longer than for a task's lock.
        conn.execute("SET LOCAL lock_timeout = '120s'")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def _run_script(self, conn: Any, sql: str) -> None:
        conn.execute(sql)

    async def close(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.close)
        # The threads end once their calls have (none is left after the pool's close but
        # one failing on it), off the loop; their eventfds are let go on their loops.
        await asyncio.to_thread(self._executor.shutdown)
