"""The JSON API under `/api`: what the CLI shows, and the decisions it takes.

Reads return the same documents as the CLI's `--json` output (`status`, `list`,
`events`, `approvals`, `show`, `report`). Writes need the server's token (or a named
one, whose name is then the decision's `by`) as `Authorization: Bearer TOKEN` and
call the library functions the CLI calls; a bad input is a 4xx `{"detail": message}`
and changes nothing: 400 for a body or argument that is not usable (`body_problem`
words a body FastAPI could not read), 409 for a decision about something settled (a
request decided or closed, a task that ended) or a task a worker runs. A body whose
fields all have defaults may be left out.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from tether import approvals, decisions, edits, signoff
from tether.report import build_report, show_call, status_at
from tether.report.calls import list_calls
from tether.report.describe import task_rows
from tether.runtime.recovery.verify import verify_task as verify_chain
from tether.runtime.tasks import cancel, pause, status_dict, unpause
from tether.web.deps import state_of
from tether.web.security import Caller

router = APIRouter(prefix="/api", tags=["tasks"])
MAX_SEQ = 2**63 - 1


async def writer(request: Request) -> Caller:
    """Dependency of every write: the token in a header (see `security`); who sent it."""
    _, access = state_of(request)
    return access.check_api(request)


Write = Annotated[Caller, Depends(writer)]


def _by(caller: Caller, body: _Body) -> str:
    """The `by` of a decision: the named token's name, else the body's (default web)."""
    return caller.by(body.by if "by" in body.model_fields_set else None)


def body_problem(exc: RequestValidationError) -> str:
    """One paragraph for a request FastAPI could not read (a missing or malformed JSON
    body, a field of the wrong type, an unknown one), naming each field."""
    parts = []
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path", "form")]
        where = ".".join(loc)
        kind = str(err.get("type", ""))
        if kind == "json_invalid":
            parts.append("the body is not valid JSON")
        elif kind == "missing" and not where:
            parts.append("the request has no body: send a JSON object")
        elif kind == "missing":
            parts.append(f"{where} is missing")
        elif kind == "extra_forbidden":
            parts.append(f"there is no field {where!r}")
        elif kind == "model_attributes_type" or (kind.endswith("_type") and not where):
            parts.append("the body must be a JSON object")
        else:
            parts.append(f"{where or 'the body'}: {err.get('msg', 'not usable')}")
    more = len(exc.errors()) - len(parts)
    text = "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
    return f"bad request: {text}"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: str = Field(
        "web",
        max_length=200,
        description="Who decides (journaled); with a named token, its name (no other).",
    )


class ApproveBody(_Body):
    """Approve a request, optionally with other arguments for the tool."""

    modify: dict[str, Any] | None = Field(None, description="The tool's arguments instead.")


class RejectBody(_Body):
    """Reject a request; the model is told why."""

    reason: str = Field("", max_length=8000)


class RetryBody(_Body):
    """Send an item back to work, with a hint the model reads."""

    hint: str = Field("", max_length=8000)


class ReasonBody(_Body):
    """A decision that needs a reason (waive, abandon)."""

    reason: str = Field(..., min_length=1, max_length=8000)


class PauseBody(_Body):
    """Pause a task (why is journaled)."""

    reason: str = Field("", max_length=8000)


class SignoffRejectBody(_Body):
    """Send work waiting for sign-off back: the hint the model reads, the items to redo."""

    hint: str = Field("", max_length=8000)
    reopen: list[str] = Field(
        default_factory=list, max_length=1000, description="Item ids (none: those the hint names)."
    )


class TellBody(_Body):
    """A message the model reads at its next round."""

    text: str = Field(..., min_length=1, max_length=8000)


@router.get("/tasks")
async def list_tasks(
    request: Request,
    status: Annotated[list[str] | None, Query(description="Only these statuses.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Tasks, newest first (`tether list --json`)."""
    store, _ = state_of(request)
    tasks = await store.list_tasks(statuses=status or None, limit=limit)
    return task_rows(tasks, store.clock.now())


@router.get("/tasks/{task_id}")
async def task_status(
    request: Request,
    task_id: str,
    at: Annotated[int | None, Query(ge=0, le=MAX_SEQ, description="As of event SEQ.")] = None,
) -> dict[str, Any]:
    """A task's state (`tether status --json`, or `--at SEQ`)."""
    store, _ = state_of(request)
    if at is not None:
        return await status_at(store, task_id, at)
    return await status_dict(store, task_id)


@router.get("/tasks/{task_id}/events")
async def task_events(
    request: Request,
    task_id: str,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int | None, Query(ge=1, le=10000)] = None,
    type: Annotated[list[str] | None, Query(description="Only these event types.")] = None,
) -> list[dict[str, Any]]:
    """The event log (`tether events --json`)."""
    store, _ = state_of(request)
    await store.get_task(task_id)
    evs = await store.read_events(task_id, after=after, limit=limit, types=type or None)
    return [e.to_dict() for e in evs]


@router.get("/tasks/{task_id}/approvals")
async def task_approvals(request: Request, task_id: str) -> list[dict[str, Any]]:
    """The task's approval requests (`tether approvals --json`)."""
    store, _ = state_of(request)
    await store.get_task(task_id)
    return [
        {
            "request_id": a.request_id,
            "status": a.status,
            "request": a.request,
            "op_id": a.op_id,
            "decision": a.decision,
            "decided_by": a.decided_by,
            "created_at": a.created_at,
            "decided_at": a.decided_at,
        }
        for a in await store.get_approvals(task_id)
    ]


@router.get("/tasks/{task_id}/calls")
async def task_calls(request: Request, task_id: str) -> list[dict[str, Any]]:
    """Every model call of the task (`tether show TASK --json`)."""
    store, _ = state_of(request)
    return await list_calls(store, task_id)


@router.get("/tasks/{task_id}/calls/{call_id}")
async def task_call(request: Request, task_id: str, call_id: str) -> dict[str, Any]:
    """One stored model call: request and response (`tether show TASK CALL --json`)."""
    store, _ = state_of(request)
    return await show_call(store, task_id, call_id)


@router.get("/tasks/{task_id}/report")
async def task_report(request: Request, task_id: str) -> dict[str, Any]:
    """The retrospective report (`tether report --format json`)."""
    store, _ = state_of(request)
    return await build_report(store, task_id)


@router.post("/tasks/{task_id}/approvals/{request_id}/approve")
async def approve(
    request: Request,
    task_id: str,
    request_id: str,
    caller: Write,
    body: Annotated[ApproveBody | None, Body()] = None,
) -> dict[str, Any]:
    """Approve a pending request (`tether approve [--modify JSON]`); no body approves as
    `web` with the arguments asked."""
    store, _g = state_of(request)
    body = body or ApproveBody()
    rec = await approvals.decide(
        store, task_id, request_id, "approve", by=_by(caller, body), modified_args=body.modify
    )
    return {"request_id": rec.request_id, "status": rec.status}


@router.post("/tasks/{task_id}/approvals/{request_id}/reject")
async def reject(
    request: Request,
    task_id: str,
    request_id: str,
    caller: Write,
    body: Annotated[RejectBody | None, Body()] = None,
) -> dict[str, Any]:
    """Reject a pending request (`tether reject`)."""
    store, _g = state_of(request)
    body = body or RejectBody()
    rec = await approvals.decide(
        store, task_id, request_id, "reject", by=_by(caller, body), reason=body.reason
    )
    return {"request_id": rec.request_id, "status": rec.status}


@router.post("/tasks/{task_id}/signoff/approve")
async def signoff_approve(
    request: Request, task_id: str, caller: Write, body: Annotated[_Body | None, Body()] = None
) -> dict[str, Any]:
    """Sign off on work that waits for it (`tether approve TASK`): the task is queued and
    delivered at its next turn."""
    store, _g = state_of(request)
    await signoff.approve(store, task_id, by=_by(caller, body or _Body()))
    return await status_dict(store, task_id)


@router.post("/tasks/{task_id}/signoff/reject")
async def signoff_reject(
    request: Request, task_id: str, body: SignoffRejectBody, caller: Write
) -> dict[str, Any]:
    """Refuse the sign-off (`tether reject TASK --hint ... --reopen ITEM`): the items go
    back to work and the model reads the hint."""
    store, _g = state_of(request)
    await signoff.reject(store, task_id, hint=body.hint, reopen=body.reopen, by=_by(caller, body))
    return await status_dict(store, task_id)


@router.post("/tasks/{task_id}/items/{item_id}/retry")
async def retry(
    request: Request,
    task_id: str,
    item_id: str,
    caller: Write,
    body: Annotated[RetryBody | None, Body()] = None,
) -> dict[str, Any]:
    """Send an item back to work (`tether retry`)."""
    store, _g = state_of(request)
    body = body or RetryBody()
    await decisions.retry_item(
        store, task_id, item_id, hint=body.hint or None, by=_by(caller, body)
    )
    return await status_dict(store, task_id)


@router.post("/tasks/{task_id}/items/{item_id}/waive")
async def waive(
    request: Request, task_id: str, item_id: str, body: ReasonBody, caller: Write
) -> dict[str, Any]:
    """Deliver without an item (`tether waive`)."""
    store, _g = state_of(request)
    await decisions.waive_item(store, task_id, item_id, reason=body.reason, by=_by(caller, body))
    return await status_dict(store, task_id)


@router.post("/tasks/{task_id}/abandon")
async def abandon(
    request: Request, task_id: str, body: ReasonBody, caller: Write
) -> dict[str, Any]:
    """End the task as abandoned (`tether abandon`)."""
    store, _g = state_of(request)
    await decisions.abandon_task(store, task_id, reason=body.reason, by=_by(caller, body))
    return await status_dict(store, task_id)


@router.post("/tasks/{task_id}/tell")
async def tell(request: Request, task_id: str, body: TellBody, caller: Write) -> dict[str, Any]:
    """A message to the agent (`tether tell`)."""
    store, _g = state_of(request)
    await edits.tell(store, task_id, body.text, by=_by(caller, body))
    return await status_dict(store, task_id)


@router.post("/tasks/{task_id}/cancel")
async def cancel_task(request: Request, task_id: str, caller: Write) -> dict[str, Any]:
    """Stop a task (`tether cancel`)."""
    store, _g = state_of(request)
    result = await cancel(store, task_id, by=caller.by())
    return {"outcome": result.outcome, "status": result.status, "message": result.message}


@router.post("/tasks/{task_id}/verify")
async def verify_task(
    request: Request,
    task_id: str,
    caller: Write,
    body: Annotated[_Body | None, Body()] = None,
) -> dict[str, Any]:
    """Re-check the task's whole chain and reopen what broke (`tether verify --json`):
    `outcome` is `holds`, `reopened` or `gap` (a person must act)."""
    store, _g = state_of(request)
    result = await verify_chain(store, task_id, by=_by(caller, body or _Body()))
    return result.to_dict()


@router.post("/tasks/{task_id}/pause")
async def pause_task(
    request: Request, task_id: str, caller: Write, body: PauseBody | None = None
) -> dict[str, Any]:
    """Pause a task (`tether pause`): at once when no live worker runs it, else at the
    worker's next round boundary (`outcome` says which)."""
    store, _g = state_of(request)
    body = body or PauseBody()
    result = await pause(store, task_id, by=_by(caller, body), reason=body.reason)
    return {"outcome": result.outcome, "status": result.status, "message": result.message}


@router.post("/tasks/{task_id}/resume")
async def resume_task(
    request: Request, task_id: str, caller: Write, body: _Body | None = None
) -> dict[str, Any]:
    """Queue a paused task again; a worker continues it (`tether resume` runs it in the
    caller's process instead)."""
    store, _g = state_of(request)
    await unpause(store, task_id, by=_by(caller, body or _Body()))
    return await status_dict(store, task_id)
