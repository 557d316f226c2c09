"""`tether verify TASK`: re-check a task's whole chain and reopen what broke."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from tether.cli import views
from tether.cli._app import ByOpt, DbOpt, JsonOpt, TaskArg, app, on_store, out, print_json


def _table(doc: dict[str, Any]) -> views.FittedTable:
    rows = [
        (Text(views.clean(r["what"])), str(r["checked"]), str(r["broken"])) for r in doc["checked"]
    ]
    return views.fitted_table([("checked", "fold"), ("count", "id"), ("broken", "id")], rows)


def _say(text: str) -> None:
    """A finding, wrapped at the console's width (80 in a pipe), words kept whole."""
    out.print(Text(views.clean(text, lines=True)), soft_wrap=False)


@app.command()
def verify(
    task_id: TaskArg, by: ByOpt = "user", db: DbOpt = None, json_out: JsonOpt = False
) -> None:
    """Re-check a task's whole chain (deliverables, stored evidence and snapshots against
    their recorded hashes, sources pinned by fingerprint, claims, sections, reports) and
    reopen what broke: a delivered task goes back to work, journaled with the reason.

    Exit 0 when everything holds or what broke was reopened; 1 when something broke that
    cannot be reopened (a pinned source changed under its version: the task waits for a
    person's decision; or the task is abandoned, failed or cancelled)."""
    from tether.runtime.recovery.verify import verify_task

    doc = on_store(db, lambda s: verify_task(s, task_id, by=by)).to_dict()
    if json_out:
        print_json(doc)
    else:
        out.print(_table(doc))
        for b in doc["broken"]:
            _say(f"broken: {b['item']}: {b['reason']}")
        for ident in doc["restored"]:
            out.print(Text(views.clean(f"restored: {ident} (the same bytes read again)")))
        if doc["outcome"] == "holds":
            out.print(Text(views.clean(f"task {task_id}: everything it rests on holds")))
        elif doc["reopened"]:
            out.print(
                Text(
                    views.clean(
                        f"task {task_id}: {doc['status']}; reopened: {', '.join(doc['reopened'])}"
                    )
                )
            )
        for gap in doc["gaps"]:
            _say(f"gap: {gap}")
        if doc["outcome"] == "reopened" and doc["status"] == "queued":
            out.print(Text(views.clean(f"run: tether resume {task_id}")))
    if doc["outcome"] == "gap":
        raise typer.Exit(1)
