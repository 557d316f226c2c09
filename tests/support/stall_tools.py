"""Tools for the proxy chaos tests (`TETHER_TOOLS=tests.support.stall_tools:TOOLS`).

`create_ticket` of `tests.services.tools` (`ticket_tool`) with a 2 s tether timeout:
with `TICKETS_TIMEOUT` set high, a stalled service is cut by tether's own tool timeout,
not by the HTTP client's.
"""

from __future__ import annotations

from tests.services.tools import ticket_tool
from tether.tools.registry import Tool

create_ticket: Tool = ticket_tool(timeout=2.0)

TOOLS: list[Tool] = [create_ticket]
