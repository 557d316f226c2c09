"""Retries, for tool calls and model calls alike: one policy, one schedule, one reading
of HTTP statuses.

- `RetryPolicy` says how often and how patiently (as Temporal's `RetryPolicy`):
  exponential backoff with **full jitter**, attempt `n + 1` waiting a uniform random time
  in ``[0, min(max_delay, base_delay * multiplier**(n-1))]``. A delay the service asked
  for (`Retry-After`, `RetryLater(delay=...)`) replaces the jittered one, capped at
  `max_retry_after`.
- `decide` is the pure decision after a failed attempt (a `RetryDecision` value); the
  engine stores its delay in the op journal, so a worker that restarts in the middle of a
  backoff resumes the schedule instead of starting over. Model adapters run the same
  schedule in-process (`tether.models._retry.call_with_retry`).
- `classify_status` says what an HTTP status means for retrying, for tools and model
  providers alike.
- `on_exhausted` (tool calls only) says what happens when the last attempt failed:
  `fail_item` (the failure goes back to the model, as always), `ask_human` (the task
  waits for a person to try again, record it done, or fail it) or `compensate` (the
  item's applied ops are undone by their tools' `compensate` hooks, newest first, and
  the item is blocked); see `tether.runtime.ops.runner`.

Written by hand (not a retry library) because the schedule must be durable.

**Defaults** (one set for everything that talks to a service): 3 attempts, 1 s base,
doubling, 60 s cap, a service's own wish honoured up to 60 s. The base and the doubling
are Temporal's; the attempt bound is tether's (Temporal retries forever by default; an
agent should hear about a dead service and work on something else). The model adapters
keep their own knob for the attempts (`max_retries=3`, i.e. 4 attempts: a model call
is the loop's heartbeat and a provider's 429 usually clears within seconds); their
delays now follow the same schedule as tools (1, 2, 4 s ceilings; formerly 0.5, 1, 2).
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: What a failure means for retrying:
#: - `transient`: it did not take effect and may work later: retry;
#: - `unknown`: it may have taken effect but no answer came: reconcile, or retry with the
#:   same idempotency key when the call is idempotent;
#: - `deterministic`: retrying will not help: the message goes back to the caller;
#: - `validation`: the call worked but its result breaks the post-condition.
FailureClass = Literal["transient", "deterministic", "validation", "unknown"]

#: What a tool call does once its retries are exhausted (see `RetryPolicy.on_exhausted`).
OnExhausted = Literal["fail_item", "ask_human", "compensate"]
ON_EXHAUSTED: tuple[str, ...] = ("fail_item", "ask_human", "compensate")

#: Statuses that say the request was not acted upon and may succeed later:
#: 408 Request Timeout, 425 Too Early, 429 Too Many Requests, 503 Service Unavailable,
#: 529 (Anthropic's "overloaded").
TRANSIENT_STATUSES = frozenset({408, 425, 429, 503, 529})
#: Statuses that leave a request's effect in doubt when it had one: 409 Conflict (with an
#: idempotency key it means another request with the same key is still being processed
#: or already done, see `classify_status`) and the gateway-ish 500, 502, 504 (the
#: backend may have run it before the answer was lost).
IN_DOUBT_STATUSES = frozenset({409, 500, 502, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry transient failures.

    `max_attempts` counts the first try (3: one call and up to two retries). Attempt
    `n + 1` waits a uniform random time in ``[0, ceiling(n)]`` (full jitter), where
    ``ceiling(n) = min(max_delay, base_delay * multiplier**(n-1))``; a delay the service
    asked for replaces that, capped at `max_retry_after`.

    `on_exhausted` (tool calls only; model calls ignore it) says what happens after the
    last attempt failed transiently: `fail_item` (the default: the failure goes back to
    the model, which may try otherwise; the item is blocked by the usual limits),
    `ask_human` (the task waits for a person's decision on the call) or `compensate`
    (the item's applied ops are compensated, newest first, and the item is blocked).
    """

    max_attempts: int = 3
    base_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    max_retry_after: float = 60.0
    on_exhausted: OnExhausted = "fail_item"

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ValueError("retry delays must not be negative")
        if self.multiplier < 1:
            raise ValueError("multiplier must be at least 1")
        if self.on_exhausted not in ON_EXHAUSTED:
            raise ValueError(
                f"on_exhausted must be one of {', '.join(ON_EXHAUSTED)}, not {self.on_exhausted!r}"
            )

    def ceiling(self, attempt: int) -> float:
        """The jitter ceiling before attempt `attempt + 1` (attempts counted from 1)."""
        if self.base_delay == 0:
            return 0.0
        exponent = max(0, attempt - 1)
        try:
            step = self.base_delay * self.multiplier**exponent
        except OverflowError:  # silly attempt numbers: the cap applies anyway
            step = math.inf
        return min(self.max_delay, step)


@dataclass(frozen=True)
class RetryDecision:
    """Whether to try again, and after how long."""

    retry: bool
    delay: float
    attempt: int
    reason: str


def backoff_delay(attempt: int, policy: RetryPolicy, rand: float) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based), full jitter.

    `rand` is a number in ``[0, 1)``; the result is ``rand * policy.ceiling(attempt)``.
    """
    if attempt < 1:
        raise ValueError("attempt numbers start at 1")
    return max(0.0, min(1.0, rand)) * policy.ceiling(attempt)


def retry_delay(
    attempt: int, policy: RetryPolicy, rand: float, retry_after: float | None = None
) -> float:
    """The wait before the next attempt: the service's `retry_after` when given (capped
    at `policy.max_retry_after`), otherwise `backoff_delay`."""
    if retry_after is not None and retry_after >= 0:  # (NaN is not >= 0)
        return min(retry_after, policy.max_retry_after)
    return backoff_delay(attempt, policy, rand)


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
    passes as transient) are retried, at most `policy.max_attempts` attempts in all;
    `hint` is a delay the service asked for (Retry-After, `RetryLater(delay=...)`),
    honoured but capped at `policy.max_retry_after`.
    """
    if failure != "transient":
        return RetryDecision(False, 0.0, attempt, f"{failure} failures are not retried")
    if attempt >= policy.max_attempts:
        return RetryDecision(False, 0.0, attempt, f"gave up after {attempt} attempts")
    r = rng or random.Random()
    delay = retry_delay(max(1, attempt), policy, r.random(), hint)
    return RetryDecision(True, delay, attempt, f"transient failure, attempt {attempt + 1} later")


def classify_status(status: int, *, has_effect: bool, first: bool = False) -> FailureClass:
    """What an HTTP error status means for retrying a call.

    - 408, 425, 429, 503, 529: `transient` (the request was not acted upon);
    - 409, 500, 502, 504: `unknown` for a call with effects, `transient` for one without
      (a read, a model call); but a 409 on an op's first attempt is `deterministic`;
    - any other 5xx: `transient`; any other status: `deterministic`.

    Why 409 is in doubt: on a POST with an idempotency key, 409 Conflict is how Stripe
    and the IETF Idempotency-Key draft answer "a request with this key is already being
    processed"; elsewhere it means "already exists" or a concurrent edit. In every case
    the effect may have happened (or may still happen). `deterministic` would send the
    error to the model, which could call again under a new op id, i.e. a new key, and
    do it twice; `transient` would blindly resend a call that is not idempotent. So a
    call with effects is reconciled (or resent with the same key when idempotent, which
    the server answers with the first result) and otherwise left to a human. Without
    effects there is nothing to duplicate: OpenAI and Anthropic use 409 for a transient
    lock conflict and their SDKs retry it.

    `first`: the call is its op's first attempt, so no earlier request carried its key:
    a 409 is then a conflict with what was there before ("already exists", someone
    else's edit), not with a request of its own, and the call did nothing:
    `deterministic`, the message goes back to the model (a sync skips the file).
    """
    if status in TRANSIENT_STATUSES:
        return "transient"
    if status == 409 and first and has_effect:
        return "deterministic"
    if status in IN_DOUBT_STATUSES:
        return "unknown" if has_effect else "transient"
    if status >= 500:
        return "transient"
    return "deterministic"


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds the service asks us to wait, from `retry-after-ms` or `retry-after`.

    `retry-after` may be a number of seconds or an HTTP date. Returns None when
    absent or unreadable. Header names are matched case-insensitively.
    """
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    ms = _seconds(lowered.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _seconds(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def _seconds(raw: str | None) -> float | None:
    """A non-negative finite number, or None."""
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if value >= 0 and math.isfinite(value) else None
