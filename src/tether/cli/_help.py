"""`--help` pages that read whole at any width and in a pipe.

Typer's rich help lays options out in a table that, at 80 columns, cuts option names and
examples with `…` and shows flags as `<bool>` and arguments as `{spec}`. These pages are
plain text instead: every option and command name is printed whole, values are named
the usual way (`--db URL`, `SPEC`, nothing after a flag), descriptions are wrapped at
spaces only (never inside a word, a URL or a model name), and each command's summary is
its whole first paragraph. The width is the terminal's (`COLUMNS`; 80 in a pipe), at
most `MAX_WIDTH`.
"""

from __future__ import annotations

import inspect
import re
import shutil
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

#: The widest help page: longer lines are harder to read, whatever the terminal.
MAX_WIDTH = 100
#: The narrowest page laid out in two columns; below it, text goes under each name.
MIN_WIDTH = 40
#: The widest name column; a longer name puts its description on the next line.
MAX_NAME_COLUMN = 30

#: What a value is called after an option, by the type Typer shows (`<int range>`).
_VALUE_NAMES = {
    "str": "TEXT",
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "NUMBER",
    "float range": "NUMBER",
    "path": "PATH",
    "list[str]": "TEXT",
}


def page_width() -> int:
    """The help page's width: the terminal's (`COLUMNS` first, 80 when there is no
    terminal), between `MIN_WIDTH` and `MAX_WIDTH`."""
    columns = shutil.get_terminal_size(fallback=(80, 24)).columns
    return max(MIN_WIDTH, min(columns, MAX_WIDTH))


def _wrap(text: str, width: int) -> list[str]:
    """`text` as lines of at most `width`, broken at spaces only: a word longer than the
    line is kept whole on a line of its own."""
    lines = textwrap.wrap(text, max(width, 1), break_long_words=False, break_on_hyphens=False)
    return lines or [""]


def _paragraphs(help_text: str) -> list[str | list[str]]:
    """A docstring's paragraphs: each one's lines joined (to be wrapped again), or, for a
    paragraph that starts with click's `\\b` marker, its lines as written."""
    text = inspect.cleandoc(help_text).partition("\f")[0]
    found: list[str | list[str]] = []
    for para in text.split("\n\n"):
        if para.startswith("\b"):
            found.append(para.strip("\b\n").splitlines())
        elif para.strip():
            found.append(" ".join(line.strip() for line in para.splitlines()))
    return found


def _text_block(help_text: str, width: int, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for para in _paragraphs(help_text):
        if lines:
            lines.append("")
        if isinstance(para, list):
            lines += [pad + line for line in para]
        else:
            lines += [pad + line for line in _wrap(para, width - indent)]
    return lines


def _rows(rows: Sequence[tuple[str, str]], width: int) -> list[str]:
    """Two columns, names whole: a description goes beside its name, wrapped in what is
    left of the line, or under it when the name is too long or a word in it would not
    fit beside it."""
    indent, gap = 2, 2
    names = [name for name, _ in rows]
    name_col = min(max((len(n) for n in names), default=0), MAX_NAME_COLUMN)
    text_col = width - indent - name_col - gap
    lines: list[str] = []
    for name, text in rows:
        words = text.split()
        beside = (
            len(name) <= name_col
            and text_col >= MIN_WIDTH // 2
            and all(len(w) <= text_col for w in words)
        )
        if not text:
            lines.append(" " * indent + name)
        elif beside:
            wrapped = _wrap(text, text_col)
            lines.append(" " * indent + name.ljust(name_col + gap) + wrapped[0])
            lines += [" " * (indent + name_col + gap) + line for line in wrapped[1:]]
        else:
            lines.append(" " * indent + name)
            under = indent + 4
            lines += [" " * under + line for line in _wrap(text, width - under)]
    return lines


def value_name(param: TyperOption | TyperArgument, ctx: typer.Context) -> str:
    """What the value of an option is called in its help (`TEXT`, `PATH`, a choice as
    `[md|html]`, or the metavar given), or of an argument (`SPEC`)."""
    if param.metavar is not None:
        return param.metavar
    if isinstance(param, TyperArgument):
        return (param.name or "value").upper()
    shown = (param.display_type(ctx) or "<str>").strip("<>")
    if "|" in shown:
        return f"[{shown}]"
    return _VALUE_NAMES.get(shown, shown.upper())


def _option_name(param: TyperOption, ctx: typer.Context) -> str:
    names = ", ".join(sorted(param.opts, key=lambda o: (o.startswith("--"), o)))
    if param.secondary_opts:
        names += " / " + ", ".join(param.secondary_opts)
    if param.is_flag or param.count:
        return names
    value = value_name(param, ctx)
    return f"{names} {value}" + ("..." if param.nargs != 1 else "")


#: A range whose top is the largest sequence number an option takes (`_app.MAX_SEQ`):
#: no bound to a reader, so `0<=x<=9223372036854775807` reads `x>=0`.
_NO_TOP = re.compile(rf"(\d+)<=x<={2**63 - 1}\b")


def _help_of(param: TyperOption | TyperArgument, ctx: typer.Context) -> str:
    """The parameter's help with Typer's bracketed extras (default, env var, range,
    required), on one line to be wrapped."""
    record = param.get_help_record(ctx)
    return _NO_TOP.sub(r"x>=\1", " ".join((record[1] if record else "").split()))


def usage_pieces(command: TyperCommand, ctx: typer.Context) -> list[str]:
    """What follows the command in its usage line: `[OPTIONS] SPEC [CALL_ID]`."""
    params = command.get_params(ctx)
    pieces = ["[OPTIONS]"] if any(isinstance(p, TyperOption) for p in params) else []
    for param in params:
        if isinstance(param, TyperArgument) and not param.hidden:
            name = value_name(param, ctx) + ("..." if param.nargs != 1 else "")
            pieces.append(name if param.required else f"[{name}]")
    return pieces


def _section(title: str, rows: Sequence[tuple[str, str]], width: int) -> list[str]:
    return ["", f"{title}:", *_rows(rows, width)] if rows else []


def command_help(command: TyperCommand, ctx: typer.Context) -> str:
    """A command's help page: usage, description, arguments, options."""
    width = page_width()
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    args = [(value_name(p, ctx), _help_of(p, ctx)) for p in params if isinstance(p, TyperArgument)]
    opts = [(_option_name(p, ctx), _help_of(p, ctx)) for p in params if isinstance(p, TyperOption)]
    lines = _wrap_usage(" ".join([ctx.command_path, *usage_pieces(command, ctx)]), width)
    if command.help:
        lines += ["", *_text_block(command.help, width, 2)]
    lines += _section("Arguments", args, width)
    lines += _section("Options", opts, width)
    if command.epilog:
        lines += ["", *_text_block(command.epilog, width, 2)]
    return "\n".join(lines) + "\n"


def _wrap_usage(usage: str, width: int) -> list[str]:
    return textwrap.wrap(
        "Usage: " + usage,
        width,
        subsequent_indent=" " * 7,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _summary(command: Any) -> str:
    """A command's whole first paragraph (or its `short_help`), on one line."""
    text = command.short_help or command.help or ""
    first = _paragraphs(text)[:1]
    if not first:
        return ""
    para = first[0]
    return " ".join(para) if isinstance(para, list) else para


def group_help(group: TyperGroup, ctx: typer.Context, commands: Sequence[tuple[str, str]]) -> str:
    """The top-level help page: usage, description, options, and each of `commands`
    (name, summary) with its whole summary."""
    width = page_width()
    params = [p for p in group.get_params(ctx) if not getattr(p, "hidden", False)]
    opts = [(_option_name(p, ctx), _help_of(p, ctx)) for p in params if isinstance(p, TyperOption)]
    lines = _wrap_usage(f"{ctx.command_path} [OPTIONS] COMMAND [ARGS]...", width)
    if group.help:
        lines += ["", *_text_block(group.help, width, 2)]
    lines += _section("Options", opts, width)
    lines += _section("Commands", commands, width)
    return "\n".join(lines) + "\n"


class TetherCommand(TyperCommand):
    """A command whose `--help` is `command_help`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Write `command_help` (instead of Typer's rich table)."""
        formatter.write(command_help(self, ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line of an error message, as the help page writes it."""
        return usage_pieces(self, ctx)


class TetherGroup(TyperGroup):
    """The `tether` group, whose `--help` is `group_help`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Write `group_help` (instead of Typer's rich table)."""
        formatter.write(group_help(self, ctx, self.command_summaries(ctx)))

    def command_summaries(self, ctx: Any) -> list[tuple[str, str]]:
        """Each visible command's name and whole summary, in order (a group that loads
        its commands lazily can answer this from a table instead of loading them)."""
        found: list[tuple[str, str]] = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                found.append((name, _summary(cmd)))
        return found

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """`tether` alone prints the help page (and exits 2, as before): Typer's rich
        error printer shows nothing for it, expecting its own help to have been printed."""
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help())
            raise typer.Exit(2)
        return super().parse_args(ctx, args)


class HelpTyper(typer.Typer):
    """A Typer app whose commands default to `TetherCommand`, its group to `TetherGroup`;
    without arguments it prints its help, and it offers no shell completion."""

    def __init__(self, *, name: str, help: str, **kwargs: Any) -> None:
        kwargs.setdefault("cls", TetherGroup)
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("add_completion", False)
        super().__init__(name=name, help=help, **kwargs)

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any
    ) -> Callable[[Any], Any]:
        """`Typer.command`, with `TetherCommand` as the default class."""
        return super().command(name, cls=cls or TetherCommand, **kwargs)
