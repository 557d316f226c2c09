"""A human's decisions about a task's items: retry one, waive one, or abandon the task.

Only the runtime blocks an item and only a human (or the contract, for optional items)
lets the task finish without one. When nothing is open but something is not done, the
task waits (kind `decision`) with a partial-completion record; these three verbs answer
it, from the CLI or from Python. Each is journaled with who decided, when and why.

They write from outside any worker (an out-of-band commit without the lease), so they
refuse a task a live worker is running: the ledger is the runtime's while a round is in
flight, and its version check refuses a write that raced with one anyway.
"""

from __future__ import annotations

import time
from typing import Any

from tether import approvals, errors, lifecycle
from tether import events as ev
from tether import ledger as L
from tether._validation import free_text
from tether.runtime.run.state import RunState
from tether.store.base import ApprovalRecord, LedgerWrite, Store, TaskPatch, TaskRecord

#: Task states a human may decide in: not terminal and not being run by a worker.
#: The longest reason or hint a person gives (as the web API takes).
MAX_REASON_CHARS = 8000
_DECIDABLE = frozenset({"queued", "waiting", "suspended", "stalled", "paused"})
#: How often a decision is made again on a fresh read when a request it closes was
#: decided meanwhile (the store refuses the stale write).
_RACES = 2


async def changeable(
    store: Store, task_id: str, verb: str, *, reopen: bool = False, running: bool = False
) -> TaskRecord:
    """The task, if a person may change it now: not run by a worker, not finished
    (with `reopen`, a finished task may be re-opened, a cancelled one never; with
    `running`, a task a live worker runs is returned too, for the caller to queue its
    request). A running task whose owner is gone is taken from it first
    (`takeover.take_from_gone`: it is then `stalled`)."""
    from tether.runtime.takeover import take_from_gone

    task = await take_from_gone(store, task_id)
    if task.status == "cancelled" or (lifecycle.is_terminal(task.status) and not reopen):
        raise errors.AlreadySettled(
            f"task {task_id} is {task.status} ({task.stop_reason}); nothing to {verb}"
        )
    if lifecycle.is_terminal(task.status):
        return task
    if task.status == "running" and running:
        return task
    if task.status not in _DECIDABLE:
        raise errors.UserError(
            f"task {task_id} is {task.status}: worker {task.lease_owner} is running it; "
            f"{verb} it when it waits, or pause it first (tether pause {task_id})"
        )
    return task


def _reason(text: str | None, what: str) -> str:
    value = free_text(text, f"the reason for {what}", limit=MAX_REASON_CHARS)
    if not value:
        raise errors.UserError(f"{what} needs a reason (--reason TEXT)")
    return value


async def _write(
    store: Store,
    task: TaskRecord,
    before: L.Ledger,
    update: L.LedgerUpdate,
    events: list[ev.Event],
    *,
    usage: dict[str, Any] | None = None,
    approvals: list[ApprovalRecord] | None = None,
) -> None:
    """Commit the ledger change, its events and — when the task waited for a decision
    or something else a human answers — queue it again so a worker continues."""
    events = [
        *events,
        ev.LedgerUpdated(version=update.ledger.version, diff=update.diff.to_list(), cause="human"),
    ]
    patch: TaskPatch | None = None
    if task.status in ("waiting", "suspended", "stalled"):
        change, moved = lifecycle.transition(task, "queued", "a human decided")
        events.append(change)
        patch = TaskPatch(**moved, usage=usage)
    elif usage is not None:
        patch = TaskPatch(usage=usage)
    await store.commit(
        task.task_id,
        None,
        events,
        task=patch,
        ledger=LedgerWrite.of(update.ledger, before.version),
        approvals=approvals or (),
    )


async def retry_item(
    store: Store, task_id: str, item_id: str, *, hint: str | None = None, by: str = "user"
) -> L.Ledger:
    """Send an item back to work: pending again with its attempt and breaker counters
    reset; `hint` reaches the model as a message from the user in the next turn."""
    task, ledger, previous = await _item_to_decide(store, task_id, item_id, "retry")
    if previous == "done":
        raise errors.UserError(f"item {item_id} is done; there is nothing to retry")
    hint_text = free_text(hint, "the hint", limit=MAX_REASON_CHARS)
    note = f"retry requested by {by}" + (f": {hint_text}" if hint_text else "")
    update = L.retry(ledger, item_id, note)
    events: list[ev.Event] = [
        ev.ItemRetried(item=item_id, by=by, hint=hint_text, previous=previous)
    ]
    if hint_text:
        events.append(ev.UserMessage(text=f"About item {item_id}: {hint_text}", by=by))
    # The failures that blocked the item are forgotten, or the first identical failure
    # after the retry would block it again at once.
    state = RunState.from_dict(task.usage)
    state.failure_keys = {
        k: v for k, v in state.failure_keys.items() if not k.startswith(f"{item_id}|")
    }
    state.credited.pop(item_id, None)
    state.proposals.pop(item_id, None)
    await _write(store, task, ledger, update, events, usage=state.to_dict())
    return update.ledger


async def _item_to_decide(
    store: Store, task_id: str, item_id: str, verb: str
) -> tuple[TaskRecord, L.Ledger, str]:
    """The task (refused unless it may take `verb`), its ledger and the status the item
    had before: a `UserError` naming the items when the task has no `item_id`."""
    task = await changeable(store, task_id, verb)
    ledger = (await store.get_ledger(task_id)).to_ledger()
    if not ledger.has_item(item_id):
        known = ", ".join(d.id for d, _ in ledger.items())
        raise errors.UserError(f"task {task_id} has no item {item_id!r} (items: {known})")
    previous = ledger.item(item_id).status
    return task, ledger, previous


def store_time(store: Store) -> float:
    """Now, by the store's clock when it has one (what the store stamps its rows with)."""
    clock = getattr(store, "clock", None)
    return float(clock.now()) if clock is not None else time.time()


async def waive_item(
    store: Store, task_id: str, item_id: str, *, reason: str, by: str = "user"
) -> L.Ledger:
    """Let the task be delivered without an item (`delivered_with_waivers`). Requests
    about calls made for the item and never sent close with it (`approval.closed`): the
    calls are not sent later."""
    why = _reason(reason, "waive")
    for _ in range(_RACES):
        try:
            return await _waive(store, task_id, item_id, why, by)
        except errors.ConcurrentUpdate:
            continue  # a decision landed meanwhile: read again and decide on that
    return await _waive(store, task_id, item_id, why, by)


async def _waive(store: Store, task_id: str, item_id: str, why: str, by: str) -> L.Ledger:
    task, ledger, previous = await _item_to_decide(store, task_id, item_id, "waive")
    if previous in ("done", "waived"):
        raise errors.UserError(f"item {item_id} is already {previous}")
    update = L.waive(ledger, item_id, f"waived by {by}: {why}")
    events: list[ev.Event] = [ev.ItemWaived(item=item_id, by=by, reason=why, previous=previous)]
    # The calls made for the item and never sent are not sent now: their requests close.
    closed_events, closed = await approvals.close_for_items(
        store,
        task_id,
        {item_id},
        f"item {item_id} waived by {by}: {why}",
        by=by,
        now=store_time(store),
    )
    await _write(store, task, ledger, update, [*events, *closed_events], approvals=closed)
    return update.ledger


async def abandon_task(
    store: Store, task_id: str, *, reason: str, by: str = "user", code: str = "abandoned_by_user"
) -> TaskRecord:
    """End the task as `abandoned`: a human gave up on it, for `reason` (kept in the
    journaled event) and `code`, its stop reason (one of `lifecycle.ABANDON_CODES`). Its
    open requests close with it, in the same commit (`approval.closed`, see
    `tether.approvals`)."""
    why = _reason(reason, "abandon")
    if code not in lifecycle.ABANDON_CODES:
        raise errors.UserError(
            f"--code {code[:60]!r} is not a reason to abandon; one of: "
            + ", ".join(lifecycle.ABANDON_CODES)
        )
    task = await changeable(store, task_id, "abandon")
    change, patch = lifecycle.transition(
        task, "abandoned", f"abandoned by {by}: {why}", stop_reason=code
    )
    await store.commit(task_id, None, [change], task=TaskPatch(**patch))
    return await store.get_task(task_id)
