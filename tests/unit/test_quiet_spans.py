"""Spans nobody is told of (no listener, no tracer provider, no meter provider) keep
their attributes as given and clean them only if they must be told after all: the log
fields and a model call's metrics come out as the cleaned attributes give them."""

from __future__ import annotations

import pytest
from tests.support.telemetry import Histogram as _Histogram
from tests.support.telemetry import Proxy as _Proxy

from tether import telemetry


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> tuple[_Proxy, _Proxy]:
    monkeypatch.setattr(telemetry, "_tracer", False)
    proxies = (_Proxy(), _Proxy())
    monkeypatch.setattr(telemetry, "_instruments", proxies)
    return proxies


def test_a_quiet_span_sets_the_log_fields_its_cleaned_attributes_give(
    quiet: tuple[_Proxy, _Proxy],
) -> None:
    class Id:
        def __str__(self) -> str:
            return "t9"

    with telemetry.span("tether.round", {"tether.task_id": Id(), "tether.round": None}) as s:
        assert dict(telemetry.log_fields()) == {"task_id": "t9"}
        telemetry.set_attributes(s, {"tether.round": 3, "tether.item": None, "x": object})
        assert dict(telemetry.log_fields()) == {"task_id": "t9", "round": 3}
        telemetry.set_attributes(s, {"tether.round": None})  # None sets nothing
        assert dict(telemetry.log_fields()) == {"task_id": "t9", "round": 3}
    assert dict(telemetry.log_fields()) == {}


def test_a_quiet_model_call_records_its_metrics_if_a_provider_comes_meanwhile(
    quiet: tuple[_Proxy, _Proxy],
) -> None:
    tokens, duration = quiet
    attrs = telemetry.model_call_attributes("act", "openai:gpt-x", "t1")
    with telemetry.span("chat openai:gpt-x", attrs) as call:
        assert dict(telemetry.log_fields()) == {"task_id": "t1"}
        telemetry.set_attributes(call, telemetry.usage_attributes("gpt-x", 10, 3, 0))
        tokens._real_instrument, duration._real_instrument = _Histogram(), _Histogram()
    assert tokens._real_instrument is not None and duration._real_instrument is not None
    recorded = tokens._real_instrument.records
    assert [a for a, _ in recorded] == [10, 3]
    common = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-x",
        "gen_ai.response.model": "gpt-x",
    }
    assert recorded[0][1] == {**common, "gen_ai.token.type": "input"}
    assert len(duration._real_instrument.records) == 1
    assert duration._real_instrument.records[0][1] == common
    # Without a provider, nothing is recorded and nothing is built for it.
    tokens._real_instrument = duration._real_instrument = None
    with telemetry.span("chat openai:gpt-x", attrs) as call:
        telemetry.set_attributes(call, telemetry.usage_attributes("gpt-x", 1, 1, 0))
    assert len(recorded) == 2
