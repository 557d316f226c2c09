"""The tool calls a round takes from its response: how many, and under which ids.

A model can answer with any number of tool calls: a confused or hostile one with
thousands. Each call and its result stay in the context, and a provider refuses an
assistant message whose calls lack their results, so a round that ran them all would
leave a latest round no context budget can hold (the run then stopped with a budget
error it could do nothing about). The runtime therefore keeps the first calls up to
`limits.max_calls_per_round` and leaves the rest out of the response *before* it is
journaled: the journal, the context, a replay and a resume all see the same shortened
response, and its text ends with the runtime's note of what was not run, so the model
can ask again.

A call's id only pairs it with its result, but providers check it: two calls of one
message under the same id, an empty id, or one with characters a provider refuses
would make every later request of the task fail the same way. Such ids are replaced the
same way, before the response is journaled, and so is a name a provider refuses (its
characters made usable; the call, under that name, is refused as malformed and the
model told the name it used is no tool's).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Container
from dataclasses import replace

from tether import events as ev
from tether.models.base import ModelResponse, ToolCall

#: The most tool names the note lists one by one (then a count).
_NAMES_SHOWN = 20
#: Ids every provider takes back (Anthropic's pattern; OpenAI's ids fit it too).
_USABLE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: Tool names every provider takes back in the history (OpenAI's and Anthropic's
#: pattern): a call under another name (`multi_tool_use.parallel`, a look-alike letter,
#: a space) would make every later request of the task fail.
_USABLE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME_MAX = 64
_UNUSABLE_CHAR = re.compile(r"[^A-Za-z0-9_-]")


def admit_calls(
    response: ModelResponse, limit: int, round_no: int, tools: Container[str] = ()
) -> tuple[ModelResponse, list[ev.Event]]:
    """`response` with at most `limit` tool calls under usable, distinct ids, and the
    audit warnings that say what was changed (none when nothing was). A name among
    `tools` (the run's) is kept whatever its characters: it is a tool of the task."""
    warnings: list[ev.Event] = []
    calls = response.tool_calls
    text = response.text
    if len(calls) > limit:
        text = _with_note(text, _left_out_note(calls, limit))
        warnings.append(
            ev.AuditWarning(
                code="too_many_calls",
                message=f"the model asked for {len(calls)} tool calls in one response; the "
                f"first {limit} were run and {len(calls) - limit} were left out",
                details={
                    "asked": len(calls),
                    "run": limit,
                    "left_out": dict(Counter(c.name for c in calls[limit:])),
                },
            )
        )
        calls = calls[:limit]
    fixed = _usable(calls, round_no, tools)
    if fixed is not calls:
        changed = sum(a.id != b.id for a, b in zip(fixed, calls, strict=True))
        warnings.append(
            ev.AuditWarning(
                code="call_ids_replaced",
                message=f"{changed} tool call id(s) of the response were empty, repeated or "
                "not usable with providers (or a name was not one providers take); the "
                "runtime gave them its own",
                details={"round": round_no, "replaced": changed},
            )
        )
        calls = fixed
    if calls is response.tool_calls and text is response.text:
        return response, warnings
    return replace(response, text=text, tool_calls=calls), warnings


def _usable(
    calls: tuple[ToolCall, ...], round_no: int, tools: Container[str] = ()
) -> tuple[ToolCall, ...]:
    """`calls` (the same tuple when nothing needs changing) with every id usable and
    distinct, and every name at most `_NAME_MAX` characters."""
    if not calls:
        return calls
    ids = {c.id for c in calls}
    if (
        len(ids) == len(calls)
        and all(map(_USABLE_ID.fullmatch, ids))
        and all(_USABLE_NAME.fullmatch(c.name) or c.name in tools for c in calls)
    ):
        return calls  # the usual answer, checked without a copy
    seen: set[str] = set()
    out: list[ToolCall] = []
    changed = False
    for n, call in enumerate(calls):
        new = call
        if call.id in seen or not _USABLE_ID.fullmatch(call.id):
            own = f"tether_{round_no}_{n}"
            while own in seen or own in ids:  # a model's own id may look like ours
                own += "_"
            new = replace(new, id=own)
        if not _USABLE_NAME.fullmatch(call.name) and call.name not in tools:
            new = replace(
                new,
                name=_UNUSABLE_CHAR.sub("_", call.name)[:_NAME_MAX] or "unnamed_tool",
                error=f"{call.name[:80]!r} is no tool's name (a name has letters, digits, "
                "_ and - only); call a listed tool by its exact name",
            )
        seen.add(new.id)
        changed = changed or new is not call
        out.append(new)
    return tuple(out) if changed else calls


def _left_out_note(calls: tuple[ToolCall, ...], limit: int) -> str:
    left = Counter(c.name[:_NAME_MAX] for c in calls[limit:])
    names = [f"{name} x{n}" if n > 1 else name for name, n in left.most_common(_NAMES_SHOWN)]
    if len(left) > _NAMES_SHOWN:
        names.append(f"{len(left) - _NAMES_SHOWN} more tools")
    return (
        f"[tether: this response asked for {len(calls)} tool calls; only the first "
        f"{limit} were run (limits.max_calls_per_round). Not run: {', '.join(names)}. "
        "Ask again in a later round for those still needed.]"
    )


def _with_note(text: str, note: str) -> str:
    return f"{text.rstrip()}\n\n{note}" if text.strip() else note
