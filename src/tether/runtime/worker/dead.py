"""Taking over a task whose lease a dead worker of this machine still holds."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Collection

from tether import errors
from tether.runtime.takeover import lease_period, owner_is_dead
from tether.store.base import Lease, Store

log = logging.getLogger("tether.worker")


async def take_from_dead(
    store: Store, worker_id: str, lease_ttl: float, passing: Collection[str]
) -> tuple[Lease, str] | None:
    """Take over a task whose lease a dead process of this machine still holds,
    instead of leaving it until the lease expires (a minute by default): the new lease
    and the dead owner, or None.

    Only a same-host owner whose pid is gone counts (`owner_is_dead`; a silent owner
    elsewhere may be merely slow), and only once it missed two renewals (silent
    for two thirds of its lease period; a live worker renews every third): the pid
    is no proof where processes that share a host name do not share pids
    (containers on the host's network), and a worker renewing its lease is alive
    whatever its pid says. Only the lease found dead is taken (`from_token`, checked
    in the claim's own transaction): a worker that took the task in between keeps it.
    Tasks in `passing` are left alone. A failure is logged; the task then waits for
    its lease to expire, as before."""
    try:
        held = await store.live_leases(f"{socket.gethostname()}:")
        for dead in held:
            if dead.worker_id == worker_id or dead.task_id in passing:
                continue
            if not owner_is_dead(dead.worker_id):
                continue
            task = await store.get_task(dead.task_id)
            silent = store.clock.now() - (task.heartbeat_at or 0.0)
            if task.fencing_token != dead.token or silent < lease_period(task) * 2 / 3:
                continue
            lease = await store.claim(
                worker_id, lease_ttl, task_id=dead.task_id, force=True, from_token=dead.token
            )
            if lease is not None:
                log.warning(
                    "task %s: its worker %s is dead (silent %.0f s); taken over "
                    "without waiting for its lease to expire",
                    dead.task_id,
                    dead.worker_id,
                    silent,
                )
                return lease, dead.worker_id
    except errors.TetherError as exc:
        log.warning("worker %s: looking for dead owners' tasks failed: %s", worker_id, exc)
    return None


#: The fewest seconds between two looks for a dead owner's task (`DeadOwners`).
DEAD_SCAN_EVERY = 1.0


class DeadOwners:
    """`take_from_dead` for a worker, at most once every `every` seconds: the look lists
    every live lease of this host (the worker's own runs' too), and a worker with an
    empty queue looked at each run's end (64 looks in a wave's last second at
    concurrency 64). A dead owner's task waits out two thirds of its lease period
    anyway: a second more changes little."""

    def __init__(
        self, store: Store, worker_id: str, lease_ttl: float, every: float = DEAD_SCAN_EVERY
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.every = every
        self.last: float | None = None

    async def take(self, passing: Collection[str]) -> tuple[Lease, str] | None:
        """`take_from_dead` (tasks in `passing` left alone), or None without a look when
        the last was too recent."""
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every:
            return None
        self.last = now
        return await take_from_dead(self.store, self.worker_id, self.lease_ttl, passing)
