"""Receivers of notices for the tests: a notifier that keeps what it is given, and a
webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from tether.runtime.watch.sinks import Notice


class Recorder:
    """A notifier that keeps what it was given."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []

    async def notify(self, notice: Notice) -> str:
        self.notices.append(notice)
        return "recorder"

    @property
    def kinds(self) -> list[str]:
        """The kinds of the notices, in order."""
        return [n.kind for n in self.notices]


@contextmanager
def webhook_receiver(fail_first: int = 0) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A receiver on 127.0.0.1: its URL, and each request it accepted (`body`, `raw`,
    and the `notice` and `signature` headers); the first `fail_first` requests get a
    503 and are not kept."""
    got: list[dict[str, Any]] = []
    seen = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen["n"] += 1
            if seen["n"] <= fail_first:
                self.send_response(503)
                self.end_headers()
                return
            got.append(
                {
                    "body": json.loads(body),
                    "raw": body,
                    "notice": self.headers.get("X-Tether-Notice"),
                    "signature": self.headers.get("X-Tether-Signature"),
                }
            )
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", got
    finally:
        server.shutdown()
        server.server_close()
