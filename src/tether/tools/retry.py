"""Retry schedules: exponential backoff with full jitter, as pure decisions.

Written by hand (not a retry library) because the schedule must be durable: the engine
stores the next attempt time in the op journal, so a worker that restarts in the middle
of a backoff resumes the schedule instead of starting over or hammering the service.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

FailureClass = Literal["transient", "deterministic", "validation", "unknown"]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry transient failures."""

    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0

    def ceiling(self, attempt: int) -> float:
        """The jitter ceiling before attempt `attempt + 1` (attempts counted from 1)."""
        return min(self.max_delay, self.base_delay * self.multiplier ** max(0, attempt - 1))


@dataclass(frozen=True)
class RetryDecision:
    """Whether to try again, and after how long."""

    retry: bool
    delay: float
    attempt: int
    reason: str


def decide(
    policy: RetryPolicy,
    attempt: int,
    failure: FailureClass,
    *,
    hint: float | None = None,
    rng: random.Random | None = None,
) -> RetryDecision:
    """Decide after `attempt` attempts failed with `failure`.

    Only transient failures (and unknown outcomes of idempotent calls, which the caller
    passes as transient) are retried; `hint` is a delay the service asked for
    (Retry-After, `RetryLater(delay=...)`), honoured but capped at `max_delay`.
    """
    if failure != "transient":
        return RetryDecision(False, 0.0, attempt, f"{failure} failures are not retried")
    if attempt >= policy.max_attempts:
        return RetryDecision(False, 0.0, attempt, f"gave up after {attempt} attempts")
    r = rng or random.Random()
    delay = r.uniform(0.0, policy.ceiling(attempt))
    if hint is not None:
        delay = min(policy.max_delay, max(delay, hint))
    return RetryDecision(True, delay, attempt, f"transient failure, attempt {attempt + 1} later")
