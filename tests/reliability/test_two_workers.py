"""Workers sharing one PostgreSQL database against one ticket API: the service's shared
concurrency limit and circuit breaker hold across processes.

The workers are real `tether worker --once` processes; the tasks are created in the
test's own store handle on the same schema. The ticket API (its own process) counts
what it saw: the most requests in flight at once, and every POST with its
Idempotency-Key (the op id) and arrival time.

- Concurrency: several tasks, each filing tickets against a service that takes 0.25 s
  per request, run by more workers than the contract's `max_concurrency` allows calls.
  The service never sees more requests in flight than the limit, and sees exactly the
  limit (it was reached); some call was made to wait for a slot (the time from its
  journaled intent to its arrival at the service); every task completes with exactly
  one ticket per item, and no slot is left taken in the shared state.
- Breaker: the service fails everything. Worker A's op fails its 3 attempts, which
  opens the breaker. Then the service heals, so that only the breaker can keep calls
  away from it. Worker B, a different process started afterwards, finds the breaker
  open in the database: its calls are refused fast with A's cooldown end, it opens
  nothing itself, and none of its requests reach the service during the cooldown.
  After the cooldown one call is the half-open probe and closes the breaker.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from tests.services.flaky_tools import MAX_ATTEMPTS, SERVICE, TOOL_NAME
from tests.support.services import TicketAPI
from tests.support.workers import Workers, add_tasks, in_store

from tether.spec import parse_spec
from tether.store import Store
from tether.tools.breaker import ServiceGuard

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

DELAY = 0.25
REFUSED = re.compile(
    rf"^service {SERVICE} is unavailable until \d+: breaker open, cooling down until ([0-9.]+)"
)


def spec_of(name: str, items: list[str], services: dict[str, Any]) -> Any:
    return parse_spec(
        {
            "name": name,
            "objective": f"file tickets {', '.join(items)}",
            "items": [
                {"id": i, "title": f"ticket {i}",
                 "done_when": {"kind": "op", "tool": TOOL_NAME, "args": {"title": i}}}
                for i in items
            ],
            "tools": [TOOL_NAME],
            "models": {"judge": "rules"},
            "services": services,
        }
    )  # fmt: skip


def events(url: str, task_id: str) -> list[Any]:
    async def go(store: Store) -> list[Any]:
        return list(await store.read_events(task_id))

    return in_store(url, go)


def of_type(evs: list[Any], type_: str) -> list[dict[str, Any]]:
    return [e.data for e in evs if e.type == type_]


def start_once(
    workers: Workers, url: str, api: TicketAPI, n: int = 1
) -> list[subprocess.Popen[bytes]]:
    """`n` `tether worker --once` on `url` calling `api`. Waits for an open breaker
    longer than 0.5 s park the task (`waiting` until the breaker's next chance)
    instead of sleeping in the worker."""
    return workers.start(url, n, "--once", TICKETS_URL=api.url, TETHER_INLINE_WAIT_MAX="0.5")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with closing(Workers(tmp_path)) as w:
        yield w


@pytest.fixture
def slow_api() -> Iterator[TicketAPI]:
    """The ticket API taking DELAY seconds per POST."""
    service = TicketAPI("--delay", str(DELAY))
    try:
        yield service
    finally:
        service.close()


@pytest.fixture
def failing_api() -> Iterator[TicketAPI]:
    """The ticket API answering 503 to every POST."""
    with TicketAPI("--fail-rate", "1.0") as service:
        yield service


# ---------------------------------------------------------------- concurrency limit


@pytest.mark.parametrize(
    ("n_workers", "limit"), [(2, 1), (3, 2)], ids=["2workers-limit1", "3workers-limit2"]
)
def test_concurrency_limit_holds_across_workers(
    n_workers: int,
    limit: int,
    pg_url: str,
    slow_api: TicketAPI,
    workers: Workers,
) -> None:
    n_tasks, n_items = n_workers + 1, 3
    services = {SERVICE: {"max_concurrency": limit}}
    names = [[f"k{t}i{i}" for i in range(1, n_items + 1)] for t in range(1, n_tasks + 1)]
    tids = add_tasks(pg_url, [spec_of(f"task{t}", items, services) for t, items in
                              enumerate(names, 1)])  # fmt: skip
    procs = start_once(workers, pg_url, slow_api, n_workers)
    workers.wait(procs, timeout=90)

    # Every task completed, one ticket per item, each from an op tether says succeeded.
    async def statuses(store: Store) -> list[tuple[str, str | None]]:
        return [((t := await store.get_task(tid)).status, t.stop_reason) for tid in tids]

    assert in_store(pg_url, statuses) == [("satisfied", "delivered")] * n_tasks
    tickets = slow_api.tickets()
    assert slow_api.stats()["created"] == len(tickets) == n_tasks * n_items
    assert sorted(t["title"] for t in tickets) == sorted(i for items in names for i in items)
    evs = {tid: events(pg_url, tid) for tid in tids}
    ok = [
        d["op_id"]
        for tid in tids
        for d in of_type(evs[tid], "op.result")
        if d["status"] == "succeeded"
    ]
    assert sorted(t["key"] for t in tickets) == sorted(ok)

    # More than one worker process did the work.
    owners = {d["worker_id"] for tid in tids for d in of_type(evs[tid], "lease.claimed")}
    pids = {int(o.rsplit(":", 1)[1]) for o in owners}
    assert pids <= {p.pid for p in procs} and len(pids) >= 2, owners

    # The service never had more requests in flight than the limit, and had that many.
    stats = slow_api.stats()
    assert stats["max_concurrent"] <= limit, stats["max_concurrent"]
    assert stats["max_concurrent"] == limit, "the limit was never reached"
    # Contended: some call waited for a slot between its journaled intent and its arrival.
    intended = {e.data["op_id"]: e.at for tid in tids for e in evs[tid] if e.type == "op.intended"}
    waited = [p["at"] - intended[p["key"]] for p in stats["posts"]]
    assert max(waited) >= DELAY / 2, f"no call ever waited for a slot: {sorted(waited)[-3:]}"

    # One POST per op (nothing failed, nothing was sent twice).
    assert all(n == 1 for n in Counter(p["key"] for p in stats["posts"]).values())

    # No slot left taken in the shared state.
    async def shared(store: Store) -> dict[str, Any]:
        return await ServiceGuard(store).state(SERVICE)

    assert in_store(pg_url, shared)["slots"] == {}


# ---------------------------------------------------------------- shared breaker


@pytest.mark.timeout(300)  # a 30 s cooldown waited out, and three workers' runs
def test_breaker_opened_by_one_worker_is_seen_by_another(
    pg_url: str,
    failing_api: TicketAPI,
    workers: Workers,
) -> None:
    # Long enough for worker A to end and worker B to start, be refused and exit inside
    # it on a loaded machine: with 12 s, at load 20, B's task was claimed again after
    # the cooldown and its half-open probe reached the service (a post this test
    # takes for one made during the cooldown).
    cooldown = 30.0
    services = {
        SERVICE: {
            "failure_rate": 0.5,
            "min_calls": MAX_ATTEMPTS,
            "cooldown_seconds": cooldown,
            "window_seconds": 60,
        }
    }

    # Worker A: its op fails MAX_ATTEMPTS times (503), which opens the breaker.
    (ta,) = add_tasks(pg_url, [spec_of("A", ["a1"], services)])
    workers.wait(start_once(workers, pg_url, failing_api), timeout=90)
    ev_a = events(pg_url, ta)
    assert [(d["src"], d["dst"]) for d in of_type(ev_a, "breaker.changed")] == [("closed", "open")]
    posts = failing_api.stats()["posts"]
    first_op = f"{ta}.r1.c0"
    assert [(p["key"], p["attempt"], p["outcome"]) for p in posts] == [
        (first_op, str(n), "unavailable") for n in range(1, MAX_ATTEMPTS + 1)
    ]
    a_until = {
        float(m.group(1))
        for d in of_type(ev_a, "op.result")
        if (m := REFUSED.match(d["error"] or ""))
    }
    assert len(a_until) == 1, "A's later calls were refused by the breaker it opened"
    (until,) = a_until
    assert posts[-1]["at"] < until - cooldown + 1  # opened by A's last failure

    async def shared(store: Store) -> dict[str, Any]:
        return await ServiceGuard(store).state(SERVICE)

    doc = in_store(pg_url, shared)
    assert doc["state"] == "open" and doc["until"] == pytest.approx(until, abs=1e-3)
    until = float(doc["until"])

    # The service heals: from now on a call that reaches it succeeds, so only the
    # breaker can keep worker B's calls away from it.
    failing_api.faults(fail_rate=0.0)

    # Worker B, another process: the breaker it finds in the database is A's.
    (tb,) = add_tasks(pg_url, [spec_of("B", ["b1"], services)])
    workers.wait(start_once(workers, pg_url, failing_api), timeout=90)
    ev_b = events(pg_url, tb)
    errors_b = [
        d["error"] or "" for t in ("op.result", "op.retry_scheduled") for d in of_type(ev_b, t)
    ]
    refused_b = [float(m.group(1)) for e in errors_b if (m := REFUSED.match(e))]
    assert refused_b, f"B's calls were not refused: {errors_b}"
    assert refused_b == pytest.approx([until] * len(refused_b), abs=1e-3)  # A's cooldown
    assert ("closed", "open") not in [
        (d["src"], d["dst"]) for d in of_type(ev_b, "breaker.changed")
    ]
    # None of B's calls reached the service during the cooldown: B's task is parked
    # until the breaker's next chance instead of spending its item's attempts.
    posts_b = [p for p in failing_api.stats()["posts"] if p["key"].startswith(f"{tb}.")]
    assert posts_b == []

    def task_state(tid: str) -> tuple[str, Any, Any]:
        async def get(store: Store) -> tuple[str, Any, Any]:
            t = await store.get_task(tid)
            return t.status, t.wake_at, t.waiting

        return in_store(pg_url, get)

    status_b, wake_b, waiting_b = task_state(tb)
    assert status_b == "waiting" and waiting_b["kind"] == "external"
    assert wake_b == pytest.approx(until, abs=1e-3)

    # After the cooldown, workers pick the parked tasks up again; the first call is the
    # half-open probe, it succeeds and closes the breaker, and every item gets done.
    time.sleep(max(0.0, until - time.time() + 0.1))
    (tc,) = add_tasks(pg_url, [spec_of("C", ["c1"], services)])
    workers.wait(start_once(workers, pg_url, failing_api), timeout=90)
    ev_all = [events(pg_url, t) for t in (ta, tb, tc)]
    changes = sorted(
        (d for evs in ev_all for d in of_type(evs, "breaker.changed")),
        key=lambda d: ("closed", "open", "half_open").index(d["src"]),
    )
    assert sorted((d["src"], d["dst"]) for d in changes) == sorted(
        [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    )
    titles = sorted(t["title"] for t in failing_api.tickets())
    assert titles == ["a1", "b1", "c1"], titles
    for tid in (ta, tb, tc):
        assert task_state(tid)[0] == "satisfied"
    assert in_store(pg_url, shared)["state"] == "closed"
