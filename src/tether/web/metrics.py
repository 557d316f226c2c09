"""`/metrics`: Prometheus text, read from the store at each scrape.

Tasks by status, and summed over the tasks (the newest `LIMIT`): rounds, model calls,
tokens by kind, money, failed tool calls by error class and model call failures,
pending approvals and how long decided ones waited, and each service's breaker as its
last `breaker.changed` event left it. Counters come from the tasks' own bookkeeping
and event logs, so they are the same whichever server or worker is asked; a scrape
sees the database, not one process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from starlette.requests import Request

from tether import lifecycle
from tether.runtime.run.state import RunState
from tether.store.base import Store
from tether.web.deps import state_of

router = APIRouter(include_in_schema=False)
#: The newest tasks a scrape sums over.
LIMIT = 1000
_BREAKER_VALUE = {"open": 1.0, "half_open": 0.5, "closed": 0.0}
ALL_STATUSES = lifecycle.STATUSES


@dataclass
class Snapshot:
    """What one scrape found."""

    by_status: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    model_calls: int = 0
    tokens: Counter[str] = field(default_factory=Counter)
    cost_usd: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)
    pending_approvals: int = 0
    approval_waits: list[float] = field(default_factory=list)
    #: service -> (seq-ordered time of the change, state it moved to).
    breakers: dict[str, tuple[float, str]] = field(default_factory=dict)


async def snapshot(store: Store) -> Snapshot:
    """Read the numbers of the newest tasks."""
    snap = Snapshot()
    for t in await store.list_tasks(limit=LIMIT):
        snap.by_status[t.status] += 1
        st = RunState.from_dict(t.usage)
        snap.rounds += st.rounds
        snap.model_calls += st.model_calls
        snap.tokens["input"] += st.input_tokens
        snap.tokens["output"] += st.output_tokens
        snap.tokens["cached"] += st.cached_tokens
        snap.cost_usd += st.cost_usd
        await _events(store, t.task_id, snap)
        for a in await store.get_approvals(t.task_id):
            if a.status == "pending":
                snap.pending_approvals += 1
            elif a.status != "closed" and a.decided_at is not None:
                # A closed request was never decided: its wait is not a person's.
                snap.approval_waits.append(max(0.0, a.decided_at - a.created_at))
    return snap


async def _events(store: Store, task_id: str, snap: Snapshot) -> None:
    types = {"op.result", "model.failed", "breaker.changed"}
    for e in await store.read_events(task_id, types=types):
        if e.type == "model.failed":
            snap.failures["model_transient" if e.data.get("transient") else "model_error"] += 1
        elif e.type == "breaker.changed":
            service = str(e.data.get("service"))
            if service not in snap.breakers or snap.breakers[service][0] <= e.at:
                snap.breakers[service] = (e.at, str(e.data.get("dst")))
        elif e.data.get("status") != "succeeded":
            snap.failures[str(e.data.get("error_class") or e.data.get("status"))] += 1


class _Collector:
    """Hands one snapshot to prometheus_client's exposition."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        s = self.snap
        tasks = GaugeMetricFamily("tether_tasks", "Tasks by status.", labels=["status"])
        for status in sorted(set(ALL_STATUSES) | set(s.by_status)):
            tasks.add_metric([status], s.by_status.get(status, 0))
        yield tasks
        yield CounterMetricFamily("tether_rounds", "Rounds run.", value=s.rounds)
        yield CounterMetricFamily("tether_model_calls", "Model calls made.", value=s.model_calls)
        tokens = CounterMetricFamily("tether_tokens", "Model tokens by kind.", labels=["kind"])
        for kind in ("input", "output", "cached"):
            tokens.add_metric([kind], s.tokens.get(kind, 0))
        yield tokens
        yield CounterMetricFamily("tether_cost_usd", "Money spent on models.", value=s.cost_usd)
        fails = CounterMetricFamily(
            "tether_failures", "Failed tool and model calls by class.", labels=["class"]
        )
        for cls, n in sorted(s.failures.items()):
            fails.add_metric([cls], n)
        yield fails
        yield GaugeMetricFamily(
            "tether_pending_approvals", "Approval requests waiting.", value=s.pending_approvals
        )
        yield SummaryMetricFamily(
            "tether_approval_wait_seconds",
            "How long decided approval requests waited for a person.",
            count_value=len(s.approval_waits),
            sum_value=sum(s.approval_waits),
        )
        breakers = GaugeMetricFamily(
            "tether_breaker_open",
            "1 when a service's breaker was last seen open (0 closed, 0.5 half-open).",
            labels=["service"],
        )
        for service, (_, state) in sorted(s.breakers.items()):
            breakers.add_metric([service], _BREAKER_VALUE.get(state, 0.0))
        yield breakers


def render(snap: Snapshot) -> bytes:
    """The Prometheus text exposition of `snap`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(snap))
    return generate_latest(registry)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics of the database."""
    store, _ = state_of(request)
    return Response(render(await snapshot(store)), media_type=CONTENT_TYPE_LATEST)
