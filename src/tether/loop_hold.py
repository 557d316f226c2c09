"""Async code that holds the event loop: measured, named and told.

Every run of a process shares one event loop: a worker's `--concurrency` runs, their
lease renewals, the worker's claims. Async code that blocks instead of awaiting (an
`async def` tool calling a sync HTTP client, `time.sleep` or a long parse; a model
adapter doing the same) holds that loop: every other run of the process and this run's
heartbeat wait, and `asyncio.wait_for` cannot interrupt it (its timeout fires once the
loop runs again). Held past the lease's ttl, the task may be taken over by another
worker while the call is still under way. Temporal's workers call the like a deadlock
after 2 seconds; tether names the code and goes on.

`Held(coro, what)` awaits a coroutine and times each stretch it runs on the loop
between two awaits (one `send` into it); `longest` is the longest. The runtime journals
a stretch of `WARN_SECONDS` or more as an `audit.warning` (`loop_held`: `warning`) and
logs it on `tether.loop`. A stretch still running after `LOG_SECONDS` is logged while
it lasts, with the stack of the code holding the loop, by a watchdog thread (one per
process, started with the first `Held`): a loop held for good is named before its task
is found stalled.

The timing is two clock reads and a dict entry per stretch (most awaited calls have one
to three), so it is always on. Written by hand: asyncio's debug mode
(`slow_callback_duration`) times every callback of the loop and names none of them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from collections.abc import Coroutine, Generator
from time import perf_counter
from typing import Any, Final, Generic, TypeVar

from tether.events import AuditWarning

T = TypeVar("T")

log = logging.getLogger("tether.loop")

#: A stretch this long (seconds) is journaled and logged when it ends.
WARN_SECONDS: float = 2.0
#: A stretch still running this long is logged while it lasts (with its stack).
LOG_SECONDS: float = 10.0
#: How often the watchdog looks (seconds).
WATCH_EVERY: float = 1.0

#: The stretches under way: thread id -> (start, what, task id). Set and
#: cleared by the loop's thread around each `send`, read by the watchdog (a dict's
#: item assignment and `pop` are atomic under the GIL).
_running: dict[int, tuple[float, str, str | None]] = {}
_watchdog: list[threading.Thread] = []
_start_lock = threading.Lock()


class Held(Generic[T]):
    """Await `coro`, timing each stretch it runs on the loop without awaiting
    (`longest`, seconds); `what` names it (`"tool deploy"`, `"model gpt-5"`) and
    `task_id` its task, for the watchdog's log."""

    __slots__ = ("_coro", "longest", "task_id", "what")

    def __init__(self, coro: Coroutine[Any, Any, T], what: str, task_id: str | None) -> None:
        self._coro = coro
        self.what = what
        self.task_id = task_id
        self.longest = 0.0
        if not _watchdog:
            _start_watchdog()

    def close(self) -> None:
        """Never awaited after all: close the coroutine (no "never awaited" warning)."""
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, T]:
        coro, running, tid = self._coro, _running, threading.get_ident()
        value: Any = None
        error: BaseException | None = None
        while True:
            start = perf_counter()
            running[tid] = (start, self.what, self.task_id)
            try:
                step = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            finally:
                took = perf_counter() - start
                running.pop(tid, None)
                if took > self.longest:
                    self.longest = took
            try:
                value, error = (yield step), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation, thrown in: passed on
                value, error = None, exc


def told(held: Held[Any]) -> str:
    """What a long stretch means, for the journal and the log."""
    return (
        f"{held.what} held the event loop for {held.longest:.1f} s without awaiting: "
        "meanwhile every other task of this process and this task's lease renewal waited, "
        "and its timeout could not fire. Async code must await its I/O (an async client, "
        "asyncio.sleep); blocking code belongs in a plain `def` tool, which tether runs "
        "in a thread"
    )


def warning(held: Held[Any]) -> AuditWarning | None:
    """The `audit.warning` (`loop_held`) a stretch of `WARN_SECONDS` or more is journaled
    as (logged here too), or None."""
    if held.longest < WARN_SECONDS:
        return None
    message = told(held)
    log.warning("task %s: %s", held.task_id or "-", message)
    return AuditWarning(
        code="loop_held",
        message=message,
        details={"what": held.what, "seconds": round(held.longest, 3)},
    )


def _forget_watchdog() -> None:
    """In a forked child: the parent's watchdog thread is not there; the next `Held`
    starts one of the child's own."""
    _watchdog.clear()
    _running.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watchdog)


def _start_watchdog() -> None:
    with _start_lock:
        if _watchdog:
            return
        thread = threading.Thread(target=_watch, name="tether-loop-watchdog", daemon=True)
        _watchdog.append(thread)
        thread.start()


def _watch() -> None:
    """Log each stretch still running after `LOG_SECONDS`, once, with its stack."""
    logged: set[tuple[int, float]] = set()  # the stretches logged: (thread, start)
    tick = threading.Event()
    while True:
        tick.wait(WATCH_EVERY)
        now = perf_counter()
        live = set()
        for tid, (start, what, task_id) in list(_running.items()):
            stretch = (tid, start)
            live.add(stretch)
            if stretch in logged or now - start < LOG_SECONDS:
                continue
            logged.add(stretch)
            frame = sys._current_frames().get(tid)
            stack = "".join(traceback.format_stack(frame)[-_STACK_FRAMES:]) if frame else ""
            log.warning(
                "task %s: %s has held the event loop for %.0f s (still running; every other "
                "task of this process waits):\n%s",
                task_id or "-",
                what,
                now - start,
                stack.rstrip(),
            )
        logged &= live


#: The innermost frames of a stuck stretch the watchdog logs.
_STACK_FRAMES: Final = 8


__all__ = ["LOG_SECONDS", "WARN_SECONDS", "Held", "told", "warning"]
