"""The dashboard's HTML pages: task list, task page, stored calls, evidence, report,
and the forms that decide (each a plain POST that redirects back on success).

Pages are rendered on the server (Jinja2, autoescaped); htmx refreshes the parts that
change (the task list, the task's state) and appends the timeline from the live stream
(`live`). A form carries the CSRF token; `security` checks it with the token cookie.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from importlib.resources import files
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Form, Query
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.requests import Request

from tether import approvals, decisions, edits, errors, ledger_view, lifecycle, signoff
from tether.redact import redact
from tether.report import build_report, show_call
from tether.report.calls import list_calls
from tether.report.describe import STATUS_STYLE, describe_event, ts
from tether.report.render import html_page
from tether.runtime.tasks import cancel, pause, status_dict, unpause
from tether.web.deps import state_of
from tether.web.security import COOKIE, Refused

if TYPE_CHECKING:
    from tether.store import Store

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(files("tether.web") / "templates"))
templates.env.filters["ts"] = ts
templates.env.filters["redact"] = lambda v: redact(str(v))


def dom_id(value: Any) -> str:
    """A stable element id for user text (request and item ids hold dots, which a CSS
    selector would read as classes: htmx finds preserved inputs by selector)."""
    return "h" + hashlib.sha256(str(value).encode()).hexdigest()[:16]


templates.env.filters["domid"] = dom_id
templates.env.globals["STATUS_STYLE"] = STATUS_STYLE
#: Statuses offered by the task list's filter.
STATUSES = tuple(STATUS_STYLE)
#: Most events the task page shows before the live stream appends.
TIMELINE_TAIL = 200
#: Most model calls the task page lists (the newest).
CALLS = 50
#: Most characters of an artifact shown on its evidence page.
EVIDENCE_CHARS = 200_000


def _render(request: Request, name: str, *, code: int = 200, **ctx: Any) -> HTMLResponse:
    _, access = state_of(request)
    cookie = request.cookies.get(COOKIE)
    caller = access.who(cookie)
    base = {
        "csrf": access.csrf_of(cookie) if caller is not None and cookie else "",
        "signed_in": caller is not None,
        "signed_in_as": caller.name if caller is not None else None,
    }
    return templates.TemplateResponse(request, name, {**base, **ctx}, status_code=code)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """A page that says what was wrong (for a 4xx or 5xx)."""
    return _render(request, "error.html", code=status, status=status, message=message)


def _login(request: Request, token: str | None) -> Response | None:
    """`?token=...` on any page: keep it as a cookie and drop it from the address."""
    if token is None:
        return None
    _, access = state_of(request)
    if not access.token_ok(token):
        raise Refused("wrong token: use the link tether serve printed")
    resp = RedirectResponse(str(request.url.remove_query_params("token")), status_code=303)
    secure = request.url.scheme == "https"  # behind a TLS proxy: see --forwarded-allow-ips
    resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/", secure=secure)
    return resp


def timeline_row(e: Any) -> dict[str, Any]:
    """One event for the timeline: seq, time, type, style and text (one line)."""
    style, text = describe_event(e)
    return {
        "seq": e.seq,
        "time": ts(e.at)[11:],
        "type": e.type,
        "style": style.replace(" ", "-"),
        "text": redact(text),
    }


async def task_rows(request: Request, status: str | None) -> list[dict[str, Any]]:
    """The task list's rows: status, progress, cost, what a task waits for."""
    store, _ = state_of(request)
    if status and status not in STATUSES:
        raise errors.UserError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
    rows = []
    for t in await store.list_tasks(statuses={status} if status else None, limit=200):
        doc = await status_dict(store, t.task_id)
        rows.append(doc)
    return rows


@router.get("/", response_class=HTMLResponse)
async def index(
    request: Request,
    status: Annotated[str | None, Query()] = None,
    token: Annotated[str | None, Query()] = None,
) -> Response:
    """The task list."""
    login = _login(request, token)
    if login is not None:
        return login
    rows = await task_rows(request, status or None)
    return _render(request, "tasks.html", tasks=rows, status=status or "", statuses=STATUSES)


@router.get("/partials/tasks", response_class=HTMLResponse)
async def tasks_partial(
    request: Request, status: Annotated[str | None, Query()] = None
) -> HTMLResponse:
    """The task list's rows (refreshed by htmx)."""
    rows = await task_rows(request, status or None)
    return _render(request, "_task_rows.html", tasks=rows)


async def _task_context(
    request: Request, task_id: str, items_after: str | None = None
) -> dict[str, Any]:
    store, _ = state_of(request)
    doc = await status_dict(store, task_id)
    # A long ledger is listed a page at a time (`?items_after=<id>` for the next one).
    rows = doc["ledger"]["items"]
    start, shown = ledger_view.row_page(rows, items_after)
    more = start + len(shown) < len(rows) and bool(shown)
    pending = await approvals.pending(store, task_id)
    closed = await store.get_approvals(task_id, statuses={"closed"})
    return {
        "task": doc,
        "terminal": lifecycle.is_terminal(doc["status"]),
        "approvals": [
            {
                "request_id": a.request_id,
                "what": a.request.get("what", ""),
                "impact": a.request.get("impact", ""),
                "args": json.dumps(a.request.get("args", {}), ensure_ascii=False, indent=1),
                "options": a.request.get("options", ["approve", "reject"]),
            }
            for a in pending
        ],
        # Shown for what happened to them, with no action: they decide nothing now.
        "closed": [
            {
                "request_id": a.request_id,
                "what": a.request.get("what", ""),
                "reason": (a.decision or {}).get("reason", ""),
            }
            for a in closed
        ],
        "gauges": _gauges(doc),
        "items": shown,
        "items_page": {
            "first": start + 1,
            "last": start + len(shown),
            "total": len(rows),
            "paged": len(shown) < len(rows),
            "after": items_after,
            "next": shown[-1]["id"] if more else None,
        },
    }


def _gauges(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Used against limit for each budget the contract sets."""
    limits, used = doc["budget"]["limits"], doc["budget"]["used"]
    out = []
    for key in ("tokens", "money_usd", "wall_seconds", "rounds"):
        limit = limits.get(key)
        if not limit:
            continue
        value = float(used.get(key, 0))
        out.append(
            {
                "name": key,
                "used": value,
                "limit": float(limit),
                "percent": min(100.0, round(100.0 * value / float(limit), 1)),
                "used_text": _number(value),
                "limit_text": _number(float(limit)),
            }
        )
    return out


def _number(value: float) -> str:
    """A budget figure for people: whole numbers without `.0`, others to 4 places."""
    return f"{int(value):,}" if value.is_integer() else f"{round(value, 4):,}"


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
async def task_page(
    request: Request,
    task_id: str,
    token: Annotated[str | None, Query()] = None,
    items_after: Annotated[str | None, Query()] = None,
) -> Response:
    """A task: live ledger (a page of its items), budget, decisions, timeline, calls,
    report."""
    login = _login(request, token)
    if login is not None:
        return login
    store, _ = state_of(request)
    ctx = await _task_context(request, task_id, items_after)
    last = ctx["task"]["last_seq"]
    events = await store.read_events(task_id, after=max(0, last - TIMELINE_TAIL))
    calls = await list_calls(store, task_id)
    return _render(
        request,
        "task.html",
        **ctx,
        timeline=[timeline_row(e) for e in events],
        after=events[-1].seq if events else 0,
        calls=calls[-CALLS:],
    )


@router.get("/tasks/{task_id}/partials/state", response_class=HTMLResponse)
async def state_partial(
    request: Request, task_id: str, items_after: Annotated[str | None, Query()] = None
) -> HTMLResponse:
    """The task's changing part: status, progress, gauges, ledger, decisions."""
    ctx = await _task_context(request, task_id, items_after)
    return _render(request, "_state.html", **ctx)


@router.get("/tasks/{task_id}/partials/calls", response_class=HTMLResponse)
async def calls_partial(request: Request, task_id: str) -> HTMLResponse:
    """The task's latest model calls (refreshed by htmx as the stream reports work)."""
    store, _ = state_of(request)
    calls = await list_calls(store, task_id)
    return _render(request, "_calls.html", task={"task_id": task_id}, calls=calls[-CALLS:])


@router.get("/tasks/{task_id}/calls/{call_id}", response_class=HTMLResponse)
async def call_page(request: Request, task_id: str, call_id: str) -> HTMLResponse:
    """A stored model call: the prompt as the model saw it and its response."""
    store, _ = state_of(request)
    doc = await show_call(store, task_id, call_id)
    return _render(request, "call.html", task_id=task_id, doc=doc, json=json)


@router.get("/tasks/{task_id}/evidence/{ref:path}", response_class=HTMLResponse)
async def evidence_page(request: Request, task_id: str, ref: str) -> HTMLResponse:
    """What an evidence ref points at: an op (arguments and result) or an artifact."""
    store, _ = state_of(request)
    await store.get_task(task_id)
    kind, _, ident = ref.partition(":")
    if kind == "op":
        ops = await store.get_ops(task_id, op_ids={ident})
        if not ops:
            raise errors.UserError(f"task {task_id} has no op {ident!r}")
        op = ops[0]
        body = json.dumps(
            {"tool": op.tool, "status": op.status, "args": op.args, "result": op.result,
             "error": op.error, "round": op.round, "attempts": op.attempts},
            ensure_ascii=False, indent=2,
        )  # fmt: skip
        return _render(request, "evidence.html", task_id=task_id, ref=ref, body=body)
    if kind == "artifact":
        try:
            art = await store.get_artifact(ident)
        except KeyError:
            raise errors.UserError(f"task {task_id} has no artifact {ident!r}") from None
        if art.task_id != task_id:
            raise errors.UserError(f"task {task_id} has no artifact {ident!r}")
        data = await store.get_blob(art.blob_hash)
        text = data[:EVIDENCE_CHARS].decode("utf-8", errors="replace")
        head = f"{art.kind} {art.name} ({art.size} bytes, valid={art.valid})"
        return _render(request, "evidence.html", task_id=task_id, ref=ref, head=head, body=text)
    raise errors.UserError(f"{ref!r} is not an evidence ref (op:... or artifact:...)")


@router.get("/tasks/{task_id}/report", response_class=HTMLResponse)
async def report_page(request: Request, task_id: str) -> HTMLResponse:
    """The retrospective report, as `tether report --format html` writes it."""
    store, _ = state_of(request)
    return HTMLResponse(html_page(await build_report(store, task_id)))


# --------------------------------------------------------------------------- decisions

CsrfField = Annotated[str | None, Form()]


def _back(task_id: str) -> RedirectResponse:
    return RedirectResponse(f"/tasks/{task_id}", status_code=303)


def _check(request: Request, csrf: str | None) -> str:
    """The form's checks (see `security`); the `by` of the decision it takes."""
    _, access = state_of(request)
    return access.check_form(request, csrf).by()


def _modified(text: str) -> dict[str, Any] | None:
    if not text.strip():
        return None
    value = approvals.parse_json_argument(text, "the modified arguments")
    if not isinstance(value, dict):
        raise errors.UserError("the modified arguments must be a JSON object")
    return value


@router.post("/tasks/{task_id}/approvals/{request_id}")
async def decide_form(
    request: Request,
    task_id: str,
    request_id: str,
    decision: Annotated[str, Form()],
    csrf: CsrfField = None,
    modify: Annotated[str, Form()] = "",
    reason: Annotated[str, Form()] = "",
) -> Response:
    """Approve, approve with modified arguments, or reject a pending request."""
    by = _check(request, csrf)
    store, _ = state_of(request)
    if decision == "approve":
        await approvals.decide(
            store, task_id, request_id, "approve", by=by, modified_args=_modified(modify)
        )
    elif decision == "reject":
        await approvals.decide(store, task_id, request_id, "reject", by=by, reason=reason)
    else:
        raise errors.UserError(f"unknown decision {decision!r}: approve or reject")
    return _back(task_id)


@router.post("/tasks/{task_id}/items/{item_id}")
async def item_form(
    request: Request,
    task_id: str,
    item_id: str,
    action: Annotated[str, Form()],
    csrf: CsrfField = None,
    text: Annotated[str, Form()] = "",
) -> Response:
    """Retry (with a hint) or waive (with a reason) an item."""
    by = _check(request, csrf)
    store, _ = state_of(request)
    if action == "retry":
        await decisions.retry_item(store, task_id, item_id, hint=text or None, by=by)
    elif action == "waive":
        await decisions.waive_item(store, task_id, item_id, reason=text, by=by)
    else:
        raise errors.UserError(f"unknown action {action!r}: retry or waive")
    return _back(task_id)


@router.post("/tasks/{task_id}/tell")
async def tell_form(
    request: Request, task_id: str, text: Annotated[str, Form()], csrf: CsrfField = None
) -> Response:
    """A message the model reads at its next round."""
    by = _check(request, csrf)
    store, _ = state_of(request)
    await edits.tell(store, task_id, text, by=by)
    return _back(task_id)


@router.post("/tasks/{task_id}/abandon")
async def abandon_form(
    request: Request, task_id: str, reason: Annotated[str, Form()] = "", csrf: CsrfField = None
) -> Response:
    """End the task as abandoned."""
    by = _check(request, csrf)
    store, _ = state_of(request)
    await decisions.abandon_task(store, task_id, reason=reason, by=by)
    return _back(task_id)


def _task_button(
    action: str, act: Callable[[Store, str, str], Awaitable[object]], doc: str
) -> None:
    """`POST /tasks/{task_id}/ACTION`: a form with no field but its CSRF token, that
    takes one decision on the task (`act(store, task_id, by)`) and redirects back."""

    async def form(request: Request, task_id: str, csrf: CsrfField = None) -> Response:
        by = _check(request, csrf)
        store, _ = state_of(request)
        await act(store, task_id, by)
        return _back(task_id)

    form.__doc__ = doc
    router.post(f"/tasks/{{task_id}}/{action}", name=f"{action.replace('/', '_')}_form")(form)


_task_button("cancel", lambda s, t, by: cancel(s, t, by=by), "Stop the task.")
_task_button(
    "pause",
    lambda s, t, by: pause(s, t, by=by),
    "Pause the task (at the running worker's next round boundary).",
)
_task_button(
    "resume", lambda s, t, by: unpause(s, t, by=by), "Queue a paused task again for the workers."
)
_task_button(
    "signoff/approve",
    lambda s, t, by: signoff.approve(s, t, by=by),
    "Sign off on the work as reported (`tether approve TASK`): the task is queued.",
)


@router.post("/tasks/{task_id}/signoff/reject")
async def signoff_reject_form(
    request: Request,
    task_id: str,
    hint: Annotated[str, Form()] = "",
    reopen: Annotated[str, Form()] = "",
    csrf: CsrfField = None,
) -> Response:
    """Send the work back (`tether reject TASK --hint ... --reopen ITEM`): `reopen` holds
    item ids separated by commas or spaces (empty: the items the hint names)."""
    by = _check(request, csrf)
    store, _ = state_of(request)
    items = [r for r in re.split(r"[,\s]+", reopen) if r]
    await signoff.reject(store, task_id, hint=hint, reopen=items, by=by)
    return _back(task_id)
