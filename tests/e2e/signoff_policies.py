"""A scripted actor for the sign-off tests: writes each Next item's file; after a person
rejected the work with a hint (a user message), it writes what the hint asks."""

from __future__ import annotations

from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call


def writer(request: ModelRequest) -> ModelResponse | str:
    """`out/<next>.txt` with `<next> done`, or `checked` once a rejected sign-off said so."""
    if request.purpose != "act":
        return '{"changes": [], "decision": "continue", "reason": "rules decide"}'
    item = (request.ledger or {}).get("next")
    told = [m for m in request.messages if "sign-off was rejected" in m.content]
    if item is None:
        return ModelResponse("All items are closed.")
    call = tool_call(
        "write_file", path=f"out/{item}.txt", content="checked\n" if told else f"{item} done\n"
    )
    return ModelResponse(f"Writing {item}.", (call,))
