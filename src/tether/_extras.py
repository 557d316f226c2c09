"""The optional extras, and what a command says when the one it needs is missing.

The core install (`pip install tether`) runs every command that needs no extra. A
command that needs one imports it where it is used, inside `needs(...)`, which turns
the missing package into one line with the install command, spelled one way
everywhere:

    tether serve needs the web extra (fastapi is not installed): pip install 'tether[web]'

That is a `MissingExtra` (a `UserError`: exit 2, never a traceback). An `ImportError`
of anything else (a bug, a package outside the extra) is left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tether.errors import UserError

#: Each extra and the top-level modules it brings that tether imports.
EXTRAS: dict[str, frozenset[str]] = {
    "postgres": frozenset({"psycopg", "psycopg_pool"}),
    "openai": frozenset({"openai"}),
    "anthropic": frozenset({"anthropic"}),
    "web": frozenset(
        {
            "fastapi",
            "starlette",
            "uvicorn",
            "sse_starlette",
            "jinja2",
            "multipart",
            "python_multipart",
            "prometheus_client",
            "matplotlib",
        }
    ),
    "report": frozenset({"matplotlib"}),
    "otel": frozenset({"opentelemetry", "prometheus_client"}),
    "metrics": frozenset({"prometheus_client"}),
    "mcp": frozenset({"mcp", "mcp_types", "jsonschema"}),
}


def install_hint(extra: str) -> str:
    """The command that installs `extra`, as every message and page spells it."""
    if extra not in EXTRAS:
        raise ValueError(f"no extra named {extra!r}")
    return f"pip install 'tether[{extra}]'"


class MissingExtra(UserError):
    """A command needs an optional extra that is not installed."""

    def __init__(self, what: str, extra: str, module: str | None = None, *, broken: bool = False):
        if module is None:
            why = ""
        elif broken:
            why = f" ({module} is installed but not in the version tether needs)"
        else:
            why = f" ({module} is not installed)"
        super().__init__(
            f"{what} needs the {extra} extra{why}: {install_hint(extra)}",
            extra=extra,
            module=module,
        )
        self.extra = extra


def missing(exc: ImportError, extra: str) -> str | None:
    """The module of `extra` whose absence `exc` reports, or None when `exc` is about
    something else."""
    name = exc.name or ""
    top = name.split(".")[0]
    return name if top in EXTRAS[extra] else None


@contextlib.contextmanager
def needs(extra: str, what: str) -> Iterator[None]:
    """Run the imports in the block; a module of `extra` that is missing (or too old to
    have what is imported) raises `MissingExtra` naming `what` (the command or the
    feature, e.g. `tether serve`)."""
    if extra not in EXTRAS:
        raise ValueError(f"no extra named {extra!r}")
    try:
        yield
    except ImportError as exc:
        module = missing(exc, extra)
        if module is None:
            raise
        broken = not isinstance(exc, ModuleNotFoundError) or "." in module
        shown = module.split(".")[0] if broken else module
        raise MissingExtra(what, extra, shown, broken=broken) from None
