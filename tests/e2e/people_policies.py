"""Scripted policies for the people-in-the-loop CLI tests (`--model
scripted:tests.e2e.people_policies:<name>`)."""

from __future__ import annotations

from tests.e2e.policies import _other
from tests.support.loop import next_item
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call

QUESTION = "NEED_HELP: which customer is this report for?"


def asks_first(request: ModelRequest) -> ModelResponse | str:
    """Asks a person until a message from the user arrives, then writes each item's file
    with that message in it (so the test sees the answer reached the model)."""
    if request.purpose != "act":
        return _other(request)
    said = [m.content for m in request.messages if "Message from the user" in m.content]
    if not said:
        return ModelResponse(QUESTION)
    item = next_item(request)
    if item is None:
        return ModelResponse("All items are closed.")
    return ModelResponse(
        f"Writing {item}.", (tool_call("write_file", path=f"out/{item}.txt", content=said[-1]),)
    )
