"""`tether worker` processes on one database, and the test's own look into that database.

The workers run the flaky ticket tool and its scripted model
(`tests/services/flaky_tools.py`); each writes a log of its own, shown when it fails.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.services.flaky_tools import POLICY, TOOLS_REF
from tether.runtime.tasks import create_task
from tether.store import Store, open_store

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def in_store(url: str, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Run `fn` on a fresh store handle on `url` (the test's own process)."""

    async def main() -> T:
        store = await open_store(url)
        try:
            return await fn(store)
        finally:
            await store.close()

    return asyncio.run(main())


def add_tasks(url: str, specs: list[Any]) -> list[str]:
    """Queue one task per spec, oldest first; their ids."""

    async def go(store: Store) -> list[str]:
        return [(await create_task(store, s)).task_id for s in specs]

    return in_store(url, go)


class Workers:
    """`tether worker` processes; `close` kills those still running (`contextlib.closing`
    in a fixture)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(
        self, url: str, n: int, *args: str, **env_extra: str
    ) -> list[subprocess.Popen[bytes]]:
        """`n` workers on the database `url`, with `args` after `tether worker` and
        `env_extra` in their environment (no other `TETHER_` variable of the test's)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env.update({"PYTHONPATH": str(ROOT), "TETHER_TOOLS": TOOLS_REF, **env_extra})
        started = []
        for _ in range(n):
            log = self.logs / f"worker-{len(self.procs)}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tether.cli", "worker", "--poll", "0.2",
                     "--quiet", "--model", POLICY, "--db", url, *args],
                    cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                )  # fmt: skip
            self.procs.append((proc, log))
            started.append(proc)
        return started

    def wait(self, procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
        """Wait for `procs` to exit by themselves within `timeout` seconds, each with
        status 0."""
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"worker {proc.pid} still running after {timeout} s: {self.log(proc)}")
            assert rc == 0, self.log(proc)

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        """The end of `proc`'s log."""
        path = next(p for q, p in self.procs if q is proc)
        return path.read_text(errors="replace")[-3000:]

    def close(self) -> None:
        """Kill the workers still running."""
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
