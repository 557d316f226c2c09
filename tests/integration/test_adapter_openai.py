"""The OpenAI-compatible adapter against a real HTTP server on 127.0.0.1.

The server answers in the chat completions wire format (tool calls, usage with
`prompt_tokens_details.cached_tokens`, DeepSeek's `prompt_cache_hit_tokens`, error
bodies with `retry-after`), and records every request so the tests can check what the
official SDK actually sent.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from typing import Any

import pytest

pytest.importorskip(
    "openai", reason="the openai extra is not installed (pip install -e '.[openai]')"
)

from tests.support.fake_provider import READ, WRITE, FakeProvider, completion
from tests.support.fake_provider import model_request as request
from tether.errors import ModelError
from tether.models._retry import RetryEvent, RetryPolicy
from tether.models.base import Message, ToolCall
from tether.models.openai import OpenAIModel


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with closing(FakeProvider()) as p:
        yield p


TINY = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.005, max_retry_after=0.5)


@pytest.fixture
async def model(provider: FakeProvider) -> AsyncIterator[OpenAIModel]:
    m = OpenAIModel(
        "gpt-4.1-mini", base_url=provider.url, api_key="sk-test", retry=TINY, timeout=10
    )
    try:
        yield m
    finally:
        await m.aclose()


# --- wire-format helpers ------------------------------------------------------------------


def fn_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# --- (a) a tool call with cached usage ----------------------------------------------------


async def test_tool_call_and_cached_usage(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.queue(
        200,
        completion(
            tool_calls=[fn_call("call_12345xyz", "read_file", '{"path": "notes/a.txt"}')],
            finish_reason="tool_calls",
            usage={
                "prompt_tokens": 2006,
                "completion_tokens": 19,
                "total_tokens": 2025,
                "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
            },
        ),
    )
    resp = await model.complete(request())
    assert resp.tool_calls == (
        ToolCall("call_12345xyz", "read_file", {"path": "notes/a.txt"}, '{"path": "notes/a.txt"}'),
    )
    assert resp.text == ""
    assert resp.usage.input_tokens == 2006  # OpenAI counts cached tokens inside the prompt
    assert resp.usage.cached_input_tokens == 1920
    assert resp.usage.output_tokens == 19
    assert resp.model == "gpt-4.1-mini-2025-04-14"
    assert resp.finish_reason == "tool_calls"
    assert resp.latency_ms > 0
    assert len(provider.requests) == 1
    assert provider.requests[0].path == "/v1/chat/completions"
    assert provider.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_deepseek_cache_hit_tokens(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.queue(
        200,
        completion(
            content="Done.",
            model="deepseek-chat",
            usage={
                "prompt_tokens": 1000,
                "completion_tokens": 5,
                "total_tokens": 1005,
                "prompt_cache_hit_tokens": 896,
                "prompt_cache_miss_tokens": 104,
            },
        ),
    )
    resp = await model.complete(request())
    assert resp.text == "Done."
    assert resp.usage.input_tokens == 1000
    assert resp.usage.cached_input_tokens == 896


async def test_missing_usage_falls_back_to_estimate(
    provider: FakeProvider, model: OpenAIModel
) -> None:
    body = completion(content="hello there")
    del body["usage"]
    provider.queue(200, body)
    resp = await model.complete(request())
    assert resp.usage.input_tokens > 0
    assert resp.usage.output_tokens > 0
    assert resp.usage.cached_input_tokens == 0


# --- (b) a 429, then success --------------------------------------------------------------


async def test_rate_limited_then_success(provider: FakeProvider) -> None:
    sleeps: list[float] = []
    retries: list[RetryEvent] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    provider.queue(
        429,
        {
            "error": {
                "message": "Rate limit reached",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }
        },
        headers={"retry-after-ms": "20"},
    )
    provider.queue(200, completion(content="ok"))
    async with OpenAIModel(
        "gpt-4.1-mini",
        base_url=provider.url,
        api_key="sk-test",
        retry=TINY,
        sleep=fake_sleep,
        on_retry=retries.append,
    ) as m:
        resp = await m.complete(request())
    assert resp.text == "ok"
    assert len(provider.requests) == 2
    assert resp.attempts == 2  # journaled with the call (model.called)
    assert sleeps == [pytest.approx(0.02)]  # retry-after honoured
    assert len(retries) == 1 and retries[0].failure.status == 429
    # The SDK itself did not retry: it was told max_retries=0.
    assert provider.requests[0].headers.get("x-stainless-retry-count") in (None, "0")


async def test_rate_limited_without_retry_after_uses_tiny_backoff(
    provider: FakeProvider, model: OpenAIModel
) -> None:
    provider.queue(429, {"error": {"message": "slow down"}})
    provider.queue(200, completion(content="ok"))
    resp = await model.complete(request())
    assert resp.text == "ok"
    assert len(provider.requests) == 2


# --- (c) malformed tool arguments ---------------------------------------------------------


async def test_malformed_tool_arguments_become_an_error(
    provider: FakeProvider, model: OpenAIModel
) -> None:
    provider.queue(
        200,
        completion(
            tool_calls=[
                fn_call("call_1", "write_file", '{"path": "out.md", "text": "unterminated'),
                fn_call("call_2", "read_file", '["notes/a.txt"]'),
                fn_call("call_3", "delete_everything", "{}"),
                fn_call("call_4", "read_file", '{"path": "ok.txt"}'),
            ],
            finish_reason="tool_calls",
        ),
    )
    resp = await model.complete(request())
    bad_json, not_object, unknown, good = resp.tool_calls
    assert bad_json.arguments is None
    assert bad_json.raw_arguments == '{"path": "out.md", "text": "unterminated'
    assert bad_json.error is not None
    assert "write_file" in bad_json.error and "not valid JSON" in bad_json.error
    assert not_object.arguments is None
    assert not_object.error is not None and "must be a JSON object" in not_object.error
    assert unknown.arguments is None
    assert unknown.error is not None and "no tool named 'delete_everything'" in unknown.error
    assert good.arguments == {"path": "ok.txt"} and good.error is None


# --- (d) failures -------------------------------------------------------------------------


async def test_server_errors_exhaust_retries(provider: FakeProvider, model: OpenAIModel) -> None:
    for _ in range(3):
        provider.queue(
            500, {"error": {"message": "The server had an error", "type": "server_error"}}
        )
    with pytest.raises(ModelError) as info:
        await model.complete(request())
    assert info.value.transient is True
    assert info.value.status == 500
    assert "3 attempts" in str(info.value)
    assert info.value.attempts == 3  # journaled with the failure (model.failed)
    assert len(provider.requests) == 3


async def test_bad_request_is_not_retried(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.queue(
        400,
        {
            "error": {
                "message": "Invalid schema for function 'read_file'",
                "type": "invalid_request_error",
                "param": "tools[0].function.parameters",
                "code": "invalid_function_parameters",
            }
        },
    )
    with pytest.raises(ModelError) as info:
        await model.complete(request())
    assert info.value.transient is False
    assert info.value.status == 400
    assert "Invalid schema" in str(info.value)
    assert len(provider.requests) == 1


@pytest.mark.parametrize("status", [401, 404])
async def test_auth_and_not_found_are_not_retried(
    provider: FakeProvider, model: OpenAIModel, status: int
) -> None:
    provider.queue(status, {"error": {"message": "nope"}})
    with pytest.raises(ModelError) as info:
        await model.complete(request())
    assert (info.value.transient, info.value.status) == (False, status)
    assert len(provider.requests) == 1


async def test_timeout_is_transient(provider: FakeProvider) -> None:
    provider.queue(200, completion(content="late"), delay=0.6)
    provider.queue(200, completion(content="late"), delay=0.6)
    async with OpenAIModel(
        "m",
        base_url=provider.url,
        api_key="k",
        timeout=0.1,
        retry=RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.001),
    ) as m:
        with pytest.raises(ModelError) as info:
            await m.complete(request())
    assert info.value.transient is True
    assert "timed out" in str(info.value)
    assert info.value.attempts == 2


async def test_timeout_bounds_the_whole_attempt(provider: FakeProvider) -> None:
    """A provider trickling its answer (each chunk well within the timeout, the whole
    answer not) is cut at the timeout: the SDK's own timeout is per read."""
    from tests.support.fault_proxy import Fault, FaultProxy

    provider.queue(200, completion(content="slow"))
    provider.queue(200, completion(content="fast"))
    with FaultProxy(int(provider.httpd.server_address[1])) as proxy:
        proxy.plan(Fault.trickle(chunk=8, interval=0.2))
        started = time.monotonic()
        async with OpenAIModel(
            "m", base_url=f"{proxy.url}/v1", api_key="k", timeout=1.0, retry=TINY
        ) as m:
            resp = await m.complete(request())
        elapsed = time.monotonic() - started
    # Trickled whole, the first answer would take about 10 s.
    assert (resp.text, resp.attempts) == ("fast", 2)
    assert elapsed < 8, elapsed


async def test_connection_refused_is_transient() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with OpenAIModel(
        "m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", retry=TINY
    ) as m:
        with pytest.raises(ModelError) as info:
            await m.complete(request())
    assert info.value.transient is True
    assert "connection error" in str(info.value)


# --- (e) the request body -----------------------------------------------------------------


async def test_request_body_shape(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.queue(200, completion(content='{"decision": "continue"}'))
    history = (
        Message("user", "Start with item i1."),
        Message(
            "assistant",
            "Reading the notes.",
            tool_calls=(ToolCall("call_a", "read_file", {"path": "a.txt"}, '{"path":"a.txt"}'),),
        ),
        Message("tool", "alpha", tool_call_id="call_a"),
        Message(
            "assistant",
            "",
            tool_calls=(
                ToolCall("call_b", "read_file", {"path": "b.txt"}, '{"path":"b.txt"}'),
                ToolCall("call_c", "write_file", None, '{"path": oops', "not valid JSON"),
            ),
        ),
        Message("tool", "beta", tool_call_id="call_b"),
        Message("tool", "error: not valid JSON", tool_call_id="call_c"),
        Message("user", "Ledger: i1 done, i2 pending."),
    )
    await model.complete(
        request(messages=history, json_output=True, temperature=0.2, max_output_tokens=512)
    )
    body = provider.requests[0].body
    assert body["model"] == "gpt-4.1-mini"
    assert body["max_tokens"] == 512  # an OpenAI-compatible base_url: the widely known name
    assert body["temperature"] == 0.2
    assert body["response_format"] == {"type": "json_object"}
    assert "prompt_cache_key" not in body  # only sent to OpenAI itself
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file of the workspace.",
                "parameters": dict(READ.parameters),
            },
        },
        {
            "type": "function",
            "function": {
                "name": "write_file",
                "description": "Write a file.",
                "parameters": dict(WRITE.parameters),
            },
        },
    ]
    msgs = body["messages"]
    assert msgs[0] == {"role": "system", "content": request().system}
    assert msgs[1] == {"role": "user", "content": "Start with item i1."}
    assert msgs[2] == {
        "role": "assistant",
        "content": "Reading the notes.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path":"a.txt"}'},
            }
        ],
    }
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_a", "content": "alpha"}
    assert msgs[4]["content"] is None
    assert [c["id"] for c in msgs[4]["tool_calls"]] == ["call_b", "call_c"]
    assert msgs[4]["tool_calls"][1]["function"]["arguments"] == '{"path": oops'  # echoed as sent
    assert msgs[5] == {"role": "tool", "tool_call_id": "call_b", "content": "beta"}
    assert msgs[6] == {"role": "tool", "tool_call_id": "call_c", "content": "error: not valid JSON"}
    assert msgs[7] == {"role": "user", "content": "Ledger: i1 done, i2 pending."}
    assert len(msgs) == 8


async def test_no_tools_and_no_json_leave_fields_out(
    provider: FakeProvider, model: OpenAIModel
) -> None:
    provider.queue(200, completion(content="summary"))
    await model.complete(request(tools=(), purpose="compact"))
    body = provider.requests[0].body
    assert "tools" not in body
    assert "response_format" not in body
    assert "temperature" not in body


async def test_openai_itself_gets_max_completion_tokens_and_cache_key() -> None:
    m = OpenAIModel("gpt-4.1-mini", api_key="sk-test")
    try:
        params = m.build_params(request(task_id="t-42"))
    finally:
        await m.aclose()
    assert params["max_completion_tokens"] == 2048
    assert "max_tokens" not in params
    assert params["prompt_cache_key"] == "tether-t-42"


async def test_truncated_arguments_say_why(provider: FakeProvider, model: OpenAIModel) -> None:
    provider.queue(
        200,
        completion(
            tool_calls=[fn_call("call_1", "write_file", '{"path": "report.md", "text": "Lorem ip')],
            finish_reason="length",
        ),
    )
    resp = await model.complete(request())
    (call,) = resp.tool_calls
    assert call.arguments is None
    assert call.error is not None and "cut off by the output token limit" in call.error
    assert resp.finish_reason == "length"
