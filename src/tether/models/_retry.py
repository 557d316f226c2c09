"""Retries of transient provider errors, in-process: the `tether.retry` schedule.

The provider SDKs are built with `max_retries=0`, so every retry of a model call is
decided here, where it can be tested and observed (an `on_retry` hook sees each one).
The policy, the backoff (full jitter) and the reading of HTTP statuses are the ones tool
calls use (`tether.retry`); only the loop is the model's own, since a model call is not
journaled and its backoff need not survive a restart.

- `call_with_retry` runs an async call, asks a classifier what each exception means,
  sleeps with an injectable `sleep` and finally raises `errors.ModelError` with
  `transient` and `status` set.
- `is_transient_status`: `tether.retry.classify_status` for a call without effects:
  timeouts, connection errors, 408, 409, 425, 429 and 5xx (529 "overloaded" included)
  are retried; everything else (400, 401, 403, 404, 422, ...) is not.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tether.errors import ModelError
from tether.retry import (
    RetryPolicy,
    backoff_delay,
    classify_status,
    decide,
    parse_retry_after,
    retry_delay,
)

__all__ = [
    "Failure",
    "RetryEvent",
    "RetryPolicy",
    "backoff_delay",
    "call_with_retry",
    "is_transient_status",
    "parse_retry_after",
    "retry_delay",
]

log = logging.getLogger("tether.models")

T = TypeVar("T")


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
    """Whether an HTTP status from a model provider is worth retrying (a model call has
    no effects, so statuses that leave an effect in doubt are simply retried)."""
    return classify_status(status, has_effect=False) == "transient"


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
    `ModelError(transient=True, status=...)`; both say how many `attempts` were made.
    The original exception is kept as `__cause__`.
    """
    draw = _Draw(rand)
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
                    f"{provider}: {failure.message}",
                    transient=False,
                    status=failure.status,
                    attempts=attempt,
                ) from exc
            decision = decide(policy, attempt, "transient", hint=failure.retry_after, rng=draw)
            if not decision.retry:
                raise ModelError(
                    f"{provider}: {failure.message} (gave up after {attempt} attempt"
                    f"{'s' if attempt != 1 else ''})",
                    transient=True,
                    status=failure.status,
                    attempts=attempt,
                ) from exc
            event = RetryEvent(attempt=attempt, delay=decision.delay, failure=failure)
            log.warning(
                "%s: attempt %d failed (%s); retrying in %.2fs",
                provider,
                attempt,
                failure.message,
                decision.delay,
            )
            if on_retry is not None:
                on_retry(event)
            await sleep(decision.delay)


class _Draw(random.Random):
    """A `random.Random` whose draws come from a plain function (tests pass a constant)."""

    def __init__(self, draw: Callable[[], float]) -> None:
        super().__init__()
        self._draw = draw

    def random(self) -> float:
        return self._draw()
