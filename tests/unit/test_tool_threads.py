"""`tether.tools._threads.run_sync`: sync tool code in a daemon thread.

The result or the exception comes back to the awaiting task, the caller's context
variables are seen in the thread, and a call abandoned by a timeout leaves a daemon
thread behind (nothing joins it at exit), never a thread of the loop's executor. A
thread whose call ended takes the next call, and ends when none comes for a while.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from tether.tools import _threads
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
    assert await _idle_soon(seen[0])
    # The late call ended, so its callback is queued: one loop step runs it (it drops it).
    await asyncio.sleep(0)


async def _idle_soon(thread: threading.Thread) -> bool:
    """Wait (up to 10 s) until `thread` finished its call and waits for another."""
    for _ in range(1000):
        with _threads._idle_lock:
            if any(w.thread is thread for w in _threads._idle):
                return True
        await asyncio.sleep(0.01)
    return False


async def test_a_finished_thread_takes_the_next_call_then_ends_when_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_threads, "IDLE_SECONDS", 0.2)

    def name() -> threading.Thread:
        return threading.current_thread()

    first = await run_sync(name)
    assert await _idle_soon(first)
    # The idle thread is taken again (the last to finish is the first reused).
    assert await run_sync(name) is first
    assert await _idle_soon(first)
    # No call for IDLE_SECONDS: the thread leaves the idle list and ends.
    first.join(10)
    assert not first.is_alive()
    with _threads._idle_lock:
        assert all(w.thread is not first for w in _threads._idle)


async def test_a_stuck_call_does_not_hold_up_the_next_one() -> None:
    release = threading.Event()

    def stuck() -> threading.Thread:
        release.wait(30)
        return threading.current_thread()

    pending = asyncio.ensure_future(run_sync(stuck))
    # The first call holds its thread: the second gets another one and answers.
    other = await asyncio.wait_for(run_sync(threading.current_thread), 10)
    assert not pending.done()
    release.set()
    assert await pending is not other


async def test_deadlines_share_one_timer_and_finished_calls_are_struck_off() -> None:
    from tether.tools._threads import start_sync

    assert await start_sync(60, int, "1") == 1
    watch = _threads._local.watch
    armed = watch.timer
    assert armed is not None and not armed.cancelled()
    for n in range(5):
        # A later deadline needs no timer of its own; a finished call leaves no entry.
        assert await start_sync(60, int, str(n)) == n
        assert watch.timer is armed and not watch.pending
