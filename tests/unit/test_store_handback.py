"""`store._handback.run_in`: a store call in a thread, its result handed back in a batch,
with what `loop.run_in_executor` did (result, exception, context, cancellation)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tether.store._handback import run_in

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_results_of_many_calls_reach_their_callers() -> None:
    async def main() -> list[int]:
        with ThreadPoolExecutor(max_workers=4) as pool:
            return await asyncio.gather(*(run_in(pool, lambda k=k: k * k) for k in range(200)))

    assert asyncio.run(main()) == [k * k for k in range(200)]


def test_an_exception_is_raised_in_the_caller() -> None:
    def boom(what: str) -> None:
        raise KeyError(what)

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as pool:
            await run_in(pool, boom, "x")

    with pytest.raises(KeyError, match="x"):
        asyncio.run(main())


def test_the_call_runs_in_a_thread_with_the_callers_context() -> None:
    async def main() -> tuple[str, bool]:
        VAR.set("caller's")
        with ThreadPoolExecutor(max_workers=1) as pool:
            return await run_in(
                pool, lambda: (VAR.get(), threading.current_thread() is threading.main_thread())
            )

    assert asyncio.run(main()) == ("caller's", False)


def test_a_call_cancelled_before_a_thread_took_it_never_runs() -> None:
    ran: list[str] = []
    release = threading.Event()
    busy = threading.Event()

    def block() -> None:
        busy.set()
        release.wait()

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as pool:
            first = asyncio.ensure_future(run_in(pool, block))
            await asyncio.to_thread(busy.wait)  # the only thread is taken
            queued = asyncio.ensure_future(run_in(pool, ran.append, "queued"))
            await asyncio.sleep(0)  # submitted
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            release.set()
            await first
            assert await run_in(pool, lambda: "after") == "after"

    asyncio.run(main())
    assert ran == []


def test_each_event_loop_gets_its_own_results() -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        for k in range(3):
            assert asyncio.run(run_in(pool, lambda k=k: k)) == k
