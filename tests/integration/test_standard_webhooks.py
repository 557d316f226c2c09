"""Standard Webhooks: every delivery of a notice carries the same `webhook-id`, a
timestamp and a `v1,` signature that an independent verifier (the `standardwebhooks`
package) accepts; failures are retried on the project's `RetryPolicy`."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tether.retry import RetryPolicy
from tether.runtime.watch.sinks import Notice, WebhookNotifier, webhook_key

FAST = RetryPolicy(max_attempts=3, base_delay=0.0)
RAW_KEY = b"sixteen-byte-key-and-then-some!!"
WHSEC = "whsec_" + base64.b64encode(RAW_KEY).decode()


class Receiver:
    """A receiver on 127.0.0.1 that answers `statuses` in turn (then 204) and keeps
    every request's headers and body."""

    def __init__(self, statuses: list[int], extra: dict[str, str] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        pending = list(statuses)
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                headers = {k.lower(): v for k, v in self.headers.items()}
                requests.append({"headers": headers, "body": body})
                status = pending.pop(0) if pending else 204
                self.send_response(status)
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flaky() -> Iterator[Receiver]:
    with Receiver([503, 500]) as r:
        yield r


def _notice() -> Notice:
    return Notice("t-1", "need_help", "NEED_HELP: which port?", {"status": "waiting"}, "n-42")


async def test_a_retried_delivery_keeps_its_id_and_verifies(flaky: Receiver) -> None:
    notifier = WebhookNotifier(flaky.url, secret=WHSEC, retry=FAST)
    channel = await notifier.notify(_notice())
    assert channel == "webhook"
    assert len(flaky.requests) == 3  # two failures, then accepted
    ids = {r["headers"]["webhook-id"] for r in flaky.requests}
    assert ids == {"n-42"}
    verifier = Webhook(WHSEC)
    for request in flaky.requests:
        payload = verifier.verify(request["body"], request["headers"])
        assert payload["id"] == "n-42" and payload["kind"] == "need_help"
        assert request["headers"]["webhook-signature"].startswith("v1,")
    # The old header comes along for one release.
    assert flaky.requests[-1]["headers"]["x-tether-notice"] == "n-42"
    assert flaky.requests[-1]["headers"]["x-tether-signature"].startswith("sha256=")


async def test_a_tampered_body_or_wrong_secret_fails_verification(flaky: Receiver) -> None:
    await WebhookNotifier(flaky.url, secret=WHSEC, retry=FAST).notify(_notice())
    request = flaky.requests[-1]
    body = json.loads(request["body"])
    body["kind"] = "finished"
    with pytest.raises(WebhookVerificationError):
        Webhook(WHSEC).verify(json.dumps(body).encode(), request["headers"])
    other = "whsec_" + base64.b64encode(b"another-key-entirely-32-bytes!!!").decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(request["body"], request["headers"])


async def test_a_raw_secret_is_the_key_as_bytes() -> None:
    with Receiver([]) as r:
        await WebhookNotifier(r.url, secret="plain-secret", retry=FAST).notify(_notice())
    request = r.requests[0]
    # The package takes raw key bytes directly; a raw secret is its UTF-8 bytes.
    Webhook(b"plain-secret").verify(request["body"], request["headers"])
    assert webhook_key("plain-secret") == b"plain-secret"
    assert webhook_key(WHSEC) == RAW_KEY


async def test_a_client_error_is_not_retried() -> None:
    with Receiver([400]) as r:
        channel = await WebhookNotifier(r.url, secret=WHSEC, retry=FAST).notify(_notice())
    assert len(r.requests) == 1 and channel.startswith("webhook (failed")


async def test_retries_stop_at_the_policy_s_attempts() -> None:
    with Receiver([503] * 10) as r:
        policy = RetryPolicy(max_attempts=4, base_delay=0.0)
        channel = await WebhookNotifier(r.url, retry=policy).notify(_notice())
    assert len(r.requests) == 4 and channel.startswith("webhook (failed")
    assert "webhook-signature" not in r.requests[0]["headers"]  # no secret, no signature
    assert {q["headers"]["webhook-id"] for q in r.requests} == {"n-42"}


async def test_an_id_less_notice_gets_one_id_for_all_its_attempts() -> None:
    with Receiver([503]) as r:
        await WebhookNotifier(r.url, secret=WHSEC, retry=FAST).notify(
            Notice("t-1", "stalled", "silent")
        )
    ids = {q["headers"]["webhook-id"] for q in r.requests}
    assert len(r.requests) == 2 and len(ids) == 1 and ids.pop().startswith("msg_")


def test_a_whsec_secret_that_is_not_base64_is_refused() -> None:
    from tether import errors

    with pytest.raises(errors.UserError, match="base64"):
        WebhookNotifier("http://127.0.0.1:9/x", secret="whsec_not base64!")
