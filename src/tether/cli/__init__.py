"""The `tether` command line.

Interfaces hold no business logic: every command opens the store (or a runtime, see
`tether.runtime.wiring`), calls the runtime or reads projections, and prints through
`views`. User mistakes print one paragraph and exit 2 (3 for an unknown task); nothing
is written on a bad input.

Modules: `_app` (the app, consoles, shared options), `tasks` (status, list, events,
timeline), `run` (run, submit, resume), `decide` (cancel, approvals and decisions),
`edit` (edit, tell), `artifacts`, `rebuild`, `worker`, `demo`, `show` (show, report),
`serve` (the web dashboard), and `views` (rendering).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated

import typer

from tether.cli._app import app, fail, out
from tether.errors import UserError


def _print_version(value: bool) -> None:
    if value:
        from tether import __version__

        out.print(f"tether {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print tether's version and exit.",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    # The options of `tether` itself; each command has its own.
    del version


# Importing a command module registers its commands; --help lists them in this order.
# The modules are light: each command imports what it runs inside its body, so that
# `tether --help` builds the help from signatures alone (no runtime, no SDK, no extra).
for _module in (
    "tasks",
    "run",
    "decide",
    "edit",
    "artifacts",
    "rebuild",
    "worker",
    "demo",
    "show",
    "replay",
    "serve",
):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["app", "main"]


def _undecodable_argument(argv: list[str]) -> str | None:
    """The first argument that is not UTF-8 text (Python keeps its bytes as unpaired
    surrogates, which no database stores), shown as bytes, or None."""
    for arg in argv:
        if any("\udc80" <= c <= "\udcff" for c in arg):
            return repr(os.fsencode(arg))
    return None


def main() -> None:
    """Console entry point."""
    bad = _undecodable_argument(sys.argv[1:])
    if bad is not None:
        raise SystemExit(
            fail(
                UserError(f"the argument {bad} is not UTF-8 text; tether keeps text as UTF-8"), 2
            ).exit_code
        )
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
