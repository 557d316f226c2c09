"""Taking over a task whose lease a dead worker of this machine still holds."""

from __future__ import annotations

import logging
import socket
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
