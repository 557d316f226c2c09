"""Taking a task over from a worker that still looks alive (`tether resume --force`).

A lease whose owner is provably gone — a process of this machine that no longer exists,
or a lease that expired unrenewed — needs no watch: `take_from_gone` takes it at once
for the commands that need the task (edit, cancel, pause, tell), and `owner_gone` is
what `status` shows as "running (owner gone)".

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

import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass

from tether import errors, failpoints, lifecycle
from tether.clock import Clock, SystemClock
from tether.store.base import Store, TaskPatch, TaskRecord

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
    from tether import events as ev

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


def owner_gone(task: TaskRecord, now: float) -> str | None:
    """Why a `running` task's owner is provably gone — its lease expired (by the store's
    clock `now`) or was given up, or its process on this machine no longer exists — or
    None (not running, or a live owner)."""
    if task.status != "running":
        return None
    if not task.lease_owner or task.lease_expiry is None:
        return "no worker holds its lease"
    if task.lease_expiry <= now:
        return f"the lease of {task.lease_owner} expired"
    if owner_is_dead(task.lease_owner):
        return f"process {task.lease_owner} is gone"
    return None


async def take_from_gone(store: Store, task_id: str, *, by: str = "user") -> TaskRecord:
    """The task, taken from an owner that is provably gone (`owner_gone`) first: the
    lease claimed by force from the token seen (the old holder's later writes are
    refused), the takeover journaled (`audit.warning` `lease_taken_over`) with the
    task moved to `stalled` (a worker or `resume` goes on from there), and the lease
    given back. A task with a live owner, or not running, is returned as it is."""
    from tether import events as ev  # here: reading a task's status needs no event models

    task = await store.get_task(task_id)
    why = owner_gone(task, store.clock.now())
    if why is None:
        return task
    lease = await store.claim(
        process_id(), DEFAULT_PERIOD, task_id=task_id, force=True, from_token=task.fencing_token
    )
    if lease is None:  # another worker took it meanwhile: it is that worker's now
        return await store.get_task(task_id)
    try:
        change, patch = lifecycle.transition(
            task,
            "stalled",
            f"{why}; taken over by {by}",
            waiting=lifecycle.KEEP,
            wake_at=lifecycle.KEEP,
        )
        warning = ev.AuditWarning(
            code="lease_taken_over",
            message=f"{why}; the task is taken over by {by} and that worker's writes will "
            "be refused",
            details={"previous_owner": task.lease_owner, "token": task.fencing_token},
        )
        failpoints.hit("before_takeover_commit")
        await store.commit(task_id, lease.token, [warning, change], task=TaskPatch(**patch))
    finally:
        with contextlib.suppress(errors.StaleLease):
            await store.release(task_id, lease.token)
    return await store.get_task(task_id)
