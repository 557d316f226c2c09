"""OpenAI-compatible chat completions, with the official `openai` SDK.

Works with OpenAI itself and with any server that speaks the chat completions wire
format at a `base_url`: vLLM, Ollama, llama.cpp server, DeepSeek, Qwen and others.

- Requests: the system prompt first, then the conversation; assistant tool calls as
  `tool_calls`, tool results as `role: tool` messages with their `tool_call_id`; tools
  as `{"type": "function", "function": {...}}`; `json_output` asks for
  `response_format: {"type": "json_object"}`.
- Responses: text, tool calls (arguments JSON-decoded; arguments that are not a JSON
  object become `ToolCall(arguments=None, error=...)`, never an exception), usage
  (`usage.prompt_tokens_details.cached_tokens`, or DeepSeek's
  `prompt_cache_hit_tokens`), model, finish reason and latency. A server that reports
  no usage gets the local estimate instead, so budgets still work.
- Retries: the SDK client is built with `max_retries=0`; transient errors (timeouts,
  connection errors, 429, 5xx) are retried by `tether.models._retry` with exponential
  backoff and full jitter, honouring `retry-after`. Failures end as
  `errors.ModelError` with `transient` and `status`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import openai

from tether import tokens
from tether.errors import ModelError, UserError
from tether.models._retry import RetryEvent, RetryPolicy, call_with_retry, sdk_classifier
from tether.models.base import Message, ModelRequest, ModelResponse, ToolCall, Usage

DEFAULT_TIMEOUT = 300.0
DEFAULT_MAX_RETRIES = 3
_PREVIEW = 200
TRUNCATED_HINT = " (The answer was cut off by the output token limit: keep arguments shorter.)"

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]


def parse_tool_arguments(name: str, raw: object) -> tuple[dict[str, Any] | None, str, str | None]:
    """Decode a tool call's argument text: `(arguments, raw_text, error)`.

    Empty text means "no arguments" (`{}`). Text that is not JSON, or JSON that is not
    an object, gives `arguments=None` and an error message meant for the model.
    Some OpenAI-compatible servers send the arguments as an object already; that is
    accepted as is.
    """
    if isinstance(raw, Mapping):
        return dict(raw), json.dumps(raw, ensure_ascii=False), None
    text = "" if raw is None else str(raw)
    if not text.strip():
        return {}, text, None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        preview = text if len(text) <= _PREVIEW else text[:_PREVIEW] + "…"
        return (
            None,
            text,
            f"the arguments of tool call {name!r} are not valid JSON ({exc.msg} at line "
            f"{exc.lineno} column {exc.colno}): {preview!r}. Call the tool again with a "
            "single JSON object as arguments.",
        )
    if not isinstance(value, dict):
        return (
            None,
            text,
            f"the arguments of tool call {name!r} must be a JSON object, not "
            f"{_json_type(value)}. Call the tool again with a single JSON object as "
            "arguments.",
        )
    return value, text, None


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    return type(value).__name__


def _int(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    return 0


def to_openai_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The chat completions `messages` for a request (system prompt first)."""
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for message in request.messages:
        out.append(_message(message))
    return out


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        if not message.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant":
        d: dict[str, Any] = {"role": "assistant"}
        if message.tool_calls:
            d["content"] = message.content or None
            d["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _raw_arguments(call)},
                }
                for call in message.tool_calls
            ]
        else:
            d["content"] = message.content
        if message.name:
            d["name"] = message.name
        return d
    d = {"role": "user", "content": message.content}
    if message.name:
        d["name"] = message.name
    return d


def _raw_arguments(call: ToolCall) -> str:
    if call.raw_arguments:
        return call.raw_arguments
    if call.arguments is not None:
        return json.dumps(dict(call.arguments), ensure_ascii=False)
    return "{}"


def to_openai_tools(request: ModelRequest) -> list[dict[str, Any]]:
    """The chat completions `tools` for a request."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
            },
        }
        for t in request.tools
    ]


def parse_openai_response(
    data: Mapping[str, Any], request: ModelRequest, *, default_model: str, latency_ms: float
) -> ModelResponse:
    """A `ModelResponse` from a chat completions response body (as a dict)."""
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        raise ModelError("the provider returned no choices", transient=False)
    choice = choices[0]
    message = choice.get("message") or {}
    text = _content_text(message.get("content"))
    if not text and isinstance(message.get("refusal"), str):
        text = message["refusal"]
    known = {t.name for t in request.tools}
    calls: list[ToolCall] = []
    for i, raw_call in enumerate(message.get("tool_calls") or ()):
        if not isinstance(raw_call, Mapping):
            continue
        function = raw_call.get("function") or {}
        name = str(function.get("name") or "")
        call_id = str(raw_call.get("id") or f"call_{i}")
        arguments, raw_text, error = parse_tool_arguments(name, function.get("arguments"))
        if not name:
            error = "the tool call has no tool name. Call one of the listed tools by name."
            arguments = None
        elif known and name not in known:
            error = f"there is no tool named {name!r}. Available tools: {', '.join(sorted(known))}."
            arguments = None
        calls.append(ToolCall(call_id, name, arguments, raw_text, error))
    finish = choice.get("finish_reason")
    if finish == "length":
        calls = [_truncated(c) for c in calls]
    usage = _usage(data.get("usage"), request, text, calls)
    return ModelResponse(
        text=text,
        tool_calls=tuple(calls),
        usage=usage,
        model=str(data.get("model") or default_model),
        latency_ms=latency_ms,
        finish_reason=str(finish) if finish is not None else None,
    )


def _truncated(call: ToolCall) -> ToolCall:
    """Say why a call's arguments broke when the output limit cut the answer."""
    if call.error is None:
        return call
    return ToolCall(call.id, call.name, None, call.raw_arguments, call.error + TRUNCATED_HINT)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers answer with content parts
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def _usage(raw: object, request: ModelRequest, text: str, calls: list[ToolCall]) -> Usage:
    if not isinstance(raw, Mapping) or "prompt_tokens" not in raw:
        # No usage reported (some local servers): fall back to the local estimate.
        output = tokens.estimate_text(text) + sum(
            tokens.estimate_text(c.name) + tokens.estimate_text(c.raw_arguments) for c in calls
        )
        return Usage(input_tokens=tokens.estimate_request(request), output_tokens=output)
    prompt = _int(raw.get("prompt_tokens"))
    details = raw.get("prompt_tokens_details")
    cached = 0
    written = 0
    if isinstance(details, Mapping):
        cached = _int(details.get("cached_tokens"))
        written = _int(details.get("cache_write_tokens"))
    if not cached:
        # DeepSeek: prompt_tokens = prompt_cache_hit_tokens + prompt_cache_miss_tokens.
        cached = _int(raw.get("prompt_cache_hit_tokens"))
    cached = min(cached, prompt)
    written = min(written, prompt - cached)
    return Usage(
        input_tokens=prompt,
        output_tokens=_int(raw.get("completion_tokens")),
        cached_input_tokens=cached,
        cache_write_tokens=written,
    )


class OpenAIModel:
    """A `Model` over OpenAI chat completions (or any OpenAI-compatible server).

    `client` may be an `openai.AsyncOpenAI` you built yourself (then you close it);
    otherwise one is built from `base_url`, `api_key` and `timeout` with the SDK's own
    retries turned off, and `aclose()` closes it. Retries follow `retry` (default:
    `max_retries` retries after the first attempt, exponential backoff, full jitter);
    `on_retry` sees each one. `max_tokens_field` picks the request field for the output
    limit: `max_completion_tokens` for OpenAI, `max_tokens` (default when `base_url`
    is given) for servers that only know the older name.
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        max_tokens_field: MaxTokensField | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model
        self.name = name or (f"openai:{model}" if base_url is None else model)
        self.retry = retry or RetryPolicy(max_attempts=max(0, max_retries) + 1)
        self._sleep = sleep
        self._on_retry = on_retry
        is_openai = base_url is None or "api.openai.com" in base_url
        self.max_tokens_field: MaxTokensField = max_tokens_field or (
            "max_completion_tokens" if is_openai else "max_tokens"
        )
        self._send_cache_key = is_openai and client is None
        self._owns_client = client is None
        if client is None and not api_key:
            api_key = os.environ.get("OPENAI_API_KEY") or None
            if api_key is None:
                if is_openai:
                    raise UserError("no OpenAI API key: set OPENAI_API_KEY (or pass api_key=...)")
                api_key = "none"  # local servers usually ignore the key
        self.client = client or openai.AsyncOpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=0,
        )
        self._classify = sdk_classifier(openai)

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `chat.completions.create` for a request."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(request),
            self.max_tokens_field: request.max_output_tokens,
        }
        if request.tools:
            params["tools"] = to_openai_tools(request)
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.json_output:
            params["response_format"] = {"type": "json_object"}
        if self._send_cache_key and request.task_id:
            # Routes a task's calls to the same cache shard on OpenAI.
            params["prompt_cache_key"] = f"tether-{request.task_id}"
        return params

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request; latency covers retries too."""
        params = self.build_params(request)
        started = time.perf_counter()

        async def call() -> dict[str, Any]:
            completion = await self.client.chat.completions.create(**params)
            body: dict[str, Any] = completion.to_dict(mode="json", warnings=False)
            return body

        data = await call_with_retry(
            call,
            classify=self._classify,
            policy=self.retry,
            provider=self.name,
            sleep=self._sleep or asyncio.sleep,
            on_retry=self._on_retry,
        )
        latency_ms = (time.perf_counter() - started) * 1000.0
        return parse_openai_response(data, request, default_model=self.model, latency_ms=latency_ms)

    async def aclose(self) -> None:
        """Close the HTTP client if this model built it."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> OpenAIModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={str(self.client.base_url)!r})"
