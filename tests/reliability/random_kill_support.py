"""Tools and the scripted analyst of the random-kill harness (`test_random_kills.py`).

- `TOOLS` (`TETHER_TOOLS=tests.reliability.random_kill_support:TOOLS`): the ticket
  tools of `tests.services.tools` (`create_ticket`: an idempotency key per op and a
  `reconcile` by key) plus `file_ticket`, the compensable ticket tool of
  `tests.services.compensation_tools` under its own name (a cancel per applied op, with
  its own key and `reconcile`).
- `analyst`: first files the batch `a`, `b`, `c` with `file_ticket` in one round (the
  service refuses `c` for good, so its retries run out and `a` and `b` are compensated),
  then does what the A/B analyst of `tests/e2e/ab_policies.py` does: reads the declared
  sources, quotes evidence, claims, writes a section per dimension and the report, and
  files one ticket (approved by a person) with the open questions. Every answer is
  worked out from the request alone, so a fresh process after a kill goes on from where
  the journal says the task is.
"""

from __future__ import annotations

from dataclasses import replace

from tests.e2e.ab_policies import _call
from tests.e2e.ab_policies import analyst as ab_analyst
from tests.services import compensation_tools
from tests.services.tools import TOOLS as TICKET_TOOLS

from tether.models.base import ModelRequest, ModelResponse
from tether.tools.registry import Tool

file_ticket: Tool = replace(compensation_tools.create_ticket, name="file_ticket")
TOOLS: list[Tool] = [*TICKET_TOOLS, file_ticket]
TOOLS_REF = "tests.reliability.random_kill_support:TOOLS"
MODEL = "scripted:tests.reliability.random_kill_support:analyst"
BATCH = ("a", "b", "c")


def _batch_pending(request: ModelRequest) -> bool:
    """The batch item is still to do and no batch call was ever answered."""
    if any(m.role == "tool" and m.name == "file_ticket" for m in request.messages):
        return False
    for it in (request.ledger or {}).get("items", []):
        if it["id"] == "batch":
            return it["status"] in ("pending", "in_progress")
    return False


def analyst(request: ModelRequest) -> ModelResponse | str:
    """The batch first, then the A/B analyst (see the module docstring)."""
    if request.purpose == "act" and _batch_pending(request):
        return ModelResponse(
            "filing the batch", tuple(_call("file_ticket", title=t) for t in BATCH)
        )
    return ab_analyst(request)
