"""Scripted policies for the crash-window tests: one external call per ledger item.

`actor` reads the Next item from the ledger the runtime gives it (as a model would) and
calls the first tool it was offered (other than `read_artifact`) once for that item:
`create_ticket*(title=<item id>)` or `insert_row(key=<item id>, value="v-<item id>")`.
With nothing open it says so, and the task can be delivered.
"""

from __future__ import annotations

from tests.support.loop import next_item
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call


def actor(request: ModelRequest) -> ModelResponse:
    """One call of the offered tool for the Next item."""
    item = next_item(request)
    if item is None:
        return ModelResponse("Everything in the ledger is closed.")
    name = next(t.name for t in request.tools if t.name != "read_artifact")
    if name == "insert_row":
        return ModelResponse(f"recording {item}", (tool_call(name, key=item, value=f"v-{item}"),))
    return ModelResponse(f"filing {item}", (tool_call(name, title=item),))
