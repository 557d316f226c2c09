"""Scripted models for `test_cli_resume_remembers` and `test_cli_exit_hints`."""

from __future__ import annotations

from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.tools.registry import tool as tether_tool


def unreachable(request: ModelRequest) -> ModelResponse | str:
    """An endpoint that never answers: every call fails as a lost connection does."""
    raise errors.ModelError("connection error: All connection attempts failed", transient=True)


@tether_tool(effect="read")
def shout(text: str) -> str:
    """Says `text` louder (a tool of a TETHER_TOOLS module)."""
    return text.upper()


#: `TETHER_TOOLS=tests.e2e.loop_policies:TOOLS`.
TOOLS = [shout]


def shouts_then_writes(request: ModelRequest) -> ModelResponse | str:
    """Calls `shout` beside each write, so that a run needs the TETHER_TOOLS tool."""
    from tests.e2e.policies import _other
    from tests.support.loop import next_item
    from tether.models.scripted import tool_call

    if request.purpose != "act":
        return _other(request)
    item = next_item(request)
    if item is None:
        return ModelResponse("All items are closed.")
    return ModelResponse(
        f"Writing {item}.",
        (
            tool_call("shout", text=item),
            tool_call("write_file", path=f"out/{item}.txt", content=f"{item} done\n"),
        ),
    )
