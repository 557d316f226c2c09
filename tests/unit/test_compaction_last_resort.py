"""When nothing else can give way, compaction shortens what the model sees again of the
latest round — its own long text and long string arguments as well as long results —
instead of failing the task; the short parts stay as they were."""

from __future__ import annotations

from tether.models.base import Message, ToolCall
from tether.runtime.round.compaction import _LAST_RESORT_CHARS, _trim_messages
from tether.runtime.round.context import Entry


def test_long_text_arguments_and_results_of_an_entry_are_cut_with_a_marker() -> None:
    big = "x" * 50_000
    call = ToolCall("c1", "write_file", {"path": "out/a.txt", "content": big, "n": 3})
    entry = Entry(
        "round",
        [
            Message("assistant", "DONE " + big, (call,)),
            Message("tool", big, tool_call_id="c1", name="write_file"),
            Message("user", "short words"),
        ],
    )
    before = entry.tokens
    _trim_messages(entry)
    text, result, words = entry.messages
    assert text.content.startswith("DONE x") and text.content.endswith("[trimmed]")
    assert len(text.content) <= _LAST_RESORT_CHARS + 20
    args = text.tool_calls[0].arguments
    assert args is not None
    assert args["path"] == "out/a.txt" and args["n"] == 3
    assert args["content"].endswith("[trimmed]") and len(args["content"]) < 3_000
    assert result.content.endswith("[trimmed]") and len(result.content) < 400
    assert words.content == "short words"
    assert entry.tokens < before / 10
