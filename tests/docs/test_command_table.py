"""docs/operations.md's table of commands is where a new user looks an option up: every
command `tether --help` lists has a row, and the row names every option the command
takes (all but `--db` and `--help`, which every command has and the page says once)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from tether.cli import app

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
#: A row of the table: `| `name` ... | `arguments and options` | does |`.
ROW = re.compile(r"^\| ((?:`[a-z ]+`(?:, )?)+) \| (.*?) \| ")
#: Options every command takes, said once above the table.
EVERYWHERE = {"--db", "--help"}


def _rows() -> dict[str, str]:
    """Each command name (`schedule list` for a group's) and the text of its row, from
    the table under "### Commands" (other tables of the page name commands too)."""
    section = PAGE.read_text("utf-8").split("\n### Commands\n", 1)[1]
    table = section.split("\n| command |", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    for line in table.splitlines():
        m = ROW.match(line)
        if m:
            for name in re.findall(r"`([a-z ]+)`", m.group(1)):
                rows[name] = m.group(2)
    return rows


def _named(option: str, row: str) -> bool:
    """Whether `row` names `option` as a whole word (`-o`, not the `-o` of `--once`)."""
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", row) is not None


def _commands() -> dict[str, typer.core.TyperCommand]:
    """Every command by its name, a group's as `group sub`."""
    root = typer.main.get_command(app)
    found: dict[str, typer.core.TyperCommand] = {}
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        if subs:
            found.update({f"{name} {sub}": c for sub, c in subs.items()})
        else:
            found[name] = cmd
    return found


def test_every_command_has_a_row_naming_each_of_its_options() -> None:
    rows = _rows()
    missing: list[str] = []
    for name, cmd in _commands().items():
        row = rows.get(name)
        if row is None:
            missing.append(f"{name}: no row")
            continue
        for param in cmd.params:
            if isinstance(param, typer.core.TyperOption) and not param.hidden:
                if set(param.opts) & EVERYWHERE:
                    continue
                if not any(_named(o, row) for o in param.opts):
                    missing.append(f"{name}: {max(param.opts, key=len)}")
    assert not missing, "docs/operations.md, table of commands: " + "; ".join(missing)


def test_every_argument_says_what_it_is_in_help() -> None:
    """`tether retry --help` listed `TASK_ID  [required]` and nothing more: where does a
    new user find it? Every argument of every command says what it is."""
    bare = [
        f"{name} {param.name}"
        for name, cmd in _commands().items()
        for param in cmd.params
        if isinstance(param, typer.core.TyperArgument) and not (param.help or "").strip()
    ]
    assert not bare, f"arguments without help: {bare}"
