"""Reading tasks: `status`, `list`, `events`, `timeline`, `watch`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from tether.cli import views
from tether.cli._app import (
    AfterOpt,
    DbOpt,
    JsonOpt,
    LimitOpt,
    TaskArg,
    TypesOpt,
    app,
    fail,
    on_store,
    out,
    print_json,
)


def _check_types(types: list[str] | None) -> None:
    """Refuse (exit 2) a `--type` that names no event type, listing those there are: a
    misspelt type would otherwise match nothing and look like an empty log."""
    if not types:
        return
    from tether.errors import UserError
    from tether.events import EVENT_TYPES

    unknown = [t for t in types if t not in EVENT_TYPES]
    if unknown:
        names = ", ".join(repr(t) for t in unknown)
        raise fail(
            UserError(
                f"--type {names}: no such event type; the event types are "
                f"{', '.join(sorted(EVENT_TYPES))}"
            ),
            2,
        )


@app.command()
def status(
    task_id: TaskArg,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    at: Annotated[
        int | None,
        typer.Option("--at", metavar="SEQ", help="As of event SEQ (folded from the event log)."),
    ] = None,
    after: Annotated[
        str | None,
        typer.Option(
            "--after", metavar="ITEM", help="List the ledger's items after ITEM (a page)."
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option("--limit", metavar="N", min=1, help="How many ledger items to list at most."),
    ] = views.STATUS_ITEMS,
) -> None:
    """Show a task: state, ledger, budget, what it waits for."""
    from tether.report.timetravel import status_at
    from tether.runtime.tasks import status_dict

    doc = on_store(
        db,
        lambda s: status_dict(s, task_id) if at is None else status_at(s, task_id, at),
        read_only=True,
    )
    if after is not None:
        _check_item(doc, after)
    if json_out:
        print_json(doc)
    else:
        out.print(views.status_view(doc, db, after=after, limit=limit))


def _check_item(doc: Mapping[str, Any], after: str) -> None:
    """Refuse (exit 2) an `--after ITEM` the task's ledger does not have, naming its
    items: a misspelt one would otherwise list the first page as if it had worked."""
    from tether.errors import UserError

    known = [str(i["id"]) for i in doc["ledger"]["items"]]
    if after in known:
        return
    shown = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
    raise fail(
        UserError(
            f"--after {after!r}: task {doc['task_id']} has no such item (its items: "
            f"{shown or 'none'})"
        ),
        2,
    )


@app.command("list")
def list_tasks(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """List tasks, newest first."""

    from tether.runtime.watch.schedules import list_schedules

    async def read(store: Any) -> tuple[list[Any], list[Any], float]:
        tasks = list(await store.list_tasks())
        return tasks, await list_schedules(store), float(store.clock.now())

    tasks, schedules, now = on_store(db, read, read_only=True)
    rows = views.task_rows(tasks, now)
    if json_out:
        print_json(rows)
        return
    if tasks:
        out.print(views.task_table(tasks, {r["task_id"] for r in rows if r.get("owner_gone")}))
    elif not schedules:
        # A bare header reads as a broken table: say what an empty database means.
        out.print("no tasks yet: start one with `tether run SPEC` (or `tether demo`)")
    if schedules:  # recurring tasks: when each starts its next occurrence
        from tether.cli.schedule import schedule_table

        out.print()
        out.print(schedule_table(schedules))


@app.command()
def events(
    task_id: TaskArg,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    after: AfterOpt = 0,
    limit: LimitOpt = None,
    type_: TypesOpt = None,
) -> None:
    """Print a task's events (append-only log)."""
    _check_types(type_)

    evs = on_store(
        db, lambda s: s.read_events(task_id, after=after, limit=limit, types=type_), read_only=True
    )
    if json_out:
        print_json([e.to_dict() for e in evs])
        return
    for e in evs:
        out.print(views.event_line(e))


FullOpt = Annotated[
    bool,
    typer.Option("--full", help="Each event's whole data under its line, not a summary."),
]


@app.command()
def timeline(
    task_id: TaskArg,
    db: DbOpt = None,
    after: AfterOpt = 0,
    type_: TypesOpt = None,
    full: FullOpt = False,
) -> None:
    """A readable, coloured timeline of a task (one line per event)."""
    _check_types(type_)

    for e in on_store(
        db, lambda s: s.read_events(task_id, after=after, types=type_), read_only=True
    ):
        out.print(views.timeline_line(e, full=full))


def _waits_on(task: Any) -> str | None:
    """What a task that waits or is suspended waits for, in the runtime's words."""
    if task.status not in ("waiting", "suspended"):
        return None
    reason = (task.waiting or {}).get("reason")
    return views.readable_until(str(reason)) if reason else str(task.status)


@app.command()
def watch(
    task_id: TaskArg,
    db: DbOpt = None,
    after: AfterOpt = 0,
    full: FullOpt = False,
    poll: Annotated[
        float,
        typer.Option("--poll", metavar="SECONDS", help="Seconds between reads.", min=0.05, max=600),
    ] = 1.0,
) -> None:
    """Follow a task from any terminal: its timeline as it grows, until it ends (a task
    run by a worker elsewhere too). Ctrl-C stops watching, not the task."""
    import asyncio

    from tether import lifecycle

    async def follow(store: Any) -> str:
        seen = after
        told = None
        while True:
            task = await store.get_task(task_id)
            for e in await store.read_events(task_id, after=seen):
                out.print(views.timeline_line(e, full=full))
                seen = e.seq
            if lifecycle.is_terminal(task.status) and seen >= task.last_seq:
                return str(task.status)
            wait = _waits_on(task) if seen >= task.last_seq else None
            if wait is not None and wait != told:
                # Nothing moves until someone answers: say what answers it, once per wait,
                # instead of watching in silence.
                out.print(views.clean(f"waiting: {views.with_db(wait, db)}; still watching"))
            told = wait
            await asyncio.sleep(poll)

    try:
        final = on_store(db, follow, read_only=True)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    out.print(views.clean(f"task {task_id} ended: {final}"))
