"""Anthropic messages API with tool use, with the official `anthropic` SDK.

- Prompt caching: the system prompt goes as text blocks with a
  `cache_control: {"type": "ephemeral"}` breakpoint on the stable system prefix, and
  one more on the last block of the last message, so each round reads the previous
  round's prefix from the cache. A request may say where the stable part of its
  system prompt ends with `metadata["system_stable_prefix"]` (a character count);
  then the system prompt is sent as two blocks with a breakpoint each, so a change of
  the tail (the ledger, at an epoch boundary) keeps the static instructions cached.
- Tool results travel as `tool_result` blocks in a user message; consecutive tool
  results (and a continuation message right after them) are merged into one user
  message, tool results first, as the API requires.
- Usage: Anthropic reports `input_tokens` without the cached part; here
  `input_tokens = input + cache_read + cache_creation`, `cached_input_tokens =
  cache_read_input_tokens` and `cache_write_tokens = cache_creation_input_tokens`.
- Client, retries, error mapping and usage normalization are shared with the OpenAI
  adapter (`tether.models._sdk`): the SDK client is built with its own HTTP client,
  `max_retries=0` and no tracing of its own; the `tether.retry` schedule retries 408,
  409, 425, 429, 5xx and 529 "overloaded", timeouts and connection errors; `timeout`
  bounds each attempt as a whole.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import Any, Unpack

import anthropic

from tether.errors import ModelError, UserError
from tether.models import _sdk
from tether.models.base import Message, ModelRequest, ModelResponse, ToolCall

DEFAULT_TIMEOUT = _sdk.DEFAULT_TIMEOUT
DEFAULT_MAX_RETRIES = _sdk.DEFAULT_MAX_RETRIES
EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
JSON_INSTRUCTION = "Answer with one JSON object and nothing else: no prose, no code fences."
TRUNCATED_HINT = _sdk.TRUNCATED_HINT


#: The content blocks of an answer's reasoning (extended thinking): kept with the answer
#: and sent back with it, as the Messages API requires within a tool-use turn.
REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def system_blocks(request: ModelRequest) -> list[dict[str, Any]]:
    """The `system` text blocks, with cache breakpoints on the stable prefix."""
    blocks: list[dict[str, Any]] = []
    system = request.system
    split = request.metadata.get("system_stable_prefix")
    if system:
        if isinstance(split, int) and not isinstance(split, bool) and 0 < split < len(system):
            blocks.append(
                {"type": "text", "text": system[:split], "cache_control": dict(EPHEMERAL)}
            )
            blocks.append(
                {"type": "text", "text": system[split:], "cache_control": dict(EPHEMERAL)}
            )
        else:
            blocks.append({"type": "text", "text": system, "cache_control": dict(EPHEMERAL)})
    if request.json_output:
        # After the breakpoints, so it does not disturb the cached prefix.
        blocks.append({"type": "text", "text": JSON_INSTRUCTION})
    return blocks


def to_anthropic_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The `messages` of a request: alternating roles, tool results merged, and a
    cache breakpoint on the last block of the last message."""
    out: list[dict[str, Any]] = []
    # The Messages API refuses a request in which two `tool_use` blocks share an id (a
    # server or proxy that sends one id every answer): a repeated id is renamed, and
    # with it the `tool_result`s that answer that message's calls.
    used: set[str] = set()
    renamed: dict[str, str] = {}
    for message in request.messages:
        if message.role == "assistant" and message.tool_calls:
            renamed = {}
            for call in message.tool_calls:
                if call.id in used:
                    n = 1
                    while f"{call.id[:120]}_{n}" in used:
                        n += 1
                    renamed[call.id] = f"{call.id[:120]}_{n}"
                used.add(renamed.get(call.id, call.id))
            if renamed:
                calls = tuple(replace(c, id=renamed.get(c.id, c.id)) for c in message.tool_calls)
                message = replace(message, tool_calls=calls)
        elif message.role == "tool" and message.tool_call_id in renamed:
            message = replace(message, tool_call_id=renamed[message.tool_call_id])
        role, blocks = _blocks(message)
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for entry in out:
        if entry["role"] == "user":
            # tool_result blocks must come first in a user message.
            entry["content"].sort(key=lambda b: 0 if b["type"] == "tool_result" else 1)
        if not entry["content"]:
            entry["content"].append({"type": "text", "text": "(empty)"})
    if out and out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "Continue."}]})
    if out:
        last = out[-1]["content"]
        last[-1] = {**last[-1], "cache_control": dict(EPHEMERAL)}
    return out


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """The role and content blocks of one message."""
    blocks: list[dict[str, Any]] = []
    if message.role == "tool":
        if not message.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        result = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        return "user", [{**result, "content": message.content}]
    if message.role == "assistant":
        # Extended thinking: the answer's thinking blocks go back first, unchanged.
        blocks.extend(dict(b) for b in message.reasoning if b.get("type") in REASONING_BLOCKS)
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    if message.role != "assistant":
        return "user", blocks
    for call in message.tool_calls:
        arguments = dict(call.arguments) if call.arguments is not None else {}
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return "assistant", blocks


def to_anthropic_tools(request: ModelRequest) -> list[dict[str, Any]]:
    """The `tools` of a request (`input_schema` is the JSON schema of arguments)."""
    return [
        {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
        for t in request.tools
    ]


def parse_anthropic_response(data: Mapping[str, Any], request: ModelRequest) -> ModelResponse:
    """A `ModelResponse` from a messages API response body (as a dict): text, tool calls,
    usage and stop reason (`AnthropicModel` adds the model, latency and attempts)."""
    content = data.get("content")
    if not isinstance(content, list):
        raise ModelError("the provider's response has no content list", transient=False)
    known = {t.name for t in request.tools}
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[dict[str, Any]] = []
    cited = False  # whether the last text block carried citations
    for i, block in enumerate(content):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            cites = bool(block.get("citations"))
            if texts and not (cites or cited):
                # Separate blocks are separate passages (a question in a block of its own
                # starts a line); the API splits one passage only around its citations.
                texts.append("\n")
            texts.append(block["text"])
            cited = cites
        elif kind in REASONING_BLOCKS:
            reasoning.append(dict(block))  # sent back as it came (its signature checks it)
        elif kind == "tool_use":
            call_id = str(block.get("id") or f"toolu_{i}")
            name = str(block.get("name") or "")
            calls.append(_sdk.tool_call(call_id, name, block.get("input"), known, noun="input"))
    text = "".join(texts)
    raw_usage = data.get("usage")
    if isinstance(raw_usage, Mapping):
        read = _sdk.as_int(raw_usage.get("cache_read_input_tokens"))
        created = _sdk.as_int(raw_usage.get("cache_creation_input_tokens"))
        # Anthropic's input_tokens leaves out what was read from or written to the cache.
        usage = _sdk.usage(
            _sdk.as_int(raw_usage.get("input_tokens")) + read + created,
            _sdk.as_int(raw_usage.get("output_tokens")),
            cached=read,
            written=created,
        )
    else:
        usage = _sdk.estimated_usage(request, text, calls)
    stop = data.get("stop_reason")
    finish = str(stop) if stop is not None else None
    return ModelResponse(
        text=text,
        tool_calls=tuple(calls),
        usage=usage,
        finish_reason=finish,
        reasoning=tuple(reasoning),
    )


class AnthropicModel(_sdk.SdkModel[anthropic.AsyncAnthropic]):
    """A `Model` over the Anthropic messages API with tool use and prompt caching.

    `client` may be an `anthropic.AsyncAnthropic` you built (then you close it);
    otherwise one is built from `api_key` (default `ANTHROPIC_API_KEY`), `base_url`
    (default `ANTHROPIC_BASE_URL` or Anthropic's) and `timeout`, with the SDK's own
    retries and tracing turned off (tether emits its own spans), and `aclose()`
    closes it. Retries follow `retry` (default: `max_retries` retries after the first
    attempt); `on_retry` sees each one. The API has no `temperature` any more, so a
    request's temperature is not sent; `extra_body` adds raw fields to every request.
    """

    provider = "anthropic"
    sdk = anthropic
    cut_off = "max_tokens"

    def __init__(
        self,
        model: str,
        *,
        extra_body: Mapping[str, Any] | None = None,
        **options: Unpack[_sdk.SdkOptions[anthropic.AsyncAnthropic]],
    ) -> None:
        self.extra_body = dict(extra_body or {})
        super().__init__(model, **options)

    def default_name(self, base_url: str | None) -> str:
        """`anthropic:MODEL`."""
        return f"anthropic:{self.model}"

    def build_client(self, api_key: str | None, base_url: str | None) -> anthropic.AsyncAnthropic:
        """The client, with the SDK's retries and tracing off (tether emits its own spans)."""
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise UserError("no Anthropic API key: set ANTHROPIC_API_KEY (or pass api_key=...)")
        return anthropic.AsyncAnthropic(
            api_key=key,
            base_url=base_url,
            timeout=self.timeout,
            max_retries=0,
            open_telemetry=False,
        )

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of `messages.create` for a request."""
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_output_tokens,
            "messages": to_anthropic_messages(request),
        }
        system = system_blocks(request)
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = to_anthropic_tools(request)
        # The current messages API (and SDK) has no sampling parameters: a request's
        # `temperature` is not sent. Use `extra_body` for fields the SDK lacks.
        if self.extra_body:
            params["extra_body"] = dict(self.extra_body)
        return params

    def _create(self, params: dict[str, Any]) -> Awaitable[Any]:
        return self.client.messages.create(**params)

    def _parse(self, data: dict[str, Any], request: ModelRequest) -> ModelResponse:
        return parse_anthropic_response(data, request)
