"""The retry policy of model calls: pure delay math and the async loop."""

from __future__ import annotations

import email.utils
import random

import pytest

from tether.errors import ModelError
from tether.models._retry import (
    Failure,
    RetryEvent,
    RetryPolicy,
    backoff_delay,
    call_with_retry,
    is_transient_status,
    parse_retry_after,
    retry_delay,
)
from tether.models._sdk import describe_status_error

# --- pure functions -----------------------------------------------------------------------


def test_full_jitter_bounds() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0)
    assert backoff_delay(1, policy, 0.0) == 0.0
    assert backoff_delay(1, policy, 0.999999) == pytest.approx(0.5, rel=1e-5)
    assert backoff_delay(2, policy, 0.5) == pytest.approx(0.5)  # half of 1.0
    assert backoff_delay(3, policy, 0.5) == pytest.approx(1.0)  # half of 2.0
    assert backoff_delay(10, policy, 0.999999) == pytest.approx(4.0, rel=1e-5)  # capped
    assert backoff_delay(10_000, policy, 0.5) == pytest.approx(2.0)  # no overflow


def test_jitter_spreads_delays() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=8.0)
    rng = random.Random(7)
    delays = [backoff_delay(4, policy, rng.random()) for _ in range(500)]
    assert all(0.0 <= d <= 8.0 for d in delays)
    assert min(delays) < 1.0 and max(delays) > 7.0  # full jitter, not equal jitter


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError):
        backoff_delay(0, RetryPolicy(), 0.5)


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=-1)


def test_retry_after_wins_and_is_capped() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0, max_retry_after=30.0)
    assert retry_delay(1, policy, 0.5, retry_after=7.0) == 7.0
    assert retry_delay(1, policy, 0.5, retry_after=3600.0) == 30.0
    assert retry_delay(1, policy, 0.5, retry_after=0.0) == 0.0
    assert retry_delay(1, policy, 0.5, retry_after=None) == pytest.approx(0.25)


def test_parse_retry_after() -> None:
    assert parse_retry_after({"Retry-After": "12"}) == 12.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after-ms": "junk", "retry-after": "9"}) == 9.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "-3"}) is None
    assert parse_retry_after({}) is None
    assert parse_retry_after(None) is None
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 20, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(20.0, abs=1.0)
    past = email.utils.formatdate(now - 20, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0


@pytest.mark.parametrize(
    ("status", "transient"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (529, True),
    ],
)
def test_transient_statuses(status: int, transient: bool) -> None:
    assert is_transient_status(status) is transient


def test_describe_status_error() -> None:
    body = {"error": {"type": "rate_limit_error", "message": "slow down"}}
    assert describe_status_error(429, body, "x") == "HTTP 429: rate_limit_error: slow down"
    assert describe_status_error(500, {"error": "boom"}, "x") == "HTTP 500: boom"
    assert describe_status_error(502, "<html>bad gateway</html>", "x").startswith(
        "HTTP 502: <html>"
    )
    assert describe_status_error(503, None, "fallback") == "HTTP 503: fallback"


# --- the async loop -----------------------------------------------------------------------


class Boom(Exception):
    def __init__(self, status: int, retry_after: float | None = None) -> None:
        super().__init__(f"status {status}")
        self.status = status
        self.retry_after = retry_after


def classify(exc: BaseException) -> Failure | None:
    if isinstance(exc, Boom):
        return Failure(
            transient=is_transient_status(exc.status),
            message=str(exc),
            status=exc.status,
            retry_after=exc.retry_after,
        )
    if isinstance(exc, TimeoutError):
        return Failure(transient=True, message="request timed out")
    return None


class Script:
    """An async call that fails with the given exceptions, then returns 'ok'."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


POLICY = RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=10.0, max_retry_after=5.0)


async def test_transient_errors_are_retried_with_backoff() -> None:
    call, sleep = Script(Boom(503), TimeoutError(), Boom(429)), Sleeps()
    events: list[RetryEvent] = []
    result = await call_with_retry(
        call,
        classify=classify,
        policy=POLICY,
        sleep=sleep,
        rand=lambda: 0.5,
        on_retry=events.append,
    )
    assert result == "ok"
    assert call.calls == 4
    assert sleep.delays == [0.5, 1.0, 2.0]  # 0.5 x (1, 2, 4)
    assert [e.attempt for e in events] == [1, 2, 3]
    assert [e.failure.status for e in events] == [503, None, 429]


async def test_retry_after_is_honoured_and_capped() -> None:
    call, sleep = Script(Boom(429, retry_after=2.0), Boom(429, retry_after=600.0)), Sleeps()
    assert await call_with_retry(call, classify=classify, policy=POLICY, sleep=sleep) == "ok"
    assert sleep.delays == [2.0, 5.0]


async def test_last_transient_failure_raises_transient_model_error() -> None:
    call, sleep = Script(*[Boom(500) for _ in range(10)]), Sleeps()
    with pytest.raises(ModelError) as info:
        await call_with_retry(call, classify=classify, policy=POLICY, sleep=sleep, provider="p")
    assert info.value.transient is True
    assert info.value.status == 500
    assert "gave up after 4 attempts" in str(info.value)
    assert str(info.value).startswith("p: ")
    assert isinstance(info.value.__cause__, Boom)
    assert call.calls == 4
    assert len(sleep.delays) == 3  # no sleep after the last attempt


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_non_transient_errors_raise_at_once(status: int) -> None:
    call, sleep = Script(Boom(status)), Sleeps()
    with pytest.raises(ModelError) as info:
        await call_with_retry(call, classify=classify, policy=POLICY, sleep=sleep)
    assert info.value.transient is False
    assert info.value.status == status
    assert call.calls == 1
    assert sleep.delays == []


async def test_unclassified_exceptions_propagate_untouched() -> None:
    call, sleep = Script(KeyError("bug")), Sleeps()
    with pytest.raises(KeyError):
        await call_with_retry(call, classify=classify, policy=POLICY, sleep=sleep)
    assert call.calls == 1


async def test_single_attempt_policy() -> None:
    call, sleep = Script(Boom(503)), Sleeps()
    with pytest.raises(ModelError) as info:
        await call_with_retry(
            call, classify=classify, policy=RetryPolicy(max_attempts=1), sleep=sleep
        )
    assert info.value.transient is True
    assert "1 attempt)" in str(info.value)
    assert sleep.delays == []
