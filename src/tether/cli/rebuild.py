"""`tether rebuild TASK [--fix]`: the projections checked against the event log."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from tether.cli import views
from tether.cli._app import DbOpt, JsonOpt, TaskArg, app, on_store, out, print_json


@app.command()
def rebuild(
    task_id: TaskArg,
    fix: Annotated[
        bool, typer.Option("--fix", help="Replace the stored ledger by the one from the log.")
    ] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Recompute a task's ledger and state from its event log and report any difference
    from the stored projections (--fix replaces the ledger)."""
    from tether.rebuild import rebuild as rebuild_task

    doc = on_store(db, lambda s: rebuild_task(s, task_id, fix=fix))
    if json_out:
        print_json(doc)
        return
    if doc["consistent"]:
        out.print(Text(f"task {task_id}: the projections agree with the event log"))
        return
    for d in doc["ledger"]:
        out.print(
            Text(
                views.clean(
                    f"ledger {d['item']}.{d['field']}: stored {d['stored']!r}, "
                    f"log {d['from_log']!r}"
                )
            )
        )
    for d in doc["task"]:
        out.print(
            Text(views.clean(f"task {d['field']}: stored {d['stored']!r}, log {d['from_log']!r}"))
        )
    for d in doc.get("approvals", []):
        out.print(
            Text(
                views.clean(
                    f"request {d['request_id']}: stored {d['stored']!r}, log {d['from_log']!r}"
                )
            )
        )
    for d in doc.get("state", []):
        have, want = len(d["stored"] or []), len(d["from_log"] or [])
        out.print(
            Text(
                views.clean(
                    f"state {d['field']} of {d['item']}: stored {have} marks, log {want} marks"
                )
            )
        )
    if doc["fixed"]:
        out.print(Text("the projections that differed were replaced by the ones from the log"))
    elif doc["ledger"] or doc.get("state"):
        out.print(Text(f"run: tether rebuild {task_id} --fix"))
