"""A scripted model for long checklists that follows the ledger honestly, with no memory
of its own (it survives a crash of the process that runs it).

Each item `f-NNNNN` takes two calls: a draft `work/<id>.part`, then the file
`out/<id>.txt`. The model pages through the open items with `ledger_items` (40 at a time),
drafts the page's items in one round, writes their files in the next (asking for the next
page in the same round), and so on; it reads what it did from the latest round of the
conversation, which compaction keeps verbatim. When the latest ledger it was given has
nothing open, it says so.
"""

from __future__ import annotations

import json
import re

from tether.models.base import Message, ModelRequest, ModelResponse
from tether.models.scripted import tool_call

PAGE = 40
_NEXT = re.compile(r"^Next: (\S+)", re.M)
_ROW = re.compile(r"^\[[ ~]\] (f-\d+):", re.M)


def _latest_ledger(request: ModelRequest) -> str:
    for m in reversed(request.messages):
        if m.role == "user" and "GOAL LEDGER" in m.content:
            return m.content
    return request.system


def _last_round(request: ModelRequest) -> tuple[Message | None, list[Message]]:
    """The latest assistant message with tool calls, and the tool results after it."""
    for n in range(len(request.messages) - 1, -1, -1):
        m = request.messages[n]
        if m.role == "assistant" and m.tool_calls:
            return m, [r for r in request.messages[n + 1 :] if r.role == "tool"]
    return None, []


def paging_drafter(request: ModelRequest) -> ModelResponse | str:
    """The policy (see the module docstring)."""
    if request.purpose == "compact":
        return "Items were drafted and written a page at a time, in the ledger's order."
    if request.purpose != "act":
        return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
    found = _NEXT.findall(_latest_ledger(request))
    if not found or found[-1] == "nothing":
        return ModelResponse("Everything in the ledger is closed.")
    last, results = _last_round(request)
    calls = list(last.tool_calls) if last is not None else []
    drafted = [
        c.arguments["path"][len("work/") : -len(".part")]
        for c in calls
        if c.name == "write_file" and str(c.arguments.get("path", "")).startswith("work/")
    ]
    if drafted:
        # The drafts are in: write the files, and ask for the next page meanwhile.
        writes = [
            tool_call("write_file", path=f"out/{i}.txt", content=f"migrated {i}") for i in drafted
        ]
        more = tool_call("ledger_items", status="open", after=drafted[-1], limit=PAGE)
        return ModelResponse(f"writing {len(drafted)} files", (*writes, more))
    by_id = {r.tool_call_id: r.content for r in results}
    page = [i for c in calls if c.name == "ledger_items" for i in _ROW.findall(by_id.get(c.id, ""))]
    if not page:
        return ModelResponse(
            "listing the open items",
            (tool_call("ledger_items", status="open", limit=PAGE),),
        )
    drafts = [
        tool_call("write_file", path=f"work/{i}.part", content=json.dumps({"draft": i}))
        for i in page
    ]
    return ModelResponse(f"drafting {len(page)} files", tuple(drafts))
