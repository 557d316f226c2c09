"""The tools and the scripted worker of the soak (`benchmarks/soak.py`).

- `put_ticket(title)`: idempotent by op id: `POST /tickets` on the ticket API at
  `$TICKETS_URL` with `Idempotency-Key: <op_id>` and no `reconcile`, so after an unknown
  outcome the runtime re-sends it with the same op id and the service answers the same
  ticket without a second effect.
- `log_ticket(title)`: not idempotent, reconciled: the same `POST` without a key (a
  second send would be a second ticket), with the op id as `X-Trace-Op`; its
  `reconcile` asks `GET /tickets?trace=<op_id>` whether the ticket exists.
- `worker`: a scripted policy for a task whose items `itI` each need K tickets
  `itI-c0` .. `itI-c{K-1}`, one per round (the item's `done_when` is the op of its last
  ticket). It works out the next ticket from the request alone: the focus item from
  the ledger, the last ticket of that item from the newest tool result or compaction
  summary that names one, so a fresh process after a kill goes on where the journal
  says the task is. Its compaction summaries name the last ticket (`Position: itI-cJ`).

`TETHER_TOOLS=tests.services.soak_tools:TOOLS`,
`--model scripted:tests.services.soak_tools:worker`; `SOAK_ITEMS` and `SOAK_CALLS` are
the numbers of items and of tickets per item.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from tests.services.tools import RETRY, HTTPStatusError, _has_id, _post_ticket, _request
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call
from tether.tools.registry import Reconciliation, Tool, ToolContext, tool

TOOLS_REF = "tests.services.soak_tools:TOOLS"
MODEL = "scripted:tests.services.soak_tools:worker"
CALLS_ENV = "SOAK_CALLS"
ITEMS_ENV = "SOAK_ITEMS"
#: A ticket in a tool result (the service's JSON) or in a summary of this worker's.
_POSITION = re.compile(r'(?:"title": "|Position: )it(\d+)-c(\d+)\b')


def item_id(i: int) -> str:
    """The id of item number `i`."""
    return f"it{i}"


def title(i: int, j: int) -> str:
    """The title of item `i`'s ticket number `j` (one intended effect)."""
    return f"it{i}-c{j}"


def tool_of(i: int, items: int) -> str:
    """The first half of the items files with `put_ticket`, the second with `log_ticket`."""
    return "put_ticket" if i < (items + 1) // 2 else "log_ticket"


def _put_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
    """File a ticket with this title in the ticket tracker."""
    return _post_ticket(title, {"Idempotency-Key": ctx.op_id, "X-Attempt": str(ctx.attempt)})


def _log_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
    """File a ticket with this title in the ticket log."""
    return _post_ticket(title, {"X-Trace-Op": ctx.op_id, "X-Attempt": str(ctx.attempt)})


async def _find_traced(op: Any, ctx: ToolContext) -> Reconciliation:
    """Ask the ticket API whether a request traced with this op's id made a ticket."""
    status, hdrs, doc = await asyncio.to_thread(_request, "GET", f"/tickets?trace={op.op_id}")
    if status == 200:
        return Reconciliation("done", doc)
    if status == 404:
        return Reconciliation("not_done")
    raise HTTPStatusError(status, hdrs, json.dumps(doc))


put_ticket: Tool = tool(
    _put_ticket,
    name="put_ticket",
    effect="write",
    idempotent=True,
    service="tickets",
    retry=RETRY,
    validate=_has_id,
)
log_ticket: Tool = tool(
    _log_ticket,
    name="log_ticket",
    effect="write",
    service="tickets",
    retry=RETRY,
    reconcile=_find_traced,
    validate=_has_id,
)
TOOLS: list[Tool] = [put_ticket, log_ticket]


def _texts(request: ModelRequest) -> list[str]:
    """What the worker reads, newest first: tool results and user messages (a
    compaction summary is one), then the system prompt."""
    out = [m.content for m in reversed(request.messages) if m.role in ("tool", "user")]
    return [*out, request.system]


def position(request: ModelRequest) -> tuple[int, int] | None:
    """The newest ticket the request names: (item, call)."""
    for text in _texts(request):
        found = _POSITION.findall(text)
        if found:
            i, j = found[-1]
            return int(i), int(j)
    return None


def worker(request: ModelRequest) -> ModelResponse | str:
    """One ticket per round for the focus item (see the module docstring)."""
    if request.purpose == "compact":
        pos = position(request)
        where = f"Position: {title(*pos)}." if pos else "No ticket yet."
        return f"Earlier rounds filed one ticket per round, in order. {where}"
    if request.purpose != "act":
        return '{"passed": true, "gaps": [], "reopen": []}'
    ledger = request.ledger or {}
    nxt = ledger.get("next")
    if not nxt:
        return "Nothing is open."
    i = int(str(nxt).removeprefix("it"))
    calls = int(os.environ.get(CALLS_ENV, "100"))
    items = int(os.environ.get(ITEMS_ENV, "100"))
    pos = position(request)
    j = pos[1] + 1 if pos and pos[0] == i else 0
    if j >= calls:
        return f"Every ticket of {nxt} is filed."
    return ModelResponse(
        f"Filing {title(i, j)}.", (tool_call(tool_of(i, items), title=title(i, j)),)
    )
