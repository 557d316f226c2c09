"""How a store call made in a thread reaches its caller on the event loop.

`_sqlite_thread.StoreThread` (both SQL stores' threads) runs `run_one` in its thread
and posts the outcome to the caller's loop, where `settle` ends the futures of a batch
of results with one wake-up. What a call does is what `loop.run_in_executor` did: it
runs in a copy of the caller's context; its exception is raised in the caller; a call
cancelled before a thread took it up never runs (one under way finishes, its result
dropped).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any


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
