"""Nobody waits in silence, nothing dies in silence: the notifier and the watchdog.

`sweep` runs from every worker between tasks:

- **Notices.** Every journal event people must hear of (an approval requested, an op
  in doubt, a decision needed, a NEED_HELP question, a budget mark of 50, 80 or 100 %,
  a task stalled, failed or finished) is sent once, with an id receivers use to drop
  repeats (`runtime.notices`), to the installation's notifier and the contract's
  `notify.targets` (`runtime.notify`).
- A task **waiting for a person** (an approval, a decision, a human's answer) is
  reminded every `renotify_after` (6 h by default, or the contract's
  `notify.renotify_after`), and after `suspend_after` (24 h, or
  `notify.suspend_after`) it is suspended and the administrators (`notify.admin`) are
  told. Each notice is a `notice.sent` event. Many workers may sweep the same database:
  each reminder is claimed first through the store's shared state (one atomic update
  per task and kind of notice), so it is sent once.
- A stop the contract ends (`on_budget_exhausted`, `on_unanswered`: `fail` after a
  deadline, see `runtime.watch.stops`) is ended `failed` once the deadline has passed,
  before it would be reminded or escalated; the failure is announced like any other.
- A task still `running` whose lease expired and whose heartbeat is older than
  `limits.stall_after` (or the worker's `stalled_after`, 10 min) lost its worker: it is
  marked `stalled` (and announced), and any worker may take it over (stalled tasks are
  claimable; recovery runs as after any crash).

Time comes from the store's clock (or `clock`): tests move it by hours in no time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether import errors, lifecycle
from tether import events as ev
from tether.clock import Clock
from tether.runtime.watch import notices as nt
from tether.runtime.watch.sinks import (
    WEBHOOK_ENV,
    WEBHOOK_SECRET_ENV,
    Fanout,
    LogNotifier,
    Notice,
    Notifier,
    WebhookNotifier,
    default_notifier,
    for_task,
)
from tether.runtime.watch.stops import HUMAN_KINDS, contract_of, end_stop
from tether.spec import NotifyConfig
from tether.store.base import Store, TaskPatch, TaskRecord

__all__ = [
    "HUMAN_KINDS",
    "WEBHOOK_ENV",
    "WEBHOOK_SECRET_ENV",
    "Fanout",
    "LogNotifier",
    "Notice",
    "Notifier",
    "SweepReport",
    "WatchPolicy",
    "WebhookNotifier",
    "after_run",
    "default_notifier",
    "sweep",
]

log = logging.getLogger("tether.watch")

#: The lease a sweep holds while it marks a task stalled (the mark is two writes).
_MARK_TTL = 30.0
_MOVED = (errors.ConcurrentUpdate, errors.IllegalTransition, errors.StaleLease)


@dataclass(frozen=True)
class WatchPolicy:
    """The installation's defaults for reminding, suspending and calling a silent task
    stalled (seconds); a contract's `notify` block overrides the first two."""

    renotify_after: float = 6 * 3600.0
    escalate_after: float = 24 * 3600.0
    stalled_after: float = 600.0


@dataclass
class SweepReport:
    """What one sweep did, by task id."""

    notified: list[str] = field(default_factory=list)
    reminded: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    #: Tasks cancelled because their worker went away before it saw the request.
    cancelled: list[str] = field(default_factory=list)
    #: Tasks ended `failed` by their contract's `on_budget_exhausted` / `on_unanswered`.
    failed: list[str] = field(default_factory=list)
    #: Every notice sent, as (task id, kind).
    notices: list[tuple[str, str]] = field(default_factory=list)


def _notify_config(task: TaskRecord) -> NotifyConfig | None:
    """The contract's `notify` block."""
    contract = contract_of(task)
    return contract.notify if contract else None


async def sweep(
    store: Store,
    *,
    notifier: Notifier | None = None,
    policy: WatchPolicy | None = None,
    clock: Clock | None = None,
) -> SweepReport:
    """One pass: mark silent tasks stalled, remind and escalate waits for a person, and
    send the notices of new journal events. `notifier` is the installation's (default:
    `TETHER_WEBHOOK_URL`, else the log); each task's contract may add targets."""
    base = notifier or default_notifier()
    policy = policy or WatchPolicy()
    now = (clock or store.clock).now()
    report = SweepReport()
    # Running tasks that went silent; any task whose cancel its worker never saw.
    for task in await store.list_tasks(lifecycle.ACTIVE, limit=10_000):
        try:
            await _silent(store, task, now, policy, report)
        except _MOVED:
            continue  # the task moved meanwhile (a decision, a worker): next sweep
    # Stops whose contract ends them, before they are reminded or escalated.
    for task in await store.list_tasks({"waiting", "suspended"}, limit=10_000):
        try:
            if await end_stop(store, task, now, escalate_after=policy.escalate_after):
                report.failed.append(task.task_id)
        except _MOVED:
            continue
    for task in await store.list_tasks({"waiting"}, limit=10_000):
        try:
            await _waiting(store, task, now, base, policy, report)
        except _MOVED:
            continue
    active = await store.list_tasks(lifecycle.ACTIVE, limit=10_000)
    ended = await store.list_tasks(lifecycle.TERMINAL, limit=1_000)
    for task in [*active, *ended]:
        if lifecycle.is_terminal(task.status) and now - task.updated_at > nt.FIRST_SIGHT_MAX_AGE:
            continue  # announced long ago (or before notices existed)
        try:
            sent = await nt.announce(store, task, for_task(base, _notify_config(task)), now)
        except _MOVED:
            continue
        for notice in sent:
            report.notices.append((task.task_id, notice.kind))
            if notice.kind != "finished":
                report.notified.append(task.task_id)
    return report


async def _waiting(
    store: Store,
    task: TaskRecord,
    now: float,
    base: Notifier,
    policy: WatchPolicy,
    report: SweepReport,
) -> None:
    waiting = dict(task.waiting or {})
    if waiting.get("kind") not in HUMAN_KINDS:
        return
    config = _notify_config(task)
    renotify = (config.renotify_after if config else None) or policy.renotify_after
    suspend = (config.suspend_after if config else None) or policy.escalate_after
    if "since" not in waiting:
        # Pin when the wait began: later commits (notices) move `updated_at`.
        await store.commit(
            task.task_id, None, [], task=TaskPatch(waiting={**waiting, "since": task.updated_at})
        )
        waiting["since"] = task.updated_at
    since = float(waiting["since"])
    notices: Sequence[float] = waiting.get("notices") or []
    reason = str(waiting.get("reason", ""))[:500]
    if now - since >= suspend:
        await _escalate(store, task, waiting, now, for_task(base, config, admin=True), report)
        return
    last = max(notices) if notices else since
    if now - last < renotify:
        return
    if not await _claim(store, task.task_id, since, renotify):
        return  # another worker sends this one
    notice = _wait_notice(task.task_id, "reminder", reason, waiting, f":{len(notices)}")
    channel = await for_task(base, config).notify(notice)
    await store.commit(
        task.task_id,
        None,
        [ev.NoticeSent(kind="reminder", channel=channel, text=reason)],
        task=TaskPatch(waiting={**waiting, "notices": [*notices, now][-20:]}),
    )
    report.reminded.append(task.task_id)
    report.notices.append((task.task_id, "reminder"))


def _wait_notice(
    task_id: str, kind: str, text: str, waiting: dict[str, Any], more_id: str = ""
) -> Notice:
    """A notice about a task's wait (a reminder, an escalation): its data and its id name
    the wait (its kind, since when), so a notice resent after a crash is the same one."""
    since = float(waiting["since"])
    return Notice(
        task_id,
        kind,
        text,
        {"waiting": waiting.get("kind"), "since": since},
        notice_id=f"{task_id}:{kind}:{since:.3f}{more_id}",
    )


async def _escalate(
    store: Store,
    task: TaskRecord,
    waiting: dict[str, Any],
    now: float,
    notifier: Notifier,
    report: SweepReport,
) -> None:
    """Nobody answered for too long: suspend the task and tell the administrators."""
    since = float(waiting["since"])
    if not await _claim(store, task.task_id, since, float("inf"), "escalate"):
        return
    hours = (now - since) / 3600
    reason = str(waiting.get("reason", ""))[:500]
    text = f"waited {hours:.0f} h for a person ({waiting.get('kind')}): {reason}"
    notice = _wait_notice(task.task_id, "escalation", text, waiting)
    channel = await notifier.notify(notice)
    change, patch = lifecycle.transition(
        task,
        "suspended",
        "no answer: escalated to an admin",
        waiting={**waiting, "escalated_at": now},
    )
    await store.commit(
        task.task_id,
        None,
        [ev.NoticeSent(kind="escalation", channel=channel, text=text), change],
        task=TaskPatch(**patch),
    )
    report.escalated.append(task.task_id)
    report.notices.append((task.task_id, "escalation"))


async def _claim(
    store: Store, task_id: str, since: float, every: float, what: str = "notice"
) -> bool:
    """True for the one sweeper that may send this notice now (an atomic update of the
    task's shared watch document: the last time each kind of notice was claimed for the
    current wait)."""

    def take(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any] | None, bool]:
        state = dict(doc or {})
        if state.get("since") != since:
            state = {"since": since}  # a new wait: nothing was sent for it yet
        last = state.get(what)
        if last is not None and now - float(last) < every:
            return state, False
        state[what] = now
        return state, True

    return await store.update_shared(f"watch:{task_id}", take)


async def _silent(
    store: Store,
    task: TaskRecord,
    now: float,
    policy: WatchPolicy,
    report: SweepReport,
) -> None:
    lease_over = task.lease_expiry is None or task.lease_expiry <= now
    beat = task.heartbeat_at or task.updated_at
    if not lease_over:
        return
    if task.cancel_requested:
        # Its worker went away before it saw the request, and a task someone asked to
        # cancel is never claimed: cancelled here, as `tether cancel` does a task
        # nobody runs.
        change, patch = lifecycle.transition(
            task,
            "cancelled",
            "cancelled: its worker stopped before it saw the request",
            stop_reason="cancelled_by_user",
            wake_at=lifecycle.KEEP,
        )
        done = report.cancelled
    else:
        if task.status != "running":
            return
        contract = contract_of(task)
        limit = (contract.limits.stall_after if contract else None) or policy.stalled_after
        if now - beat < limit:
            return
        text = (
            f"no heartbeat for {now - beat:.0f} s from {task.lease_owner or 'its worker'}; "
            "marked stalled, any worker may take it over"
        )
        change, patch = lifecycle.transition(
            task, "stalled", text, waiting=lifecycle.KEEP, wake_at=lifecycle.KEEP
        )
        done = report.stalled
    # Every worker sweeps: the mark is made under a lease of its own, taken only if the
    # task's token is still the one read above (no worker ran it, no other sweep
    # marked it since), so the task is marked once and never while someone runs it.
    # The holder is this process, in the form `owner_is_dead` reads: a sweep that dies
    # here leaves a lease the workers of this host take over before it expires.
    sweeper = f"{socket.gethostname()}:{os.getpid()}"
    lease = await store.claim(sweeper, _MARK_TTL, task_id=task.task_id)
    if lease is None:
        return  # a worker, or another sweep, holds it now
    try:
        if lease.token != task.fencing_token + 1:
            return
        # The status change is announced from the journal, like every other.
        await store.commit(task.task_id, lease.token, [change], task=TaskPatch(**patch))
    finally:
        with contextlib.suppress(errors.TetherError):
            await store.release(task.task_id, lease.token)
    done.append(task.task_id)


async def after_run(
    store: Store,
    task_id: str,
    *,
    notifier: Notifier | None = None,
    policy: WatchPolicy | None = None,
    clock: Clock | None = None,
) -> list[Notice]:
    """What a foreground run (`tether run`, `tether resume`) does when it stops, with no
    worker around: end a stop its contract ends now (`fail` with no deadline left),
    then send the notices of the task's journal — once: the same cursor as the sweep's
    moves past them, so a worker that sweeps later does not send them again. Returns
    the notices sent."""
    policy = policy or WatchPolicy()
    now = (clock or store.clock).now()
    task = await store.get_task(task_id)
    contract = contract_of(task)
    with contextlib.suppress(*_MOVED):
        if await end_stop(store, task, now, escalate_after=policy.escalate_after):
            task = await store.get_task(task_id)
    config = contract.notify if contract else None
    return await nt.announce(store, task, for_task(notifier or default_notifier(), config), now)
