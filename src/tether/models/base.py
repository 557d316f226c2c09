"""The `Model` protocol: one async method, `complete(request) -> response`.

Requests carry a `purpose` (`act | judge | compact | review | probe`) so a runtime can route
each kind of call to its own model, and responses carry usage that counts input,
output and cached input tokens. Usage is normalized: `input_tokens` is the whole prompt
(cached part included, as OpenAI reports it); `cached_input_tokens` is the part read
from the provider's prompt cache (Anthropic and DeepSeek report it apart; adapters add
it back in).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from tether._frozen_init import direct_init as direct_init  # re-exported (its old home)
from tether.text import clean_data, clean_text

Purpose = Literal["act", "judge", "compact", "review", "probe"]
Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolSchema:
    """A tool as the model sees it: name, description, JSON schema of arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


@direct_init
@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for.

    `arguments` is None when the model's argument text was not a JSON object; then
    `error` says why and the runtime sends that back to the model instead of running.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] | None
    raw_arguments: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "id": self.id,
            "name": self.name,
            "arguments": None if self.arguments is None else dict(self.arguments),
            "raw_arguments": self.raw_arguments,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        """Inverse of `to_dict`."""
        return cls(
            d["id"], d["name"], d.get("arguments"), d.get("raw_arguments", ""), d.get("error")
        )


@direct_init
@dataclass(frozen=True)
class Message:
    """One conversation message. Tool results have role `tool` and a `tool_call_id`."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    #: An assistant message's reasoning blocks as its provider sent them
    #: (`ModelResponse.reasoning`), sent back with it verbatim.
    reasoning: tuple[Mapping[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        if self.reasoning:
            d["reasoning"] = [dict(b) for b in self.reasoning]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        """Inverse of `to_dict`."""
        return cls(
            role=d["role"],
            content=d.get("content", ""),
            tool_calls=tuple(ToolCall.from_dict(c) for c in d.get("tool_calls", ())),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            reasoning=_reasoning(d.get("reasoning")),
        )


def _reasoning(value: Any) -> tuple[Mapping[str, Any], ...]:
    """Stored reasoning blocks (anything else: none)."""
    if not isinstance(value, list | tuple):
        return ()
    return tuple(dict(b) for b in value if isinstance(b, Mapping))


@direct_init
@dataclass(frozen=True)
class ModelRequest:
    """What the runtime asks of a model."""

    purpose: Purpose
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSchema, ...] = ()
    max_output_tokens: int = 2048
    temperature: float | None = None
    json_output: bool = False
    task_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: The goal ledger as data (`Ledger.to_dict()` plus `next`), so a policy or a judge
    #: need not parse the prompt. Not sent to providers; not part of the stored prompt.
    ledger: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what the blob store keeps of a prompt)."""
        return {
            "purpose": self.purpose,
            "system": self.system,
            "messages": [m.to_dict() for m in self.messages],
            "tools": [t.to_dict() for t in self.tools],
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "json_output": self.json_output,
            "task_id": self.task_id,
            "metadata": dict(self.metadata),
        }


@direct_init
@dataclass(frozen=True)
class Usage:
    """Token counts of one call (normalized; see the module docstring)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        """JSON-ready form."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }


#: The finish reasons of an answer the output token limit cut off (the OpenAI-compatible
#: wire's, Anthropic's).
CUT_OFF_REASONS: frozenset[str | None] = frozenset({"length", "max_tokens"})


@direct_init
@dataclass(frozen=True)
class ModelResponse:
    """What a model answered."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    latency_ms: float = 0.0
    finish_reason: str | None = None
    #: Requests sent to the provider for this answer (1 + the retries it took).
    attempts: int = 1
    #: The provider's reasoning blocks, verbatim (Anthropic's `thinking` and
    #: `redacted_thinking`, with their signatures): the provider requires them back,
    #: unchanged, with the answer's tool calls. Not text: nothing judges them.
    reasoning: tuple[Mapping[str, Any], ...] = ()

    @property
    def cut_off(self) -> bool:
        """The answer was stopped by the output token limit (OpenAI's `length`,
        Anthropic's `max_tokens`), not ended by the model."""
        return self.finish_reason in CUT_OFF_REASONS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (journaled, and read back by replay); `attempts` only when
        the answer took retries."""
        d: dict[str, Any] = {
            "text": self.text,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "usage": self.usage.to_dict(),
            "model": self.model,
            "latency_ms": self.latency_ms,
            "finish_reason": self.finish_reason,
        }
        if self.attempts != 1:
            d["attempts"] = self.attempts
        if self.reasoning:
            d["reasoning"] = [dict(b) for b in self.reasoning]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelResponse:
        """Inverse of `to_dict`."""
        return cls(
            text=d.get("text", ""),
            tool_calls=tuple(ToolCall.from_dict(c) for c in d.get("tool_calls", ())),
            usage=Usage(**d.get("usage", {})),
            model=d.get("model", ""),
            latency_ms=float(d.get("latency_ms", 0.0)),
            finish_reason=d.get("finish_reason"),
            attempts=int(d.get("attempts", 1)),
            reasoning=_reasoning(d.get("reasoning")),
        )


def clean_response(resp: ModelResponse) -> ModelResponse:
    """`resp` as the runtime takes it: lone surrogates replaced in its text, its tool
    calls (names, ids, arguments, keys included) and its model name (`tether.text`: a
    provider's JSON may escape any UTF-16 unit, and no store, file or hash takes such
    text), and a tool call whose arguments are not JSON data tether can walk (not an
    object, too deep, too large: `spec_values.shape_problem`) made one the model is told
    it cannot use. `resp` itself (the same object) when all is well: a few `isascii`
    calls a round."""
    text, model = clean_text(resp.text), clean_text(resp.model)
    given = resp.tool_calls
    calls = tuple([_clean_call(c) for c in given])
    # Whether every call came back as it was (the usual case), without a generator.
    same_calls = True
    for a, b in zip(calls, given, strict=True):
        if a is not b:
            same_calls = False
            break
    finish = resp.finish_reason
    if finish is not None:
        finish = clean_text(finish if isinstance(finish, str) else str(finish))
    usage, latency = _clean_usage(resp.usage), resp.latency_ms
    # Opaque provider blocks, signed: left as they are unless a string in them cannot be
    # stored at all (a lone surrogate; the provider then refuses the changed block).
    reasoning = clean_data(resp.reasoning) if resp.reasoning else resp.reasoning
    if not (isinstance(latency, (int, float)) and 0 <= latency < _MAX_COUNT):
        latency = 0.0  # NaN, infinite, negative or not a number: not measured
    if (
        text is resp.text
        and model is resp.model
        and finish is resp.finish_reason
        and usage is resp.usage
        and latency is resp.latency_ms
        and reasoning is resp.reasoning
        and same_calls
    ):
        return resp
    return dataclasses.replace(
        resp,
        text=text,
        model=model,
        tool_calls=calls,
        finish_reason=finish,
        usage=usage,
        latency_ms=float(latency),
        reasoning=reasoning,
    )


#: The largest count taken from a provider (2**53 - 1: exact in any JSON reader, and in
#: every store's integer columns).
_MAX_COUNT = 2**53 - 1


def _count(value: Any) -> int:
    if type(value) is int and 0 <= value <= _MAX_COUNT:
        return value
    if isinstance(value, (int, float)) and value == value:  # not NaN
        return int(min(max(value, 0), _MAX_COUNT))
    return 0


def _clean_usage(usage: Usage) -> Usage:
    """Token counts as the runtime takes them: whole numbers from 0 to `_MAX_COUNT` (a
    negative, fractional, huge or missing count from an adapter is a bug of its own,
    and must not end the run or overflow a store's column)."""
    a, b = usage.input_tokens, usage.output_tokens
    c, d = usage.cached_input_tokens, usage.cache_write_tokens
    if (
        type(a) is int
        and type(b) is int
        and type(c) is int
        and type(d) is int
        and min(a, b, c, d) >= 0
        and max(a, b, c, d) <= _MAX_COUNT
    ):
        return usage  # the usual case, decided without a call per count
    return Usage(_count(a), _count(b), _count(c), _count(d))


def _clean_call(call: ToolCall) -> ToolCall:
    id_, name, raw = clean_text(call.id), clean_text(call.name), clean_text(call.raw_arguments)
    arguments = call.arguments
    error = None if call.error is None else clean_text(call.error)
    # Arguments too deep or too large for the runtime's walks (and the stores' encoders)
    # go back to the model as unusable, as arguments that are not a JSON object do.
    problem = _shape_problem(arguments)
    if problem is not None:
        return ToolCall(
            id_,
            name,
            None,
            raw,
            f"the arguments of tool call {name!r} {problem}. Call the tool again with "
            "plainer arguments.",
        )
    arguments = clean_data(arguments)
    # The cleaners hand back the very object they were given when it is clean.
    if (
        id_ is call.id
        and name is call.name
        and arguments is call.arguments
        and raw is call.raw_arguments
        and error is call.error
    ):
        return call
    return ToolCall(id_, name, arguments, raw, error)


def _shape_problem(arguments: Any) -> str | None:
    # Flat arguments of JSON scalars under text keys (the usual case) need no walk.
    if arguments is None:
        return None
    if not isinstance(arguments, Mapping):  # a `Model` of one's own may hand anything
        return "are not a JSON object"
    # One loop over the items, not two generators (a round's every call comes here).
    for k, v in arguments.items():
        if type(k) is not str or not isinstance(v, _SCALARS):
            from tether.spec_values import shape_problem

            return shape_problem(arguments)
    return None


_SCALARS = (str, int, float, bool, type(None))


@runtime_checkable
class Model(Protocol):
    """Anything that can answer a `ModelRequest`. Plug in your own or a scripted one."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request."""
        ...
