"""`tether.metrics`: a worker's own counters (fed by the runtime's spans, no query at a
scrape), the database's figures in a fixed number of queries, and `/readyz`'s check."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tests.support.loop import honest_actor, spec_of
from tether import errors, telemetry
from tether.clock import FakeClock
from tether.metrics import (
    LIMIT,
    ClusterCollector,
    ProcessMetrics,
    cluster_snapshot,
    readiness,
    render,
)
from tether.models.scripted import ScriptedModel
from tether.runtime.engine import ModelSet
from tether.runtime.tasks import create_task
from tether.runtime.worker import Worker
from tether.store import SCHEMA_VERSION, Store
from tether.store.memory import MemoryStore

LIMIT_S = 60.0


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text body, by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }


@pytest.fixture
def process() -> Any:
    metrics = ProcessMetrics("host:1", registry=CollectorRegistry())
    stop = metrics.install()
    yield metrics
    stop()


def value(metrics: ProcessMetrics, name: str, **labels: str) -> float:
    return samples(render(metrics.registry)).get(
        (name, tuple(sorted({"worker": "host:1", **labels}.items()))), 0.0
    )


# --- a worker's own figures -------------------------------------------------------------


def test_spans_feed_the_counters(process: ProcessMetrics) -> None:
    with telemetry.span(telemetry.AGENT_SPAN, telemetry.agent_attributes("t1")):
        assert value(process, "tether_worker_tasks_in_flight") == 1
        with telemetry.span("tether.round", {"tether.task_id": "t1"}) as rnd:
            telemetry.set_attributes(rnd, {"tether.round": 1})
            attrs = telemetry.model_call_attributes("act", "openai:gpt-x", "t1")
            with telemetry.span("chat openai:gpt-x", attrs) as call:
                telemetry.set_attributes(call, telemetry.usage_attributes("gpt-x", 10, 3, 4))
            with (
                pytest.raises(OSError),
                telemetry.span(
                    "execute_tool fetch", telemetry.tool_call_attributes("fetch", "op1", "t1", 1)
                ),
            ):
                raise OSError("reset")
        # A round that found nothing to do (no round number) is no round.
        with telemetry.span("tether.round", {"tether.task_id": "t1"}):
            pass
    with telemetry.span(telemetry.CLAIM_SPAN):
        pass
    process.finished("satisfied")

    assert value(process, "tether_worker_tasks_in_flight") == 0
    assert value(process, "tether_worker_turns_total") == 1
    assert value(process, "tether_worker_rounds_total") == 1
    assert value(process, "tether_worker_model_calls_total", purpose="act") == 1
    assert value(process, "tether_worker_tokens_total", kind="input") == 10
    assert value(process, "tether_worker_tokens_total", kind="output") == 3
    assert value(process, "tether_worker_tokens_total", kind="cached") == 4
    assert value(process, "tether_worker_tool_calls_total", tool="fetch") == 1
    assert value(process, "tether_worker_failures_total", kind="tool", error_type="OSError") == 1
    assert value(process, "tether_worker_claim_seconds_count") == 1
    assert value(process, "tether_worker_task_runs_total", status="satisfied") == 1


def test_a_listener_removed_hears_nothing(process: ProcessMetrics) -> None:
    other = ProcessMetrics("host:2", registry=CollectorRegistry())
    other.install()()  # installed, then removed at once
    with telemetry.span(telemetry.CLAIM_SPAN):
        pass
    assert value(process, "tether_worker_claim_seconds_count") == 1
    assert samples(render(other.registry))[("tether_worker_claim_seconds_count",
                                            (("worker", "host:2"),))] == 0  # fmt: skip


async def test_a_real_worker_counts_what_its_tasks_recorded(
    tmp_path: Path, process: ProcessMetrics
) -> None:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    ids = []
    for n in range(2):
        (tmp_path / f"ws{n}").mkdir()
        ids.append((await create_task(store, spec_of(2), workspace=tmp_path / f"ws{n}")).task_id)
        clock.advance(1)
    models = ModelSet(actor=ScriptedModel(policy=honest_actor))
    w = Worker(store, models, worker_id="host:1", once=True, clock=clock, on_result=None)
    stats = await asyncio.wait_for(w.run(), LIMIT_S)
    assert stats.ran == 2
    used = [(await store.get_task(t)).usage for t in ids]
    assert value(process, "tether_worker_rounds_total") == sum(u["rounds"] for u in used) > 0
    assert value(process, "tether_worker_model_calls_total", purpose="act") == sum(
        u["model_calls"] for u in used
    )
    assert value(process, "tether_worker_tool_calls_total", tool="write_file") >= 4
    # Two tasks, and the claim that found nothing.
    assert value(process, "tether_worker_claim_seconds_count") == 3
    assert value(process, "tether_worker_tasks_in_flight") == 0


# --- the database's figures -------------------------------------------------------------


class Counting:
    """A store that counts the calls made to it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()
        self.clock = store.clock

    def __getattr__(self, name: str) -> Any:
        self.calls[name] += 1
        return getattr(self.store, name)


async def test_a_scrape_makes_the_same_few_queries_however_many_tasks(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    services = {"services": {"tickets": {"failure_rate": 0.5}}}
    made = []

    async def scrape() -> tuple[Counter[str], Any]:
        counting = Counting(store)
        snap = await cluster_snapshot(counting)  # type: ignore[arg-type]
        return counting.calls, snap

    for n in range(60):
        made.append(await create_task(store, spec_of(1, **services if n % 2 else {})))
        if n == 4:
            few, snap = await scrape()
            assert snap.by_status["queued"] == 5
    many, snap = await scrape()
    assert many == few == Counter({"list_tasks": 2, "get_shared": 1})
    assert snap.by_status["queued"] == 60
    assert LIMIT >= 60


async def test_the_cluster_figures(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    spec = spec_of(1, services={"tickets": {"failure_rate": 0.5}})
    await create_task(store, spec)
    clock.advance(30)
    await store.update_shared("service:tickets", lambda doc, now: ({"state": "open"}, None))
    got = samples(render(ClusterCollector.fixed(await cluster_snapshot(store))))
    assert got[("tether_tasks", (("status", "queued"),))] == 1
    assert got[("tether_tasks", (("status", "satisfied"),))] == 0
    assert got[("tether_oldest_queued_seconds", ())] == 30
    assert got[("tether_breaker_open", (("service", "tickets"),))] == 1


# --- readiness ----------------------------------------------------------------------------


class Schema:
    """A store whose `schema_version` answers `answer` (a value, or raises it)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def schema_version(self) -> int:
        if isinstance(self.answer, asyncio.Event):
            await self.answer.wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return int(self.answer)


async def test_ready_only_on_a_reachable_database_of_the_current_schema() -> None:
    store = await MemoryStore.open()
    ok = await readiness(store)
    assert ok.ready and ok.to_dict() == {
        "status": "ready",
        "schema": SCHEMA_VERSION,
        "schema_needed": SCHEMA_VERSION,
    }
    old = await readiness(Schema(SCHEMA_VERSION - 1))  # type: ignore[arg-type]
    assert not old.ready and f"schema {SCHEMA_VERSION - 1}" in old.reason
    assert old.to_dict()["status"] == "unavailable"
    down = await readiness(Schema(errors.StoreUnavailable("no route to host")))  # type: ignore[arg-type]
    assert not down.ready and "no route to host" in down.reason
    stuck = await readiness(Schema(asyncio.Event()), timeout=0.05)  # type: ignore[arg-type]
    assert not stuck.ready and "did not answer" in stuck.reason


def test_a_database_away_leaves_the_processs_own_figures(process: ProcessMetrics) -> None:
    def away() -> Any:
        raise errors.StoreUnavailable("connection refused")

    process.registry.register(ClusterCollector(away))
    got = samples(render(process.registry))
    assert ("tether_worker_rounds_total", (("worker", "host:1"),)) in got
    assert not [name for name, _ in got if name.startswith("tether_tasks")]
