"""`tether serve`: the web dashboard (needs the `web` extra)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from tether import errors
from tether._extras import needs
from tether.cli._app import DbOpt, app, err, fail
from tether.cli.views import clean


@app.command()
def serve(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (only this machine by default).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port (0: any free one).", min=0, max=65535)
    ] = 8765,
    db: DbOpt = None,
) -> None:
    """The web dashboard: tasks, live ledger and timeline, decisions, calls, reports.

    Changing anything needs the token: TETHER_TOKEN, or one generated and printed
    here. Open the printed link to sign your browser in."""
    try:
        with needs("web", "tether serve"):
            from tether.web.security import new_token
            from tether.web.server import serve as run_server
    except errors.UserError as exc:
        raise fail(exc, 2) from None
    from tether.store import default_url, sqlite_path

    url = db or default_url()
    if url.startswith("sqlite://") and not sqlite_path(url).exists():
        raise fail(errors.StoreConfigError(f"no tether database at {sqlite_path(url)}"), 2)
    token = os.environ.get("TETHER_TOKEN") or new_token()
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: listening on {clean(host)}: anyone who reaches it can read tasks")

    def announce(base: str) -> None:
        # One line on stdout a person (or a test) can read: the link signs in.
        sys.stdout.write(f"tether dashboard on {base}/?token={token}\n")
        sys.stdout.flush()

    try:
        run_server(db=url, host=host, port=port, token=token, announce=announce)
    except errors.UserError as exc:
        raise fail(exc, 2) from None
