"""Sync tool code in a daemon thread, awaited from the event loop.

`asyncio.to_thread` runs on the loop's default executor, whose threads are joined when
the loop closes (`asyncio.run`) and again at interpreter exit. A sync tool stuck in a
call that never returns (a stalled service, an HTTP client without a timeout) is
abandoned by the tool timeout, yet such a thread kept `tether run` from exiting after
its task was delivered, until the stalled call ended — forever, for a peer that never
answers. Here each call runs in a daemon thread: cancelling the await abandons the
thread (it cannot be killed), and nothing waits for it at exit.

Starting a thread per call cost the event loop a thread creation and a wait for the new
thread to run on every round; so a daemon thread that finished its call waits (up to
`IDLE_SECONDS`) for the next one. A thread stuck in an abandoned call is never idle, so
the next call gets another thread, as before. A thread is back on the idle list before
it hands its result to the loop: the loop, woken by the hand-off, then finds the thread
about to wait for its next call (releasing the GIL) rather than still doing its
bookkeeping, and the next call can go to it right away.

A call's deadline (`start_sync`'s timeout, a tool's `timeout`) is kept on its future:
`TimeoutError` is set on it, and the thread abandoned, by one timer per event loop
(`_Watch`), not a timer and a cancellation of the awaiting task per call.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: How long a finished thread waits for another call before it ends.
IDLE_SECONDS = 30.0


class _Worker:
    """A daemon thread and its inbox of calls (a call is given its worker, and puts it
    back on the idle list with `idle` once its function returned)."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Callable[[_Worker], None]] = queue.SimpleQueue()
        #: The function the thread was last named after.
        self.named: Callable[..., Any] | None = None
        self.thread = threading.Thread(target=self._serve, name="tether tool", daemon=True)

    def idle(self) -> None:
        """Ready for the next call."""
        with _idle_lock:
            _idle.append(self)

    def _serve(self) -> None:
        job: Callable[[_Worker], None] | None = self.inbox.get()
        while job is not None:
            job(self)
            job = None  # drop the finished call's references while idle
            while job is None:
                try:
                    job = self.inbox.get(timeout=IDLE_SECONDS)
                except queue.Empty:
                    with _idle_lock:
                        if self in _idle:
                            _idle.remove(self)
                            return
                    # A caller took this worker just now: its call is on the way.


# The idle workers (last in, first out: the warmest thread is reused).
_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _forget_idle() -> None:
    # A forked child has none of its parent's threads: their inboxes would never answer,
    # and the lock may have been held by one of them at the fork.
    global _idle_lock
    _idle_lock = threading.Lock()
    _idle.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_idle)


def _submit(job: Callable[[_Worker], None]) -> None:
    with _idle_lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker()
        worker.thread.start()
    worker.inbox.put(job)


class _Watch:
    """The deadlines of one event loop's calls in threads, kept with one timer.

    A timer per call (made, then cancelled when the call returns, in nearly every
    round) cost the loop a timer handle, a heap push and a cancelled entry in its heap;
    here a call only writes its deadline down. The one timer is set for the earliest
    deadline when it is armed; a later call's deadline needs no new timer, and when the
    timer goes off it fails the calls past their deadline with `TimeoutError` and is
    set again for the earliest of the rest (calls that ended were struck off).
    """

    __slots__ = ("at", "loop", "pending", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[asyncio.Future[Any], float] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.at = math.inf

    def add(self, future: asyncio.Future[Any], timeout: float) -> None:
        """`future` fails with `TimeoutError` unless done within `timeout` seconds."""
        at = self.loop.time() + timeout
        self.pending[future] = at
        if at < self.at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.at = at
        self.timer = self.loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self.timer, self.at = None, math.inf
        now = self.loop.time()
        nearest = math.inf
        for future, at in list(self.pending.items()):
            if future.done():  # cancelled while it ran (the result path strikes it off)
                del self.pending[future]
            elif at <= now:
                del self.pending[future]
                future.set_exception(TimeoutError())
            elif at < nearest:
                nearest = at
        if nearest < math.inf:
            self._arm(nearest)


# The deadlines of the loop running in this thread (a thread runs one loop at a time;
# the watch of a loop that ended is replaced by the next loop's).
_local = threading.local()


def _watch(loop: asyncio.AbstractEventLoop) -> _Watch:
    found: _Watch | None = getattr(_local, "watch", None)
    if found is None or found.loop is not loop:
        found = _local.watch = _Watch(loop)
    return found


def start_sync(
    timeout: float | None, fn: Callable[..., T], /, *args: Any, **kwargs: Any
) -> asyncio.Future[T]:
    """`fn(*args, **kwargs)` started in a daemon thread, with the caller's context
    variables (as `asyncio.to_thread`); the future has its result or exception, or
    `TimeoutError` after `timeout` seconds (None: no deadline), when the thread is
    abandoned (its late result is dropped). Cancelling the future abandons it too.

    A deadline kept on the future itself needs no task of its own and no cancellation
    of the awaiting task (as `asyncio.timeout` does it), and the thread's own
    bookkeeping (its name, the call) is done in the thread, off the loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    watch = None
    if timeout is not None:
        watch = _watch(loop)
        watch.add(future, timeout)

    def settle(result: T | None, error: BaseException | None) -> None:
        if watch is not None:
            watch.pending.pop(future, None)
        if future.done():  # abandoned: a timeout, or the await was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work(worker: _Worker) -> None:
        if worker.named is not fn:  # the thread is named after its tool (a new one)
            worker.thread.name = f"tool {getattr(fn, '__name__', 'call')}"
            worker.named = fn
        result: T | None = None
        error: BaseException | None = None
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the awaiting task, never lost here
            error = exc
        worker.idle()
        # The loop, woken by the hand-off, needs this thread's GIL: it finds it about
        # to wait for its next call (a `try`, not `contextlib.suppress`'s two calls).
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody waits
            return

    _submit(work)
    return future


async def run_sync(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`await fn(*args, **kwargs)` run in a daemon thread, with the caller's context
    variables (as `asyncio.to_thread`)."""
    return await start_sync(None, fn, *args, **kwargs)
