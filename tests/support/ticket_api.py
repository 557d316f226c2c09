"""The ticket service (`tests/services/ticket_api.py`) as a child process of the test.

It counts its own effects (`stats`, `tickets`), so a test can say how many tickets a
crash, a lost response or a second worker really made; `faults` sets its fault knobs.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, Self

SERVICE = Path(__file__).resolve().parents[1] / "services" / "ticket_api.py"


class TicketAPI:
    """The ticket API as a child process on an ephemeral port."""

    def __init__(self, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVICE), "--port", "0", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError("the ticket API did not start")
        self.port = int(json.loads(line)["port"])
        self.url = f"http://127.0.0.1:{self.port}"

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        """Effects and requests as the service counts them."""
        status, doc = self._call("GET", "/stats")
        assert status == 200
        return dict(doc)

    def tickets(self) -> list[dict[str, Any]]:
        """Every ticket the service holds."""
        status, doc = self._call("GET", "/tickets")
        assert status == 200
        return list(doc)

    def faults(self, **knobs: Any) -> None:
        """Set fault knobs (see the service's docstring)."""
        status, _ = self._call("POST", "/admin/faults", knobs)
        assert status == 200

    def close(self) -> None:
        """Stop the process and close its pipes."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
