"""The task page's live stream (Server-Sent Events).

The stream reads the task's new events every `poll` seconds (the store has no push; a
worker in another process writes them) and sends each as a `timeline` message (one
`<li>`, appended by htmx), then one `state` message when anything arrived (the page
then reloads its state part: progress bar, gauges, ledger, decisions). It starts after
the event the page was rendered with (or the `Last-Event-ID` a reconnecting browser
sends: each message's id is its seq), so nothing is shown twice or missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request

from tether.web.deps import state_of

router = APIRouter(include_in_schema=False)
#: Most events one poll sends (a long backlog streams over a few polls).
BATCH = 500


@router.get("/tasks/{task_id}/stream")
async def stream(
    request: Request, task_id: str, after: Annotated[int, Query(ge=0)] = 0
) -> EventSourceResponse:
    """New events of a task as they are written."""
    from tether.web.pages import templates, timeline_row

    store, _ = state_of(request)
    await store.get_task(task_id)
    poll: float = request.app.state.poll
    row = templates.env.get_template("_event.html")
    # A browser that reconnects by itself says what it saw last: nothing twice.
    seen = request.headers.get("last-event-id", "")
    start = max(after, int(seen)) if seen.isdigit() else after

    async def events() -> AsyncIterator[dict[str, Any]]:
        last = start
        while not await request.is_disconnected():
            batch = await store.read_events(task_id, after=last, limit=BATCH)
            for e in batch:
                yield {"event": "timeline", "id": str(e.seq), "data": row.render(e=timeline_row(e))}
            if batch:
                last = batch[-1].seq
                yield {"event": "state", "id": str(last), "data": str(last)}
            else:
                await asyncio.sleep(poll)

    return EventSourceResponse(events(), ping=15)
