"""The PostgreSQL store: many workers on many machines.

psycopg 3 with a `psycopg_pool` connection pool. Task rows are locked with
`FOR UPDATE` inside each commit and claimers skip each other's rows with
`FOR UPDATE SKIP LOCKED`. A `schema=NAME` query parameter in the URL puts tether's
tables in their own schema (created if missing), which tests use for isolation.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tether import errors
from tether.clock import Clock
from tether.store._sql import SqlStore
from tether.store.base import SCHEMA_VERSION

T = TypeVar("T")
_PLACEHOLDER = re.compile(r"(?<![:\w]):(\w+)")
_MIGRATION_LOCK = 0x7E7E_0001


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


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
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


class PostgresStore(SqlStore):
    """The multi-worker store."""

    dialect = "postgres"
    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"

    def __init__(self, url: str, *, clock: Clock | None = None, max_size: int = 8) -> None:
        super().__init__(_redact(url), clock)
        self._conninfo, self.schema = split_schema(url)
        self._max_size = max_size
        self._pool: Any = None

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        clock: Clock | None = None,
        max_size: int = 8,
        connect_timeout: float = 5.0,
        migrate_to: int = SCHEMA_VERSION,
    ) -> PostgresStore:
        """Connect, create the schema if asked, and migrate."""
        store = cls(url, clock=clock, max_size=max_size)
        try:
            await asyncio.to_thread(store._open_sync, connect_timeout)
            await store._run(store._migrate_sync, migrate_to)
        except BaseException:
            await store.close()
            raise
        return store

    def _open_sync(self, connect_timeout: float) -> None:
        try:
            import psycopg
            from psycopg.rows import dict_row
            from psycopg_pool import ConnectionPool
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise errors.StoreConfigError(
                "PostgreSQL support is not installed: pip install 'tether[postgres]'"
            ) from exc
        try:
            # A direct first connection gives libpq's own words when the server is away.
            conn = psycopg.connect(
                self._conninfo, connect_timeout=max(1, int(connect_timeout)), autocommit=True
            )
        except psycopg.Error as exc:
            raise errors.StoreUnavailable(
                f"cannot connect to PostgreSQL at {self.url}: {_first_line(exc)}"
            ) from exc
        with conn:
            if self.schema:
                self._create_schema(conn, psycopg)
        schema = self.schema

        def configure(conn: Any) -> None:
            if schema:
                conn.execute(f'SET search_path TO "{schema}"')

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

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def _sql(self, query: str) -> str:
        return _PLACEHOLDER.sub(r"%(\1)s", query)

    @contextmanager
    def _tx(self, write: bool) -> Iterator[Any]:
        import psycopg

        if self._pool is None:
            raise errors.StoreError("the store is closed")
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except psycopg.OperationalError as exc:
            raise errors.StoreUnavailable(f"PostgreSQL at {self.url} failed: {exc}") from exc
        except psycopg.Error as exc:
            raise errors.StoreError(f"PostgreSQL error at {self.url}: {exc}") from exc

    def _xmany(self, conn: Any, query: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            with conn.cursor() as cur:
                cur.executemany(self._sql(query), rows)

    def _lock_migrations(self, conn: Any) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def _existing_tables(self, conn: Any) -> set[str]:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        return {r["table_name"] for r in rows}

    def _run_script(self, conn: Any, sql: str) -> None:
        conn.execute(sql)

    async def close(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.close)
