"""A small ticket API, run as its own process on 127.0.0.1, for the crash-window tests.

    python tests/services/ticket_api.py [--port 0] [--seed N] [--fail-rate F] ...

It prints one JSON line `{"port": N}` on stdout once it listens, and runs until it gets
SIGTERM or SIGINT.

- `POST /tickets` with `{"title": ...}` creates a ticket. An `Idempotency-Key` header is
  honoured: the same key returns the same ticket (200, no second effect); a new ticket
  answers 201.
- `GET /tickets?key=K`: the ticket created with key K, or 404; `GET /tickets?trace=T`:
  the first ticket created by a request with `X-Trace-Op: T`, or 404 (each look-up by
  key or trace is counted in `/stats` as `lookups`). `GET /tickets`: all.
- `POST /tickets/<id>/cancel` cancels a ticket (a saga's compensation): the first one
  takes effect (200, `cancelled: true`, `cancel_key` the request's `Idempotency-Key`),
  a later one answers the same without a second effect. Every cancel request is logged
  in `/stats` (`cancels`, with its ticket, key and outcome) and `cancelled` counts the
  effective ones. `cancel_drop_after` / `cancel_unavailable` (numbers of cancel
  requests, from 1) drop the answer after executing / answer 503, like the POST knobs.
- `GET /stats`: what the service saw: `created` (tickets actually created: the effect
  count), `posts` (every `POST /tickets` in arrival order, with its key, title, time,
  attempt header and what was done with it), `max_concurrent` (the most requests in
  flight at once).
- `POST /admin/faults` with a JSON object sets fault knobs (also given as flags):
  `delay` (seconds before answering a POST), `drop_after` / `drop_before` (numbers of
  POSTs, counted from 1, whose connection is closed without an answer after / before
  executing them: "executed but the response was lost" / "lost on the way"),
  `unavailable` (POST numbers answered 503 with `Retry-After: retry_after`),
  `unavailable_titles` (tickets with these titles are answered 503 on every POST,
  however the requests are numbered: a fault that survives restarts of the client), and
  `fail_rate` with `seed` (that fraction of POSTs answered 503, chosen by a seeded
  generator in arrival order, so a run is reproducible).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class State:
    """Tickets, counters and fault knobs, shared by the handler threads."""

    def __init__(self, faults: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.tickets: list[dict[str, Any]] = []
        self.by_key: dict[str, dict[str, Any]] = {}
        self.by_trace: dict[str, dict[str, Any]] = {}
        self.lookups = 0
        self.posts: list[dict[str, Any]] = []
        self.cancels: list[dict[str, Any]] = []
        self.inflight = 0
        self.max_concurrent = 0
        self.faults: dict[str, Any] = {}
        self.rng = random.Random(0)
        self.set_faults(faults)

    def set_faults(self, faults: dict[str, Any]) -> None:
        """Merge fault knobs; a new `seed` restarts the failure sequence."""
        with self.lock:
            self.faults.update(faults)
            if "seed" in faults:
                self.rng = random.Random(int(faults["seed"]))

    def stats(self) -> dict[str, Any]:
        """The effect count and the request log as the service saw them."""
        with self.lock:
            return {
                "created": len(self.tickets),
                "posts": [dict(p) for p in self.posts],
                "cancelled": sum(1 for t in self.tickets if t.get("cancelled")),
                "cancels": [dict(c) for c in self.cancels],
                "max_concurrent": self.max_concurrent,
                "lookups": self.lookups,
                "faults": dict(self.faults),
            }


class Handler(BaseHTTPRequestHandler):
    """The ticket API's routes."""

    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read /stats, not the access log."""

    # ------------------------------------------------------------ plumbing

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without a word."""
        self.close_connection = True
        self.wfile.flush()

    def _body(self) -> Any:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        return json.loads(raw) if raw else {}

    def _enter(self) -> None:
        st = self.server.state
        with st.lock:
            st.inflight += 1
            st.max_concurrent = max(st.max_concurrent, st.inflight)

    def _leave(self) -> None:
        st = self.server.state
        with st.lock:
            st.inflight -= 1

    # ------------------------------------------------------------ routes

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        st = self.server.state
        if url.path == "/stats":
            self._send(200, st.stats())
            return
        if url.path == "/tickets":
            self._enter()
            try:
                query = parse_qs(url.query)
                keys, traces = query.get("key"), query.get("trace")
                with st.lock:
                    if keys is None and traces is None:
                        body: Any = list(st.tickets)
                        found = True
                    else:
                        st.lookups += 1
                        body = st.by_key.get(keys[0]) if keys else st.by_trace.get(traces[0])
                        found = body is not None
                if found:
                    self._send(200, body)
                else:
                    what = f"key {keys[0]!r}" if keys else f"trace {traces[0] if traces else ''!r}"
                    self._send(404, {"error": f"no ticket with {what}"})
            finally:
                self._leave()
            return
        self._send(404, {"error": f"no route {url.path}"})

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        st = self.server.state
        if url.path == "/admin/faults":
            st.set_faults(self._body())
            self._send(200, st.stats()["faults"])
            return
        parts = url.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "tickets" and parts[2] == "cancel":
            self._cancel(st, parts[1])
            return
        if url.path != "/tickets":
            self._send(404, {"error": f"no route {url.path}"})
            return
        self._enter()
        try:
            self._create(st)
        finally:
            self._leave()

    def _create(self, st: State) -> None:
        try:
            body = self._body()
        except ValueError:
            self._send(400, {"error": "the body is not JSON"})
            return
        title = body.get("title") if isinstance(body, dict) else None
        if not isinstance(title, str) or not title:
            self._send(400, {"error": "title (a non-empty string) is required"})
            return
        key = self.headers.get("Idempotency-Key")
        with st.lock:
            n = len(st.posts) + 1
            faults = dict(st.faults)
            roll = st.rng.random()
            post: dict[str, Any] = {
                "n": n,
                "key": key,
                "trace": self.headers.get("X-Trace-Op"),
                "attempt": self.headers.get("X-Attempt"),
                "title": title,
                "at": time.time(),
                "outcome": "pending",
            }
            st.posts.append(post)
        delay = float(faults.get("delay") or 0.0)
        if delay:
            time.sleep(delay)
        if n in (faults.get("drop_before") or ()):
            post["outcome"] = "dropped_before"
            self._drop()
            return
        down = n in (faults.get("unavailable") or ()) or title in (
            faults.get("unavailable_titles") or ()
        )
        if down or roll < float(faults.get("fail_rate") or 0):
            post["outcome"] = "unavailable"
            retry_after = faults.get("retry_after")
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            self._send(503, {"error": "unavailable, try later"}, headers)
            return
        with st.lock:
            existing = st.by_key.get(key) if key else None
            if existing is None:
                trace = post["trace"]
                ticket = {"id": len(st.tickets) + 1, "key": key, "title": title, "at": time.time()}
                st.tickets.append(ticket)
                if key:
                    st.by_key[key] = ticket
                if trace:
                    st.by_trace.setdefault(trace, ticket)
                status = 201
                post["outcome"] = "created"
            else:
                ticket = existing
                status = 200
                post["outcome"] = "replayed"
            post["ticket"] = ticket["id"]
        if n in (faults.get("drop_after") or ()):
            post["outcome"] += "+dropped"
            self._drop()
            return
        self._send(status, ticket)

    def _cancel(self, st: State, ident: str) -> None:
        """`POST /tickets/<id>/cancel`: cancel once; a repeat has no second effect."""
        key = self.headers.get("Idempotency-Key")
        with st.lock:
            n = len(st.cancels) + 1
            faults = dict(st.faults)
            entry: dict[str, Any] = {"n": n, "ticket": ident, "key": key, "outcome": "pending"}
            st.cancels.append(entry)
            ticket = next((t for t in st.tickets if str(t["id"]) == ident), None)
            if ticket is None:
                entry["outcome"] = "not_found"
            elif n in (faults.get("cancel_unavailable") or ()):
                entry["outcome"] = "unavailable"
            elif ticket.get("cancelled"):
                entry["outcome"] = "replayed"
            else:
                ticket["cancelled"] = True
                ticket["cancel_key"] = key
                entry["outcome"] = "cancelled"
            body = dict(ticket) if ticket is not None else None
        if body is None:
            self._send(404, {"error": f"no ticket {ident!r}"})
            return
        if entry["outcome"] == "unavailable":
            self._send(503, {"error": "unavailable, try later"})
            return
        if n in (faults.get("cancel_drop_after") or ()):
            entry["outcome"] += "+dropped"
            self._drop()
            return
        self._send(200, body)


class Server(ThreadingHTTPServer):
    """The HTTP server with the shared state."""

    daemon_threads = True

    def __init__(self, port: int, state: State) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.state = state


def _numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    """Run the service until SIGTERM/SIGINT."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--drop-after", type=_numbers, default=[])
    p.add_argument("--drop-before", type=_numbers, default=[])
    p.add_argument("--unavailable", type=_numbers, default=[])
    p.add_argument("--retry-after", type=float, default=None)
    a = p.parse_args(argv)
    state = State(
        {
            "seed": a.seed,
            "fail_rate": a.fail_rate,
            "delay": a.delay,
            "drop_after": a.drop_after,
            "drop_before": a.drop_before,
            "unavailable": a.unavailable,
            "retry_after": a.retry_after,
        }
    )
    server = Server(a.port, state)

    def stop(*_: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
