"""Human decisions on approval requests, from the CLI, the web page or Python.

A request is created by the runtime (a risky tool call, or an op whose outcome is
unknown) and the task waits. A decision is journaled with who made it; once no request
of the task is pending, the task is queued again so a worker (or `tether resume`)
continues it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from tether import errors
from tether import events as ev
from tether._validation import free_text
from tether.spec import MAX_DEPTH, data_problem
from tether.store.base import ApprovalRecord, Store, TaskPatch

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
    """The task's requests still waiting for a decision."""
    await store.get_task(task_id)
    return await store.get_approvals(task_id, statuses={"pending"})


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
    was unknown — record that it did happen (`done`, with the `result` a human saw)."""
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
        raise errors.UserError(
            f"request {request_id} was already {req.status} by {req.decided_by or 'someone'}"
        )
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
        events.append(
            ev.TaskStatusChanged(src="waiting", dst="queued", reason=f"{request_id} {decision}d")
        )
        patch = TaskPatch(status="queued", waiting=None, wake_at=None)
    await store.commit(task_id, None, events, task=patch, approvals=[record])
    return record
