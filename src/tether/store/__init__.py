"""Storage backends and `open_store(url)`.

URLs: `sqlite:///relative/or/absolute/path.db[?synchronous=LEVEL]` (default
`.tether/tether.db`), `postgresql://user@host:port/db[?schema=name]`, `memory://`.

SQLite's `synchronous` level is FULL unless asked otherwise: by the `synchronous=`
argument of `open_store`, else the URL's `?synchronous=` (`off`, `normal`, `full` or
`extra`, any case), else the `TETHER_SQLITE_SYNCHRONOUS` environment variable. NORMAL
(in WAL mode) keeps the database consistent after a crash of the process or the machine
but may lose the last commits on a power loss or OS crash; see `tether.store.sqlite`.
`?busy_timeout=SECONDS` bounds how long a SQLite write waits for another process's lock
(30 s by default) before it fails with `StoreBusy`.

`open_store(url, read_only=True)` is for commands that only show things: it migrates
nothing and takes no write lock (a database that needs migrating is refused with
`SchemaOutdated`), so it works while another process writes and on read-only media.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypedDict
from urllib.parse import parse_qsl

from tether import errors
from tether.clock import Clock
from tether.store._sqlite_level import sqlite_synchronous
from tether.store.base import (
    SCHEMA_VERSION,
    ApprovalRecord,
    ArtifactHit,
    ArtifactRecord,
    CommitResult,
    Lease,
    LedgerRecord,
    LedgerWrite,
    MarksWrite,
    OpRecord,
    Store,
    StoredEvent,
    TaskPatch,
    TaskRecord,
)

DEFAULT_URL = "sqlite:///.tether/tether.db"

__all__ = [
    "DEFAULT_URL",
    "SCHEMA_VERSION",
    "ApprovalRecord",
    "ArtifactHit",
    "ArtifactRecord",
    "CommitResult",
    "Lease",
    "LedgerRecord",
    "LedgerWrite",
    "MarksWrite",
    "OpRecord",
    "OpenOptions",
    "Store",
    "StoredEvent",
    "TaskPatch",
    "TaskRecord",
    "default_url",
    "open_store",
    "sqlite_path",
    "sqlite_synchronous",
]


def default_url() -> str:
    """`TETHER_DB` if set, else the SQLite file `.tether/tether.db` in the working folder."""
    return os.environ.get("TETHER_DB") or DEFAULT_URL


#: The `synchronous` levels SQLite knows.
#: The query parameters a `sqlite:///` URL may carry.
SQLITE_URL_PARAMS = ("synchronous", "busy_timeout")


def _sqlite_split(url: str) -> tuple[str, dict[str, str]]:
    """`(path part, query parameters)` of a `sqlite:///` URL; unknown parameters refused."""
    rest, _, query = url[len("sqlite://") :].partition("?")
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in SQLITE_URL_PARAMS:
            raise errors.StoreConfigError(
                f"{url!r}: unknown parameter {key!r}; a sqlite:/// URL takes"
                f" {', '.join(SQLITE_URL_PARAMS)}"
            )
        params[key] = value
    return rest, params


def sqlite_path(url: str) -> Path:
    """The file path of a `sqlite:///` URL (three slashes, then the path; a `?query`
    after it is not part of the path)."""
    rest, _ = _sqlite_split(url)
    if rest.startswith("/"):
        rest = rest[1:]
    if not rest:
        raise errors.StoreConfigError(f"{url!r} names no file; use sqlite:///path/to/file.db")
    return Path(rest)


def _busy_timeout_ms(url: str, value: str | None) -> int:
    from tether.store.sqlite import DEFAULT_BUSY_TIMEOUT_MS

    if value is None:
        return DEFAULT_BUSY_TIMEOUT_MS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:  # also refuses NaN
        raise errors.StoreConfigError(
            f"{url}: busy_timeout={value!r} is not a number of seconds between 0 and 3600"
        )
    return max(1, int(seconds * 1000))


class OpenOptions(TypedDict, total=False):
    """How `open_store` opens any database (and `open_db`, which passes them on)."""

    clock: Clock | None
    read_only: bool
    migrate: bool


async def open_store(
    url: str | None = None,
    *,
    clock: Clock | None = None,
    create: bool = True,
    synchronous: str | None = None,
    read_only: bool = False,
    migrate: bool = True,
) -> Store:
    """Open a store by URL, migrating it to the current schema (`read_only`: migrating
    nothing, taking no write lock; `migrate=False`: refusing a schema below the current
    one with `SchemaOutdated` instead of migrating it; see the module)."""
    url = url or default_url()
    if url.startswith("sqlite://"):
        from tether.store.sqlite import SQLiteStore

        path = sqlite_path(url)
        _, params = _sqlite_split(url)
        env = os.environ.get("TETHER_SQLITE_SYNCHRONOUS")
        if synchronous is not None:
            sync = sqlite_synchronous(synchronous)
        elif "synchronous" in params:
            sync = sqlite_synchronous(params["synchronous"], f"{url}: synchronous")
        elif env:
            sync = sqlite_synchronous(env, "TETHER_SQLITE_SYNCHRONOUS")
        else:
            sync = "FULL"
        return await SQLiteStore.open(
            path,
            clock=clock,
            create=create,
            synchronous=sync,  # type: ignore[arg-type]
            busy_timeout_ms=_busy_timeout_ms(url, params.get("busy_timeout")),
            read_only=read_only,
            migrate=migrate,
        )
    if url.startswith(("postgresql://", "postgres://")):
        from tether.store.postgres import PostgresStore

        return await PostgresStore.open(url, clock=clock, read_only=read_only, migrate=migrate)
    if url.startswith("memory://"):
        from tether.store.memory import MemoryStore

        return await MemoryStore.open(clock)
    raise errors.StoreConfigError(
        f"unknown database URL {url!r}: expected sqlite:///path, postgresql://... or "
        f"memory://{_url_hint(url)}"
    )


def _url_hint(url: str) -> str:
    """A likely meant URL for a bare file path (`--db tether.db`)."""
    if "://" in url or not url.strip() or "\n" in url:
        return ""
    scheme, colon, rest = url.partition(":")
    if colon and scheme.lower() in ("sqlite", "sqlite3") and rest:
        url = rest  # `sqlite:tether.db`: the slashes were left out
    try:
        path = Path(url).expanduser()
        if path.suffix in (".db", ".sqlite", ".sqlite3") or path.is_file():
            return f" (a file: sqlite:///{path.resolve()})"
    except (OSError, RuntimeError, ValueError):  # a name too long, a bad ~user, a NUL
        pass
    return ""
