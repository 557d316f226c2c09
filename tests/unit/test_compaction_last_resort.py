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
    first = _LAST_RESORT_CHARS[0]
    _trim_messages(entry, first)
    text, result, words = entry.messages
    assert text.content.startswith("DONE x") and text.content.endswith("[trimmed]")
    assert len(text.content) <= first + 20
    args = text.tool_calls[0].arguments
    assert args is not None
    assert args["path"] == "out/a.txt" and args["n"] == 3
    assert args["content"].endswith("[trimmed]") and len(args["content"]) < 3_000
    assert result.content.endswith("[trimmed]") and len(result.content) < 400
    assert words.content == "short words"
    assert entry.tokens < before / 10


def test_later_cuts_are_shorter_and_reach_values_that_are_not_text() -> None:
    """Each later last-resort cut is shorter; an argument that is not text but whose
    JSON is long becomes its cut JSON text (an adapter may send the arguments object)."""
    assert list(_LAST_RESORT_CHARS) == sorted(_LAST_RESORT_CHARS, reverse=True)
    last = _LAST_RESORT_CHARS[-1]
    numbers = list(range(5_000))
    call = ToolCall("c1", "f", {"rows": numbers, "few": [1, 2], "flag": True})
    entry = Entry("round", [Message("assistant", "y" * 5_000, (call,))])
    _trim_messages(entry, last)
    (msg,) = entry.messages
    assert len(msg.content) <= last + 20
    args = msg.tool_calls[0].arguments
    assert args is not None
    assert args["few"] == [1, 2] and args["flag"] is True
    assert isinstance(args["rows"], str) and args["rows"].startswith("[0, 1, 2")
    assert len(args["rows"]) <= last + 20
