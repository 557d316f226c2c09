"""Where notices go: the log, webhooks, and the mix a task's contract asks for.

A `Notice` is one message to the people responsible for a task, with an id that stays
the same on every delivery attempt (receivers drop repeats). The installation's
notifier comes from the environment (`TETHER_WEBHOOK_URL`, `TETHER_WEBHOOK_SECRET`;
the log without them); a contract's `notify:` block adds its own targets and its
`admin` targets for escalations (`for_task`). Webhooks are signed per the Standard
Webhooks scheme (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,...`) and
sent with the standard library so that the core needs no HTTP dependency.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tether import errors
from tether.retry import RetryPolicy, classify_status, decide, parse_retry_after

if TYPE_CHECKING:
    from tether.spec import NotifyConfig, NotifyTarget

log = logging.getLogger("tether.watch")

WEBHOOK_ENV = "TETHER_WEBHOOK_URL"
WEBHOOK_SECRET_ENV = "TETHER_WEBHOOK_SECRET"
#: The prefix of a secret in the Standard Webhooks form (`whsec_` and base64 bytes).
SECRET_PREFIX = "whsec_"


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
        log.warning(
            "task %s: %s: %s",
            notice.task_id,
            notice.kind,
            notice.text,
            extra={"task_id": notice.task_id, "event": f"notice.{notice.kind}"},
        )
        return "log"


class TerminalNotifier(LogNotifier):
    """A foreground run's notices when the installation has no webhook: the person at
    the terminal is shown the task's status (the wait and what answers it) by the
    command itself, so nothing more is printed; journaled as sent on `terminal`."""

    async def notify(self, notice: Notice) -> str:
        """Nothing to print: the command shows the status."""
        return "terminal"


def webhook_key(secret: str, *, env: str | None = None) -> bytes:
    """The HMAC key of a webhook secret: `whsec_<base64>` (the Standard Webhooks form,
    as receivers' libraries print it) is the base64-decoded bytes after the prefix; any
    other value is taken as a raw secret, its UTF-8 bytes. A `whsec_` secret that is not
    base64 is a `UserError`, naming `env`, the variable that holds the secret, when given."""
    where = f"{env}: " if env else ""
    secret = secret.strip()
    if secret.startswith(SECRET_PREFIX):
        try:
            encoded = secret[len(SECRET_PREFIX) :]
            # Unpadded base64 is accepted, as the receivers' libraries accept it.
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise errors.UserError(
                f"{where}a webhook secret that starts with {SECRET_PREFIX!r} must be base64 "
                "after it"
            ) from None
        if not key:
            raise errors.UserError(f"{where}a webhook secret must not be empty after 'whsec_'")
        return key
    return secret.encode("utf-8")


def standard_signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks `webhook-signature` value: `v1,` and the base64 HMAC-SHA256
    of `{id}.{timestamp}.{body}`."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


class _Rejected(OSError):
    """An HTTP error status from the receiver, with what it means for retrying."""

    def __init__(self, status: int, reason: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.retry_after = retry_after


class WebhookNotifier:
    """Notices POSTed as JSON to a URL, signed per Standard Webhooks and retried with the
    project's `RetryPolicy`; a delivery that still fails is logged and journaled, never
    raised (a reminder tries again).

    Each request carries the Standard Webhooks headers: `webhook-id` (the notice id, the
    same on every retry, so a receiver drops repeats), `webhook-timestamp` (unix seconds
    of this attempt) and, when a secret is set, `webhook-signature: v1,<base64>`, the
    HMAC-SHA256 of `{id}.{timestamp}.{body}` with the secret's key (see `webhook_key`).
    For one release the old headers come along too: `X-Tether-Notice` (the id) and
    `X-Tether-Signature: sha256=<hex>` (the HMAC-SHA256 of the body alone, keyed with
    the secret string as given).

    Retries: a connection error, a timeout and a transient or gateway status (408, 409,
    425, 429, 5xx: a delivery is idempotent by its id) are tried again on `retry`'s
    schedule, honouring `Retry-After`; any other status (400, 401, 404...) is not."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        secret: str | None = None,
        retry: RetryPolicy | None = None,
        name: str = "webhook",
        secret_env: str | None = None,
    ) -> None:
        from tether._validation import http_url_problem

        problem = http_url_problem(url)
        if problem:
            shown = url if len(url) <= 80 else url[:77] + "..."
            raise errors.UserError(f"the webhook {shown!r} {problem}")
        self.url = url
        self.timeout = timeout
        self.secret = secret
        self.key = webhook_key(secret, env=secret_env) if secret else None
        self.retry = retry or RetryPolicy()
        self.name = name

    def headers(self, body: bytes, notice_id: str, timestamp: int) -> dict[str, str]:
        """The headers of one attempt."""
        headers = {
            "Content-Type": "application/json",
            "webhook-id": notice_id,
            "webhook-timestamp": str(timestamp),
            "X-Tether-Notice": notice_id,
        }
        if self.secret and self.key is not None:
            headers["webhook-signature"] = standard_signature(self.key, notice_id, timestamp, body)
            legacy = hmac.new(self.secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
            headers["X-Tether-Signature"] = f"sha256={legacy}"
        return headers

    def _post(self, body: bytes, notice_id: str) -> None:
        # Here, not at the top: every run loads this module, few send a webhook.
        import urllib.error
        import urllib.request

        headers = self.headers(body, notice_id, int(time.time()))
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            wait = parse_retry_after(dict(exc.headers.items())) if exc.headers else None
            exc.close()  # an error response holds its connection open otherwise
            raise _Rejected(exc.code, str(exc.reason), wait) from None

    async def notify(self, notice: Notice) -> str:
        """POST the notice; the channel's name says whether it arrived."""
        body = json.dumps(notice.to_dict(), ensure_ascii=False).encode("utf-8")
        # A notice without an id still gets one id for all its attempts.
        msg_id = notice.notice_id or f"msg_{uuid.uuid4().hex}"
        attempt = 0
        while True:
            attempt += 1
            try:
                await asyncio.to_thread(self._post, body, msg_id)
                return self.name
            except Exception as exc:  # best effort: the event says it was tried
                error: Exception = exc
                if isinstance(exc, _Rejected):
                    failure = classify_status(exc.status, has_effect=False)
                    hint = exc.retry_after
                else:
                    failure, hint = "transient", None
                decision = decide(self.retry, attempt, failure, hint=hint)
                if not decision.retry:
                    break
                await asyncio.sleep(decision.delay)
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
    if not url:
        return LogNotifier()
    return WebhookNotifier(url, secret=secret, secret_env=WEBHOOK_SECRET_ENV)


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
    return WebhookNotifier(target.webhook, secret=secret, name=name, secret_env=target.secret_env)


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
