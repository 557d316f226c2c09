"""Prometheus metrics and health, for a worker's endpoint and the dashboard's.

Two kinds of figures, exported so that a sum over the scraped processes is right:

- **A process's own** (`ProcessMetrics`): what this worker did since it started —
  turns, rounds, model calls and tokens, tool calls, failures, tasks finished, claim
  latency, turns in flight — counted in memory as the runtime's spans end (see
  `telemetry.add_listener`), labelled with the worker's id. A scrape reads no database.
- **The database's** (`ClusterCollector`): tasks by status and by what they wait for,
  how long the oldest queued task has waited, the usage of the newest tasks, each
  contract service's breaker. Exported by the dashboard's `/metrics` and by one worker
  started with `--cluster-metrics`, never by every worker. A scrape makes a fixed
  number of queries: two task listings (at most `LIMIT` each) and one read per
  distinct service the listed contracts name (at most `MAX_SERVICES`).

`readiness(store)` is what `/readyz` answers: the database answers and its schema is
the one this tether writes. `prometheus_client` (extras `metrics`, `web`, `otel`) is
imported where it is used.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether import errors, lifecycle, telemetry
from tether.runtime.run.state import RunState
from tether.store.base import SCHEMA_VERSION, Store

log = logging.getLogger("tether.metrics")

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

#: The most tasks each of a cluster scrape's two listings reads (active, finished).
LIMIT = 1000
#: The most services whose breaker a cluster scrape reads.
MAX_SERVICES = 100
#: Seconds `/readyz` waits for the database.
READY_TIMEOUT = 5.0
#: The content type of the Prometheus text exposition.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: A claim's latency buckets, in seconds (a claim is one short transaction).
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BREAKER_VALUE = {"open": 1.0, "half_open": 0.5, "closed": 0.0}
ACTIVE = tuple(s for s in lifecycle.STATUSES if not lifecycle.is_terminal(s))
FINISHED = tuple(s for s in lifecycle.STATUSES if lifecycle.is_terminal(s))


# --- health ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Readiness:
    """What `/readyz` answers: ready, or why not."""

    ready: bool
    reason: str = ""
    schema: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON body of `/readyz`."""
        doc: dict[str, Any] = {"status": "ready" if self.ready else "unavailable"}
        if self.reason:
            doc["reason"] = self.reason
        doc["schema"] = self.schema
        doc["schema_needed"] = SCHEMA_VERSION
        return doc


async def readiness(store: Store, timeout: float = READY_TIMEOUT) -> Readiness:
    """Ready when the database answers within `timeout` seconds and its schema is the
    one this tether writes (`SCHEMA_VERSION`)."""
    try:
        schema = await asyncio.wait_for(store.schema_version(), timeout)
    except TimeoutError:
        return Readiness(False, f"the database did not answer within {timeout:g} s")
    except (errors.TetherError, OSError) as exc:
        return Readiness(False, f"the database is unavailable: {exc}")
    if schema != SCHEMA_VERSION:
        return Readiness(
            False,
            f"the database has schema {schema}, this tether needs {SCHEMA_VERSION}",
            schema,
        )
    return Readiness(True, schema=schema)


# --- a process's own figures ------------------------------------------------------------


class ProcessMetrics:
    """A worker process's counters, kept up to date by the runtime's spans.

    `install()` starts listening (`telemetry.add_listener`) and returns the call that
    stops; `finished(status)` counts a task run that ended (the worker's `on_result`)."""

    def __init__(self, worker_id: str, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            gc_collector,
            platform_collector,
            process_collector,
        )

        self.registry = registry or CollectorRegistry(auto_describe=True)
        if registry is None:
            process_collector.ProcessCollector(registry=self.registry)
            platform_collector.PlatformCollector(registry=self.registry)
            gc_collector.GCCollector(registry=self.registry)
        self.worker_id = worker_id
        reg = self.registry
        w = ["worker"]
        self.in_flight = Gauge(
            "tether_worker_tasks_in_flight", "Turns of tasks running in this worker now.", w,
            registry=reg,
        )  # fmt: skip
        self.turns = Counter("tether_worker_turns", "Turns started.", w, registry=reg)
        self.rounds = Counter("tether_worker_rounds", "Rounds run.", w, registry=reg)
        self.model_calls = Counter(
            "tether_worker_model_calls", "Model calls, by purpose.", [*w, "purpose"], registry=reg
        )
        self.tokens = Counter(
            "tether_worker_tokens", "Model tokens, by kind.", [*w, "kind"], registry=reg
        )
        self.tool_calls = Counter(
            "tether_worker_tool_calls", "Tool call attempts, by tool.", [*w, "tool"], registry=reg
        )
        self.failures = Counter(
            "tether_worker_failures",
            "Model and tool calls that raised, by kind and error type.",
            [*w, "kind", "error_type"],
            registry=reg,
        )
        self.finished_runs = Counter(
            "tether_worker_task_runs",
            "Task runs that ended here, by the status they left.",
            [*w, "status"],
            registry=reg,
        )
        self.claims = Histogram(
            "tether_worker_claim_seconds",
            "How long one claim of a task took (found one or not).",
            w,
            buckets=CLAIM_BUCKETS,
            registry=reg,
        )
        # Every series exists from the start at 0 (rate() needs a first sample).
        for metric in (self.in_flight, self.turns, self.rounds, self.claims):
            metric.labels(worker_id)
        for kind in ("input", "output", "cached"):
            self.tokens.labels(worker_id, kind)

    def install(self) -> Any:
        """Listen to the runtime's spans; returns the call that stops listening."""
        return telemetry.add_listener(self)

    def finished(self, status: str) -> None:
        """A task run ended here, leaving the task `status`."""
        self.finished_runs.labels(self.worker_id, status).inc()

    def span_started(self, name: str, attributes: Mapping[str, Any]) -> None:
        """A turn starts: one more in flight."""
        if name == telemetry.AGENT_SPAN:
            self.in_flight.labels(self.worker_id).inc()
            self.turns.labels(self.worker_id).inc()

    def span_ended(
        self, name: str, attributes: Mapping[str, Any], seconds: float, error: str | None
    ) -> None:
        """Count what the span was."""
        w = self.worker_id
        operation = attributes.get("gen_ai.operation.name")
        if name == telemetry.AGENT_SPAN:
            self.in_flight.labels(w).dec()
        elif name == telemetry.CLAIM_SPAN:
            self.claims.labels(w).observe(seconds)
        elif name == "tether.round" and "tether.round" in attributes:
            self.rounds.labels(w).inc()  # a round that began (not one found nothing to do)
        elif operation == "chat":
            self.model_calls.labels(w, str(attributes.get("tether.purpose", ""))).inc()
            for kind, key in (
                ("input", "gen_ai.usage.input_tokens"),
                ("output", "gen_ai.usage.output_tokens"),
                ("cached", "gen_ai.usage.cache_read.input_tokens"),
            ):
                count = attributes.get(key)
                if isinstance(count, int) and count > 0:
                    self.tokens.labels(w, kind).inc(count)
            if error:
                self.failures.labels(w, "model", error).inc()
        elif operation == "execute_tool":
            self.tool_calls.labels(w, str(attributes.get("gen_ai.tool.name", ""))).inc()
            if error:
                self.failures.labels(w, "tool", error).inc()


# --- the database's figures -------------------------------------------------------------


@dataclass
class ClusterSnapshot:
    """What one cluster scrape found."""

    by_status: Counter[str] = field(default_factory=Counter)
    waiting: Counter[str] = field(default_factory=Counter)
    oldest_queued: float = 0.0
    rounds: int = 0
    model_calls: int = 0
    tokens: Counter[str] = field(default_factory=Counter)
    cost_usd: float = 0.0
    #: service -> the state its breaker is in (`closed`, `open`, `half_open`).
    breakers: dict[str, str] = field(default_factory=dict)


async def cluster_snapshot(store: Store) -> ClusterSnapshot:
    """The database's figures, in a fixed number of queries (see the module)."""
    from tether.tools.breaker import service_key

    snap = ClusterSnapshot()
    now = store.clock.now()
    services: set[str] = set()
    tasks = [
        *await store.list_tasks(ACTIVE, limit=LIMIT),
        *await store.list_tasks(FINISHED, limit=LIMIT),
    ]
    for t in tasks:
        snap.by_status[t.status] += 1
        if t.status == "waiting":
            snap.waiting[str((t.waiting or {}).get("kind") or "unknown")] += 1
        if t.status == "queued":
            snap.oldest_queued = max(snap.oldest_queued, now - t.updated_at)
        st = RunState.from_dict(t.usage)
        snap.rounds += st.rounds
        snap.model_calls += st.model_calls
        snap.tokens["input"] += st.input_tokens
        snap.tokens["output"] += st.output_tokens
        snap.tokens["cached"] += st.cached_tokens
        snap.cost_usd += st.cost_usd
        named = t.spec.get("services")
        if isinstance(named, Mapping):
            services.update(str(s) for s in named)
    for service in sorted(services)[:MAX_SERVICES]:
        doc = await store.get_shared(service_key(service))
        if doc is not None:
            snap.breakers[service] = str(doc.get("state", "closed"))
    return snap


class ClusterCollector:
    """The database's figures at each scrape, for a `CollectorRegistry`.

    `read()` returns a snapshot; in a worker it runs the query on the worker's event
    loop (`blocking_reader`), in the dashboard the route takes one first (`fixed`). A
    read that fails is logged and exports nothing: the other collectors of the registry
    (a worker's own figures) still answer."""

    def __init__(self, read: Any) -> None:
        self.read = read

    @staticmethod
    def fixed(snap: ClusterSnapshot) -> ClusterCollector:
        """A collector of one snapshot taken already."""
        return ClusterCollector(lambda: snap)

    def describe(self) -> list[Metric]:
        """Nothing at registration: a registry would otherwise collect (query) then."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The metric families of one snapshot."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            s: ClusterSnapshot = self.read()
        except Exception as exc:  # the database away: the process's own figures still go out
            log.warning("the database's figures could not be read: %s", exc)
            return
        tasks = GaugeMetricFamily("tether_tasks", "Tasks by status.", labels=["status"])
        for status in sorted(set(lifecycle.STATUSES) | set(s.by_status)):
            tasks.add_metric([status], s.by_status.get(status, 0))
        yield tasks
        waiting = GaugeMetricFamily(
            "tether_tasks_waiting", "Waiting tasks by what they wait for.", labels=["kind"]
        )
        for kind, n in sorted(s.waiting.items()):
            waiting.add_metric([kind], n)
        yield waiting
        yield GaugeMetricFamily(
            "tether_oldest_queued_seconds",
            "How long the oldest queued task has waited for a worker (0: none queued).",
            value=s.oldest_queued,
        )
        yield CounterMetricFamily("tether_rounds", "Rounds run by the tasks.", value=s.rounds)
        yield CounterMetricFamily(
            "tether_model_calls", "Model calls made by the tasks.", value=s.model_calls
        )
        tokens = CounterMetricFamily("tether_tokens", "Model tokens by kind.", labels=["kind"])
        for kind in ("input", "output", "cached"):
            tokens.add_metric([kind], s.tokens.get(kind, 0))
        yield tokens
        yield CounterMetricFamily("tether_cost_usd", "Money spent on models.", value=s.cost_usd)
        breakers = GaugeMetricFamily(
            "tether_breaker_open",
            "1 when a service's breaker is open (0 closed, 0.5 half-open).",
            labels=["service"],
        )
        for service, state in sorted(s.breakers.items()):
            breakers.add_metric([service], _BREAKER_VALUE.get(state, 0.0))
        yield breakers


def blocking_reader(store: Store, loop: asyncio.AbstractEventLoop, timeout: float = 30.0) -> Any:
    """A `ClusterCollector` reader for another thread: takes the snapshot on `loop`."""

    def read() -> ClusterSnapshot:
        future = asyncio.run_coroutine_threadsafe(cluster_snapshot(store), loop)
        return future.result(timeout)

    return read


def render(*collectors: Any) -> bytes:
    """The Prometheus text exposition of `collectors`."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    return generate_latest(registry)
