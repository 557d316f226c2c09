"""The services of `tests/services/` as child processes of the test.

They count their own effects (`stats`), so a test can say how many tickets a crash, a
lost response or a second worker really made, or how many notices arrived.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, Self

SERVICES = Path(__file__).resolve().parents[1] / "services"


class ServiceProcess:
    """A service of `tests/services/` as a child process on an ephemeral port of
    127.0.0.1 (it prints `{"port": N}` once it listens); `close` stops it."""

    #: The service's file in `tests/services/`.
    script = ""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVICES / self.script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError(f"{self.script} did not start")
        self.port = int(json.loads(line)["port"])
        self.base = f"http://127.0.0.1:{self.port}"

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
        """What the service counted (see its docstring)."""
        status, doc = self._call("GET", "/stats")
        assert status == 200
        return dict(doc)

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


class TicketAPI(ServiceProcess):
    """The ticket API (`ticket_api.py`): it counts its own effects (`stats`, `tickets`);
    `flags` are its command line (`--delay`, `--fail-rate`...)."""

    script = "ticket_api.py"

    def __init__(self, *flags: str) -> None:
        super().__init__("--port", "0", *flags)
        self.url = self.base

    def tickets(self) -> list[dict[str, Any]]:
        """Every ticket the service holds."""
        status, doc = self._call("GET", "/tickets")
        assert status == 200
        return list(doc)

    def faults(self, **knobs: Any) -> None:
        """Set fault knobs (see the service's docstring)."""
        status, _ = self._call("POST", "/admin/faults", knobs)
        assert status == 200


class NoticeReceiver(ServiceProcess):
    """The webhook receiver (`notice_receiver.py`), without the test's `NOTICE_SECRET`;
    `stats` has the notices it received."""

    script = "notice_receiver.py"

    def __init__(self) -> None:
        super().__init__(env={k: v for k, v in os.environ.items() if k != "NOTICE_SECRET"})
        self.url = f"{self.base}/hook"
