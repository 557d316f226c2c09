"""The breaker and concurrency slots as pure decisions: no store, no sleeping.

Time is a number passed in; hours of cooldown take no time.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether import spec
from tether.tools import breaker as br
from tether.tools.breaker import Admission, BreakerPolicy, ServiceConfig, Transition

T0 = 1_800_000_000.0
POLICY = BreakerPolicy()  # 30 % of at least 10 calls in 60 s, 60 s cooldown


def feed(
    state: dict[str, Any] | None,
    outcomes: str,
    now: float = T0,
    policy: BreakerPolicy = POLICY,
    step: float = 0.0,
) -> tuple[dict[str, Any], list[Transition]]:
    """Record outcomes given as a string: `.` ok, `x` failed; `step` seconds apart."""
    out: list[Transition] = []
    s = br.normalize(state)
    for n, c in enumerate(outcomes):
        s, ts = br.record(s, now + n * step, policy, c == ".", f"h{n}", service="svc")
        out += ts
    return s, out


def opened(now: float = T0, policy: BreakerPolicy = POLICY) -> dict[str, Any]:
    s, ts = feed(None, "xxx.......", now, policy)
    assert [t.dst for t in ts] == ["open"]
    return s


# --- closed and opening -------------------------------------------------------------------


def test_a_new_service_is_closed_and_admits() -> None:
    s, adm = br.admit(None, T0, POLICY, "a")
    assert adm == Admission(True, None, "breaker closed", "closed")
    assert s == br.new_state()
    assert json.loads(json.dumps(s)) == s


def test_opens_at_thirty_percent_of_ten_calls() -> None:
    s, ts = feed(None, ".......xx")  # 2 of 9
    assert s["state"] == "closed" and not ts
    s, ts = feed(s, "x", now=T0 + 1)  # 3 of 10 = 30 %
    assert s["state"] == "open"
    assert ts == [Transition("svc", "closed", "open", ts[0].reason, T0 + 1)]
    assert "3 of 10" in ts[0].reason
    assert s["opened_at"] == T0 + 1 and s["until"] == T0 + 1 + 60
    assert s["calls"] == [] and s["probe"] is None


def test_stays_closed_below_the_rate() -> None:
    s, ts = feed(None, "xx........")  # 20 %
    assert s["state"] == "closed" and not ts
    s, ts = feed(None, "xx" + "." * 8 + "x" + "." * 9)  # 3 of 20 = 15 %
    assert s["state"] == "closed" and not ts
    assert len(s["calls"]) == 20


def test_stays_closed_below_min_calls_however_bad() -> None:
    s, ts = feed(None, "x" * 9)
    assert s["state"] == "closed" and not ts
    s, ts = feed(s, "x")
    assert s["state"] == "open" and len(ts) == 1


def test_the_window_slides() -> None:
    s, _ = feed(None, "xxx")
    # A minute later those failures are out of the window: 3 failures among the next
    # 10 calls would open it, 7 successes do not, and the window holds only them.
    s, ts = feed(s, ".......", now=T0 + 60)
    assert s["state"] == "closed" and not ts
    assert [c[0] for c in s["calls"]] == [T0 + 60] * 7
    # Spread out: calls older than 60 s are pruned as time goes on.
    s, ts = feed(None, "x" * 30, step=10.0)
    assert s["state"] == "closed" and not ts
    assert len(s["calls"]) == 6


def test_window_is_bounded() -> None:
    s, _ = feed(None, "." * (br.MAX_WINDOW_CALLS + 50))
    assert len(s["calls"]) == br.MAX_WINDOW_CALLS


def test_custom_policy() -> None:
    p = BreakerPolicy(failure_rate=0.5, min_calls=4, window_seconds=10, cooldown_seconds=5)
    s, ts = feed(None, "x..", policy=p)
    assert s["state"] == "closed" and not ts
    s, ts = feed(s, "x", policy=p)
    assert s["state"] == "open" and s["until"] == T0 + 5 and len(ts) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_rate": 0},
        {"failure_rate": 1.5},
        {"min_calls": 0},
        {"window_seconds": 0},
        {"cooldown_seconds": -1},
        {"probe_timeout_seconds": 0},
    ],
)
def test_policy_refuses_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        BreakerPolicy(**kwargs)


# --- open, half-open, probe --------------------------------------------------------------


def test_open_refuses_until_the_cooldown_is_over() -> None:
    s = opened()
    for dt in (0, 1, 59.999):
        s2, adm = br.admit(s, T0 + dt, POLICY, "a", service="svc")
        assert not adm.allowed and adm.cause == "open"
        assert adm.retry_at == T0 + 60
        assert s2 == s and not adm.transitions


def test_after_cooldown_exactly_one_probe() -> None:
    s = opened()
    s, adm = br.admit(s, T0 + 60, POLICY, "probe", service="svc")
    assert adm.allowed and adm.cause == "probe"
    assert adm.transitions == (
        Transition("svc", "open", "half_open", "cooldown over: one probe", T0 + 60),
    )
    assert s["state"] == "half_open"
    assert s["probe"] == {"holder": "probe", "expires": T0 + 120}
    # Everyone else is refused while the probe is out, and told to look again soon.
    for n in range(5):
        s2, other = br.admit(s, T0 + 61 + n, POLICY, f"other{n}", service="svc")
        assert not other.allowed and other.cause == "probing"
        assert other.retry_at is not None and T0 + 61 + n < other.retry_at <= T0 + 120
        assert s2 == s
    # The probe's holder asking again is still the probe.
    s3, again = br.admit(s, T0 + 62, POLICY, "probe")
    assert again.allowed and again.cause == "probe" and not again.transitions
    assert s3["probe"]["holder"] == "probe"


def test_probe_success_closes_and_resets_the_window() -> None:
    s = opened()
    s, _ = br.admit(s, T0 + 60, POLICY, "p")
    s, ts = br.record(s, T0 + 61, POLICY, True, "p", service="svc")
    assert ts == [Transition("svc", "half_open", "closed", "probe succeeded", T0 + 61)]
    assert s["state"] == "closed" and s["calls"] == [] and s["probe"] is None
    assert s["until"] is None and s["opened_at"] is None
    _, adm = br.admit(s, T0 + 61, POLICY, "next")
    assert adm.allowed and adm.cause == "closed"
    # A fresh window: it takes min_calls calls again to open.
    s, ts = feed(s, "x" * 9, now=T0 + 62)
    assert s["state"] == "closed" and not ts


def test_probe_failure_reopens_for_a_new_cooldown() -> None:
    s = opened()
    s, _ = br.admit(s, T0 + 90, POLICY, "p")
    s, ts = br.record(s, T0 + 95, POLICY, False, "p", service="svc")
    assert ts == [Transition("svc", "half_open", "open", "probe failed", T0 + 95)]
    assert s["state"] == "open" and s["opened_at"] == T0 + 95 and s["until"] == T0 + 155
    _, adm = br.admit(s, T0 + 154, POLICY, "q")
    assert not adm.allowed and adm.retry_at == T0 + 155
    s, adm = br.admit(s, T0 + 155, POLICY, "q")
    assert adm.allowed and adm.cause == "probe"


def test_an_abandoned_probe_is_taken_over_after_its_timeout() -> None:
    p = BreakerPolicy(probe_timeout_seconds=10)
    s = opened(policy=p)
    s, _ = br.admit(s, T0 + 60, p, "dead")
    _, adm = br.admit(s, T0 + 69.9, p, "b")
    assert not adm.allowed and adm.retry_at == pytest.approx(T0 + 70)
    s, adm = br.admit(s, T0 + 70, p, "b")
    assert adm.allowed and adm.cause == "probe" and s["probe"]["holder"] == "b"
    # The dead probe's late verdict is not the probe's any more: nothing changes.
    s2, ts = br.record(s, T0 + 71, p, True, "dead")
    assert s2 == s and not ts
    s, ts = br.record(s, T0 + 71, p, True, "b")
    assert s["state"] == "closed" and [t.dst for t in ts] == ["closed"]


def test_outcomes_of_stragglers_change_nothing_while_open() -> None:
    s = opened()
    for ok in (True, False):
        s2, ts = br.record(s, T0 + 5, POLICY, ok, "late")
        assert s2 == s and not ts


def test_functions_do_not_touch_their_input() -> None:
    s = opened()
    s["slots"] = {"x": T0 + 100}
    before = copy.deepcopy(s)
    br.admit(s, T0 + 60, POLICY, "p")
    br.record(s, T0 + 60, POLICY, False, "p")
    br.acquire_slot(s, T0, 3, "y", 10)
    br.release_slot(s, "x")
    br.admit_call(s, T0 + 60, POLICY, 1, "z", 10)
    assert s == before


# --- concurrency slots -------------------------------------------------------------------


def test_slots_up_to_the_limit() -> None:
    s: dict[str, Any] | None = None
    granted = []
    for h in "abc":
        s, ok = br.acquire_slot(s, T0, 2, h, 30)
        granted.append(ok)
    assert granted == [True, True, False]
    assert s is not None and set(s["slots"]) == {"a", "b"}
    # The same holder again keeps its slot (renewed), it does not take a second one.
    s, ok = br.acquire_slot(s, T0 + 5, 2, "a", 30)
    assert ok and s["slots"] == {"a": T0 + 35, "b": T0 + 30}
    s = br.release_slot(s, "b")
    s, ok = br.acquire_slot(s, T0 + 6, 2, "c", 30)
    assert ok and set(s["slots"]) == {"a", "c"}
    # Releasing what one does not hold is harmless.
    assert br.release_slot(s, "nobody") == s


def test_slots_of_dead_holders_expire() -> None:
    s, _ = br.acquire_slot(None, T0, 1, "dead", 30)
    _, ok = br.acquire_slot(s, T0 + 29.9, 1, "b", 30)
    assert not ok
    assert br.live_slots(s, T0 + 29.9) == {"dead": T0 + 30}
    assert br.live_slots(s, T0 + 30) == {}
    s, ok = br.acquire_slot(s, T0 + 30, 1, "b", 30)
    assert ok and s["slots"] == {"b": T0 + 60}


def test_no_limit_grants_without_recording() -> None:
    s, ok = br.acquire_slot(None, T0, None, "a", 30)
    assert ok and s["slots"] == {}


def test_admit_call_is_breaker_and_slot_together() -> None:
    # Closed with a free slot: both granted.
    s, adm = br.admit_call(None, T0, POLICY, 1, "a", 30)
    assert adm.allowed and s["slots"] == {"a": T0 + 30}
    # No slot left: refused as busy, retry soon, state unchanged.
    s2, adm = br.admit_call(s, T0 + 1, POLICY, 1, "b", 30, retry_delay=2)
    assert not adm.allowed and adm.cause == "busy" and adm.retry_at == T0 + 3
    assert s2 == s
    # Open: refused by the breaker, no slot taken.
    o = opened()
    o2, adm = br.admit_call(o, T0 + 1, POLICY, 5, "c", 30)
    assert adm.cause == "open" and o2["slots"] == {}
    # Half-open time but no slot: the caller does not take the probe either.
    o["slots"] = {"x": T0 + 1000}
    o3, adm = br.admit_call(o, T0 + 60, POLICY, 1, "c", 30)
    assert adm.cause == "busy" and o3["state"] == "open" and o3["probe"] is None
    # With a slot it probes, and the transition is reported.
    o4, adm = br.admit_call(o, T0 + 60, POLICY, 2, "c", 30, service="svc")
    assert adm.cause == "probe" and [t.dst for t in adm.transitions] == ["half_open"]
    assert set(o4["slots"]) == {"x", "c"} and o4["probe"]["holder"] == "c"


# --- configuration from a contract -------------------------------------------------------


def test_service_config_from_spec() -> None:
    cfg = ServiceConfig.from_spec(None)
    assert cfg == ServiceConfig()
    limits = spec.Limits(breaker_failure_rate=0.5, breaker_min_calls=4, breaker_cooldown_seconds=9)
    cfg = ServiceConfig.from_spec(spec.ServicePolicy(max_concurrency=2), limits)
    assert cfg.max_concurrency == 2
    assert cfg.breaker == BreakerPolicy(0.5, 4, 60.0, 9.0)
    own = spec.ServicePolicy(failure_rate=0.2, min_calls=20, window_seconds=30, cooldown_seconds=5)
    cfg = ServiceConfig.from_spec(own, limits, slot_ttl=12)
    assert cfg.breaker == BreakerPolicy(0.2, 20, 30.0, 5.0)
    assert cfg.max_concurrency is None and cfg.slot_ttl == 12
    with pytest.raises(ValueError):
        ServiceConfig(max_concurrency=0)


# --- properties --------------------------------------------------------------------------

holders = st.sampled_from([f"h{n}" for n in range(6)])
slot_ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), holders, st.floats(0.5, 50)),
        st.tuples(st.just("release"), holders, st.just(0.0)),
        st.tuples(st.just("wait"), st.just(""), st.floats(0, 40)),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(limit=st.integers(1, 4), ops=slot_ops)
def test_held_slots_never_exceed_the_limit(limit: int, ops: list[tuple[str, str, float]]) -> None:
    """Any interleaving of acquires, releases and time: at no moment do more than
    `limit` holders hold a slot (granted, not released, not past their ttl)."""
    state: dict[str, Any] | None = None
    now = T0
    held: dict[str, float] = {}  # the reference model: holder -> expiry
    for kind, holder, x in ops:
        if kind == "acquire":
            state, ok = br.acquire_slot(state, now, limit, holder, x)
            live = {h: e for h, e in held.items() if e > now}
            assert ok == (holder in live or len(live) < limit)
            if ok:
                held[holder] = now + x
        elif kind == "release":
            state = br.release_slot(state, holder)
            held.pop(holder, None)
        else:
            now += x
        live = {h: e for h, e in held.items() if e > now}
        assert len(live) <= limit
        assert br.live_slots(state, now) == live
        assert json.loads(json.dumps(state)) == (state or None)


breaker_ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), holders, st.just(True)),
        st.tuples(st.just("record"), holders, st.booleans()),
        st.tuples(st.just("wait"), st.sampled_from(["1", "10", "61"]), st.just(True)),
    ),
    max_size=120,
)


@settings(max_examples=400, deadline=None)
@given(ops=breaker_ops)
def test_breaker_invariants(ops: list[tuple[str, str, bool]]) -> None:
    """Whatever happens: one probe at most, and only half-open; a closed breaker's
    window never holds an opening failure rate; refusals name a later time; every
    transition starts where the state was."""
    policy = BreakerPolicy(probe_timeout_seconds=30)
    state = br.new_state()
    now = T0
    for kind, holder, ok in ops:
        before = state["state"]
        if kind == "admit":
            state, adm = br.admit(state, now, policy, holder)
            if not adm.allowed:
                assert adm.retry_at is not None and adm.retry_at > now
                assert before != "closed"
            transitions = list(adm.transitions)
        elif kind == "record":
            state, transitions = br.record(state, now, policy, ok, holder)
        else:
            now += float(holder)
            transitions = []
        if transitions:
            assert len(transitions) == 1 and transitions[0].src == before
            assert transitions[0].dst == state["state"] and transitions[0].at == now
        else:
            assert state["state"] == before
        assert (state["probe"] is not None) == (state["state"] == "half_open")
        if state["state"] == "closed":
            calls = state["calls"]
            failed = sum(1 for c in calls if not c[1])
            assert len(calls) < policy.min_calls or failed < policy.failure_rate * len(calls)
        if state["state"] == "open":
            assert state["until"] == state["opened_at"] + policy.cooldown_seconds


def test_one_admission_and_guard_type_serve_the_runtime() -> None:
    # The runtime's ops declare no guard types of their own: they use the breaker's, whose
    # protocol declares every member ops calls (`finish` and `transitions` included).
    import inspect

    from tether.runtime.ops import attempt, ports, runner

    assert runner.Guard is br.Guard and runner.Admission is br.Admission
    assert "Guard" not in vars(attempt) and "Admission" not in vars(attempt)
    assert ports.ToolEnv.__annotations__["guard"] == "Guard | None"
    adm = Admission(False, T0 + 5, "breaker open", "open")
    assert adm.transitions == ()
    for name in ("admit", "release", "record", "finish"):
        assert name in vars(br.Guard)
        assert inspect.iscoroutinefunction(getattr(br.ServiceGuard, name))
