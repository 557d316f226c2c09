"""The per-round bookkeeping made cheaper keeps its contract:

- `RunState.to_dict` writes what a loop over its fields wrote (order, None left out,
  unknown keys first, `by_purpose` and `state_version` last);
- `RunState.marks_write` sends what changed without copying the lists it sent, and
  writes an item whole when its list was changed in place;
- a span with no log field leaves the log fields alone, and one that sets a field
  later still ends it;
- the GenAI metrics skip OpenTelemetry's proxy instruments while no meter provider is
  behind them, and record once one is;
- `history.dumps` is `json.dumps(..., ensure_ascii=False, sort_keys=True)`.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.telemetry import Histogram as _Histogram
from tests.support.telemetry import Proxy as _Proxy

from tether import telemetry
from tether.runtime.round import history
from tether.runtime.run.state import STATE_VERSION, RunState, Spend
from tether.store.base import MarksWrite


def _loop_to_dict(state: RunState) -> dict[str, Any]:
    """`to_dict` as it was written before: a loop over the fields."""
    out: dict[str, Any] = dict(state.extra)
    for f in fields(RunState):
        if f.name in ("extra", "by_purpose"):
            continue
        value = getattr(state, f.name)
        if value is not None:
            out[f.name] = value
    out["by_purpose"] = {k: v.to_dict() for k, v in state.by_purpose.items()}
    out["state_version"] = STATE_VERSION
    return out


_values = st.one_of(st.none(), st.integers(0, 9), st.text(max_size=3))


@given(
    st.dictionaries(st.sampled_from(["zz", "aa", "future"]), _values, max_size=3),
    st.sampled_from(["inflight", "unjudged", "system_blob", "token_ratio", "signed_off"]),
    st.booleans(),
)
def test_to_dict_writes_what_the_field_loop_wrote(
    extra: dict[str, Any], optional: str, set_it: bool
) -> None:
    state = RunState(extra=extra)
    state.by_purpose["act"] = Spend(calls=2, input=10)
    state.seen["i1"] = ["a", "b"]
    if set_it:
        setattr(state, optional, {"x": 1} if optional in ("inflight", "unjudged") else "v")
    state.marks_write()  # sets the private marks base: never stored
    got = state.to_dict()
    assert list(got.items()) == list(_loop_to_dict(state).items())
    assert "_marks_base" not in got and "extra" not in got
    assert (optional in got) == set_it


def test_marks_write_sends_the_change_of_a_replaced_list() -> None:
    state = RunState.from_dict({"seen": {"i1": ["a", "b", "c"], "i2": ["x"]}})
    state.seen["i1"] = ["b", "c", "d"]  # the oldest dropped, one added
    del state.seen["i2"]
    assert state.marks_write() == MarksWrite({"i1": (1, ("d",)), "i2": (None, ())})
    assert state.marks_write() == MarksWrite({})  # stored now: nothing more to send


def test_marks_write_of_no_change_is_shared_and_read_only() -> None:
    """A commit that changes no list gets the one `MarksWrite` of no change, which no
    store can change; a list replaced, added or dropped after it is a change again."""
    state = RunState.from_dict({"seen": {"i1": ["a"], "i2": ["x"]}})
    first, second = state.marks_write(), state.marks_write()
    assert first is second and first == MarksWrite({}) and not first.items
    with pytest.raises(TypeError):
        first.items["i1"] = (0, ())  # type: ignore[index]
    state.seen["i3"] = ["n"]
    del state.seen["i2"]  # as many items as before, other ones
    assert state.marks_write() == MarksWrite({"i2": (None, ()), "i3": (0, ("n",))})
    state.seen["i1"] = ["a", "b"]
    assert state.marks_write() == MarksWrite({"i1": (0, ("b",))})
    assert state.marks_write() is first


def test_marks_write_rewrites_a_list_changed_in_place() -> None:
    state = RunState.from_dict({"seen": {"i1": ["a", "b"]}})
    state.seen["i1"].append("c")  # what the store held is not known from the list
    assert state.marks_write() == MarksWrite({"i1": (None, ("a", "b", "c"))})
    state.seen["i1"] = [*state.seen["i1"], "d"]
    assert state.marks_write() == MarksWrite({"i1": (0, ("d",))})


def test_a_span_without_log_fields_leaves_them_and_ends_the_ones_it_sets() -> None:
    with telemetry.span("turn", {"tether.task_id": "t1"}):
        outer = telemetry.log_fields()
        with telemetry.span("tether.phase.read"):
            assert telemetry.log_fields() is outer  # not set again
        with telemetry.span("tether.phase.act") as phase:
            phase.set_attribute("tether.round", 3)
            phase.set_attribute("tether.round", 4)
            assert dict(telemetry.log_fields()) == {"task_id": "t1", "round": 4}
        assert dict(telemetry.log_fields()) == {"task_id": "t1"}
    assert dict(telemetry.log_fields()) == {}


def _chat() -> None:
    attrs = telemetry.model_call_attributes("act", "openai:gpt-x", "t1")
    with telemetry.span("chat openai:gpt-x", attrs) as call:
        telemetry.set_attributes(call, telemetry.usage_attributes("gpt-x", 10, 3, 0))


def test_metrics_skip_proxies_until_a_provider_is_behind_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens, duration = _Proxy(), _Proxy()
    monkeypatch.setattr(telemetry, "_instruments", (tokens, duration))
    _chat()
    assert tokens.records == [] and duration.records == []  # not even built
    real_tokens, real_duration = _Histogram(), _Histogram()
    tokens._real_instrument, duration._real_instrument = real_tokens, real_duration
    _chat()
    assert [a for a, _ in real_tokens.records] == [10, 3]
    assert len(real_duration.records) == 1
    # Instruments of a provider set before the first call are used as they are.
    plain = _Histogram()
    monkeypatch.setattr(telemetry, "_instruments", (plain, _Histogram()))
    _chat()
    assert [a for a, _ in plain.records] == [10, 3]


@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=10,
    )
)
def test_history_dumps_is_json_dumps(doc: Any) -> None:
    assert history.dumps(doc) == json.dumps(doc, ensure_ascii=False, sort_keys=True)


async def test_a_thread_deadline_times_out_the_await_and_only_its_own_cancellation() -> None:
    import asyncio
    import threading

    from tether.tools._threads import start_sync

    release = threading.Event()

    def stuck(answer: str) -> str:
        release.wait(10)
        return answer

    try:
        assert await start_sync(5, str.upper, "done") == "DONE"
        with pytest.raises(TimeoutError):
            await start_sync(0.01, stuck, "late")
        me = asyncio.current_task()
        assert me is not None and me.cancelling() == 0  # nothing cancelled this task
        # A later call with an earlier deadline is not kept waiting by the one timer
        # set for an earlier call's later deadline; that call still times out.
        slow = start_sync(0.5, stuck, "slow")
        with pytest.raises(TimeoutError):
            await start_sync(0.01, stuck, "fast")
        assert not slow.done()
        with pytest.raises(TimeoutError):
            await slow
        # Another cancellation is not a timeout.
        task = asyncio.ensure_future(asyncio.wait_for(start_sync(5, stuck, "x"), None))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        release.set()
