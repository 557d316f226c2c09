"""Retries of transient provider errors: exponential backoff with full jitter.

The provider SDKs are built with `max_retries=0`, so every retry of a model call is
decided here, where it can be tested and observed (an `on_retry` hook sees each one).

- `backoff_delay` is a pure function: attempt number, policy and a random number in
  ``[0, 1)`` in, seconds out ("full jitter": uniform between 0 and the capped
  exponential step).
- `parse_retry_after` reads `retry-after-ms` / `retry-after` (seconds or an HTTP date)
  from response headers; the server's wish is honoured, capped by the policy.
- `call_with_retry` runs an async call, asks a classifier what each exception means,
  sleeps with an injectable `sleep` and finally raises `errors.ModelError` with
  `transient` and `status` set.

Transient: timeouts, connection errors, 408, 409, 429, 5xx (529 "overloaded"
included). Everything else (400, 401, 403, 404, 422, ...) is not retried.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tether.errors import ModelError

log = logging.getLogger("tether.models")

T = TypeVar("T")

TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry transient provider errors.

    `max_attempts` counts the first try (4 means one call and up to three retries).
    The n-th retry waits a uniform random time in ``[0, min(max_delay, base_delay *
    2**(n-1))]``; a `retry-after` header from the server replaces that, capped at
    `max_retry_after`.
    """

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ValueError("retry delays must not be negative")


@dataclass(frozen=True)
class Failure:
    """What a classifier made of one exception."""

    transient: bool
    message: str
    status: int | None = None
    retry_after: float | None = None


@dataclass(frozen=True)
class RetryEvent:
    """One retry about to happen, as the `on_retry` hook sees it."""

    attempt: int
    """The attempt that failed (1 = the first call)."""
    delay: float
    """Seconds we are about to wait."""
    failure: Failure


def is_transient_status(status: int) -> bool:
    """Whether an HTTP status from a model provider is worth retrying."""
    return status in TRANSIENT_STATUSES or status >= 500


def backoff_delay(attempt: int, policy: RetryPolicy, rand: float) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based), full jitter.

    `rand` is a number in ``[0, 1)``; the result is ``rand * min(max_delay,
    base_delay * 2**(attempt-1))``.
    """
    if attempt < 1:
        raise ValueError("attempt numbers start at 1")
    # min() before the power would overflow for silly attempt numbers.
    exponent = min(attempt - 1, 64)
    ceiling = min(policy.max_delay, policy.base_delay * math.pow(2.0, exponent))
    return max(0.0, min(1.0, rand)) * ceiling


def retry_delay(
    attempt: int, policy: RetryPolicy, rand: float, retry_after: float | None = None
) -> float:
    """The wait before the next attempt: the server's `retry_after` when given
    (capped at `policy.max_retry_after`), otherwise `backoff_delay`."""
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, policy.max_retry_after)
    return backoff_delay(attempt, policy, rand)


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds the server asks us to wait, from `retry-after-ms` or `retry-after`.

    `retry-after` may be a number of seconds or an HTTP date. Returns None when
    absent or unreadable. Header names are matched case-insensitively.
    """
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = -1.0
        if value >= 0 and math.isfinite(value):
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        current = time.time() if now is None else now
        return max(0.0, when.timestamp() - current)
    return value if value >= 0 and math.isfinite(value) else None


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    *,
    classify: Callable[[BaseException], Failure | None],
    policy: RetryPolicy,
    provider: str = "model",
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
    on_retry: Callable[[RetryEvent], None] | None = None,
) -> T:
    """Run `call`, retrying transient failures per `policy`.

    `classify` maps an exception to a `Failure`, or to None for exceptions that are
    not provider errors (those propagate untouched). A non-transient failure raises
    `ModelError(transient=False, status=...)` at once; the last transient one raises
    `ModelError(transient=True, status=...)`. The original exception is kept as
    `__cause__`.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            if not failure.transient:
                raise ModelError(
                    f"{provider}: {failure.message}", transient=False, status=failure.status
                ) from exc
            if attempt >= policy.max_attempts:
                raise ModelError(
                    f"{provider}: {failure.message} (gave up after {attempt} attempt"
                    f"{'s' if attempt != 1 else ''})",
                    transient=True,
                    status=failure.status,
                ) from exc
            delay = retry_delay(attempt, policy, rand(), failure.retry_after)
            event = RetryEvent(attempt=attempt, delay=delay, failure=failure)
            log.warning(
                "%s: attempt %d failed (%s); retrying in %.2fs",
                provider,
                attempt,
                failure.message,
                delay,
            )
            if on_retry is not None:
                on_retry(event)
            await sleep(delay)


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


def sdk_classifier(sdk: object) -> Callable[[BaseException], Failure | None]:
    """A classifier for the exception family shared by the `openai` and `anthropic`
    SDKs (`APIStatusError`, `APITimeoutError`, `APIConnectionError`,
    `APIResponseValidationError`), given the SDK module."""
    status_error: type[BaseException] = sdk.APIStatusError  # type: ignore[attr-defined]
    timeout_error: type[BaseException] = sdk.APITimeoutError  # type: ignore[attr-defined]
    connection_error: type[BaseException] = sdk.APIConnectionError  # type: ignore[attr-defined]
    validation_error: type[BaseException] = sdk.APIResponseValidationError  # type: ignore[attr-defined]

    def classify(exc: BaseException) -> Failure | None:
        if isinstance(exc, timeout_error):
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
            status = int(getattr(exc, "status_code", 0) or 0)
            response = getattr(exc, "response", None)
            headers = getattr(response, "headers", None)
            message = describe_status_error(status, getattr(exc, "body", None), str(exc))
            return Failure(
                transient=is_transient_status(status),
                message=message,
                status=status,
                retry_after=parse_retry_after(headers) if headers is not None else None,
            )
        return None

    return classify
