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
- Client, retries, error mapping and usage normalization are shared with the Anthropic
  adapter (`tether.models._sdk`): the SDK client is built with its own HTTP client and
  `max_retries=0`; transient errors (timeouts, connection errors, 408, 409, 425, 429,
  5xx) are retried on the `tether.retry` schedule, honouring `retry-after`; `timeout`
  bounds each attempt as a whole (a trickled answer included). Failures end as
  `errors.ModelError` with `transient`, `status` and `attempts`; an answer says how
  many `attempts` it took.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Mapping
from typing import Any, Literal, Unpack

import openai

from tether.errors import ModelError, UserError
from tether.models import _sdk
from tether.models.base import Message, ModelRequest, ModelResponse, ToolCall, Usage

DEFAULT_TIMEOUT = _sdk.DEFAULT_TIMEOUT
DEFAULT_MAX_RETRIES = _sdk.DEFAULT_MAX_RETRIES
TRUNCATED_HINT = _sdk.TRUNCATED_HINT

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]


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


def parse_openai_response(data: Mapping[str, Any], request: ModelRequest) -> ModelResponse:
    """A `ModelResponse` from a chat completions response body (as a dict): text, tool
    calls, usage and finish reason (`OpenAIModel` adds the model, latency and attempts)."""
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
        calls.append(_sdk.tool_call(call_id, name, function.get("arguments"), known))
    usage = _usage(data.get("usage"), request, text, calls)
    finish = choice.get("finish_reason")
    return ModelResponse(
        text=text,
        tool_calls=tuple(calls),
        usage=usage,
        finish_reason=str(finish) if finish is not None else None,
    )


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
        return _sdk.estimated_usage(request, text, calls)  # some local servers report none
    details = raw.get("prompt_tokens_details")
    cached = written = 0
    if isinstance(details, Mapping):
        cached = _sdk.as_int(details.get("cached_tokens"))
        written = _sdk.as_int(details.get("cache_write_tokens"))
    if not cached:
        # DeepSeek: prompt_tokens = prompt_cache_hit_tokens + prompt_cache_miss_tokens.
        cached = _sdk.as_int(raw.get("prompt_cache_hit_tokens"))
    return _sdk.usage(
        _sdk.as_int(raw.get("prompt_tokens")),
        _sdk.as_int(raw.get("completion_tokens")),
        cached=cached,
        written=written,
    )


class OpenAIModel(_sdk.SdkModel[openai.AsyncOpenAI]):
    """A `Model` over OpenAI chat completions (or any OpenAI-compatible server).

    `client` may be an `openai.AsyncOpenAI` you built yourself (then you close it);
    otherwise one is built from `base_url`, `api_key` and `timeout` with the SDK's own
    retries turned off, and `aclose()` closes it. Retries follow `retry` (default:
    `max_retries` retries after the first attempt, exponential backoff, full jitter);
    `on_retry` sees each one. `max_tokens_field` picks the request field for the output
    limit: `max_completion_tokens` for OpenAI, `max_tokens` (default when `base_url`
    is given) for servers that only know the older name.

    Without `api_key`, OpenAI's own API (no `base_url`, or an https URL on
    `api.openai.com`) takes `OPENAI_API_KEY`; any other `base_url` gets the placeholder
    `none`, never `OPENAI_API_KEY`: pass its key as `api_key`.
    """

    provider = "openai"
    sdk = openai
    cut_off = "length"

    def __init__(
        self,
        model: str,
        *,
        max_tokens_field: MaxTokensField | None = None,
        **options: Unpack[_sdk.SdkOptions[openai.AsyncOpenAI]],
    ) -> None:
        is_openai = _sdk.is_openai_url(options.get("base_url"))
        self.max_tokens_field: MaxTokensField = max_tokens_field or (
            "max_completion_tokens" if is_openai else "max_tokens"
        )
        self._send_cache_key = is_openai and options.get("client") is None
        super().__init__(model, **options)

    def default_name(self, base_url: str | None) -> str:
        """`openai:MODEL` on OpenAI's default URL, else the model's own name."""
        return f"openai:{self.model}" if base_url is None else self.model

    def build_client(self, api_key: str | None, base_url: str | None) -> openai.AsyncOpenAI:
        """The client, with the SDK's own retries off."""
        if not api_key:
            if not _sdk.is_openai_url(base_url):
                # Never OPENAI_API_KEY: a key meant for OpenAI goes to OpenAI only.
                # A local server wants none; the SDK refuses an empty one.
                api_key = "none"
            else:
                api_key = os.environ.get("OPENAI_API_KEY") or None
                if api_key is None:
                    raise UserError("no OpenAI API key: set OPENAI_API_KEY (or pass api_key=...)")
        return openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=self.timeout, max_retries=0
        )

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

    def _create(self, params: dict[str, Any]) -> Awaitable[Any]:
        return self.client.chat.completions.create(**params)

    def _parse(self, data: dict[str, Any], request: ModelRequest) -> ModelResponse:
        return parse_openai_response(data, request)
