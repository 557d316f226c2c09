"""Changing a task: `edit` (a new version of its contract) and `tell` (a message)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from tether import errors
from tether.cli import views
from tether.cli._app import ByOpt, DbOpt, app, out, run_async, with_store


def _changes(sets: list[str], file: Path | None) -> dict[str, Any]:
    """The partial spec: a YAML file's fields, then each `--set PATH=VALUE` over them."""
    from tether.approvals import parse_json_argument
    from tether.spec import load_document

    changes: dict[str, Any] = {}
    if file is not None:
        doc = load_document(file)
        if not isinstance(doc, dict):
            raise errors.UserError(f"{file}: expected a mapping of spec fields to change")
        changes.update(doc)
    for entry in sets:
        path, sep, raw = entry.partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if not sep or not keys:
            raise errors.UserError(
                f"--set {entry!r}: expected FIELD=VALUE, e.g. limits.max_rounds=300"
            )
        value = parse_json_argument(raw, f"--set {path}", text_fallback=True)
        node = changes
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise errors.UserError(f"--set {path}: {key} is not a group of fields")
            node = child
        node[keys[-1]] = value
    if not changes:
        raise errors.UserError("nothing to change: give --set FIELD=VALUE or --file CHANGES.yaml")
    return changes


@app.command()
def edit(
    task_id: str,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="FIELD=VALUE, a dotted path into the spec (VALUE as JSON, or plain text), "
            "e.g. --set limits.max_rounds=300 --set budget.money_usd=5",
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="A YAML file with the spec fields to change."),
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (journaled).")] = "",
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Change a task's goal or constraints: a new version; a stopped task goes on."""
    from tether.edits import edit_task

    async def main() -> str:
        changes = _changes(list(sets or []), file)
        task = await with_store(
            db, lambda s: edit_task(s, task_id, changes, by=by, reason=reason), create=False
        )
        return (
            f"task {task_id} is at version {task.version} ({task.status}); "
            f"continue with: tether resume {task_id}"
        )

    out.print(Text(views.clean(run_async(main))))


@app.command()
def tell(
    task_id: str,
    message: Annotated[str, typer.Argument(help="What to tell the agent.")],
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Send the agent a message (an answer to its NEED_HELP, a correction)."""
    from tether.edits import tell as tell_task

    async def main() -> str:
        task = await with_store(db, lambda s: tell_task(s, task_id, message, by=by), create=False)
        return f"told task {task_id} ({task.status})"

    out.print(Text(views.clean(run_async(main))))
