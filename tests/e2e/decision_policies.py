"""A scripted actor for the decision tests: it will not touch item `i2` until a human
gives a hint about it (a `retry --hint` reaches the model as a user message)."""

from __future__ import annotations

from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call


def stubborn(request: ModelRequest) -> ModelResponse | str:
    """Writes `out/<next>.txt`, except for i2 before a hint about it: then it only talks."""
    if request.purpose != "act":
        return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
    item = (request.ledger or {}).get("next")
    if item is None:
        return ModelResponse("All items are closed. Everything is done.")
    hinted = any("About item i2" in m.content for m in request.messages if m.role == "user")
    if item == "i2" and not hinted:
        return ModelResponse("i2 is already complete, trust me.")
    return ModelResponse(
        f"Writing {item}.",
        (tool_call("write_file", path=f"out/{item}.txt", content=f"{item} done\n"),),
    )
