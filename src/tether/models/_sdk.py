"""Plumbing shared by the adapters over the official provider SDKs (`openai`,
`anthropic`): the client, the retry loop, error mapping, usage and tool-call decoding.

- **Client**: `SdkModel` builds the SDK's async client with the SDK's own HTTP client
  (today `httpx2`, not classic `httpx`: tether passes none of its own) and
  `max_retries=0`, so every retry is decided by `tether.retry` and seen by `on_retry`.
  A client passed in is the caller's to close; a built one is closed by `aclose()`.
- **Timeout**: `timeout` bounds each attempt as a whole. The SDK's own timeout bounds
  each read, so a provider trickling its answer a few bytes at a time would never
  time out there; the attempt's deadline (`DeadlineExceeded`, transient) does.
- **Errors**: `sdk_classifier` reads the exception family both SDKs share
  (`APIStatusError`, `APITimeoutError`, `APIConnectionError`,
  `APIResponseValidationError`); `call_with_retry` turns the last failure into
  `errors.ModelError` with `transient` and `status`.
- **Usage**: `usage` normalizes counts (cached and cache-written tokens are parts of
  `input_tokens`); `estimated_usage` stands in when a server reports none.
- **Tool calls**: `decode_arguments` and `tool_call` turn the model's argument text
  into a `ToolCall`, with an error meant for the model instead of an exception.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any, Generic, Self, TypedDict, TypeVar, Unpack
from urllib.parse import urlsplit

from tether import tokens
from tether.models._retry import (
    Failure,
    RetryEvent,
    RetryPolicy,
    call_with_retry,
    is_transient_status,
    parse_retry_after,
)
from tether.models.base import ModelRequest, ModelResponse, ToolCall, Usage

DEFAULT_TIMEOUT = 300.0
#: Retries after the first attempt, unless a `RetryPolicy` is given.
DEFAULT_MAX_RETRIES = 3
TRUNCATED_HINT = " (The answer was cut off by the output token limit: keep arguments shorter.)"
_PREVIEW = 200

ClientT = TypeVar("ClientT")
Classifier = Callable[[BaseException], Failure | None]


# --- keys ---------------------------------------------------------------------------------

#: The only host `OPENAI_API_KEY` is ever sent to.
OPENAI_HOST = "api.openai.com"


def is_openai_url(base_url: str | None) -> bool:
    """True for OpenAI's own API: no base URL (the SDK's default), or an https URL whose
    host is `api.openai.com` (a host, not a substring: `api.openai.com.example.net` or a
    path naming it is another server)."""
    if base_url is None:
        return True
    try:
        parts = urlsplit(base_url.strip())
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme == "https" and host == OPENAI_HOST


# --- errors -------------------------------------------------------------------------------


class DeadlineExceeded(TimeoutError):
    """One attempt took longer than the model timeout as a whole (a trickled answer)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"request timed out (no complete answer within {seconds:g} s)")
        self.seconds = seconds


def describe_status_error(status: int, body: object, fallback: str) -> str:
    """A short, readable message for an HTTP error from a provider."""
    detail: str | None = None
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping):
            msg = err.get("message")
            kind = err.get("type") or err.get("code")
            if isinstance(msg, str) and msg:
                detail = f"{kind}: {msg}" if isinstance(kind, str) and kind else msg
        elif isinstance(err, str) and err:
            detail = err
    elif isinstance(body, str) and body.strip():
        detail = body.strip()[:300]
    return f"HTTP {status}: {detail or fallback}"


def sdk_classifier(sdk: object) -> Classifier:
    """A classifier for the exception family shared by the `openai` and `anthropic`
    SDKs, given the SDK module. Other exceptions are not provider errors (None)."""
    status_error: type[BaseException] = sdk.APIStatusError  # type: ignore[attr-defined]
    timeout_error: type[BaseException] = sdk.APITimeoutError  # type: ignore[attr-defined]
    connection_error: type[BaseException] = sdk.APIConnectionError  # type: ignore[attr-defined]
    validation_error: type[BaseException] = sdk.APIResponseValidationError  # type: ignore[attr-defined]

    def classify(exc: BaseException) -> Failure | None:
        if isinstance(exc, DeadlineExceeded):
            return Failure(transient=True, message=str(exc))
        if isinstance(exc, timeout_error):  # (a subclass of the connection error)
            return Failure(transient=True, message="request timed out")
        if isinstance(exc, connection_error):
            cause = exc.__cause__ or exc.__context__
            why = f": {cause}" if cause is not None and str(cause) else ""
            return Failure(transient=True, message=f"connection error{why}")
        if isinstance(exc, validation_error):
            status = getattr(exc, "status_code", None)
            return Failure(
                transient=True,
                message="the provider's response did not match its documented format",
                status=status if isinstance(status, int) else None,
            )
        if isinstance(exc, status_error):
            return _status_failure(exc)
        return None

    return classify


def _status_failure(exc: BaseException) -> Failure:
    status = int(getattr(exc, "status_code", 0) or 0)
    headers = getattr(getattr(exc, "response", None), "headers", None)
    return Failure(
        transient=is_transient_status(status),
        message=describe_status_error(status, getattr(exc, "body", None), str(exc)),
        status=status,
        retry_after=parse_retry_after(headers) if headers is not None else None,
    )


# --- the adapter base ---------------------------------------------------------------------


class SdkOptions(TypedDict, Generic[ClientT], total=False):
    """The keyword arguments every SDK adapter takes, all optional (what each means:
    `SdkModel`)."""

    base_url: str | None
    api_key: str | None
    client: ClientT | None
    #: Default `DEFAULT_MAX_RETRIES`.
    max_retries: int
    #: Seconds; default `DEFAULT_TIMEOUT`.
    timeout: float
    retry: RetryPolicy | None
    sleep: Callable[[float], Awaitable[None]] | None
    on_retry: Callable[[RetryEvent], None] | None
    name: str | None


class SdkModel(Generic[ClientT]):
    """What the SDK adapters share: name, retry policy, the attempt's deadline
    (`timeout`), the client's lifetime and the retried call. Subclasses name their SDK
    (`sdk`), build its client and their request, and parse the response body.

    The options are `SdkOptions`. `client` may be one you built (then you close it);
    otherwise `build_client` builds one from `api_key` and `base_url`, and `aclose()`
    closes it. `name` defaults to `default_name`. Retries follow `retry` (default:
    `max_retries` retries after the first attempt); `on_retry` sees each one, `sleep`
    waits between them.
    """

    provider = "sdk"
    #: The SDK module (`openai`, `anthropic`): `sdk_classifier` reads its exceptions.
    sdk: ModuleType
    #: The finish reason that says the output token limit cut the answer off.
    cut_off: str

    def __init__(self, model: str, **options: Unpack[SdkOptions[ClientT]]) -> None:
        unknown = sorted(set(options) - SdkOptions.__optional_keys__)
        if unknown:  # a misspelt option must not be dropped without a word
            raise TypeError(f"{type(self).__name__}() got unexpected keyword(s): {unknown}")
        self.model = model
        self.name = options.get("name") or self.default_name(options.get("base_url"))
        retries = options.get("max_retries", DEFAULT_MAX_RETRIES)
        self.retry = options.get("retry") or RetryPolicy(max_attempts=max(0, retries) + 1)
        self.timeout = options.get("timeout", DEFAULT_TIMEOUT)
        self._sleep = options.get("sleep")
        self._on_retry = options.get("on_retry")
        self._classify = sdk_classifier(self.sdk)
        client = options.get("client")
        self._owns_client = client is None
        if client is None:
            client = self.build_client(options.get("api_key"), options.get("base_url"))
        self.client: ClientT = client

    def default_name(self, base_url: str | None) -> str:
        """The model's name when none is given (as events and errors show it)."""
        raise NotImplementedError

    def build_client(self, api_key: str | None, base_url: str | None) -> ClientT:
        """The SDK's client, with the SDK's own retries off (`tether.retry` decides)."""
        raise NotImplementedError

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request; latency covers retries too."""
        params = self.build_params(request)
        data, latency_ms, attempts = await self._send(lambda: self._create(params))
        answer = self._parse(data, request)
        answer = replace(answer, usage=plausible_usage(answer.usage, request, answer))
        calls = answer.tool_calls
        if answer.finish_reason is not None and answer.finish_reason == self.cut_off:
            calls = tuple(mark_truncated(calls))
        return replace(
            answer,
            tool_calls=calls,
            model=str(data.get("model") or self.model),
            latency_ms=latency_ms,
            attempts=attempts,
        )

    def build_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of the SDK's create call for a request."""
        raise NotImplementedError

    def _create(self, params: dict[str, Any]) -> Awaitable[Any]:
        """The SDK's create call with `params` (not yet awaited)."""
        raise NotImplementedError

    def _parse(self, data: dict[str, Any], request: ModelRequest) -> ModelResponse:
        """The response body `data` as a `ModelResponse`: text, tool calls, usage and
        finish reason (`complete` adds the rest and marks calls cut off by `cut_off`)."""
        raise NotImplementedError

    async def _send(self, call: Callable[[], Awaitable[Any]]) -> tuple[dict[str, Any], float, int]:
        """Run one SDK call with retries: the response body as a dict, the latency in
        milliseconds (retries included) and the number of attempts it took."""
        started = time.perf_counter()
        attempts = 0

        async def once() -> dict[str, Any]:
            nonlocal attempts
            attempts += 1
            try:
                async with asyncio.timeout(self.timeout):
                    answer = await call()
            except TimeoutError as exc:  # the deadline's own; the SDK's are not these
                raise DeadlineExceeded(self.timeout) from exc
            body: dict[str, Any] = answer.to_dict(mode="json", warnings=False)
            return body

        data = await call_with_retry(
            once,
            classify=self._classify,
            policy=self.retry,
            provider=self.name,
            sleep=self._sleep or asyncio.sleep,
            on_retry=self._on_retry,
        )
        return data, (time.perf_counter() - started) * 1000.0, attempts

    async def aclose(self) -> None:
        """Close the HTTP client if this model built it."""
        if self._owns_client:
            await self.client.close()  # type: ignore[attr-defined]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        base_url = str(self.client.base_url)  # type: ignore[attr-defined]
        return f"{type(self).__name__}({self.model!r}, base_url={base_url!r})"


# --- usage --------------------------------------------------------------------------------


def as_int(value: object) -> int:
    """A token count from a provider's JSON (a bool or anything else counts as 0)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else 0  # NaN, infinity: no count
    return 0


def usage(prompt: int, output: int, *, cached: int = 0, written: int = 0) -> Usage:
    """Normalized usage: `prompt` is the whole prompt; the cached part and the part
    written to the cache are clipped into it (never more than the prompt together)."""
    cached = max(0, min(cached, prompt))
    written = max(0, min(written, prompt - cached))
    return Usage(
        input_tokens=prompt,
        output_tokens=output,
        cached_input_tokens=cached,
        cache_write_tokens=written,
    )


def _count(value: object) -> int | None:
    """A token count as reported, if it is one (an int, not a bool, 0 or more)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def plausible_usage(reported: Usage, request: ModelRequest, answer: ModelResponse) -> Usage:
    """The usage a budget counts: the provider's, or the local estimate where it is no
    count at all (not a number, negative) or says a prompt that was sent, or an answer
    that came, cost nothing. A server that reports no usage, or lies about it, must not
    make a token budget free."""
    prompt, output = _count(reported.input_tokens), _count(reported.output_tokens)
    said = bool(answer.text or answer.tool_calls)
    if prompt and (output or not said) and output is not None:
        return reported  # the usual answer
    est = estimated_usage(request, answer.text, answer.tool_calls)
    cached = _count(reported.cached_input_tokens) or 0
    written = _count(reported.cache_write_tokens) or 0
    return usage(
        prompt if prompt else est.input_tokens,
        output if output or (output == 0 and not said) else est.output_tokens,
        cached=cached,
        written=written,
    )


def estimated_usage(request: ModelRequest, text: str, calls: Sequence[ToolCall]) -> Usage:
    """The local estimate, for a server that reports no usage (budgets still work)."""
    output = tokens.estimate_text(text) + sum(
        tokens.estimate_text(c.name) + tokens.estimate_text(c.raw_arguments) for c in calls
    )
    return Usage(input_tokens=tokens.estimate_request(request), output_tokens=output)


# --- tool calls ---------------------------------------------------------------------------


def decode_arguments(
    name: str, raw: object, *, noun: str = "arguments"
) -> tuple[dict[str, Any] | None, str, str | None]:
    """Decode a tool call's arguments: `(arguments, raw_text, error)`.

    An object is taken as is; empty text means "no arguments" (`{}`). Text that is not
    JSON, or JSON that is not an object, gives `arguments=None` and an error message
    meant for the model (`noun` names the field: `arguments`, Anthropic's `input`).
    """
    if isinstance(raw, Mapping):
        return dict(raw), json.dumps(raw, ensure_ascii=False), None
    if raw is not None and not isinstance(raw, str):
        return None, json.dumps(raw, ensure_ascii=False, default=str), _not_object(name, raw, noun)
    text = raw or ""
    if not text.strip():
        return {}, text, None
    try:
        # JSON has no NaN or Infinity, which Python's decoder takes (a database's JSON
        # does not): the model is told, as of any text that is not JSON.
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # not JSON, a constant refused, too deep
        preview = text if len(text) <= _PREVIEW else text[:_PREVIEW] + "…"
        is_are = "is" if noun == "input" else "are"
        if isinstance(exc, json.JSONDecodeError):
            why = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        elif isinstance(exc, RecursionError):
            why = "nested too deeply"
        else:
            why = str(exc)
        return (
            None,
            text,
            f"the {noun} of tool call {name!r} {is_are} not valid JSON ({why}): {preview!r}. "
            f"Call the tool again with a single JSON object as {noun}.",
        )
    if not isinstance(value, dict):
        return None, text, _not_object(name, value, noun)
    return value, text, None


def _no_constant(name: str) -> Any:
    """`json.loads`'s `parse_constant`: `NaN`, `Infinity` and `-Infinity` refused."""
    raise ValueError(f"{name} is not a JSON number")


def _not_object(name: str, value: object, noun: str) -> str:
    return (
        f"the {noun} of tool call {name!r} must be a JSON object, not {_json_type(value)}. "
        f"Call the tool again with a single JSON object as {noun}."
    )


def _json_type(value: object) -> str:
    if isinstance(value, list | tuple):
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


def tool_call(
    call_id: str, name: str, raw: object, known: Collection[str], *, noun: str = "arguments"
) -> ToolCall:
    """A `ToolCall` from a provider's call: arguments decoded, and an error for the model
    when they are unusable or the tool is not one of the `known` ones offered."""
    arguments, raw_text, error = decode_arguments(name, raw, noun=noun)
    if not name:
        error = "the tool call has no tool name. Call one of the listed tools by name."
        arguments = None
    elif known and name not in known:
        error = f"there is no tool named {name!r}. Available tools: {', '.join(sorted(known))}."
        arguments = None
    return ToolCall(call_id, name, arguments, raw_text, error)


def mark_truncated(calls: Sequence[ToolCall]) -> list[ToolCall]:
    """Say why a call's arguments broke when the output limit cut the answer."""
    return [
        c
        if c.error is None
        else ToolCall(c.id, c.name, None, c.raw_arguments, c.error + TRUNCATED_HINT)
        for c in calls
    ]
