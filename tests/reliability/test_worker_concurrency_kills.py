"""Workers running several tasks at once (`--concurrency 3`), one SIGKILLed at a random
moment while it holds several leases, on SQLite and PostgreSQL: every task still ends
delivered, each run by one holder at a time, and every op reaches the ticket service
once (its idempotency key is the op id).

The moment of the kill is seeded and printed (`TETHER_TEST_SEED=N` reproduces it); it
waits on a condition (the victim holds at least two leases and the service has seen a
number of POSTs), never on a sleep.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from tests.reliability.test_many_workers import (
    BACKENDS,
    all_events,
    check_one_holder_at_a_time,
    db_url,
    statuses,
    ticket_spec,
)
from tests.support.procs import wait_for
from tests.support.services import TicketAPI
from tests.support.workers import Workers, add_tasks, in_store

from tether.store import Store

pytestmark = [pytest.mark.slow]


@pytest.fixture
def api() -> Any:
    service = TicketAPI("--delay", "0.05")
    try:
        yield service
    finally:
        service.close()


@pytest.fixture
def workers(tmp_path: Path) -> Any:
    with closing(Workers(tmp_path)) as w:
        yield w


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_worker_killed_with_several_runs_in_flight_loses_and_repeats_nothing(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    api: TicketAPI,
    workers: Workers,
) -> None:
    seed = int(os.environ.get("TETHER_TEST_SEED") or random.SystemRandom().randrange(10**6))
    print(f"seed={seed} (TETHER_TEST_SEED={seed} reproduces the plan)")
    rng = random.Random(seed)
    url = db_url(kind, tmp_path, request)
    n_tasks = 9
    names = [[f"t{t}a", f"t{t}b", f"t{t}c"] for t in range(n_tasks)]
    tids = add_tasks(url, [ticket_spec(f"task{t}", n) for t, n in enumerate(names)])
    after_posts = rng.randrange(1, 8)
    (victim,) = workers.start(url, 1, "--concurrency", "3", "--lease", "6", TICKETS_URL=api.url)

    def victim_busy() -> Any:
        async def go(store: Store) -> Any:
            mine = [
                t for t in tids if ((await store.get_task(t)).lease_owner or "").endswith(
                    f":{victim.pid}")
            ]  # fmt: skip
            return mine if len(mine) >= 2 else None

        return len(api.stats()["posts"]) >= after_posts and in_store(url, go)

    wait_for(victim_busy, "the victim to hold several leases mid-run", timeout=120)
    victim.kill()
    victim.wait(timeout=30)

    # Every lease the victim held when it died: it may have claimed another task between
    # the look above and the kill (a lease the `--once` workers below could not take yet,
    # so they would end without it).
    async def victims(store: Store) -> list[str]:
        owners = [((await store.get_task(t)).lease_owner or "", t) for t in tids]
        return [t for owner, t in owners if owner.endswith(f":{victim.pid}")]

    held = in_store(url, victims)

    def silent_enough() -> Any:
        # Two renewals missed (two thirds of the lease): the victim's tasks may be taken
        # over at once by a worker of this machine, its pid being gone.
        async def go(store: Store) -> bool:
            for t in held:
                task = await store.get_task(t)
                if task.lease_owner is None:
                    continue
                period = (task.lease_expiry or 0.0) - (task.heartbeat_at or 0.0)
                if time.time() - (task.heartbeat_at or 0.0) < period * 2 / 3:
                    return False
            return True

        return in_store(url, go)

    wait_for(silent_enough, "the victim's leases to miss two renewals")
    procs = workers.start(url, 2, "--once", "--concurrency", "3", "--lease", "6",
                          TICKETS_URL=api.url)  # fmt: skip
    workers.wait(procs, timeout=180)
    assert statuses(url, tids) == [("satisfied", "delivered")] * n_tasks

    evs = all_events(url, tids)
    for tid in tids:
        check_one_holder_at_a_time(tid, evs[tid])
    posts = Counter(p["key"] for p in api.stats()["posts"])
    assert all(n == 1 for n in posts.values()), posts.most_common(3)
    tickets = api.tickets()
    assert sorted(t["title"] for t in tickets) == sorted(i for n in names for i in n)
