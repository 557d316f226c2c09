"""`open_db`: the store a command names, with a clear error when it is not there.

Kept apart from `tether.runtime.wiring` (which builds engines, models and tools) so a
command that only reads the database imports the store and nothing of the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from tether import errors
from tether.store import OpenOptions, default_url, open_store, sqlite_path

if TYPE_CHECKING:
    from tether.store.base import Store


async def open_db(
    db: str | None = None, *, create: bool = True, **options: Unpack[OpenOptions]
) -> Store:
    """Open the store at `db` (default: `TETHER_DB`, else `.tether/tether.db`), with
    `open_store`'s `options`.

    With `create=False` a missing SQLite file is a `StoreConfigError` instead of a new,
    empty database (for commands that read or continue existing tasks); `read_only`
    migrates nothing and takes no write lock (for commands that only show things);
    `migrate=False` (`--no-migrate`) refuses a schema below this tether's, and a missing
    file, instead of migrating or creating (see `tether.store.schema_policy`)."""
    url = db or default_url()
    create = create and options.get("migrate", True)
    if url.startswith("sqlite://"):
        path = sqlite_path(url)
        try:
            exists = path.exists()
        except (OSError, ValueError) as exc:  # a name too long, a NUL character
            shown = str(path) if len(str(path)) <= 80 else str(path)[:77] + "..."
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise errors.StoreConfigError(
                f"cannot use {shown!r} as a database file: {reason}"
            ) from None
        if not create and not exists:
            raise errors.StoreConfigError(
                f"no tether database at {path} (start a task with `tether run` or "
                "`tether demo`, or point --db / TETHER_DB at your database)"
            )
    return await open_store(url, **options)
