"""A webhook receiver for tether's notices, run as its own process on 127.0.0.1.

    NOTICE_SECRET=... python tests/services/notice_receiver.py [--fail-first N]

It prints one JSON line `{"port": N}` on stdout once it listens, and runs until SIGTERM.

- `POST /hook`: one notice. When `NOTICE_SECRET` is set, `X-Tether-Signature` must be
  `sha256=<HMAC-SHA256 of the body>`, else the answer is 401 and the notice is counted
  as `rejected`. The first `--fail-first` POSTs are answered 503 (a passing fault).
  Notices are de-duplicated by path and `X-Tether-Notice` id, as a receiver should.
- `GET /stats`: `notices` (the distinct ones, in arrival order), `deliveries` (every
  accepted POST), `repeats` (accepted POSTs of an id seen before), `rejected`, `failed`.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class State:
    """What the receiver saw, shared by the handler threads."""

    def __init__(self, secret: str | None, fail_first: int) -> None:
        self.secret = secret
        self.fail_first = fail_first
        self.lock = threading.Lock()
        self.posts = 0
        self.notices: list[dict[str, Any]] = []
        self.ids: set[tuple[str, str]] = set()
        self.deliveries = 0
        self.repeats = 0
        self.rejected = 0
        self.failed = 0

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "notices": list(self.notices),
                "deliveries": self.deliveries,
                "repeats": self.repeats,
                "rejected": self.rejected,
                "failed": self.failed,
            }


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, doc: Any = None) -> None:
            body = json.dumps(doc).encode() if doc is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/stats":
                self._answer(200, state.stats())
            else:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.lock:
                state.posts += 1
                if state.posts <= state.fail_first:
                    state.failed += 1
                    code = 503
                elif state.secret is not None and not _signed(state.secret, body, self.headers):
                    state.rejected += 1
                    code = 401
                else:
                    code = 204
                    state.deliveries += 1
                    nid = self.headers.get("X-Tether-Notice", "")
                    if (self.path, nid) in state.ids:
                        state.repeats += 1
                    else:
                        state.ids.add((self.path, nid))
                        state.notices.append(
                            {"id": nid, "path": self.path, "body": json.loads(body)}
                        )
            self._answer(code)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _signed(secret: str, body: bytes, headers: Any) -> bool:
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers.get("X-Tether-Signature", ""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-first", type=int, default=0)
    args = parser.parse_args()
    state = State(os.environ.get("NOTICE_SECRET") or None, args.fail_first)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(json.dumps({"port": server.server_port}), flush=True)
    sys.stdout.close()
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
