"""`tether.retry.decide`: the one retry decision of tool calls (and, through
`call_with_retry`, of model calls). Pure: attempts, a policy and a random source in, a
`RetryDecision` out."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tether
from tether.models import _retry as model_retry
from tether.retry import FailureClass, RetryPolicy, decide, retry_delay
from tether.tools import retry as tool_retry


class Fixed(random.Random):
    """Every draw is `value`."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_one_policy_class_for_tools_and_models() -> None:
    assert tool_retry.RetryPolicy is RetryPolicy
    assert model_retry.RetryPolicy is RetryPolicy
    assert tether.RetryPolicy is RetryPolicy
    assert tool_retry.decide is decide


def test_defaults() -> None:
    p = RetryPolicy()
    assert (p.max_attempts, p.base_delay, p.multiplier, p.max_delay, p.max_retry_after) == (
        3,
        1.0,
        2.0,
        60.0,
        60.0,
    )
    assert [p.ceiling(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


POLICY = RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=10.0, max_retry_after=30.0)


@pytest.mark.parametrize(
    ("attempt", "failure", "hint", "draw", "retry", "delay", "reason"),
    [
        # Only transient failures are retried, below the attempt bound.
        (1, "transient", None, 0.5, True, 0.5, "attempt 2 later"),
        (2, "transient", None, 0.5, True, 1.0, "attempt 3 later"),
        (3, "transient", None, 0.5, True, 2.0, "attempt 4 later"),
        (4, "transient", None, 0.5, False, 0.0, "gave up after 4 attempts"),
        (9, "transient", None, 0.5, False, 0.0, "gave up after 9 attempts"),
        (1, "deterministic", None, 0.5, False, 0.0, "deterministic failures are not retried"),
        (1, "validation", None, 0.5, False, 0.0, "validation failures are not retried"),
        (1, "unknown", None, 0.5, False, 0.0, "unknown failures are not retried"),
        # Full jitter: anywhere from 0 to the ceiling.
        (1, "transient", None, 0.0, True, 0.0, ""),
        (3, "transient", None, 0.999, True, 3.996, ""),
        # The service's wish replaces the jitter, capped at max_retry_after.
        (1, "transient", 7.0, 0.5, True, 7.0, ""),
        (1, "transient", 0.0, 0.5, True, 0.0, ""),
        (1, "transient", 3600.0, 0.5, True, 30.0, ""),
        (1, "transient", -1.0, 0.5, True, 0.5, ""),  # nonsense: ignored
        (1, "transient", math.nan, 0.5, True, 0.5, ""),
        (1, "deterministic", 5.0, 0.5, False, 0.0, ""),  # a hint retries nothing
    ],
)
def test_decide_table(
    attempt: int,
    failure: FailureClass,
    hint: float | None,
    draw: float,
    retry: bool,
    delay: float,
    reason: str,
) -> None:
    d = decide(POLICY, attempt, failure, hint=hint, rng=Fixed(draw))
    assert d.retry is retry
    assert d.delay == pytest.approx(delay)
    assert d.attempt == attempt
    assert reason in d.reason


def test_ceiling_is_capped_and_does_not_overflow() -> None:
    p = RetryPolicy(base_delay=0.5, max_delay=4.0, multiplier=3.0)
    assert [p.ceiling(n) for n in (1, 2, 3, 4)] == [0.5, 1.5, 4.0, 4.0]
    assert p.ceiling(10**6) == 4.0
    assert RetryPolicy(base_delay=0.0).ceiling(10**6) == 0.0
    assert RetryPolicy(multiplier=1.0, max_delay=9).ceiling(10**6) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": -1.0},
        {"max_delay": -1.0},
        {"max_retry_after": -1.0},
        {"multiplier": 0.5},
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_full_jitter_spreads_over_the_whole_range() -> None:
    p = RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=8.0)
    rng = random.Random(7)
    delays = [decide(p, 4, "transient", rng=rng).delay for _ in range(2000)]
    assert all(0.0 <= d <= 8.0 for d in delays)
    assert min(delays) < 0.1 and max(delays) > 7.9  # not "equal jitter" (ceiling/2 + ...)
    assert statistics.mean(delays) == pytest.approx(4.0, abs=0.3)


def test_seeded_decisions_repeat() -> None:
    first = [decide(POLICY, 2, "transient", rng=random.Random(3)).delay for _ in range(3)]
    assert len(set(first)) == 1


policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 12),
    base_delay=st.floats(0.0, 10.0),
    max_delay=st.floats(0.0, 120.0),
    multiplier=st.floats(1.0, 5.0),
    max_retry_after=st.floats(0.0, 300.0),
)
failures = st.sampled_from(["transient", "deterministic", "validation", "unknown"])
hints = st.none() | st.floats(-10.0, 1e6) | st.just(math.nan)


@settings(max_examples=300, deadline=None)
@given(policies, st.integers(1, 200), failures, hints, st.floats(0.0, 1.0, exclude_max=True))
def test_decide_properties(
    policy: RetryPolicy,
    attempt: int,
    failure: FailureClass,
    hint: float | None,
    draw: float,
) -> None:
    d = decide(policy, attempt, failure, hint=hint, rng=Fixed(draw))
    assert d.retry is (failure == "transient" and attempt < policy.max_attempts)
    if not d.retry:
        assert d.delay == 0.0
        return
    assert d.delay >= 0.0
    if hint is not None and hint >= 0:
        assert d.delay == min(hint, policy.max_retry_after)
    else:
        # Full jitter: the draw scales the capped exponential step.
        assert 0.0 <= d.delay <= policy.max_delay
        assert d.delay == pytest.approx(draw * policy.ceiling(attempt))
        assert d.delay == retry_delay(attempt, policy, draw)


@settings(max_examples=200, deadline=None)
@given(policies, st.integers(0, 2**32))
def test_attempts_are_bounded(policy: RetryPolicy, seed: int) -> None:
    # A call that always fails transiently is tried exactly `max_attempts` times.
    rng = random.Random(seed)
    attempt, waited = 1, []
    while (d := decide(policy, attempt, "transient", rng=rng)).retry:
        waited.append(d.delay)
        attempt += 1
        assert attempt <= policy.max_attempts
    assert attempt == policy.max_attempts
    assert len(waited) == policy.max_attempts - 1
    assert all(0.0 <= w <= policy.ceiling(n + 1) for n, w in enumerate(waited))


@settings(max_examples=100, deadline=None)
@given(policies, st.integers(1, 10_000))
def test_ceiling_is_monotone_and_capped(policy: RetryPolicy, attempt: int) -> None:
    assert 0.0 <= policy.ceiling(attempt) <= policy.max_delay
    assert policy.ceiling(attempt) <= policy.ceiling(attempt + 1) + 1e-12
