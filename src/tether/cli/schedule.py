"""`tether schedule list` and `tether schedule cancel`: recurring tasks.

A contract with a `schedule:` is submitted with `tether submit`; workers start each
occurrence as a task of its own (see `tether.runtime.watch.schedules`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.text import Text

from tether.cli import views
from tether.cli._app import DbOpt, JsonOpt, app, on_store, out, print_json
from tether.cli._help import HelpTyper

group = HelpTyper(name="schedule", help="Recurring tasks: list the schedules, cancel one.")
app.add_typer(group)


def schedule_table(items: Sequence[Any]) -> views.FittedTable:
    """Schedule, name, rule, next occurrence, started/skipped, state."""
    rows = [
        (
            Text(views.clean(s.schedule_id)),
            Text(views.clean(s.name)),
            Text(views.clean(s.rule)),
            views.ts(s.next_at)[:16] if s.next_at is not None else "-",
            f"{s.started}/{s.skipped}",
            Text(s.state, "green" if s.state == "active" else ""),
        )
        for s in items
    ]
    return views.fitted_table(
        [
            ("schedule", "id"),
            ("name", "fold"),
            ("when", "fold"),
            ("next", "id"),
            ("run/skip", "id"),
            ("state", "text"),
        ],
        rows,
    )


@group.command("list")
def list_schedules(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """The schedules, newest first: when each starts its next occurrence."""
    from tether.runtime.watch.schedules import list_schedules as listed

    items = on_store(db, listed, read_only=True)
    if json_out:
        print_json([s.to_dict() for s in items])
    elif not items:
        out.print("no schedules")
    else:
        out.print(schedule_table(items))


@group.command("cancel")
def cancel(
    schedule_id: Annotated[str, typer.Argument(help="The schedule (`s…`).")],
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Start no more occurrences of a schedule (those already started go on)."""
    from tether.runtime.watch.schedules import cancel_schedule

    view = on_store(db, lambda s: cancel_schedule(s, schedule_id))
    if json_out:
        print_json(view.to_dict())
    else:
        out.print(f"schedule {view.schedule_id}: {view.state}")
