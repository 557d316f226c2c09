"""Human decisions on approval requests, from the CLI, the web page or Python.

A request is created by the runtime (a risky tool call, or an op whose outcome is
unknown) and the task waits. A decision is journaled with who made it; once no request
of the task is pending, the task is queued again so a worker (or `tether resume`)
continues it.

A request closes with what it decides about: when its task ends (the store closes the
task's open requests in the commit that ends it), or when the item its call worked for
is waived or removed by an edit (`close_for_items`). Each close is journaled as
`approval.closed` with why; a closed request is never decided, nor its call sent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any, Literal

from tether import errors, lifecycle
from tether import events as ev
from tether._validation import free_text
from tether.spec import MAX_DEPTH, data_problem
from tether.store import _rules as rules
from tether.store._rules import CLOSED
from tether.store.base import ApprovalRecord, Store, TaskPatch, TaskRecord

Decision = Literal["approve", "reject", "done"]


def check_json_argument(value: Any, what: str) -> None:
    """`UserError` naming `what` unless `value` is JSON data tether can store: no NaN or
    infinity, no text with NUL characters or unpaired surrogates, integers within 64
    bits, nesting within `tether.spec.MAX_DEPTH` levels, only JSON types."""
    problem = data_problem(value)
    if problem:
        raise errors.UserError(f"{what} {problem}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json_argument(text: str, what: str, *, text_fallback: bool = False) -> Any:
    """Decode a JSON argument a person typed (`--modify`, `--result`) and check it (see
    `check_json_argument`); a mistake is a `UserError` naming `what`. With
    `text_fallback`, text that is not JSON at all is returned as it is (a plain string),
    but JSON that is too deep or holds NaN is still refused."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise errors.UserError(f"{what} is nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        if text_fallback:
            return text
        raise errors.UserError(f"{what} is not valid JSON: {exc}") from None
    except ValueError as exc:  # NaN / Infinity, or an integer of thousands of digits
        reason = str(exc)
        if "Exceeds the limit" in reason:
            reason = f"a number of more than {sys.get_int_max_str_digits()} digits"
        raise errors.UserError(f"{what} is not usable JSON: {reason[:120]}") from None
    check_json_argument(value, what)
    return value


#: The longest reason given with a decision (as the web API takes).
MAX_REASON_CHARS = 8000


async def pending(store: Store, task_id: str) -> list[ApprovalRecord]:
    """The task's requests still waiting for a decision (none once the task ended: its
    requests closed with it)."""
    task = await store.get_task(task_id)
    if lifecycle.is_terminal(task.status):
        return []
    return await store.get_approvals(task_id, statuses={"pending"})


def settled_message(req: ApprovalRecord) -> str:
    """Why a request cannot be decided any more: who decided it, or what closed it."""
    if req.status == CLOSED:
        reason = (req.decision or {}).get("reason") or "closed"
        return f"request {req.request_id} was closed: {reason}; there is nothing to decide"
    return f"request {req.request_id} was already {req.status} by {req.decided_by or 'someone'}"


def _ended(task: TaskRecord) -> errors.AlreadySettled:
    return errors.AlreadySettled(
        f"task {task.task_id} is {task.status} ({task.stop_reason}): its requests closed "
        "with it; there is nothing to decide"
    )


async def decide(
    store: Store,
    task_id: str,
    request_id: str,
    decision: Decision,
    *,
    by: str = "user",
    modified_args: Mapping[str, Any] | None = None,
    reason: str = "",
    result: Any = None,
) -> ApprovalRecord:
    """Approve (optionally with modified arguments), reject, or — for an op whose outcome
    was unknown — record that it did happen (`done`, with the `result` a human saw).

    A request decided already, or closed with what it decided about (the task ended, its
    item was waived or removed), is `AlreadySettled`, naming who decided or what closed
    it; the store checks it again in the decision's own transaction, so a decision that
    races with the close never turns a closed request into an approved one."""
    reason = free_text(reason, "the reason", limit=MAX_REASON_CHARS)
    task = await store.get_task(task_id)
    requests = {a.request_id: a for a in await store.get_approvals(task_id)}
    req = requests.get(request_id)
    if req is None:
        known = ", ".join(sorted(requests)) or "none"
        raise errors.UserError(
            f"task {task_id} has no approval request {request_id!r} (requests: {known})"
        )
    if req.status != "pending":
        raise errors.AlreadySettled(settled_message(req))
    if lifecycle.is_terminal(task.status):
        raise _ended(task)
    if decision == "done" and "done" not in req.request.get("options", ["done"]):
        raise errors.UserError(
            f"--done is for ops whose outcome is unknown, whose retries ran out or whose "
            f"compensation failed; {request_id} asks for an approval"
        )
    if modified_args is not None:
        if decision != "approve":
            raise errors.UserError("--modify goes with approve, not reject")
        if "modify" not in req.request.get("options", []):
            raise errors.UserError(
                f"request {request_id} cannot be modified, only approved or rejected"
            )
        if not isinstance(modified_args, Mapping):
            raise errors.UserError("--modify must be a JSON object of tool arguments")
        check_json_argument(dict(modified_args), "modified_args")
    if result is not None:
        check_json_argument(result, "result")
    now = getattr(store, "clock", None)
    at = now.now() if now is not None else None
    record = replace(
        req,
        status="rejected" if decision == "reject" else "approved",
        decision={
            "decision": "modify" if modified_args is not None else decision,
            "modified_args": dict(modified_args) if modified_args is not None else None,
            "reason": reason,
            "result": result,
        },
        decided_by=by,
        decided_at=at,
    )
    events: list[ev.Event] = [
        ev.ApprovalDecided(
            request_id=request_id,
            decision=record.decision["decision"] if record.decision else decision,
            by=by,
            modified_args=dict(modified_args) if modified_args is not None else None,
        )
    ]
    still = [a for a in requests.values() if a.status == "pending" and a.request_id != request_id]
    patch = None
    if task.status == "waiting" and not still:
        change, moved = lifecycle.transition(task, "queued", f"{request_id} {decision}d")
        events.append(change)
        patch = TaskPatch(**moved)
    try:
        await store.commit(task_id, None, events, task=patch, approvals=[record])
    except (errors.ConcurrentUpdate, errors.IllegalTransition):
        # Raced with something that settled it (a close, another decision, the task's
        # end): say what, as if it had come first; anything else is not ours to explain.
        raise await _lost_race(store, task_id, request_id) from None
    return record


async def _lost_race(store: Store, task_id: str, request_id: str) -> Exception:
    """The error for a decision whose commit the store refused."""
    task = await store.get_task(task_id)
    for req in await store.get_approvals(task_id):
        if req.request_id == request_id and req.status != "pending":
            return errors.AlreadySettled(settled_message(req))
    if lifecycle.is_terminal(task.status):
        return _ended(task)
    return errors.ConcurrentUpdate(
        f"task {task_id} changed while {request_id} was being decided; try again"
    )


# --- requests that close with what they decide about ------------------------------------


async def item_focus(store: Store, task_id: str) -> dict[int, str | None]:
    """Round number -> the item the round worked on (its `round.started` event)."""
    out: dict[int, str | None] = {}
    for e in await store.read_events(task_id, types={"round.started"}):
        out[int(e.data.get("round", 0))] = e.data.get("item")
    return out


async def close_for_items(
    store: Store, task_id: str, items: Collection[str], reason: str, *, by: str, now: float
) -> tuple[list[ev.Event], list[ApprovalRecord]]:
    """The closing of every open request about a call made for one of `items` that was
    never sent (its op still waits for a decision): the item was waived or removed, so
    the call must not be sent later. A request about a call that may already have taken
    effect (an op in doubt, a failed compensation) stays open: what happened outside
    is still for a person to say. Returns the events and records to commit with the
    change that settles the items."""
    if not items:
        return [], []
    waiting = {o.op_id: o for o in await store.get_ops(task_id, statuses={"awaiting_approval"})}
    if not waiting:
        return [], []
    focus = await item_focus(store, task_id)
    events: list[ev.Event] = []
    records: list[ApprovalRecord] = []
    status = {op_id: op.status for op_id, op in waiting.items()}
    for appr in rules.open_requests(await store.get_approvals(task_id), status):
        op = waiting.get(appr.op_id or "")
        if op is None or focus.get(op.round) not in items:
            continue
        events.append(rules.close_event(appr, reason, by))
        records.append(rules.close_request(appr, reason, by, now))
    return events, records
