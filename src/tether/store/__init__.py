"""Storage backends and `open_store(url)`.

URLs: `sqlite:///relative/or/absolute/path.db` (default `.tether/tether.db`),
`postgresql://user@host:port/db[?schema=name]`, `memory://`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tether import errors
from tether.clock import Clock
from tether.store.base import (
    SCHEMA_VERSION,
    ApprovalRecord,
    ArtifactRecord,
    CommitResult,
    Lease,
    LedgerRecord,
    LedgerWrite,
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
    "ArtifactRecord",
    "CommitResult",
    "Lease",
    "LedgerRecord",
    "LedgerWrite",
    "OpRecord",
    "Store",
    "StoredEvent",
    "TaskPatch",
    "TaskRecord",
    "default_url",
    "open_store",
    "sqlite_path",
]


def default_url() -> str:
    """`TETHER_DB` if set, else the SQLite file `.tether/tether.db` in the working folder."""
    return os.environ.get("TETHER_DB") or DEFAULT_URL


def sqlite_path(url: str) -> Path:
    """The file path of a `sqlite:///` URL (three slashes, then the path)."""
    rest = url[len("sqlite://") :]
    if rest.startswith("/"):
        rest = rest[1:]
    if not rest:
        raise errors.StoreConfigError(f"{url!r} names no file; use sqlite:///path/to/file.db")
    return Path(rest)


async def open_store(
    url: str | None = None,
    *,
    clock: Clock | None = None,
    create: bool = True,
    synchronous: str | None = None,
) -> Store:
    """Open a store by URL, migrating it to the current schema."""
    url = url or default_url()
    if url.startswith("sqlite://"):
        from tether.store.sqlite import SQLiteStore

        sync = (synchronous or os.environ.get("TETHER_SQLITE_SYNCHRONOUS") or "FULL").upper()
        if sync not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise errors.StoreConfigError(f"synchronous={sync!r} is not OFF, NORMAL, FULL or EXTRA")
        return await SQLiteStore.open(
            sqlite_path(url),
            clock=clock,
            create=create,
            synchronous=sync,  # type: ignore[arg-type]
        )
    if url.startswith(("postgresql://", "postgres://")):
        from tether.store.postgres import PostgresStore

        return await PostgresStore.open(url, clock=clock)
    if url.startswith("memory://"):
        from tether.store.memory import MemoryStore

        return await MemoryStore.open(clock)
    raise errors.StoreConfigError(
        f"unknown database URL {url!r}: expected sqlite:///path, postgresql://... or memory://"
    )
