"""Store calls in a thread pool, their results handed back to the event loop in batches.

`loop.run_in_executor` wakes the loop once per result (`call_soon_threadsafe`: a write to
its self-pipe, then a pass of the loop to copy the result to an asyncio future, then
another to resume the coroutine). A worker with many runs in flight gets its store
threads' results in bursts: runs whose model calls end together commit together
(`benchmarks/scale_bench.py`, issue 22). `run_in` gives each call one asyncio future,
set straight from the thread's result, and the results that end before the loop gets
to them are handed back with one wake-up and one pass for all of them, while the GIL
and the loop are what the runs queue for.

What a call does is what `run_in_executor` did: it runs in the executor's thread in a
copy of the caller's context; its exception is raised in the caller; a call cancelled
before a thread took it up never runs (one under way finishes, its result dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")


class HandBack:
    """The results ready for one event loop, handed over with one wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], BaseException | None, Any]] = []
        self._scheduled = False

    def post(self, fut: asyncio.Future[Any], exc: BaseException | None, value: Any) -> None:
        """From a thread: `fut` ends with `exc` or `value` at the loop's next pass."""
        with self._lock:
            self._ready.append((fut, exc, value))
            if self._scheduled:
                return  # the wake-up already asked for takes this one too
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
            self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            self._scheduled = False
        settle(ready)


def settle(ready: list[tuple[asyncio.Future[Any], BaseException | None, Any]]) -> None:
    """On the loop's thread: end each future with its exception or value (one its
    caller gave up on, cancelled, is left as it is)."""
    for fut, exc, value in ready:
        if fut.cancelled():
            continue
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)


_handbacks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HandBack] = (
    weakref.WeakKeyDictionary()
)


async def run_in(executor: Executor, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in one of `executor`'s threads (see the module)."""
    loop = asyncio.get_running_loop()
    back = _handbacks.get(loop)
    if back is None:
        back = _handbacks[loop] = HandBack(loop)
    fut: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()

    executor.submit(run_one, fut, ctx, fn, args, back.post)
    return await fut


def run_one(
    fut: asyncio.Future[Any],
    ctx: contextvars.Context,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    post: Callable[[asyncio.Future[Any], BaseException | None, Any], None],
) -> None:
    """In a store's thread: `fn(*args)` in `ctx`, its value or exception posted for
    `fut`; not run when the caller gave `fut` up before the thread took it."""
    if fut.cancelled():
        return
    try:
        value = ctx.run(fn, *args)
    except BaseException as exc:  # handed to the caller, as the executor's future did
        post(fut, exc, None)
    else:
        post(fut, None, value)
