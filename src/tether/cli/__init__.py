"""The `tether` command line.

Interfaces hold no business logic: every command opens the store (or a runtime, see
`tether.runtime.wiring`), calls the runtime or reads projections, and prints through
`views`. User mistakes print one paragraph and exit 2 (3 for an unknown task); nothing
is written on a bad input.

Modules: `_app` (the app, consoles, shared options), `tasks` (status, list, events,
timeline), `run` (run, submit, resume), `decide` (cancel, approvals and decisions),
`edit` (edit, tell), `artifacts`, `rebuild`, `verify`, `worker`, `demo`, `show` (show,
report), `serve` (the web dashboard), `schedule` (recurring tasks), `migrate`, and
`views` (rendering).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any


def _quit_quietly(signum: int, frame: FrameType | None) -> None:
    os._exit(130)


def _is_the_program() -> bool:
    """Whether this process is the `tether` command (its console script, or `python -m
    tether.cli`), not one that merely imports the package (a test, an application)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parent = os.path.basename(os.path.dirname(sys.argv[0])) if name else ""
    return os.path.splitext(name)[0] == "tether" or (name == "__main__.py" and parent == "cli")


# Loading the command line (Typer, Rich, the command's module) takes a few hundred
# milliseconds; a Ctrl-C then raised KeyboardInterrupt inside whichever module was being
# imported, and Python printed its traceback. In the `tether` program, such a Ctrl-C
# ends the process at once with exit 130 (nothing is written yet); `_main` gives Ctrl-C
# back to Python just before the command runs. Not when Ctrl-C is ignored (a background
# job) or someone else handles it.
if _is_the_program() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _quit_quietly)

import typer  # noqa: E402  (after the handler above: its import is most of the wait)

from tether.cli import _app, _logging  # noqa: E402
from tether.errors import UserError  # noqa: E402

if TYPE_CHECKING:
    from tether.cli._app import app

#: Each command and the module that defines it, in the order `--help` lists them.
#: Importing a module registers its commands. A module is light: each command imports
#: what it runs inside its body, so the help is built from signatures alone (no
#: runtime, no SDK, no extra), and a command runs with its own module loaded, not the
#: others (`main`). A command missing here still works: it is found by loading all.
COMMANDS: dict[str, str] = {
    **dict.fromkeys(("status", "list", "events", "timeline", "watch"), "tasks"),
    **dict.fromkeys(("run", "submit", "resume"), "run"),
    **dict.fromkeys(
        ("cancel", "pause", "approve", "reject", "retry", "waive", "abandon", "approvals"),
        "decide",
    ),
    **dict.fromkeys(("edit", "tell"), "edit"),
    "artifacts": "artifacts",
    "rebuild": "rebuild",
    "verify": "verify",
    "worker": "worker",
    "demo": "demo",
    **dict.fromkeys(("show", "report"), "show"),
    "replay": "replay",
    "serve": "serve",
    "migrate": "migrate",
    # Groups of sub-commands come after the commands in `--help` (as Typer lists them).
    "schedule": "schedule",
}


#: The options of `tether` itself that take a value (given before the command).
GLOBAL_OPTIONS = ("--log-level", "--log-format")


def _command_name(argv: Sequence[str] | None) -> str | None:
    """The command `argv` names: its first word that is no option (nor the value of an
    option of `tether` itself)."""
    args = list(argv or ())
    values = {i + 1 for i, a in enumerate(args) if a in GLOBAL_OPTIONS}
    return next((a for i, a in enumerate(args) if not a.startswith("-") and i not in values), None)


#: Options a command does not take but a person may well try on it, and what to do
#: instead (the parser's own answer names the closest option it has, `--help`).
NOT_TAKEN: dict[tuple[str, str], str] = {
    ("submit", "--model"): "submit only queues the task; the workers run it with their "
    "model (tether worker --model MODEL), else the spec's models.actor or TETHER_MODEL",
}


#: Words a person may well try as a command that are options of `tether` itself (the
#: parser's own answer would suggest the closest command: `version` -> `verify`).
NOT_COMMANDS: dict[str, str] = {
    "version": "there is no command 'version': tether --version prints which tether you have",
}


def _not_taken(argv: Sequence[str]) -> str | None:
    """What `NOT_TAKEN` says of an option in `argv` its command does not take, or
    `NOT_COMMANDS` of a command that is none."""
    name = _command_name(argv)
    if name in NOT_COMMANDS:
        return NOT_COMMANDS[name]
    for (command, option), instead in NOT_TAKEN.items():
        if name == command and any(a == option or a.startswith(option + "=") for a in argv):
            return f"{command} takes no {option}: {instead}"
    return None


def load_commands(argv: Sequence[str] | None = None) -> None:
    """Register the command `argv` names (its module alone), none for `--version`
    alone, or, for anything else (`--help`, no command, an unknown one), every
    command."""
    if list(argv or ()) == ["--version"]:
        return  # printed before any command is looked at
    name = _command_name(argv)
    modules = [COMMANDS[name]] if name in COMMANDS else dict.fromkeys(COMMANDS.values())
    for module in modules:
        importlib.import_module(f"{__name__}.{module}")


def __getattr__(name: str) -> Any:
    """`tether.cli.app`: the app with every command registered."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    load_commands()
    return _app.app


def _print_version(value: bool) -> None:
    if value:
        from tether import __version__

        _app.out.print(f"tether {__version__}")
        raise typer.Exit()


def _log_option(name: str, metavar: str, parse: Callable[[str | None], str], help: str) -> Any:
    """A logging option of `tether` itself: also read from `TETHER_LOG_<METAVAR>`,
    checked by `parse` (a bad value: exit 2 with the choices)."""

    def check(value: str | None) -> str:
        try:
            return parse(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None

    return typer.Option(
        name, metavar=metavar, envvar=f"TETHER_LOG_{metavar}", help=help, callback=check
    )


@_app.app.callback()
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
    log_level: Annotated[
        str,
        _log_option(
            "--log-level",
            "LEVEL",
            _logging.parse_level,
            "Log lines on stderr from this level on: debug, info, warning, error, critical.",
        ),
    ] = _logging.DEFAULT_LEVEL,
    log_format: Annotated[
        str,
        _log_option(
            "--log-format",
            "FORMAT",
            _logging.parse_format,
            "Log lines as text, or as json (one object per line).",
        ),
    ] = _logging.DEFAULT_FORMAT,
) -> None:
    # The options of `tether` itself; each command has its own.
    del version
    _logging.configure(log_level, log_format)


__all__ = ["COMMANDS", "app", "load_commands", "main"]


def _undecodable_argument(argv: list[str]) -> str | None:
    """The first argument that is not UTF-8 text (Python keeps its bytes as unpaired
    surrogates, which no database stores), shown as bytes, or None."""
    for arg in argv:
        if any("\udc80" <= c <= "\udcff" for c in arg):
            return repr(os.fsencode(arg))
    return None


def main() -> None:
    """Console entry point."""
    _app.pause_gc()  # on again when the command runs (`run_async`) or ends
    try:
        _main()
    finally:
        _app.resume_gc()


def _main() -> None:
    bad = _undecodable_argument(sys.argv[1:])
    if bad is not None:
        raise SystemExit(
            _app.fail(
                UserError(f"the argument {bad} is not UTF-8 text; tether keeps text as UTF-8"), 2
            ).exit_code
        )
    instead = _not_taken(sys.argv[1:])
    if instead is not None:
        raise SystemExit(_app.fail(UserError(instead), 2).exit_code)
    load_commands(sys.argv[1:])
    try:
        if signal.getsignal(signal.SIGINT) is _quit_quietly:
            # The command handles Ctrl-C from here on (`run`: "stopping after ...").
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _app.app()
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)
