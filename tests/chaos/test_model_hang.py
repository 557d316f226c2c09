"""A model provider that never answers holds nobody hostage.

A real HTTP server on 127.0.0.1 (a thread of the test) accepts connections, reads the
request and never answers, behind the OpenAI-compatible adapter of a real `tether run`:

- the model timeout is configurable (`TETHER_MODEL_TIMEOUT`, `TETHER_MODEL_RETRIES`;
  the spec's `models: {timeout, max_retries}`): the run gives up on the provider in
  seconds instead of 300 s × 4 attempts;
- the first Ctrl-C interrupts the call in flight at once: the run exits 130, the lease
  is given back, and a resume with a working model finishes the task.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.cli import DONE, assert_ok, describe, json_out, popen_tether, tether, write_spec
from tests.support.procs import reap, wait_for

pytestmark = pytest.mark.slow


class SilentServer:
    """Accepts HTTP requests and never answers them; counts the requests it read."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self._held: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        # The reading thread owns the connection and closes it: closing it from another
        # thread while this one waits in recv (or missing one accepted late) left
        # sockets to the garbage collector, whose ResourceWarning then failed a later
        # test.
        with conn:
            try:
                while data := conn.recv(65536):
                    if b"POST" in data:
                        self.requests += 1
            except OSError:
                return

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        for c in list(self._held):
            # Wakes the reader (recv returns b""), which then closes its connection.
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def model_of(server: SilentServer) -> str:
    return f"openai-compatible:http://127.0.0.1:{server.port}/v1#never"


def test_model_timeout_is_configurable(tmp_path: Path, silent: SilentServer) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1)
    doc = yaml.safe_load(spec.read_text())
    doc["models"].update(timeout=1, max_retries=1)
    spec.write_text(yaml.safe_dump(doc))
    (tmp_path / "ws").mkdir()
    start = time.monotonic()
    proc = tether(
        "run",
        spec,
        "--workspace",
        tmp_path / "ws",
        "--model",
        model_of(silent),
        cwd=tmp_path,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert "Traceback" not in proc.stderr, describe(proc)
    # Two attempts of one second each (and a backoff), not 300 s each.
    assert silent.requests >= 2, describe(proc)
    assert elapsed < 60, describe(proc)
    listed = json_out(tether("list", "--json", cwd=tmp_path))
    events = json_out(tether("events", listed[0]["task_id"], "--json", cwd=tmp_path))
    failed = [e for e in events if e["type"] == "model.failed"]
    assert failed and "timed out" in str(failed[0]["data"]).lower(), events


def test_environment_sets_the_model_timeout(tmp_path: Path, silent: SilentServer) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 1)
    (tmp_path / "ws").mkdir()
    start = time.monotonic()
    from tests.support.cli import cli_env

    proc = tether(
        "run",
        spec,
        "--workspace",
        tmp_path / "ws",
        "--model",
        model_of(silent),
        cwd=tmp_path,
        timeout=120,
        env=cli_env(TETHER_MODEL_TIMEOUT="1", TETHER_MODEL_RETRIES="0"),
    )
    assert "Traceback" not in proc.stderr, describe(proc)
    assert silent.requests >= 1 and time.monotonic() - start < 60, describe(proc)
    bad = tether(
        "run",
        spec,
        "--workspace",
        tmp_path / "ws",
        "--model",
        model_of(silent),
        cwd=tmp_path,
        env=cli_env(TETHER_MODEL_TIMEOUT="nan"),
    )
    assert bad.returncode == 2 and "TETHER_MODEL_TIMEOUT" in bad.stderr, describe(bad)


def test_ctrl_c_interrupts_a_model_call_in_flight(tmp_path: Path, silent: SilentServer) -> None:
    spec = write_spec(tmp_path / "spec.yaml", 2)
    (tmp_path / "ws").mkdir()
    run = popen_tether(
        "run", spec, "--workspace", tmp_path / "ws", "--model", model_of(silent), cwd=tmp_path
    )
    try:
        wait_for(lambda: silent.requests >= 1 or run.poll() is not None, "the model request")
        assert run.poll() is None, run.communicate()
        start = time.monotonic()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
        assert time.monotonic() - start < 20, err
        assert run.returncode == 130, err
        assert "Traceback" not in err
    finally:
        reap(run)
    task_id = json_out(tether("list", "--json", cwd=tmp_path))[0]["task_id"]
    # The lease was given back: a resume takes the task at once and finishes it.
    resumed = tether("resume", task_id, "--model", DONE, cwd=tmp_path, timeout=90)
    assert_ok(resumed)
    doc = json_out(tether("status", task_id, "--json", cwd=tmp_path))
    assert doc["status"] == "satisfied"
