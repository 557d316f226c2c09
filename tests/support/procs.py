"""Helpers for the chaos tests: real `tether` processes, frozen and thawed.

- `wait_stopped(proc)`: wait (with a deadline) until the kernel says the process is
  stopped (state `T` in `/proc/PID/stat`), as a `stop` fail point leaves it.
- `reap(proc)`: SIGKILL a process (stopped or not) and wait for it.
- `wait_for(check, what)`: poll a condition with a deadline, no fixed sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def proc_state(pid: int) -> str | None:
    """The one-letter state of a process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(delay)
        delay = min(0.2, delay * 2)


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Wait until `proc` is stopped by its fail point (fails if it exits instead)."""

    def stopped() -> bool:
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the process exited ({proc.returncode}) instead: {err}")
        return proc_state(proc.pid) == "T"

    wait_for(stopped, f"process {proc.pid} to stop at its fail point", timeout)


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill `proc` (also when stopped) and collect it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
