"""Policy and references for the flaky-service and two-worker reliability tests.

The tool is `create_ticket` of `tests.services.tools` (service `tickets`, an
`Idempotency-Key` per op, `RETRY`: 3 attempts with a 0.05 s base delay), registered with
`TETHER_TOOLS=tests.services.flaky_tools:TOOLS`.

`actor` is the scripted model of those tests (`--model scripted:tests.services.flaky_tools:actor`):

- asked to act, it files one ticket for the item the ledger names as Next, every round,
  whatever happened to the previous call: an item whose call failed (transiently, or
  refused fast by an open breaker) is simply tried again in the next round, as a model
  that keeps going would;
- asked to compact the context (long runs against a flaky service have many rounds),
  it answers with a short summary instead of a tool call;
- with nothing open, it says so.
"""

from __future__ import annotations

from tests.services.tools import RETRY, TICKET_TOOLS, create_ticket
from tests.support.loop import next_item
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call
from tether.tools.registry import Tool

TOOLS: list[Tool] = list(TICKET_TOOLS)
TOOL_NAME = create_ticket.name
SERVICE = create_ticket.service
#: The most POSTs one op may make (its retry policy's attempts).
MAX_ATTEMPTS = RETRY.max_attempts
POLICY = "scripted:tests.services.flaky_tools:actor"
TOOLS_REF = "tests.services.flaky_tools:TOOLS"


def actor(request: ModelRequest) -> ModelResponse:
    """One `create_ticket(title=<Next item>)` per round; a summary when compacting."""
    if request.purpose == "compact":
        return ModelResponse("Filing one ticket per ledger item; the ledger shows which are done.")
    item = next_item(request)
    if item is None:
        return ModelResponse("Everything in the ledger is closed.")
    return ModelResponse(f"filing {item}", (tool_call(TOOL_NAME, title=item),))
