"""Taking a task over from a worker that still looks alive (`tether resume --force`).

A lease that has not expired may belong to a worker that is merely slow, or to one on a
host that is gone. Before forcing it, `confirm_stopped` watches the lease for one full
lease period of its holder (what its last renewal bought; a live tether worker renews
three times in that span), or until it expires unrenewed if that comes first: a
renewal, or another worker claiming the task, ends the watch with a refusal and nothing
is changed. If the holder stayed silent, the takeover is journaled (`audit.warning`
`lease_taken_over`, naming the previous owner) and the caller claims with `force`: the
risen fencing token refuses anything the old holder still tries to write.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

from tether import errors
from tether import events as ev
from tether.clock import Clock, SystemClock
from tether.store.base import Store, TaskRecord

#: The lease period assumed when the holder's cannot be told (no heartbeat recorded).
DEFAULT_PERIOD = 60.0


@dataclass(frozen=True)
class Watched:
    """What watching a lease found before a takeover."""

    #: The worker taken over from; None when no live lease stood in the way.
    previous_owner: str | None
    #: Seconds the lease was watched without a renewal.
    watched: float


def _live(task: TaskRecord, now: float) -> bool:
    return bool(task.lease_owner) and (task.lease_expiry or 0.0) > now


def lease_period(task: TaskRecord) -> float:
    """The holder's lease period: what its last renewal bought (expiry minus the last
    heartbeat, which a renewal sets); at least one second."""
    if task.lease_expiry is None or task.heartbeat_at is None:
        return DEFAULT_PERIOD
    return max(1.0, task.lease_expiry - task.heartbeat_at)


def _renewed(before: TaskRecord, now: TaskRecord) -> bool:
    """Did the holder show life: a renewal (a later expiry) or a commit (a later
    heartbeat)?"""
    return (now.lease_expiry or 0.0) > (before.lease_expiry or 0.0) or (now.heartbeat_at or 0.0) > (
        before.heartbeat_at or 0.0
    )


async def confirm_stopped(
    store: Store,
    task_id: str,
    *,
    clock: Clock | None = None,
    poll: float = 0.2,
    on_watch: Callable[[TaskRecord, float], None] | None = None,
) -> Watched:
    """Watch a live lease on `task_id` for one lease period of its holder before a
    takeover; `UserError` if the holder renews it or another worker claims the task
    meanwhile. Journals the takeover. `on_watch(task, seconds)` is told when a watch
    begins (a CLI prints it)."""
    clock = clock or SystemClock()
    task = await store.get_task(task_id)
    start = clock.now()
    if not _live(task, start):
        return Watched(None, 0.0)
    period = lease_period(task)
    if on_watch is not None:
        on_watch(task, period)
    while True:
        await clock.sleep(max(0.0, min(poll, start + period - clock.now())))
        now = clock.now()
        current = await store.get_task(task_id)
        if current.fencing_token != task.fencing_token:
            raise errors.UserError(
                f"task {task_id} was claimed by {current.lease_owner or 'another worker'} "
                "while its lease was watched; nothing was taken over"
            )
        if not current.lease_owner:
            return Watched(None, now - start)  # given back: nobody to take over from
        if not _live(current, now):
            break  # expired unrenewed: claimable, though it still names its holder
        if _renewed(task, current):
            raise errors.UserError(
                f"task {task_id}: its worker {task.lease_owner!r} renewed the lease "
                f"{now - start:.1f} s into the watch, so it is alive; nothing was taken "
                "over. Stop that worker (or let it finish) and resume again"
            )
        if now - start >= period:
            break
    await store.commit(
        task_id,
        None,
        [
            ev.AuditWarning(
                code="lease_taken_over",
                message=f"{task.lease_owner} did not renew its lease in "
                f"{clock.now() - start:.0f} s of watching; the task is taken over and "
                "that worker's writes will be refused",
                details={
                    "previous_owner": task.lease_owner,
                    "token": task.fencing_token,
                    "watched_seconds": round(clock.now() - start, 3),
                },
            )
        ],
    )
    return Watched(task.lease_owner, clock.now() - start)


def process_id() -> str:
    """This process as `host:pid`: the default worker id, and the form `owner_is_dead`
    reads (lease owners, notice senders)."""
    import os

    return f"{socket.gethostname()}:{os.getpid()}"


def owner_is_dead(owner: str | None) -> bool:
    """True when a lease owner is a process of this machine that no longer exists."""
    if not owner:
        return False
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    import os

    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
