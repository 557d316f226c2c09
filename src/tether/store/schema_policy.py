"""Which tether may run on which schema: the migration policy.

Every migration (schema version V) declares the oldest code that can still run on a
database at V, as the schema version that code knows: `COMPATIBLE_FROM[V]`. A tether
that knows schema K runs on a database at V > K when every migration above K declares
K or less; otherwise it refuses the database (`SchemaTooNew`), before touching it.

- A migration that only adds what older code neither reads nor must write (a table, an
  index, a column with a default, storage settings) keeps the previous migration's
  value: old workers go on beside new ones on the migrated database.
- One that moves, drops or renames what older code reads, or adds a rule older code's
  writes would break, declares its own version: every older tether is refused.

An older tether cannot know later migrations, so the migrator records each version's
value in `tether_schema.compatible_from`, and the check reads it from there (a version
recorded without it, by a tether older than this policy, is compatible with no older
code). A tether never migrates a database down, and `--no-migrate` (or
`TETHER_NO_MIGRATE=1`) refuses a database below its own schema instead of migrating it:
`tether migrate` does that.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

from tether import errors
from tether.store import base

#: For each schema version, the oldest schema version whose code can still run on it.
#: 5 only sets PostgreSQL storage parameters (nothing for SQLite): additive. 4 adds the
#: search index, which code of schema 3 would not fill; 6 moves the specs out of `tasks`;
#: 7 moves the ledgers' state and skeleton out of `ledgers`; 8 the run state's progress
#: marks out of `tasks.usage` (older code would find none and write them where 8 reads
#: none); 9 keys SQLite's events by the task's number (older code would write events
#: outside their task's range); 10 stores PostgreSQL's events compacted (older code
#: would read them with their default fields missing); 11 writes PostgreSQL's events a
#: row per commit (`events` is a view there: older code could not write it); 12 moves
#: PostgreSQL's op results to `op_results` (older code would write the dropped column).
COMPATIBLE_FROM: Mapping[int, int] = {
    **{1: 1, 2: 2, 3: 3, 4: 4, 5: 4, 6: 6, 7: 7, 8: 8, 9: 9, 10: 10},
    11: 11,
    12: 12,
}
#: Where a migration is another thing on one dialect: 9 changes nothing on PostgreSQL,
#: so code of schema 8 runs on a PostgreSQL database at 9 (a rolling upgrade of
#: PostgreSQL workers goes on), while SQLite's refuses it; 10 changes nothing on SQLite
#: (it stored events and results so already), so code of 9 runs on a SQLite database
#: at 10, while PostgreSQL's refuses it; 11 and 12 change nothing on SQLite either (code
#: of 9 still runs there).
COMPATIBLE_FROM_BY_DIALECT: Mapping[str, Mapping[int, int]] = {
    "postgres": {9: 8},
    "sqlite": {10: 9, 11: 9, 12: 9},
}

#: The column of `tether_schema` that records `COMPATIBLE_FROM` with each version.
COLUMN = "compatible_from"


def code_schema() -> int:
    """The schema version this tether's code knows (read at each call)."""
    return base.SCHEMA_VERSION


def compatible_from(version: int, dialect: str = "") -> int:
    """The oldest code's schema version that can run on a database at `version` (of
    `dialect`, where its migration differs there)."""
    own = COMPATIBLE_FROM_BY_DIALECT.get(dialect, {})
    return own.get(version, COMPATIBLE_FROM.get(version, version))


def check_newer(rows: Iterable[Mapping[str, Any]], found: int, code: int) -> None:
    """Refuse a database at `found` > `code` unless every migration above `code` (its
    `tether_schema` rows, `rows`) declares code of schema `code` compatible."""
    needs = code
    for row in rows:
        version = int(row["version"])
        if version <= code:
            continue
        keys = row.keys() if hasattr(row, "keys") else ()
        declared = row[COLUMN] if COLUMN in keys else None
        needs = max(needs, version if declared is None else int(declared))
    if needs > code:
        raise errors.SchemaTooNew(found, code, needs=needs)


async def open_schema(
    store: Any, connect: Callable[[], Awaitable[object]], *, migrate_to: int | None, read_only: bool
) -> None:
    """Connect `store` (an `SqlStore`) with `connect`, then migrate its schema to
    `migrate_to`, or (None: a read-only or `migrate=False` open) only check it; the
    store is closed again when any of it fails."""
    try:
        await connect()
        if migrate_to is None:
            await store._run(store._check_schema_sync, read_only)
        else:
            await store._run(store._migrate_sync, migrate_to)
    except BaseException:
        await store.close()
        raise


def check_database(store: Any, conn: Any, found: int) -> None:
    """`check_newer` for the database `store` (an `SqlStore`) reads on `conn`, when its
    schema `found` is above this tether's."""
    code = code_schema()
    if found > code:
        query = "SELECT * FROM tether_schema WHERE version > :v"
        check_newer(store._x(conn, query, {"v": code}).fetchall(), found, code)


def prepare_table(store: Any, conn: Any, exists: bool) -> None:
    """Create `tether_schema`, or give one made before this policy its column (in the
    migration's transaction, under its lock)."""
    if not exists:
        store._run_script(
            conn,
            "CREATE TABLE tether_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            f" applied_at DOUBLE PRECISION NOT NULL, {COLUMN} INTEGER)",
        )
        return
    cur = store._x(conn, "SELECT * FROM tether_schema WHERE version < 0")
    if COLUMN not in [d[0] for d in cur.description]:
        store._run_script(conn, f"ALTER TABLE tether_schema ADD COLUMN {COLUMN} INTEGER")


def record(store: Any, conn: Any, version: int, name: str) -> None:
    """Record migration `version` as applied, with the oldest code it declares."""
    dialect = str(store.dialect)
    store._x(
        conn,
        f"INSERT INTO tether_schema (version, name, applied_at, {COLUMN}) VALUES (:v, :n, :t, :c)",
        {"v": version, "n": name, "t": store.clock.now(), "c": compatible_from(version, dialect)},
    )


def behind(url: str, found: int, needed: int, *, read_only: bool) -> errors.SchemaOutdated:
    """The refusal of a database below this tether's schema that it may not migrate: a
    command that only reads, or one started with `--no-migrate`."""
    what = "holds no tether tables yet" if found == 0 else f"is at schema {found}"
    why = (
        "this command only reads"
        if read_only
        else "migrations are off here (--no-migrate or TETHER_NO_MIGRATE)"
    )
    return errors.SchemaOutdated(
        f"{url} {what}, and this tether needs schema {needed}; {why}: run `tether migrate`"
        f" (or a command that writes, such as tether run) to bring it to schema {needed}",
        found=found,
        needed=needed,
    )


def migrations(dialect: str) -> list[tuple[int, str, str]]:
    """`(version, name, sql)` for every migration of a dialect, in order."""
    from importlib import resources  # only a migration reads them; most opens do not

    out = []
    for entry in (resources.files("tether.store") / "migrations" / dialect).iterdir():
        m = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if m:
            out.append((int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    out.sort()
    return out


def iter_statements(script: str) -> Iterator[str]:
    """Split a migration script into statements (no semicolons inside our DDL)."""
    for part in script.split(";"):
        lines = [ln for ln in part.splitlines() if not ln.strip().startswith("--")]
        stmt = "\n".join(lines).strip()
        if stmt:
            yield stmt
