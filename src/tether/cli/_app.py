"""The Typer app, the consoles, the shared options, and running a command's coroutine."""

from __future__ import annotations

import gc
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from tether import errors
from tether.cli._help import HelpTyper
from tether.cli.views import clean, json_text, json_view

if TYPE_CHECKING:
    from tether.store import Store

T = TypeVar("T")
# Help pages are plain text, whole at 80 columns and in a pipe (see `_help`).
app = HelpTyper(
    name="tether",
    help="tether: a durable runtime for long-running LLM agents.",
    pretty_exceptions_enable=False,
)
# Markup and emoji codes are off: task names, objectives and events are user text and
# must print as-is (and through `views.clean`, which escapes control characters).
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)

#: The largest event sequence number or count an option takes (a signed 64-bit integer,
#: what the databases hold); larger values are clamped to it.
MAX_SEQ = 2**63 - 1

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="Database URL: sqlite:///path (default .tether/tether.db) or postgresql://...; "
        "also TETHER_DB.",
        show_default=False,
    ),
]
NoMigrateOpt = Annotated[
    bool,
    typer.Option(
        "--no-migrate",
        envvar="TETHER_NO_MIGRATE",
        help="Refuse a database whose schema is older than this tether's instead of "
        "migrating it (run `tether migrate` first); also TETHER_NO_MIGRATE=1.",
        show_default=False,
        show_envvar=False,
    ),
]
AfterOpt = Annotated[
    int,
    typer.Option(
        "--after", metavar="SEQ", help="Only events with seq > SEQ.", min=0, max=MAX_SEQ, clamp=True
    ),
]
LimitOpt = Annotated[
    int | None,
    typer.Option("--limit", metavar="N", help="At most this many.", min=0, max=MAX_SEQ, clamp=True),
]
TypesOpt = Annotated[
    list[str] | None,
    typer.Option("--type", metavar="TYPE", help="Only these event types (repeatable)."),
]


def repeated(flag: str, metavar: str, help: str) -> Any:
    """A text option given as often as wanted (`--flag VALUE --flag VALUE`)."""
    return typer.Option(flag, metavar=metavar, help=help)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
TaskArg = Annotated[
    str, typer.Argument(metavar="TASK_ID", help="The task's id, as `tether list` shows it.")
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        metavar="MODEL",
        help="Model for the task, e.g. openai:gpt-4.1-mini, anthropic:claude-sonnet-4-5, "
        "openai-compatible:http://127.0.0.1:8000/v1#model (its key, if any, from "
        "TETHER_OPENAI_COMPATIBLE_API_KEY), scripted:module:function.",
    ),
]
#: The longest `--by` (as the web API's `by`).
MAX_BY_CHARS = 200


def _by(value: str) -> str:
    from tether.spec import label_problem

    problem = label_problem(value) or (
        f"is {len(value):,} characters long; at most {MAX_BY_CHARS}"
        if len(value) > MAX_BY_CHARS
        else None
    )
    if problem:
        raise typer.BadParameter(f"the name {problem}")
    return value


ByOpt = Annotated[
    str, typer.Option("--by", metavar="NAME", help="Who decides (journaled).", callback=_by)
]

#: The most seconds `--model-timeout` takes (as `TETHER_MODEL_TIMEOUT`).
MAX_MODEL_TIMEOUT = 3600.0


def _model_timeout(value: float | None) -> float | None:
    if value is not None and not (0 < value <= MAX_MODEL_TIMEOUT):  # also refuses NaN
        raise typer.BadParameter(
            f"{value} is not a number of seconds above 0 and at most {MAX_MODEL_TIMEOUT:g}"
        )
    return value


ModelTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--model-timeout",
        metavar="SECONDS",
        help="Seconds one model request may take before it is given up (and retried); "
        "over the spec's models.timeout and TETHER_MODEL_TIMEOUT (default 300).",
        callback=_model_timeout,
        show_default=False,
    ),
]
ModelRetriesOpt = Annotated[
    int | None,
    typer.Option(
        "--model-retries",
        metavar="N",
        help="How often a failed or timed-out model request is tried again (0-10); over "
        "the spec's models.max_retries and TETHER_MODEL_RETRIES (default 3).",
        min=0,
        max=10,
        show_default=False,
    ),
]


def model_options(timeout: float | None, retries: int | None) -> dict[str, float | int | None]:
    """`--model-timeout` / `--model-retries` as `open_runtime`'s `model_options`."""
    return {"timeout": timeout, "max_retries": retries}


#: The longest run without a space an error message shows whole: an echoed value (a
#: 100,000-character task id, say) is cut to its start and its length.
MAX_WORD = 300
_LONG_WORD = re.compile(rf"\S{{{MAX_WORD + 1},}}")


def _short_words(text: str) -> str:
    return _LONG_WORD.sub(lambda m: f"{m.group()[:60]}... ({len(m.group()):,} characters)", text)


def fail(exc: BaseException, code: int) -> typer.Exit:
    """Print a user-facing error; the exit to raise."""
    err.print(Text(clean(_short_words(f"tether: {exc}"), lines=True), style="bold red"))
    return typer.Exit(code)


#: The largest `--json` output highlighted on a terminal (characters): rich's
#: highlighting and line handling took 40 s for a long task's 2 million lines of events.
_HIGHLIGHT_MAX = 200_000


def print_json(doc: Any) -> None:
    """Print `doc` as `--json` output (`views.json_text`): highlighted on a terminal,
    written as it is to a pipe or a file (and when long). A reader that stops reading
    (`| head`) ends it quietly."""
    text = json_text(doc)
    if out.is_terminal and len(text) <= _HIGHLIGHT_MAX:
        out.print(json_view(doc))
        return
    stream = out.file
    try:
        stream.write(text)
        stream.write("\n")
        stream.flush()
    except BrokenPipeError:
        # Nothing more is wanted; stdout is pointed at /dev/null so that the flush at
        # exit does not fail again with a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


#: Whether `pause_gc` turned the cyclic garbage collector off (and `resume_gc` must turn
#: it back on).
_gc_paused = False


def pause_gc() -> None:
    """Turn the cyclic garbage collector off while the command starts (`main`).

    Loading a command allocates hundreds of thousands of objects that live as long as
    the process (modules, classes, validators), and each allocation burst triggers
    collections that walk them all: ~10% of a `tether resume`'s CPU before its first
    event, for no garbage. `resume_gc` turns it back on before the command's work."""
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc() -> None:
    """Turn the collector back on (when `pause_gc` turned it off), first moving what
    start-up made into the permanent generation (`gc.freeze`): it stays for the
    process's life, and a long run's full collections need not walk it every time."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an async command; user mistakes become one paragraph and an exit code."""
    import asyncio  # here, not at the top: `tether --help` starts no event loop

    resume_gc()  # the command's modules are loaded: collect its garbage from here on
    try:
        return asyncio.run(main())
    except errors.UserError as exc:
        raise fail(exc, getattr(exc, "exit_code", 2)) from None
    except errors.TetherError as exc:
        raise fail(exc, getattr(exc, "exit_code", 1)) from None


def lasting_db(db: str | None, consequence: str) -> None:
    """Refuse `memory://` (from `--db` or `TETHER_DB`) for a command that needs a
    database outliving it: each command's memory store is its own, empty at start and
    gone at exit, so `consequence` (what would happen there) is never what was meant."""
    from tether.store import default_url

    url = db or default_url()
    if url.startswith("memory://"):
        raise errors.UserError(
            f"{url} keeps nothing between commands (each command has its own, gone when "
            f"it ends): {consequence}; give the database your tasks are in (by default "
            ".tether/tether.db in the folder they were started from, or --db "
            "sqlite:///PATH or postgresql://...)"
        )


async def with_store(
    db: str | None,
    fn: Callable[[Store], Awaitable[T]],
    *,
    create: bool,
    read_only: bool = False,
) -> T:
    """Open the store, call `fn` with it, close it (`read_only`: see `open_store`).
    Without `create` it is an existing database, so never `memory://` (`lasting_db`)."""
    from tether.store.opening import open_db

    if not create:
        lasting_db(db, "no task is there to find")
    store = await open_db(db, create=create, read_only=read_only)
    try:
        return await fn(store)
    finally:
        await store.close()


def on_store(db: str | None, fn: Callable[[Store], Awaitable[T]], *, read_only: bool = False) -> T:
    """A command's work on the existing database at `db`: `fn` with the store (see
    `with_store`; never created), run as `run_async` runs it; what `fn` returns."""
    return run_async(lambda: with_store(db, fn, create=False, read_only=read_only))
