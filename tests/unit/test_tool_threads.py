"""`tether.tools._threads.run_sync`: sync tool code in a daemon thread of its own.

The result or the exception comes back to the awaiting task, the caller's context
variables are seen in the thread, and a call abandoned by a timeout leaves a daemon
thread behind (nothing joins it at exit), never a thread of the loop's executor.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from tether.tools._threads import run_sync

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


async def test_result_exception_and_context() -> None:
    def add(a: int, b: int = 0) -> tuple[int, str, bool]:
        me = threading.current_thread()
        return a + b, VAR.get(), me.daemon

    VAR.set("caller")
    assert await run_sync(add, 2, b=3) == (5, "caller", True)

    def boom() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await run_sync(boom)


async def test_a_call_abandoned_by_a_timeout_leaves_a_daemon_thread() -> None:
    release = threading.Event()
    seen: list[threading.Thread] = []

    def stuck() -> str:
        seen.append(threading.current_thread())
        release.wait(30)
        return "late"

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run_sync(stuck), 0.05)
    assert len(seen) == 1 and seen[0].daemon and seen[0].is_alive()
    # The late answer finds nobody waiting: no error, no "Future exception was never
    # retrieved" warning (the test session turns warnings into errors).
    release.set()
    seen[0].join(10)
    assert not seen[0].is_alive()
    # The thread ended, so its callback is queued: one loop step runs it (it drops it).
    await asyncio.sleep(0)
