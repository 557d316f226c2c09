"""Property test: the context's running totals (history tokens, the flat message list)
equal what a pass over its entries computes, after any sequence of appends, drops,
reassignments, in-place trims and compaction fits.

`Context` keeps the sum of its entries' tokens and their messages as entries come and
go, so a round's estimate and request cost no pass over the whole history; these must
never drift from the entries themselves (a drift would change the prompt or when
compaction runs).
"""

from __future__ import annotations

from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import tokens
from tether.models.base import Message, ToolCall, ToolSchema
from tether.runtime.round import compaction
from tether.runtime.round.context import Context, Entry

KINDS = ("turn", "round", "continuation", "summary")

texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="abc xyz", min_size=290, max_size=420),  # long enough to be trimmed
    st.text(alphabet="字a", max_size=30),
)


@st.composite
def messages(draw: Any) -> Message:
    role = draw(st.sampled_from(("user", "assistant", "tool")))
    if role == "assistant" and draw(st.booleans()):
        raw = draw(st.text(max_size=30))
        call = ToolCall("c1", "do_step", {"a": raw}, raw_arguments=raw)
        return Message("assistant", draw(texts), (call,))
    if role == "tool":
        return Message("tool", draw(texts), tool_call_id="c1", name="do_step")
    return Message(role, draw(texts))


@st.composite
def entries(draw: Any) -> Entry:
    return Entry(
        draw(st.sampled_from(KINDS)),
        draw(st.lists(messages(), min_size=1, max_size=3)),
        draw(st.one_of(st.none(), st.integers(1, 50))),
    )


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), entries()),
        st.tuples(st.just("drop"), st.integers(0, 20)),
        st.tuples(st.just("assign"), st.lists(entries(), max_size=5)),
        st.tuples(st.just("keep_tail"), st.integers(0, 6)),
        st.tuples(st.just("trim"), st.integers(0, 20)),
        st.tuples(st.just("trim_all"), st.none()),
        st.tuples(st.just("fit"), st.integers(0, 600)),
        st.tuples(st.just("system"), texts),
        st.tuples(st.just("calibrate"), st.integers(1, 4000)),
    ),
    max_size=30,
)


def _check(ctx: Context) -> None:
    """The running values against a fresh pass over the entries."""
    for e in ctx.entries:
        assert e.tokens == sum(tokens.estimate_message(m) for m in e.messages)
    fixed = tokens.estimate_text(ctx.system) + tokens.estimate_tools(ctx.tools)
    raw = fixed + sum(e.tokens for e in ctx.entries)
    assert ctx.history_tokens() == sum(e.tokens for e in ctx.entries)
    assert ctx.raw_estimate() == raw
    assert ctx.estimate() == ctx.calibrator.scale(raw)
    flat = tuple(m for e in ctx.entries for m in e.messages)
    assert ctx.messages() == flat
    assert ctx.request("act", task_id="t").messages == flat


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(entries(), max_size=4), ops=operations)
def test_running_totals_match_the_entries(first: list[Entry], ops: list[Any]) -> None:
    schema = ToolSchema("do_step", "Process one record.", {"type": "object"})
    ctx = Context(system="SYSTEM\n\nGOAL LEDGER\n- i1", tools=(schema,), entries=list(first))
    _check(ctx)
    for op, arg in ops:
        entries_now = ctx.entries
        if op == "append":
            ctx.append(arg)
        elif op == "drop" and entries_now:
            ctx.drop(arg % len(entries_now))
        elif op == "assign":
            ctx.entries = list(arg)
        elif op == "keep_tail":
            # As a compaction does: a summary, then the recent entries.
            summary = Entry("summary", [Message("user", "summary")])
            ctx.entries = [summary, *entries_now[len(entries_now) - min(arg, len(entries_now)) :]]
        elif op == "trim" and entries_now:
            compaction._trim_results(entries_now[arg % len(entries_now)])
            ctx.recount()
        elif op == "trim_all":
            for e in entries_now:
                compaction._trim_messages(e, compaction._LAST_RESORT_CHARS[-1])
            ctx.recount()
        elif op == "fit" and entries_now and entries_now[0].kind == "summary":
            # `_fit` drops, folds and trims entries in place; it needs a summary first.
            compaction._fit(ctx, arg, "kept", "", cast(Any, None), cast(Any, None), [])
        elif op == "system":
            ctx.system = arg
        elif op == "calibrate":
            ctx.calibrator.observe(max(1, ctx.raw_estimate()), arg)
        _check(ctx)


def test_messages_tuple_is_rebuilt_after_a_change() -> None:
    """The cached message tuple is never stale: an append shows in the next request."""
    ctx = Context(system="s", tools=())
    first = ctx.messages()
    assert first == ()
    ctx.append(Entry("turn", [Message("user", "hello")]))
    assert [m.content for m in ctx.messages()] == ["hello"]
    assert ctx.messages() is ctx.messages()  # built once per change
    ctx.append(Entry("round", [Message("assistant", "hi")], 1))
    assert [m.content for m in ctx.messages()] == ["hello", "hi"]
