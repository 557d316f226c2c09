"""The `tether` command line.

Interfaces hold no business logic: every command opens the store (or a runtime, see
`tether.runtime.wiring`), calls the runtime or reads projections, and prints through
`views`. User mistakes print one paragraph and exit 2 (3 for an unknown task); nothing
is written on a bad input.

Modules: `_app` (the app, consoles, shared options), `tasks` (status, list, events,
timeline), `run` (run, submit, resume), `decide` (cancel, approvals and decisions),
`worker`, `demo`, and `views` (rendering).
"""

from __future__ import annotations

import importlib
import sys

from tether.cli._app import app

# Importing a command module registers its commands; --help lists them in this order.
for _module in ("tasks", "run", "decide", "worker", "demo"):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["app", "main"]


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
