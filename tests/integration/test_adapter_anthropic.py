"""The Anthropic adapter against a real HTTP server on 127.0.0.1.

The server answers in the messages API wire format (`tool_use` content blocks, usage
with `cache_read_input_tokens` / `cache_creation_input_tokens`, `rate_limit_error` and
`overloaded_error` bodies) and records every request, so the tests can check what the
official SDK sent: system blocks and the last message with `cache_control`
breakpoints, tool results merged into one user message, the `anthropic-version`
header.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from typing import Any

import pytest

pytest.importorskip(
    "anthropic", reason="the anthropic extra is not installed (pip install -e '.[anthropic]')"
)

from tests.support.fake_provider import READ, WRITE, FakeProvider, model_request
from tether.errors import ModelError, UserError
from tether.models._retry import RetryEvent, RetryPolicy
from tether.models.anthropic import AnthropicModel
from tether.models.base import Message, ModelRequest, ModelResponse, ToolCall


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with closing(FakeProvider(prefix="")) as p:
        yield p


TINY = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.005, max_retry_after=0.5)
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
async def model(provider: FakeProvider) -> AsyncIterator[AnthropicModel]:
    m = AnthropicModel(
        "claude-sonnet-4-6", base_url=provider.url, api_key="sk-ant-test", retry=TINY, timeout=10
    )
    try:
        yield m
    finally:
        await m.aclose()


# --- wire-format helpers ------------------------------------------------------------------


def message(
    content: list[dict[str, Any]],
    *,
    usage: dict[str, Any] | None = None,
    stop_reason: str = "end_turn",
    model: str = "claude-sonnet-4-6-20260217",
) -> dict[str, Any]:
    return {
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage
        or {
            "input_tokens": 12,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 3,
        },
    }


def error(kind: str, text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": text}, "request_id": "req_011"}


SYSTEM = "You are a careful agent. Use the tools.\n\n## Ledger\n- [ ] i1 read notes"


def request(**kwargs: Any) -> ModelRequest:
    return model_request(**{"system": SYSTEM, **kwargs})


# --- (a) a tool call with cache usage -----------------------------------------------------


async def test_tool_use_and_cache_usage(provider: FakeProvider, model: AnthropicModel) -> None:
    provider.queue(
        200,
        message(
            [
                {"type": "text", "text": "I'll read the notes first."},
                {
                    "type": "tool_use",
                    "id": "toolu_01A09q90qw90lq917835lq9",
                    "name": "read_file",
                    "input": {"path": "notes/a.txt"},
                },
            ],
            stop_reason="tool_use",
            usage={
                "input_tokens": 50,
                "cache_creation_input_tokens": 248,
                "cache_read_input_tokens": 1800,
                "output_tokens": 80,
                "service_tier": "standard",
            },
        ),
    )
    resp = await model.complete(request())
    assert resp.text == "I'll read the notes first."
    (call,) = resp.tool_calls
    assert call.id == "toolu_01A09q90qw90lq917835lq9"
    assert call.name == "read_file"
    assert call.arguments == {"path": "notes/a.txt"}
    assert json.loads(call.raw_arguments) == {"path": "notes/a.txt"}
    assert call.error is None
    # Normalized: the whole prompt, of which 1800 were read from the cache.
    assert resp.usage.input_tokens == 50 + 248 + 1800
    assert resp.usage.cached_input_tokens == 1800
    assert resp.usage.cache_write_tokens == 248
    assert resp.usage.output_tokens == 80
    assert resp.model == "claude-sonnet-4-6-20260217"
    assert resp.finish_reason == "tool_use"
    assert resp.latency_ms > 0
    seen = provider.requests[0]
    assert seen.path == "/v1/messages"
    # Older SDKs send `x-api-key`; anthropic 2.x sends the key as a bearer token.
    key = seen.headers.get("x-api-key") or seen.headers.get("authorization", "")
    assert key.removeprefix("Bearer ") == "sk-ant-test"


# --- (b) a 429, then success --------------------------------------------------------------


async def test_rate_limited_then_success(provider: FakeProvider) -> None:
    sleeps: list[float] = []
    retries: list[RetryEvent] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    provider.queue(
        429,
        error("rate_limit_error", "Number of request tokens has exceeded your rate limit."),
        headers={"retry-after": "0.03"},
    )
    provider.queue(200, message([{"type": "text", "text": "ok"}]))
    async with AnthropicModel(
        "claude-haiku-4-5",
        base_url=provider.url,
        api_key="k",
        retry=TINY,
        sleep=fake_sleep,
        on_retry=retries.append,
    ) as m:
        resp = await m.complete(request())
    assert resp.text == "ok"
    assert len(provider.requests) == 2
    assert sleeps == [pytest.approx(0.03)]
    assert retries[0].failure.status == 429
    assert "rate_limit_error" in retries[0].failure.message


async def test_overloaded_is_retried(provider: FakeProvider, model: AnthropicModel) -> None:
    provider.queue(529, error("overloaded_error", "Overloaded"))
    provider.queue(200, message([{"type": "text", "text": "ok"}]))
    resp = await model.complete(request())
    assert resp.text == "ok"
    assert len(provider.requests) == 2


# --- (c) malformed tool input -------------------------------------------------------------


async def test_malformed_tool_input_becomes_an_error(
    provider: FakeProvider, model: AnthropicModel
) -> None:
    provider.queue(
        200,
        message(
            [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "write_file",
                    "input": '{"path": "x.md", "text": ',
                },
                {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": ["a.txt"]},
                {"type": "tool_use", "id": "toolu_3", "name": "rm_rf", "input": {}},
                {
                    "type": "tool_use",
                    "id": "toolu_4",
                    "name": "read_file",
                    "input": {"path": "ok.txt"},
                },
            ],
            stop_reason="tool_use",
        ),
    )
    resp = await model.complete(request())
    bad_json, not_object, unknown, good = resp.tool_calls
    assert bad_json.arguments is None
    assert bad_json.error is not None and "not valid JSON" in bad_json.error
    assert "write_file" in bad_json.error
    assert not_object.arguments is None
    assert not_object.error is not None and "must be a JSON object" in not_object.error
    assert unknown.arguments is None
    assert unknown.error is not None and "no tool named 'rm_rf'" in unknown.error
    assert good.arguments == {"path": "ok.txt"} and good.error is None


# --- (d) failures -------------------------------------------------------------------------


async def test_server_errors_exhaust_retries(provider: FakeProvider, model: AnthropicModel) -> None:
    for _ in range(3):
        provider.queue(500, error("api_error", "Internal server error"))
    with pytest.raises(ModelError) as info:
        await model.complete(request())
    assert info.value.transient is True
    assert info.value.status == 500
    assert len(provider.requests) == 3


async def test_bad_request_is_not_retried(provider: FakeProvider, model: AnthropicModel) -> None:
    provider.queue(
        400,
        error("invalid_request_error", "messages.1.content.0: unexpected `tool_use_id` found"),
    )
    with pytest.raises(ModelError) as info:
        await model.complete(request())
    assert info.value.transient is False
    assert info.value.status == 400
    assert "invalid_request_error" in str(info.value)
    assert len(provider.requests) == 1


async def test_authentication_error_is_not_retried(
    provider: FakeProvider, model: AnthropicModel
) -> None:
    provider.queue(401, error("authentication_error", "invalid x-api-key"))
    with pytest.raises(ModelError) as info:
        await model.complete(request())
    assert (info.value.transient, info.value.status) == (False, 401)
    assert len(provider.requests) == 1


async def test_missing_api_key_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UserError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-4-6")


# --- (e) the request body -----------------------------------------------------------------


HISTORY = (
    Message("user", "Start with item i1."),
    Message(
        "assistant",
        "Reading both notes.",
        tool_calls=(
            ToolCall("toolu_a", "read_file", {"path": "a.txt"}, '{"path": "a.txt"}'),
            ToolCall("toolu_b", "read_file", {"path": "b.txt"}, '{"path": "b.txt"}'),
        ),
    ),
    Message("tool", "alpha", tool_call_id="toolu_a"),
    Message("tool", "beta", tool_call_id="toolu_b"),
    Message("user", "Ledger: i1 in progress; next read c.txt."),
)


async def test_request_body_and_cache_breakpoints(
    provider: FakeProvider, model: AnthropicModel
) -> None:
    provider.queue(200, message([{"type": "text", "text": "fine"}]))
    await model.complete(request(messages=HISTORY, temperature=0.0, max_output_tokens=700))
    seen = provider.requests[0]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", seen.headers["anthropic-version"])
    body = seen.body
    assert body["model"] == "claude-sonnet-4-6"
    assert body["max_tokens"] == 700
    assert "temperature" not in body  # the current API has no sampling parameters
    assert body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    assert body["tools"] == [
        {
            "name": "read_file",
            "description": "Read a file of the workspace.",
            "input_schema": dict(READ.parameters),
        },
        {
            "name": "write_file",
            "description": "Write a file.",
            "input_schema": dict(WRITE.parameters),
        },
    ]
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0] == {"role": "user", "content": [{"type": "text", "text": "Start with item i1."}]}
    assert msgs[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Reading both notes."},
            {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.txt"}},
            {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "b.txt"}},
        ],
    }
    # Both tool results and the continuation in one user message, results first;
    # the breakpoint sits on the very last block.
    assert msgs[2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "alpha"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "beta"},
            {
                "type": "text",
                "text": "Ledger: i1 in progress; next read c.txt.",
                "cache_control": EPHEMERAL,
            },
        ],
    }
    breakpoints = json.dumps(body).count('"cache_control"')
    assert breakpoints == 2  # stable system prefix + last message


async def test_last_tool_result_carries_the_breakpoint(
    provider: FakeProvider, model: AnthropicModel
) -> None:
    provider.queue(200, message([{"type": "text", "text": "fine"}]))
    await model.complete(request(messages=HISTORY[:4]))
    last = provider.requests[0].body["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "tool_result"]
    assert last["content"][-1]["cache_control"] == EPHEMERAL
    assert "cache_control" not in last["content"][0]


async def test_stable_system_prefix_gets_its_own_breakpoint(
    provider: FakeProvider, model: AnthropicModel
) -> None:
    provider.queue(200, message([{"type": "text", "text": "{}"}]))
    split = SYSTEM.index("## Ledger")
    await model.complete(
        request(metadata={"system_stable_prefix": split}, json_output=True, purpose="judge")
    )
    system = provider.requests[0].body["system"]
    assert system[0] == {"type": "text", "text": SYSTEM[:split], "cache_control": EPHEMERAL}
    assert system[1] == {"type": "text", "text": SYSTEM[split:], "cache_control": EPHEMERAL}
    assert "cache_control" not in system[2] and "JSON" in system[2]["text"]


async def test_prefix_is_byte_stable_across_rounds(
    provider: FakeProvider, model: AnthropicModel
) -> None:
    """Round n+1 appends to round n: everything but the moving breakpoint is equal."""
    provider.queue(200, message([{"type": "text", "text": "a"}]))
    provider.queue(200, message([{"type": "text", "text": "b"}]))
    await model.complete(request(messages=HISTORY[:4]))
    await model.complete(request(messages=HISTORY))
    first, second = (r.body for r in provider.requests)
    assert first["system"] == second["system"]
    assert first["tools"] == second["tools"]
    assert first["messages"][:2] == second["messages"][:2]


# --- extended thinking: the answer's thinking blocks go back with it ---------------------

THINKING = {
    "type": "thinking",
    "thinking": "The notes are in notes/a.txt; read them before writing.",
    "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlx"}


def _thinking_answer(tool_id: str, path: str) -> dict[str, Any]:
    return message(
        [
            THINKING,
            REDACTED,
            {"type": "text", "text": "Reading the notes."},
            {"type": "tool_use", "id": tool_id, "name": "read_file", "input": {"path": path}},
        ],
        stop_reason="tool_use",
    )


async def test_thinking_blocks_go_back_verbatim_with_the_tool_results(
    provider: FakeProvider, model: AnthropicModel
) -> None:
    """With extended thinking on, the Messages API refuses a tool-use turn whose thinking
    blocks are missing or changed: they come back first in the assistant message, as the
    provider sent them (signature and redacted data included), and are no text."""
    provider.queue(200, _thinking_answer("toolu_01", "notes/a.txt"))
    provider.queue(200, message([{"type": "text", "text": "Done."}]))
    first = await model.complete(request())
    assert first.text == "Reading the notes."  # the thinking is not the answer's text
    assert first.reasoning == (THINKING, REDACTED)
    assert ModelResponse.from_dict(first.to_dict()) == first
    history = (
        Message("user", "Read the notes."),
        Message("assistant", first.text, tool_calls=first.tool_calls, reasoning=first.reasoning),
        Message("tool", "a note", tool_call_id="toolu_01", name="read_file"),
    )
    await model.complete(request(messages=history))
    sent = provider.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"][:2] == [THINKING, REDACTED]
    assert [b["type"] for b in sent[1]["content"][2:]] == ["text", "tool_use"]


async def test_a_run_sends_the_thinking_back_after_a_restart(
    provider: FakeProvider, tmp_path: Any
) -> None:
    """Through the runtime: the act call's thinking is journaled with its answer, so the
    next round's request carries it, from the history a new engine rebuilds from the log
    too (a crash or a pause between the rounds)."""
    from tests.support.loop import spec_of
    from tether.runtime.engine import Engine, ModelSet
    from tether.runtime.tasks import create_task
    from tether.store.memory import MemoryStore

    store = await MemoryStore.open()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("a note\n")
    spec = spec_of(1)
    task = await create_task(store, spec, workspace=tmp_path)
    provider.queue(200, _thinking_answer("toolu_01", "notes/a.txt"))
    write = {"type": "tool_use", "id": "toolu_02", "name": "write_file"}
    write["input"] = {"path": "out/i1.txt", "content": "done"}
    provider.queue(200, message([THINKING, write], stop_reason="tool_use"))
    for rounds in (1, None):  # one round, then a new engine (the history from the log)
        m = AnthropicModel(
            "claude-sonnet-4-6", base_url=provider.url, api_key="sk-ant-test", retry=TINY
        )
        try:
            engine = Engine(store, ModelSet(actor=m), lease_ttl=30, max_rounds_this_run=rounds)
            result = await engine.run(task.task_id)
        finally:
            await m.aclose()
    assert result.status == "satisfied"
    second = provider.requests[1].body["messages"]
    assistant = [m for m in second if m["role"] == "assistant"][-1]
    assert assistant["content"][:2] == [THINKING, REDACTED]
    assert [b["type"] for b in assistant["content"][2:]] == ["text", "tool_use"]
