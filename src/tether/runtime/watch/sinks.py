"""Where notices go: the log, webhooks, and the mix a task's contract asks for.

A `Notice` is one message to the people responsible for a task, with an id that stays
the same on every delivery attempt (receivers drop repeats). The installation's
notifier comes from the environment (`TETHER_WEBHOOK_URL`, `TETHER_WEBHOOK_SECRET`;
the log without them); a contract's `notify:` block adds its own targets and its
`admin` targets for escalations (`for_task`). Webhooks are sent with the standard
library so that the core needs no HTTP dependency.
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
from typing import TYPE_CHECKING, Any, Protocol

from tether import errors

if TYPE_CHECKING:
    from tether.spec import NotifyConfig, NotifyTarget

log = logging.getLogger("tether.watch")

WEBHOOK_ENV = "TETHER_WEBHOOK_URL"
WEBHOOK_SECRET_ENV = "TETHER_WEBHOOK_SECRET"


@dataclass(frozen=True)
class Notice:
    """One message to the people responsible for a task.

    `kind`: `approval_requested`, `op_in_doubt`, `decision_needed`, `need_help`,
    `limit_reached` (`max_rounds` or `max_rounds_per_milestone`), `budget`, `stalled`,
    `failed`, `finished` (one per journal event), `reminder`
    (a wait goes on) or `escalation` (a wait went on too long; the task is suspended).
    """

    task_id: str
    kind: str
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
        """Log the notice."""
        log.warning("task %s: %s: %s", notice.task_id, notice.kind, notice.text)
        return "log"


class WebhookNotifier:
    """Notices POSTed as JSON to a URL, retried a few times with backoff; a delivery that
    still fails is logged and journaled, never raised (a reminder tries again).

    Each request carries `X-Tether-Notice` (the notice id, the same on every retry, so a
    receiver drops repeats) and, when a secret is set, `X-Tether-Signature:
    sha256=<hex>`, the HMAC-SHA256 of the body with that secret."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        secret: str | None = None,
        attempts: int = 3,
        backoff: float = 0.5,
        name: str = "webhook",
    ) -> None:
        from tether._validation import http_url_problem

        problem = http_url_problem(url)
        if problem:
            shown = url if len(url) <= 80 else url[:77] + "..."
            raise errors.UserError(f"the webhook {shown!r} {problem}")
        self.url = url
        self.timeout = timeout
        self.secret = secret
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.name = name

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
        """POST the notice; the channel's name says whether it arrived."""
        body = json.dumps(notice.to_dict(), ensure_ascii=False).encode("utf-8")
        error: Exception | None = None
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                await asyncio.to_thread(self._post, body, notice.notice_id)
                return self.name
            except Exception as exc:  # best effort: the event says it was tried
                error = exc
        log.warning("webhook %s failed for task %s: %s", self.url, notice.task_id, error)
        return f"{self.name} (failed: {type(error).__name__})"


class Fanout:
    """Several notifiers, each given every notice (one failing stops none of the
    others); the channel names are joined."""

    def __init__(self, notifiers: Sequence[Notifier]) -> None:
        self.notifiers = list(notifiers)

    async def notify(self, notice: Notice) -> str:
        """Deliver to every notifier."""
        channels = [await n.notify(notice) for n in self.notifiers]
        return ", ".join(channels)


def default_notifier() -> Notifier:
    """The installation's notifier: the webhook in `TETHER_WEBHOOK_URL` (signed with
    `TETHER_WEBHOOK_SECRET` when set), else the log."""
    url = os.environ.get(WEBHOOK_ENV, "").strip()
    secret = os.environ.get(WEBHOOK_SECRET_ENV) or None
    return WebhookNotifier(url, secret=secret) if url else LogNotifier()


def _target(target: NotifyTarget) -> Notifier:
    if target == "log" or isinstance(target, str):
        return LogNotifier()
    secret: str | None = None
    name = "webhook"
    if target.secret_env:
        secret = os.environ.get(target.secret_env) or None
        if secret is None:
            # Sent unsigned rather than not at all; the journal says why.
            log.warning("notify: %s is not set; the webhook is sent unsigned", target.secret_env)
            name = f"webhook (unsigned: {target.secret_env} is not set)"
    return WebhookNotifier(target.webhook, secret=secret, name=name)


def _key(target: NotifyTarget) -> str:
    return target if isinstance(target, str) else target.webhook


def for_task(base: Notifier, config: NotifyConfig | None, *, admin: bool = False) -> Notifier:
    """The notifier of one task: the installation's (`base`) plus the contract's
    targets, and its admin targets too when `admin` (an escalation). A target that is
    the installation's own webhook, or listed twice, is sent to once."""
    if config is None:
        return base
    seen = {"log"} if isinstance(base, LogNotifier) else set()
    if isinstance(base, WebhookNotifier):
        seen.add(base.url)
    extra: list[Notifier] = []
    for target in [*config.targets, *(config.admin if admin else [])]:
        key = _key(target)
        if key in seen:
            continue
        seen.add(key)
        extra.append(_target(target))
    return Fanout([base, *extra]) if extra else base
