"""Any answer a model (or an adapter of one's own) can hand the runtime, generated: a
run goes on or stops with a status, never an exception out of `Engine.run` and never a
half-written round — odd text, odd calls (names, ids, arguments, argument text and
errors), many calls, odd usage figures, on the memory and SQLite stores."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.adversarial import contract, op_rule_items
from tests.support.loop import run_task
from tether import open_store
from tether.models.base import ModelResponse, ToolCall, Usage
from tether.models.scripted import ScriptedModel
from tether.store.base import Store

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Text as a provider's JSON can carry it: any code point, lone surrogates included.
odd_text = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=200),
    st.sampled_from(
        ["", "\x00", "\ud800", "NEED_HELP", "DONE. All items are complete.", "x" * 50_000]
    ),
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True, allow_infinity=True),
        odd_text,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=4)
    ),
    max_leaves=20,
)
names = st.one_of(
    st.sampled_from(["write_file", "read_file", "list_files", "read_artifact"]), odd_text
)
ids = st.one_of(st.sampled_from(["", "same", "call_1", "a b"]), odd_text)


@st.composite
def calls(draw: Any) -> ToolCall:
    arguments = draw(st.one_of(st.none(), st.dictionaries(odd_text, json_values, max_size=4)))
    try:
        raw = json.dumps(arguments)
    except (TypeError, ValueError):
        raw = "{}"
    raw = draw(st.one_of(st.just(raw), odd_text))
    error = draw(st.one_of(st.none(), odd_text)) if arguments is None else None
    return ToolCall(draw(ids), draw(names), arguments, raw, error)


counts = st.integers(min_value=-(10**12), max_value=10**20)


@st.composite
def responses(draw: Any) -> ModelResponse:
    many = draw(st.sampled_from([0, 1, 3, 70]))
    tool_calls = tuple(draw(calls()) for _ in range(many if many < 70 else 1)) * (
        1 if many < 70 else 70
    )
    usage = Usage(draw(counts), draw(counts), draw(counts), draw(counts))
    return ModelResponse(
        draw(odd_text),
        tool_calls,
        usage,
        draw(odd_text),
        draw(st.floats(allow_nan=True, allow_infinity=True)),
        draw(st.one_of(st.none(), odd_text)),
    )


def _on(kind: str, body: Callable[[Store, Path], Awaitable[Any]]) -> Any:
    """`body(store, folder)` on a new store of `kind` (memory, sqlite, or a PostgreSQL
    URL) in a temporary folder, the store closed afterwards."""

    async def go(url: str, folder: Path) -> Any:
        store = await open_store(url)
        try:
            return await body(store, folder)
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as d:
        url = {"memory": "memory://", "sqlite": f"sqlite:///{d}/t.db"}.get(kind, kind)
        return asyncio.run(go(url, Path(d)))


def _answering(answers: list[ModelResponse]) -> Callable[[Store, Path], Awaitable[Any]]:
    """A run whose actor gives `answers` in turn (the last one again after them)."""

    async def body(store: Store, folder: Path) -> Any:
        spec = contract(
            op_rule_items("a"),
            models={"judge": "rules"},
            limits={"max_rounds": len(answers) + 1},
        )
        asked = iter(range(10**6))
        model = ScriptedModel(policy=lambda r: answers[min(next(asked), len(answers) - 1)])
        tid, result = await run_task(store, spec, folder, model)
        task = await store.get_task(tid)
        # What the run says and what the store holds agree; the log reads back.
        assert task.status == result.status
        assert await store.read_events(tid)
        return result

    return body


@FUZZ
@given(st.lists(responses(), min_size=1, max_size=3), st.sampled_from(["memory", "sqlite"]))
def test_any_model_answer_ends_in_a_status(answers: list[ModelResponse], kind: str) -> None:
    result = _on(kind, _answering(answers))
    assert result.status in {"satisfied", "waiting", "suspended", "failed", "queued"}
    assert 0 <= result.rounds <= len(answers) + 1  # the limit: the last answer repeats


@settings(FUZZ, max_examples=15, suppress_health_check=list(HealthCheck))
@given(st.lists(responses(), min_size=1, max_size=2))
def test_any_model_answer_ends_in_a_status_on_postgres(
    pg_schema_url: Callable[[], str], answers: list[ModelResponse]
) -> None:
    result = _on(pg_schema_url(), _answering(answers))
    assert result.status in {"satisfied", "waiting", "suspended", "failed", "queued"}


#: What a judge model may answer: odd text, or the verdict's shape with odd values.
statuses = st.one_of(
    st.sampled_from(["done", "in_progress", "blocked", "skipped", "pending", "waived"]),
    odd_text,
)
changes = st.fixed_dictionaries(
    {"item": st.one_of(st.sampled_from(["a", "b"]), odd_text), "status": statuses},
    optional={
        "evidence": st.one_of(st.lists(odd_text, max_size=3), json_values),
        "note": json_values,
    },
)
verdicts = st.fixed_dictionaries(
    {
        "changes": st.one_of(st.lists(changes, max_size=3), json_values),
        "decision": st.one_of(
            st.sampled_from(["continue", "satisfied", "need_user", "blocked"]), json_values
        ),
    },
    optional={"reason": json_values},
)


def _text(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return "{}"


judge_answers = st.one_of(odd_text, verdicts.map(_text), json_values.map(_text))


@FUZZ
@given(
    st.lists(responses(), min_size=1, max_size=3),
    st.lists(judge_answers, min_size=1, max_size=3),
    odd_text,
    st.sampled_from(["memory", "sqlite"]),
)
def test_any_judge_or_compressor_answer_ends_in_a_status(
    answers: list[ModelResponse], judged: list[str], summary: str, kind: str
) -> None:
    """An LLM judge that answers anything, and a compressor that writes anything, on a
    budget small enough to compact: the run ends in a status, and the ledger only holds
    what the audit let through (an item done has evidence)."""

    async def body(store: Store, folder: Path) -> Any:
        spec = contract(
            [*op_rule_items("a"), {"id": "b", "title": "look around"}],
            limits={"max_rounds": len(answers) + 2},
            context={"input_budget_tokens": 1500, "preview_chars": 200},
        )
        acted, said = iter(range(10**6)), iter(range(10**6))
        act = ScriptedModel(policy=lambda r: answers[min(next(acted), len(answers) - 1)])
        judge = ScriptedModel(
            policy=lambda r: ModelResponse(judged[min(next(said), len(judged) - 1)])
        )
        compact = ScriptedModel(policy=lambda r: ModelResponse(summary))
        tid, result = await run_task(store, spec, folder, act, judge=judge, compact=compact)
        ledger = (await store.get_ledger(tid)).to_ledger()
        for definition, state in ledger.items():
            if state.status == "done":
                assert state.evidence, definition.id
        return result

    result = _on(kind, body)
    assert result.status in {"satisfied", "waiting", "suspended", "failed", "queued"}


class _Odd:
    """An object of a tool's own, with a `__repr__` that says something odd."""

    def __repr__(self) -> str:
        return "odd \ud800 \x00 object"


tool_values = st.one_of(
    json_values,
    st.binary(max_size=64),
    st.sets(st.integers(), max_size=3),
    st.complex_numbers(),
    st.dates(),
    st.builds(_Odd),
    st.dictionaries(st.one_of(st.integers(), st.none(), st.booleans()), json_values, max_size=3),
    st.tuples(json_values, st.builds(_Odd)),
)
failures = st.one_of(
    st.builds(ValueError, odd_text),
    st.builds(RuntimeError),
    st.builds(KeyError, json_values),
    st.builds(OSError, st.integers(), odd_text),
)


@FUZZ
@given(
    st.lists(st.one_of(tool_values, failures), min_size=1, max_size=3),
    st.sampled_from(["memory", "sqlite"]),
)
def test_any_tool_value_or_failure_ends_in_a_status(outputs: list[Any], kind: str) -> None:
    """A tool of one's own that returns anything or raises anything: each call is a
    result or a failure the model reads, never the run's end."""
    from tether import ToolRegistry, tool
    from tether.models.scripted import tool_call

    given_out = iter(outputs)

    @tool(effect="read")
    def anything(n: int) -> Any:
        """Returns or raises what the test gives."""
        value = next(given_out, "done")
        if isinstance(value, BaseException):
            raise value
        return value

    async def body(store: Store, folder: Path) -> Any:
        spec = contract(
            [{"id": "a", "title": "look around"}],
            tools=["anything"],
            models={"judge": "rules"},
            limits={"max_rounds": len(outputs), "no_progress_rounds": 100},
        )
        calls = iter(range(10**6))
        model = ScriptedModel(
            policy=lambda r: ModelResponse("again", (tool_call("anything", n=next(calls)),))
        )
        tid, result = await run_task(store, spec, folder, model, registry=ToolRegistry([anything]))
        ops = await store.get_ops(tid)
        assert len(ops) == len(outputs)
        assert all(o.status in ("succeeded", "failed") for o in ops), ops
        return result

    result = _on(kind, body)
    assert result.status == "waiting"
