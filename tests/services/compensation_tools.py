"""A ticket tool whose applied ops can be compensated, and the scripted model of the
compensation crash tests (`TETHER_TOOLS=tests.services.compensation_tools:TOOLS`,
`--model scripted:tests.services.compensation_tools:actor`).

- `create_ticket(title)`: as in `tests.services.tools` (an `Idempotency-Key` per op,
  `reconcile` by key), plus `compensate`: `POST /tickets/<id>/cancel` with the
  compensation's own op id as its `Idempotency-Key`, the ticket id read from the
  original op's journaled result; its `reconcile` asks the service whether the ticket
  is cancelled already.
- `actor`: files the batch of three tickets (`a`, `b`, `c`) in one round, then says
  the batch is as far as it goes.
"""

from __future__ import annotations

import json
from typing import Any

from tests.services.tools import HTTPStatusError, _find_ticket, _request, ticket_tool
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call
from tether.tools.registry import Compensation, Reconciliation, Tool, ToolContext

TITLES = ("a", "b", "c")


def ticket_of(op: Any) -> int:
    """The ticket id in an applied op's journaled result."""
    return int(json.loads(str((op.result or {})["content"]))["id"])


def _cancel(op: Any, ctx: ToolContext) -> dict[str, Any]:
    """Cancel the ticket the op created."""
    path = f"/tickets/{ticket_of(op)}/cancel"
    status, hdrs, doc = _request("POST", path, None, {"Idempotency-Key": ctx.op_id})
    if status != 200:
        raise HTTPStatusError(status, hdrs, json.dumps(doc))
    return dict(doc)


async def _cancelled(op: Any, ctx: ToolContext) -> Reconciliation:
    """Is the op's ticket cancelled already?"""
    found = await _find_ticket(op, ctx)
    if found.outcome != "done":
        return Reconciliation("unknown")
    ticket = found.result
    return Reconciliation("done", ticket) if ticket.get("cancelled") else Reconciliation("not_done")


create_ticket: Tool = ticket_tool(compensate=Compensation(_cancel, reconcile=_cancelled))

TOOLS: list[Tool] = [create_ticket]
TOOLS_REF = "tests.services.compensation_tools:TOOLS"
POLICY = "scripted:tests.services.compensation_tools:actor"


def actor(request: ModelRequest) -> ModelResponse:
    """The batch of three tickets in one round; then nothing more to do."""
    if any(m.role == "tool" for m in request.messages):
        return ModelResponse("the batch went as far as it could")
    return ModelResponse(
        "filing the batch", tuple(tool_call("create_ticket", title=t) for t in TITLES)
    )
