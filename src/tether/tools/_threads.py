"""Sync tool code in a daemon thread of its own, awaited from the event loop.

`asyncio.to_thread` runs on the loop's default executor, whose threads are joined when
the loop closes (`asyncio.run`) and again at interpreter exit. A sync tool stuck in a
call that never returns (a stalled service, an HTTP client without a timeout) is
abandoned by the tool timeout, yet such a thread kept `tether run` from exiting after
its task was delivered, until the stalled call ended — forever, for a peer that never
answers. Here each call gets a daemon thread: cancelling the await abandons the thread
(it cannot be killed), and nothing waits for it at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_sync(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`await fn(*args, **kwargs)` run in a new daemon thread, with the caller's
    context variables (as `asyncio.to_thread`)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # abandoned: the await was cancelled (a timeout)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting task, never lost here
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    name = f"tool {getattr(fn, '__name__', 'call')}"
    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
