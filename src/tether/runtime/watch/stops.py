"""Every stop ends on purpose: the contract's `on_budget_exhausted` and `on_unanswered`.

A task parked because its budget is used up (`suspended`, its wait of kind `budget`),
or waiting for a person who does not answer (an approval, a decision, a question;
still `waiting`, or `suspended` by the escalation), waits for ever unless its contract
says `fail` (see `tether.spec_policies`). Then, once the deadline has passed since the
stop began, `end_stop` ends it `failed` with the stop's own reason: `budget_exhausted`,
`max_rounds` (a round limit nobody raised) or `needs_user_input` (any other wait for a
person). The sweep calls it for every parked task; a foreground run calls it for its
task when it stops (a deadline of zero ends the stop there and then).
"""

from __future__ import annotations

from typing import Any

from tether import errors, lifecycle
from tether.spec import TaskSpec, parse_spec
from tether.store.base import Store, TaskPatch, TaskRecord

#: Waiting kinds a person must answer.
HUMAN_KINDS = frozenset({"approval", "decision", "human"})
#: Status reasons of a wait at a round limit (`checks.limits`): unanswered, it ends as
#: `max_rounds`. A wait at the context budget is not one (no stop reason names it: it
#: ends as `needs_user_input`), though `notices.LIMIT_REASONS` tells of both as limits.
ROUND_LIMIT_REASONS = frozenset({"max_rounds", "max_rounds_per_milestone"})


def contract_of(task: TaskRecord) -> TaskSpec | None:
    """The task's contract (None if the stored spec no longer parses)."""
    try:
        return parse_spec(task.spec, source=f"task {task.task_id}", stored=True)
    except errors.UserError:
        return None


async def _stop_began(store: Store, task: TaskRecord, into: str) -> tuple[float, str]:
    """When the task last moved into `into`, and the reason that move journaled."""
    moves = await store.read_events(task.task_id, types={"task.status"})
    for event in reversed(moves):
        if event.data.get("dst") == into:
            return event.at, str(event.data.get("reason") or "")
    return task.updated_at, ""


async def due(
    store: Store, task: TaskRecord, contract: TaskSpec, now: float, escalate_after: float
) -> tuple[str, str] | None:
    """The stop reason and the words of the failure when the task's stop is past the
    deadline its contract gives it; None while it waits (or for ever)."""
    waiting: dict[str, Any] = dict(task.waiting or {})
    kind = waiting.get("kind")
    if task.status == "suspended" and kind == "budget":
        deadline = contract.on_budget_exhausted.deadline(0.0)
        if deadline is None:
            return None
        since, _ = await _stop_began(store, task, "suspended")
        stop, what = "budget_exhausted", "the budget is used up"
        rule = "on_budget_exhausted"
    elif task.status in ("waiting", "suspended") and kind in HUMAN_KINDS:
        window = contract.notify.suspend_after or escalate_after
        deadline = contract.on_unanswered.deadline(window)
        if deadline is None:
            return None
        began, why = await _stop_began(store, task, "waiting")
        since = float(waiting.get("since", began))
        stop = "max_rounds" if why in ROUND_LIMIT_REASONS else "needs_user_input"
        what = f"nobody answered ({kind}: {str(waiting.get('reason', ''))[:300]})"
        rule = "on_unanswered"
    else:
        return None
    if now - since < deadline:
        return None
    hours = (now - since) / 3600
    return stop, f"{what}; failed after {hours:.1f} h by the contract's {rule}"


async def end_stop(
    store: Store,
    task: TaskRecord,
    now: float,
    *,
    escalate_after: float,
    contract: TaskSpec | None = None,
) -> str | None:
    """End the task `failed` if its stop is past its contract's deadline; returns the
    stop reason it ended with, or None. A task that moved meanwhile (a person answered)
    raises `IllegalTransition` or `ConcurrentUpdate` and is left as it is."""
    contract = contract or contract_of(task)
    if contract is None or task.status not in ("waiting", "suspended"):
        return None
    found = await due(store, task, contract, now, escalate_after)
    if found is None:
        return None
    stop, text = found
    fresh = await store.get_task(task.task_id)
    if (fresh.status, fresh.waiting) != (task.status, task.waiting):
        return None  # answered, raised or decided meanwhile
    change, patch = lifecycle.transition(fresh, "failed", text, stop_reason=stop)
    await store.commit(task.task_id, None, [change], task=TaskPatch(**patch))
    return stop
