"""`tether serve`: the web dashboard (needs the `web` extra)."""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from tether import errors
from tether._extras import needs
from tether.cli._app import DbOpt, NoMigrateOpt, app, err, fail, lasting_db, run_async
from tether.cli.views import clean

#: An `--allowed-host`: `*`, `*.domain`, or a host name or address (no port).
_HOST = re.compile(r"\*|(\*\.)?[A-Za-z0-9_.-]+|\[?[0-9A-Fa-f:.]+\]?")


def _hosts(flags: list[str] | None) -> list[str]:
    """The `--allowed-host` names, else `TETHER_ALLOWED_HOSTS` (a comma list)."""
    source = "--allowed-host"
    names = list(flags or ())
    if not names and os.environ.get("TETHER_ALLOWED_HOSTS"):
        source = "TETHER_ALLOWED_HOSTS"
        names = os.environ["TETHER_ALLOWED_HOSTS"].split(",")
    out = []
    for name in (n.strip() for n in names):
        if not _HOST.fullmatch(name):
            raise errors.UserError(
                f"{source}: {name!r} is not a host name (a name, *.domain, or * for any; "
                "no scheme, port or path)"
            )
        out.append(name.strip("[]").lower())
    return out


def _named(tokens_file: Path | None) -> dict[str, str] | None:
    """The named tokens of `--tokens-file` (or `TETHER_TOKENS`), None without any."""
    from tether.web.security import parse_tokens

    if tokens_file is not None:
        try:
            text = tokens_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise errors.UserError(f"--tokens-file {tokens_file}: cannot read it: {why}") from None
        return parse_tokens(text, f"--tokens-file {tokens_file}")
    if os.environ.get("TETHER_TOKENS", "").strip():
        return parse_tokens(os.environ["TETHER_TOKENS"], "TETHER_TOKENS", lines=False)
    return None


def _proxies(value: str | None) -> str | None:
    """`--forwarded-allow-ips` (or `TETHER_FORWARDED_ALLOW_IPS`) as given, once each
    entry is checked: an address, a network or `*` (a typo would trust no proxy, and the
    sign-in would leave https without a word)."""
    if value is None or not value.strip():
        return value
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise errors.UserError(
                f"--forwarded-allow-ips (TETHER_FORWARDED_ALLOW_IPS): {entry!r} is not an "
                "address or a network (e.g. 10.0.0.5, 10.0.0.0/8, or * for all), "
                "comma-separated"
            ) from None
    return value


def _shared_token() -> str | None:
    """`TETHER_TOKEN` when set, held to the rule of a named token (at least
    `MIN_TOKEN_CHARS` characters, no spaces or commas): it guards every decision, and
    the printed sign-in link carries it."""
    from tether.web.security import MIN_TOKEN_CHARS

    token = os.environ.get("TETHER_TOKEN")
    if not token:
        return None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() or c == "," for c in token):
        raise errors.UserError(
            f"TETHER_TOKEN must be at least {MIN_TOKEN_CHARS} characters without spaces "
            'or commas (e.g. from `python -c "import secrets; '
            'print(secrets.token_urlsafe(24))"`), or unset for one generated at start'
        )
    return token


async def _open_once(url: str, migrate: bool) -> None:
    """Open the database as the app will (migrating it, or refusing an old schema with
    `--no-migrate`), so that a refusal is one paragraph before the server starts."""
    from tether.store.opening import open_db

    lasting_db(url, "the dashboard would show no task")
    store = await open_db(url, create=False, migrate=migrate)
    await store.close()


@app.command()
def serve(
    host: Annotated[
        str,
        typer.Option(
            "--host", metavar="ADDRESS", help="Address to listen on (only this machine by default)."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", metavar="PORT", help="Port (0: any free one).", min=0, max=65535),
    ] = 8765,
    db: DbOpt = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME",
            help="A host name the dashboard answers to besides this machine's (the name a "
            "reverse proxy serves it under; *.domain for a domain's, * for any); "
            "repeatable; also TETHER_ALLOWED_HOSTS (comma-separated).",
            show_default=False,
        ),
    ] = None,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            "--forwarded-allow-ips",
            metavar="IPS",
            envvar="TETHER_FORWARDED_ALLOW_IPS",
            help="Proxies (comma-separated addresses or networks, * for all) whose "
            "X-Forwarded-For and X-Forwarded-Proto headers are trusted; none by default; "
            "also TETHER_FORWARDED_ALLOW_IPS.",
            show_default=False,
            show_envvar=False,
        ),
    ] = None,
    tokens_file: Annotated[
        Path | None,
        typer.Option(
            "--tokens-file",
            metavar="FILE",
            envvar="TETHER_TOKENS_FILE",
            help="Named tokens, one per person: lines of name:token. The name is the "
            "--by of every decision taken with that token. Also TETHER_TOKENS "
            "(name:token,name:token) or TETHER_TOKENS_FILE.",
            show_default=False,
            show_envvar=False,
        ),
    ] = None,
    no_migrate: NoMigrateOpt = False,
) -> None:
    """The web dashboard: tasks, live ledger and timeline, decisions, calls, reports.

    Changing anything needs a token: a named one (--tokens-file, TETHER_TOKENS), else
    TETHER_TOKEN, else one generated and printed here. Open the printed link to sign
    your browser in (with named tokens, add ?token=YOURS to it)."""
    try:
        with needs("web", "tether serve"):
            from tether.web.security import new_token
            from tether.web.server import serve as run_server
        hosts = _hosts(allowed_host)
        named = _named(tokens_file)
        forwarded_allow_ips = _proxies(forwarded_allow_ips)
        shared = None if named else _shared_token()
    except errors.UserError as exc:
        raise fail(exc, 2) from None
    from tether.store import default_url, sqlite_path

    url = db or default_url()
    if url.startswith("sqlite://") and not sqlite_path(url).exists():
        raise fail(errors.StoreConfigError(f"no tether database at {sqlite_path(url)}"), 2)
    run_async(lambda: _open_once(url, not no_migrate))
    token: str | None = None
    if named:
        if os.environ.get("TETHER_TOKEN"):
            err.print("warning: TETHER_TOKEN is not used: each person signs in with a named token")
    else:
        token = shared or new_token()
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: listening on {clean(host)}: anyone who reaches it can read tasks")
    if "*" in hosts:
        err.print("warning: --allowed-host *: any host name is answered (no DNS rebinding check)")

    def announce(base: str) -> None:
        # One line on stdout a person (or a test) can read: the link signs in.
        if token:
            sys.stdout.write(f"tether dashboard on {base}/?token={token}\n")
        else:  # named tokens: each person adds their own; none is shown
            sys.stdout.write(f"tether dashboard on {base}/?token=YOURS (your own token)\n")
        sys.stdout.flush()

    try:
        run_server(
            db=url,
            host=host,
            port=port,
            token=token,
            announce=announce,
            named=named,
            allowed_hosts=hosts,
            forwarded_allow_ips=forwarded_allow_ips,
            migrate=not no_migrate,
        )
    except errors.UserError as exc:
        raise fail(exc, 2) from None
