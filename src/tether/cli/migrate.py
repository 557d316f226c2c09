"""`tether migrate`: bring a database to this tether's schema, or (`--check`) say whether
it needs it (see `tether.store.schema_policy`)."""

from __future__ import annotations

from typing import Annotated

import typer

from tether import errors
from tether.cli._app import DbOpt, JsonOpt, app, out, print_json, run_async


async def _found(url: str) -> int:
    """The database's schema version, migrating and creating nothing (0: no tether
    tables, or no SQLite file, yet); `SchemaTooNew` for a newer schema this tether may
    not run on."""
    from tether.store import open_store, sqlite_path

    if url.startswith("sqlite://") and not sqlite_path(url).exists():
        return 0
    try:
        store = await open_store(url, migrate=False)
    except errors.SchemaOutdated as exc:
        return int(exc.fields["found"])
    try:
        return await store.schema_version()
    finally:
        await store.close()


async def _apply(url: str) -> int:
    from tether.store.opening import open_db

    store = await open_db(url)
    try:
        return await store.schema_version()
    finally:
        await store.close()


@app.command()
def migrate(
    db: DbOpt = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Change nothing: exit 1 when migrations are pending, 0 when the schema is "
            "current (for CI and deploy scripts).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Apply the pending migrations of the database (commands that write do it too,
    unless started with --no-migrate); print the schema versions before and after.

    A database migrated by a newer tether is left as it is: this tether runs on it
    when the newer migrations declare it compatible, and refuses it (exit 2) when not.
    With --json: `{"state", "found", "code", "pending", "reached"}`, state one of
    `current`, `newer`, `pending` (with --check) and `migrated`; the exit codes stay."""
    from tether.store import default_url
    from tether.store.schema_policy import code_schema

    url = db or default_url()
    code = code_schema()
    found = run_async(lambda: _found(url))

    def say(state: str, text: str, reached: int) -> None:
        if as_json:
            pending = max(0, code - reached)
            doc = {"state": state, "found": found, "code": code, "pending": pending}
            print_json({**doc, "reached": reached})
        else:
            out.print(text)

    if found > code:
        text = f"schema {found}: newer than this tether's ({code}) and compatible with it"
        say("newer", f"{text}; nothing to migrate", found)
        return
    if found == code:
        say("current", f"schema {found}: current; nothing to migrate", found)
        return
    pending = code - found
    if check:
        say(
            "pending",
            f"schema {found}: {pending} migration(s) pending to reach schema {code}; "
            "run `tether migrate`",
            found,
        )
        raise typer.Exit(1)
    reached = run_async(lambda: _apply(url))
    say("migrated", f"migrated from schema {found} to {reached}", reached)
