"""Tools for the proxy chaos tests (`TETHER_TOOLS=tests.support.stall_tools:TOOLS`).

`create_ticket` of `tests.services.tools` declared again with a 2 s tether timeout:
with `TICKETS_TIMEOUT` set high, a stalled service is cut by tether's own tool timeout,
not by the HTTP client's.
"""

from __future__ import annotations

from tests.services.tools import RETRY, _create_ticket, _find_ticket, _has_id
from tether.tools.registry import Tool, tool

create_ticket: Tool = tool(
    _create_ticket,
    name="create_ticket",
    effect="write",
    service="tickets",
    retry=RETRY,
    reconcile=_find_ticket,
    validate=_has_id,
    timeout=2.0,
)

TOOLS: list[Tool] = [create_ticket]
