"""Nobody waits in silence, nothing dies in silence: the notifier and the watchdog.

`sweep` runs from every worker between tasks (and from `tether watch`):

- A task **waiting for a person** (an approval, a decision, a human's answer) gets a
  notice as soon as it is seen waiting, a reminder every `renotify_after` (6 h by
  default), and after `escalate_after` (24 h) it is suspended and an administrator is
  told. Each notice is a `notice.sent` event, and its time is kept in the task's
  `waiting` document. Many workers may sweep the same database: each notice is claimed
  first through the store's shared state (one atomic update per task and kind of
  notice), so it is sent once.
- A task still `running` whose lease expired and whose heartbeat is older than
  `stalled_after` lost its worker: it is marked `stalled` with an alert, and any worker
  may take it over (stalled tasks are claimable; recovery runs as after any crash).

Notices go to a `Notifier`: the log by default, a webhook when `TETHER_WEBHOOK_URL`
names one (a JSON POST, sent with the standard library so the core needs no HTTP
dependency).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tether import errors
from tether import events as ev
from tether.clock import Clock, SystemClock
from tether.store.base import Store, TaskPatch, TaskRecord

log = logging.getLogger("tether.watch")

#: Waiting kinds a person must answer.
HUMAN_KINDS = frozenset({"approval", "decision", "human"})
WEBHOOK_ENV = "TETHER_WEBHOOK_URL"
WEBHOOK_SECRET_ENV = "TETHER_WEBHOOK_SECRET"


@dataclass(frozen=True)
class Notice:
    """One message to the people responsible for a task."""

    task_id: str
    kind: str  # waiting | reminder | escalation | stalled
    text: str
    details: Mapping[str, Any] = field(default_factory=dict)
    #: The same for every delivery attempt of this notice: receivers drop repeats.
    notice_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the webhook's body)."""
        return {
            "id": self.notice_id,
            "task_id": self.task_id,
            "kind": self.kind,
            "text": self.text,
            **self.details,
        }


class Notifier(Protocol):
    """Where notices go."""

    async def notify(self, notice: Notice) -> str:
        """Deliver one notice; returns the channel's name (for the journal)."""
        ...


class LogNotifier:
    """Notices as warnings in the log."""

    async def notify(self, notice: Notice) -> str:
        log.warning("task %s: %s: %s", notice.task_id, notice.kind, notice.text)
        return "log"


class WebhookNotifier:
    """Notices POSTed as JSON to a URL, retried a few times with backoff; a delivery that
    still fails is logged and journaled, never raised (the next reminder tries again).

    Each request carries `X-Tether-Notice` (the notice id, the same on every retry, so a
    receiver drops repeats) and, when a secret is set (`TETHER_WEBHOOK_SECRET`),
    `X-Tether-Signature: sha256=<hex>`, the HMAC-SHA256 of the body with that secret."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        secret: str | None = None,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise errors.UserError(f"{WEBHOOK_ENV} must be an http(s) URL, not {url[:80]!r}")
        self.url = url
        self.timeout = timeout
        self.secret = secret
        self.attempts = max(1, attempts)
        self.backoff = backoff

    def _post(self, body: bytes, notice_id: str) -> None:
        headers = {"Content-Type": "application/json", "X-Tether-Notice": notice_id}
        if self.secret:
            digest = hmac.new(self.secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
            headers["X-Tether-Signature"] = f"sha256={digest}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            exc.close()  # an error response holds its connection open otherwise
            raise OSError(f"HTTP {exc.code} {exc.reason}") from None

    async def notify(self, notice: Notice) -> str:
        body = json.dumps(notice.to_dict(), ensure_ascii=False).encode("utf-8")
        error: Exception | None = None
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                await asyncio.to_thread(self._post, body, notice.notice_id)
                return "webhook"
            except Exception as exc:  # best effort: the event says it was tried
                error = exc
        log.warning("webhook %s failed for task %s: %s", self.url, notice.task_id, error)
        return f"webhook (failed: {type(error).__name__})"


def default_notifier() -> Notifier:
    """The webhook in `TETHER_WEBHOOK_URL`, else the log."""
    url = os.environ.get(WEBHOOK_ENV, "").strip()
    secret = os.environ.get(WEBHOOK_SECRET_ENV) or None
    return WebhookNotifier(url, secret=secret) if url else LogNotifier()


@dataclass(frozen=True)
class WatchPolicy:
    """When to remind, escalate, and call a silent task stalled (seconds)."""

    renotify_after: float = 6 * 3600.0
    escalate_after: float = 24 * 3600.0
    stalled_after: float = 300.0


@dataclass
class SweepReport:
    """What one sweep did, by task id."""

    notified: list[str] = field(default_factory=list)
    reminded: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)


async def sweep(
    store: Store,
    *,
    notifier: Notifier | None = None,
    policy: WatchPolicy | None = None,
    clock: Clock | None = None,
) -> SweepReport:
    """One pass over the tasks that wait for a person or went silent."""
    notifier = notifier or default_notifier()
    policy = policy or WatchPolicy()
    now = (clock or getattr(store, "clock", None) or SystemClock()).now()
    report = SweepReport()
    for task in await store.list_tasks({"waiting"}, limit=10_000):
        try:
            await _waiting(store, task, now, notifier, policy, report)
        except (errors.ConcurrentUpdate, errors.IllegalTransition, errors.StaleLease):
            continue  # the task moved meanwhile (a decision, a worker): next sweep
    for task in await store.list_tasks({"running"}, limit=10_000):
        try:
            await _silent(store, task, now, notifier, policy, report)
        except (errors.ConcurrentUpdate, errors.IllegalTransition, errors.StaleLease):
            continue
    return report


async def _waiting(
    store: Store,
    task: TaskRecord,
    now: float,
    notifier: Notifier,
    policy: WatchPolicy,
    report: SweepReport,
) -> None:
    waiting = dict(task.waiting or {})
    if waiting.get("kind") not in HUMAN_KINDS:
        return
    since = float(waiting.get("since") or task.updated_at)
    notices: Sequence[float] = waiting.get("notices") or []
    reason = str(waiting.get("reason", ""))[:500]
    if now - since >= policy.escalate_after:
        if not await _claim(store, task.task_id, since, policy.escalate_after, "escalate"):
            return
        hours = (now - since) / 3600
        text = f"waited {hours:.0f} h for a person ({waiting.get('kind')}): {reason}"
        notice = Notice(
            task.task_id,
            "escalation",
            text,
            {"waiting": waiting.get("kind")},
            notice_id=f"{task.task_id}:escalation:{since:.3f}",
        )
        channel = await notifier.notify(notice)
        await store.commit(
            task.task_id,
            None,
            [
                ev.NoticeSent(kind="escalation", channel=channel, text=text),
                ev.TaskStatusChanged(
                    src="waiting", dst="suspended", reason="no answer: escalated to an admin"
                ),
            ],
            task=TaskPatch(
                status="suspended",
                waiting={**waiting, "since": since, "escalated_at": now},
                wake_at=None,
            ),
        )
        report.escalated.append(task.task_id)
        return
    last = max(notices) if notices else None
    if last is not None and now - last < policy.renotify_after:
        return
    if not await _claim(store, task.task_id, since, policy.renotify_after):
        return  # another worker sends this one
    kind = "waiting" if last is None else "reminder"
    notice = Notice(
        task.task_id,
        kind,
        reason,
        {"waiting": waiting.get("kind")},
        notice_id=f"{task.task_id}:{kind}:{since:.3f}:{len(notices)}",
    )
    channel = await notifier.notify(notice)
    await store.commit(
        task.task_id,
        None,
        [ev.NoticeSent(kind=kind, channel=channel, text=reason)],
        task=TaskPatch(waiting={**waiting, "since": since, "notices": [*notices, now][-20:]}),
    )
    (report.notified if last is None else report.reminded).append(task.task_id)


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
    notifier: Notifier,
    policy: WatchPolicy,
    report: SweepReport,
) -> None:
    lease_over = task.lease_expiry is None or task.lease_expiry <= now
    beat = task.heartbeat_at or task.updated_at
    if not lease_over or now - beat < policy.stalled_after:
        return
    text = (
        f"no heartbeat for {now - beat:.0f} s from {task.lease_owner or 'its worker'}; "
        "marked stalled, any worker may take it over"
    )
    channel = await notifier.notify(
        Notice(task.task_id, "stalled", text, notice_id=f"{task.task_id}:stalled:{beat:.3f}")
    )
    await store.commit(
        task.task_id,
        None,
        [
            ev.NoticeSent(kind="stalled", channel=channel, text=text),
            ev.TaskStatusChanged(src="running", dst="stalled", reason=text),
        ],
        task=TaskPatch(status="stalled"),
    )
    report.stalled.append(task.task_id)
