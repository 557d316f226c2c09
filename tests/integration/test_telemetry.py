"""OpenTelemetry spans of a real run, read back with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import by_purpose, honest_actor, rules_judge, run_task, spec_of
from tether import telemetry
from tether.models.scripted import ScriptedModel
from tether.store.memory import MemoryStore


@pytest.fixture(scope="module")
def exporter() -> Iterator[Any]:
    """Finished spans of this process, kept in memory (the provider is global)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory
    memory.shutdown()


async def test_a_run_has_turn_round_phase_model_and_tool_spans(
    exporter: Any, tmp_path: Path
) -> None:
    exporter.clear()
    model = ScriptedModel(policy=by_purpose(act=honest_actor, judge=rules_judge), name="m-1")
    tid, result = await run_task(MemoryStore(), spec_of(2), tmp_path, model, judge=model)
    assert result.status == "satisfied"
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("tether.task_id") == tid]
    everything = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in everything}

    def parent(s: Any) -> Any:
        return by_id[s.parent.span_id] if s.parent is not None else None

    from opentelemetry.trace import SpanKind

    (turn,) = [s for s in spans if s.name == "invoke_agent tether"]
    assert turn.kind == SpanKind.INTERNAL
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.name"] == "tether"
    assert turn.attributes["gen_ai.agent.id"] == tid == turn.attributes["gen_ai.conversation.id"]
    assert len({s.context.trace_id for s in spans}) == 1
    rounds = sorted(
        (s for s in spans if s.name == "tether.round" and "tether.round" in s.attributes),
        key=lambda s: s.attributes["tether.round"],
    )
    assert [(r.attributes["tether.round"], r.attributes["tether.item"]) for r in rounds] == [
        (1, "i1"),
        (2, "i2"),
    ]
    assert all(parent(r) is turn for r in rounds)
    phases = [
        s for s in everything if s.name.startswith("tether.phase.") and parent(s) is rounds[0]
    ]
    assert [p.name for p in phases] == [
        "tether.phase.read",
        "tether.phase.assemble",
        "tether.phase.decide",
        "tether.phase.act",
    ]

    chats = [s for s in spans if s.name == "chat m-1"]
    purposes = [c.attributes["tether.purpose"] for c in chats]
    assert purposes.count("act") == 2 and purposes.count("judge") == 2
    for c in chats:
        assert c.attributes["gen_ai.operation.name"] == "chat"
        assert c.kind == SpanKind.CLIENT and "error.type" not in c.attributes
        assert c.attributes["gen_ai.request.model"] == "m-1"
        assert c.attributes["gen_ai.usage.input_tokens"] > 0
        assert "gen_ai.usage.output_tokens" in c.attributes
        assert "gen_ai.usage.cache_read.input_tokens" in c.attributes
    act_calls = [c for c in chats if c.attributes["tether.purpose"] == "act"]
    assert parent(act_calls[0]).name == "tether.phase.decide"
    assert parent(parent(act_calls[0])) is rounds[0]

    tools = [s for s in spans if s.name == "execute_tool write_file"]
    assert [(t.attributes["tether.op_id"], t.attributes["tether.round"]) for t in tools] == [
        (f"{tid}.r1.c0", 1),
        (f"{tid}.r2.c0", 2),
    ]
    assert all(t.attributes["gen_ai.tool.name"] == "write_file" for t in tools)
    assert all(t.kind == SpanKind.INTERNAL for t in tools)
    assert [t.attributes["gen_ai.tool.call.id"] for t in tools] == [f"{tid}.r1.c0", f"{tid}.r2.c0"]
    assert parent(tools[1]).name == "tether.phase.act" and parent(parent(tools[1])) is rounds[1]


async def test_without_opentelemetry_spans_are_no_ops(
    monkeypatch: pytest.MonkeyPatch, exporter: Any, tmp_path: Path
) -> None:
    # As if opentelemetry-api were not installed: the run works and records nothing.
    monkeypatch.setattr(telemetry, "_tracer", False)
    exporter.clear()
    _, result = await run_task(
        MemoryStore(), spec_of(1), tmp_path, ScriptedModel(policy=honest_actor)
    )
    assert result.status == "satisfied"
    assert exporter.get_finished_spans() == ()
    with telemetry.span("x", {"a": 1}) as s:
        s.set_attribute("b", 2)


async def test_a_round_that_stops_is_not_an_error_but_a_failure_is(
    exporter: Any, tmp_path: Path
) -> None:
    """A model the provider refuses ends the round waiting for a human: the model call's
    span is an error (with the exception recorded), the round's span is not — it carries
    how the round stopped."""
    from opentelemetry.trace import StatusCode

    from tether import errors

    def refused(_: Any) -> Any:
        raise errors.ModelError("401: bad key", transient=False)

    exporter.clear()
    model = ScriptedModel(policy=refused, name="m-2")
    tid, result = await run_task(
        MemoryStore(), spec_of(1, models={"judge": "rules"}), tmp_path, model
    )
    assert result.status == "waiting"
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("tether.task_id") == tid]
    (chat,) = [s for s in spans if s.name == "chat m-2"]
    assert chat.status.status_code == StatusCode.ERROR and "bad key" in str(chat.status.description)
    assert any(e.name == "exception" for e in chat.events)
    assert chat.attributes["error.type"] == "tether.errors.ModelError"
    (round_,) = [s for s in spans if s.name == "tether.round"]
    assert round_.status.status_code != StatusCode.ERROR
    assert round_.attributes["tether.stopped"] == "waiting"
    assert not any(e.name == "exception" for e in round_.events)


@pytest.fixture
def metric_reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The GenAI histograms recorded into an in-memory reader of a meter provider of this
    test's own (the global one can be set only once per process)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(
        telemetry, "_instruments", telemetry.make_instruments(provider.get_meter("tether"))
    )
    yield reader
    provider.shutdown()


def _points(reader: Any, name: str) -> tuple[str, list[Any]]:
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    return metric.unit, list(metric.data.data_points)
    raise AssertionError(f"no metric {name}")


async def test_model_names_lose_tether_s_prefix_and_calls_are_measured(
    exporter: Any, metric_reader: Any, tmp_path: Path
) -> None:
    exporter.clear()
    model = ScriptedModel(
        policy=by_purpose(act=honest_actor, judge=rules_judge), name="openai:gpt-4.1-mini"
    )
    tid, result = await run_task(MemoryStore(), spec_of(1), tmp_path, model, judge=model)
    assert result.status == "satisfied"
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("tether.task_id") == tid]
    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert chats and {c.name for c in chats} == {"chat gpt-4.1-mini"}
    for c in chats:
        assert c.attributes["gen_ai.provider.name"] == "openai"
        assert c.attributes["gen_ai.request.model"] == "gpt-4.1-mini"
        assert c.attributes["gen_ai.response.model"] == "gpt-4.1-mini"

    unit, tokens = _points(metric_reader, "gen_ai.client.token.usage")
    assert unit == "{token}"
    by_type: dict[str, int] = {}
    for p in tokens:
        assert p.attributes["gen_ai.operation.name"] == "chat"
        assert p.attributes["gen_ai.provider.name"] == "openai"
        assert p.attributes["gen_ai.request.model"] == "gpt-4.1-mini"
        kind = p.attributes["gen_ai.token.type"]
        by_type[kind] = by_type.get(kind, 0) + p.sum
        assert p.count == len(chats)
    assert by_type == {
        "input": sum(c.attributes["gen_ai.usage.input_tokens"] for c in chats),
        "output": sum(c.attributes["gen_ai.usage.output_tokens"] for c in chats),
    }
    assert by_type["input"] > 0
    unit, durations = _points(metric_reader, "gen_ai.client.operation.duration")
    assert unit == "s"
    assert sum(p.count for p in durations) == len(chats)
    assert all("error.type" not in p.attributes for p in durations)


async def test_without_a_tracer_provider_no_span_is_built_yet_calls_are_measured(
    monkeypatch: pytest.MonkeyPatch, exporter: Any, metric_reader: Any, tmp_path: Path
) -> None:
    """A host that configured no tracer provider gets only non-recording spans from
    OpenTelemetry: tether builds none (they cost more than a round's own work), while the
    listeners still see every span and the GenAI metrics, which follow a meter provider
    of their own, are still recorded."""
    from opentelemetry import trace

    assert telemetry._get_tracer()  # installed: the tracer and its provider check are set
    monkeypatch.setattr(
        telemetry,
        "_no_provider",
        (trace.ProxyTracerProvider, telemetry._unset_providers(trace)),
    )
    ended: list[str] = []

    class Listener:
        def span_started(self, name: str, attributes: Any) -> None:
            pass

        def span_ended(self, name: str, attributes: Any, seconds: float, error: Any) -> None:
            ended.append(name)

    remove = telemetry.add_listener(Listener())
    exporter.clear()
    try:
        model = ScriptedModel(policy=honest_actor, name="openai:gpt-4.1-mini")
        _, result = await run_task(MemoryStore(), spec_of(1), tmp_path, model)
    finally:
        remove()
    assert result.status == "satisfied"
    assert exporter.get_finished_spans() == ()
    chats = [n for n in ended if n.startswith("chat ")]
    assert chats and "tether.round" in ended
    # A listener is told of a round's phases too (they are left out only for nobody).
    phases = ("read", "assemble", "decide", "act")
    assert {f"tether.phase.{p}" for p in phases} <= set(ended)
    _, durations = _points(metric_reader, "gen_ai.client.operation.duration")
    assert sum(p.count for p in durations) == len(chats)


async def test_a_failed_call_s_duration_carries_its_error_type(
    exporter: Any, metric_reader: Any, tmp_path: Path
) -> None:
    from tether import errors

    def refused(_: Any) -> Any:
        raise errors.ModelError("401: bad key", transient=False)

    model = ScriptedModel(policy=refused, name="anthropic:claude-sonnet-4-5")
    await run_task(MemoryStore(), spec_of(1, models={"judge": "rules"}), tmp_path, model)
    _, durations = _points(metric_reader, "gen_ai.client.operation.duration")
    (point,) = durations
    assert point.attributes["error.type"] == "tether.errors.ModelError"
    assert point.attributes["gen_ai.provider.name"] == "anthropic"
    assert point.attributes["gen_ai.request.model"] == "claude-sonnet-4-5"
    # No usage came back: no token counts are made up.
    with pytest.raises(AssertionError, match="no metric"):
        _points(metric_reader, "gen_ai.client.token.usage")


def test_tether_model_names_split_into_provider_and_model() -> None:
    assert telemetry.split_model("openai:gpt-5.2") == ("openai", "gpt-5.2", None)
    assert telemetry.split_model("deepseek:deepseek-chat") == (
        "deepseek",
        "deepseek-chat",
        None,
    )
    assert telemetry.split_model("openai-compatible:http://10.0.0.5:8000/v1#qwen3-8b") == (
        "openai-compatible",
        "qwen3-8b",
        "10.0.0.5",
    )
    assert telemetry.split_model("scripted:demo.json")[0] == "tether.scripted"
    assert telemetry.split_model("m-1") == (None, "m-1", None)
