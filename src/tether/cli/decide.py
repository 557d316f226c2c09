"""A human's decisions: `cancel`, `pause`, `approve`, `reject`, `retry`, `waive`, `abandon`,
and the `approvals` list."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from tether import errors
from tether.cli import views
from tether.cli._app import (
    ByOpt,
    DbOpt,
    JsonOpt,
    TaskArg,
    app,
    fail,
    on_store,
    out,
    print_json,
)
from tether.runtime import hints

if TYPE_CHECKING:
    from tether.store import Store


@app.command()
def cancel(task_id: TaskArg, db: DbOpt = None) -> None:
    """Ask a task to stop; a running worker stops between steps."""
    from tether.runtime.tasks import cancel as cancel_task

    _say(on_store(db, lambda s: cancel_task(s, task_id, by="cli")).message)


@app.command()
def pause(
    task_id: TaskArg,
    reason: Annotated[str, typer.Option("--reason", help="Why (journaled).")] = "",
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Pause a task until `tether resume`; a running worker pauses it at its next round."""
    from tether.runtime.tasks import pause as pause_task

    result = on_store(db, lambda s: pause_task(s, task_id, by=by, reason=reason))
    if result.outcome in ("paused", "requested"):
        _said(task_id, db, result.message)
    else:
        _say(result.message)


@app.command()
def approve(
    task_id: TaskArg,
    request_id: Annotated[
        str | None,
        typer.Argument(help="The request to approve; without it, sign off on the work."),
    ] = None,
    db: DbOpt = None,
    modify: Annotated[
        str | None,
        typer.Option(
            "--modify", metavar="JSON", help="Approve with these arguments (a JSON object)."
        ),
    ] = None,
    done: Annotated[
        bool,
        typer.Option(
            "--done",
            help="For an op whose outcome was unknown, whose retries ran out or whose "
            "compensation failed: it did happen (done another way, undone by hand).",
        ),
    ] = False,
    result: Annotated[
        str | None,
        typer.Option("--result", metavar="JSON", help="With --done: what the service returned."),
    ] = None,
    by: ByOpt = "cli",
) -> None:
    """Approve a pending request (optionally with modified arguments, or --done); without
    a request, sign off on a task that waits for it (`review: human`)."""
    from tether import approvals

    if request_id is None:
        if modify is not None or done or result is not None:
            raise fail(errors.UserError("--modify, --done and --result need a REQUEST"), 2)
        _sign_off(task_id, db, by)
        return
    args = None
    seen = None
    if result is not None and not done:
        # Without --done there is no outcome to record: the value would be dropped.
        raise fail(errors.UserError("--result goes with --done (what the service returned)"), 2)
    try:
        if modify is not None:
            args = approvals.parse_json_argument(modify, "--modify")
        if result is not None:
            # Text that is not JSON is kept as text (what the service said, in words).
            seen = approvals.parse_json_argument(result, "--result", text_fallback=True)
    except errors.UserError as exc:
        raise fail(exc, 2) from None
    if modify is not None and not isinstance(args, dict):
        raise fail(errors.UserError("--modify must be a JSON object of tool arguments"), 2)

    async def decide(store: Store) -> Any:
        if args is not None:
            from tether.runtime.wiring import check_tool_args

            asked = {a.request_id: a for a in await store.get_approvals(task_id)}
            if request_id in asked:
                check_tool_args(asked[request_id].request.get("tool"), args, "--modify")
        return await approvals.decide(
            store,
            task_id,
            request_id,
            "done" if done else "approve",
            by=by,
            modified_args=args,
            result=seen,
        )

    _decide(db, task_id, decide, f"{'recorded as done' if done else 'approved'} {request_id}")


@app.command()
def reject(
    task_id: TaskArg,
    request_id: Annotated[
        str | None,
        typer.Argument(help="The request to reject; without it, reject the work (sign-off)."),
    ] = None,
    db: DbOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (the model is told).")] = "",
    hint: Annotated[
        str | None,
        typer.Option("--hint", help="Sign-off: what to redo (the model is told)."),
    ] = None,
    reopen: Annotated[
        list[str] | None,
        typer.Option("--reopen", metavar="ITEM", help="Sign-off: an item to redo (repeat it)."),
    ] = None,
    by: ByOpt = "cli",
) -> None:
    """Reject a pending request (the model is told and the task goes on without it); without
    a request, reject a task's work awaiting sign-off: `--reopen` items go back to work."""
    from tether import approvals

    if request_id is None:
        _reject_work(task_id, db, hint if hint is not None else reason, reopen or [], by)
        return
    if hint is not None or reopen:
        raise fail(errors.UserError("--hint and --reopen are for a sign-off (no REQUEST)"), 2)

    _decide(
        db,
        task_id,
        lambda s: approvals.decide(s, task_id, request_id, "reject", by=by, reason=reason),
        f"rejected {request_id}",
    )


def _sign_off(task_id: str, db: str | None, by: str) -> None:
    from tether import signoff

    on_store(db, lambda s: signoff.approve(s, task_id, by=by))
    _said(task_id, db, f"signed off on {task_id}", then="deliver")


def _reject_work(task_id: str, db: str | None, hint: str, items: list[str], by: str) -> None:
    from tether import signoff

    ledger = on_store(db, lambda s: signoff.reject(s, task_id, hint=hint, reopen=items, by=by))
    redo = [d.id for d, s in ledger.items() if s.status == "pending"]
    _said(task_id, db, f"back to work on {', '.join(redo)}")


def _say(text: str) -> None:
    out.print(Text(views.clean(text)))


def _said(task_id: str, db: str | None, done: str, *, then: str = "continue") -> None:
    """Say what a decision did, and the command that takes the task on from there."""
    _say(f"{done}; {then} with: {hints.resume(task_id, db)}")


def _decide(
    db: str | None, task_id: str, act: Callable[[Store], Awaitable[object]], done: str
) -> None:
    """Take a decision (`act`, on the database at `db`), then say it (`_said`)."""
    on_store(db, act)
    _said(task_id, db, done)


@app.command()
def retry(
    task_id: TaskArg,
    item: Annotated[str, typer.Argument(help="The item to work on again.")],
    hint: Annotated[
        str | None, typer.Option("--hint", help="A hint for the model about this item.")
    ] = None,
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Send a blocked (or skipped, or waived) item back to work, its counters reset."""
    from tether.decisions import retry_item

    _decide(
        db,
        task_id,
        lambda s: retry_item(s, task_id, item, hint=hint, by=by),
        f"{item} is pending again",
    )


@app.command()
def waive(
    task_id: TaskArg,
    item: Annotated[str, typer.Argument(help="The item to deliver without.")],
    reason: Annotated[str, typer.Option("--reason", help="Why it may stay undone.")] = "",
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """Let the task be delivered without an item (it ends delivered_with_waivers)."""
    from tether.decisions import waive_item

    _decide(
        db, task_id, lambda s: waive_item(s, task_id, item, reason=reason, by=by), f"{item} waived"
    )


@app.command()
def abandon(
    task_id: TaskArg,
    reason: Annotated[str, typer.Option("--reason", help="Why the task is given up.")] = "",
    code: Annotated[
        str,
        typer.Option(
            "--code",
            help="The stop reason: abandoned_by_user (the default), budget_exhausted, "
            "environment_unrecoverable, needs_user_input, non_convergent or max_rounds.",
        ),
    ] = "abandoned_by_user",
    by: ByOpt = "cli",
    db: DbOpt = None,
) -> None:
    """End a task as abandoned, with its reason (kept in the journal) and a stop reason
    (--code)."""
    from tether.decisions import abandon_task

    task = on_store(db, lambda s: abandon_task(s, task_id, reason=reason, by=by, code=code))
    _say(f"task {task_id} abandoned ({task.stop_reason}): {reason.strip()}")


@app.command()
def approvals(task_id: TaskArg, db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """List a task's approval requests."""

    items = on_store(db, lambda s: _all_approvals(s, task_id), read_only=True)
    if json_out:
        print_json([a.__dict__ for a in items])
        return
    if not items:  # a bare header reads as a broken table
        out.print(f"task {views.clean(task_id)} has no approval requests")
        return
    out.print(views.approvals_table(items))
    if any(
        a.status == "pending" and len(str(a.request.get("what", ""))) > views.MAX_WHAT
        for a in items
    ):
        out.print(
            f"(calls cut short above: tether approvals {views.clean(task_id)} --json "
            "shows their arguments whole)"
        )


async def _all_approvals(store: Store, task_id: str) -> list[Any]:
    await store.get_task(task_id)
    return await store.get_approvals(task_id)
