"""`store._sqlite_thread.StoreThread`: the SQLite store's one thread, with what
`loop.run_in_executor` did (result, exception, context, cancellation, order), its
results handed back in batches, and its shutdown."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import weakref

import pytest

from tether.store import _sqlite_thread
from tether.store._sqlite_thread import StoreThread

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_results_of_many_calls_reach_their_callers_in_order() -> None:
    order: list[int] = []

    def square(k: int) -> int:
        order.append(k)
        return k * k

    async def main() -> list[int]:
        thread = StoreThread("t")
        try:
            return await asyncio.gather(*(thread.call(square, k) for k in range(500)))
        finally:
            thread.shutdown()

    assert asyncio.run(main()) == [k * k for k in range(500)]
    assert order == list(range(500))


def test_an_exception_is_raised_in_the_caller() -> None:
    def boom(what: str) -> None:
        raise KeyError(what)

    async def main() -> None:
        thread = StoreThread("t")
        try:
            await thread.call(boom, "x")
        finally:
            thread.shutdown()

    with pytest.raises(KeyError, match="x"):
        asyncio.run(main())


def test_the_call_runs_in_the_one_thread_with_the_callers_context() -> None:
    async def main() -> tuple[set[str], set[str]]:
        VAR.set("caller's")
        thread = StoreThread("tether-test")
        try:
            got = await asyncio.gather(
                *(
                    thread.call(lambda: (VAR.get(), threading.current_thread().name))
                    for _ in range(20)
                )
            )
        finally:
            thread.shutdown()
        return {v for v, _ in got}, {n for _, n in got}

    assert asyncio.run(main()) == ({"caller's"}, {"tether-test"})


def test_a_call_cancelled_before_the_thread_took_it_never_runs() -> None:
    ran: list[str] = []
    release = threading.Event()
    busy = threading.Event()

    def block() -> None:
        busy.set()
        release.wait()

    async def main() -> None:
        thread = StoreThread("t")
        try:
            first = asyncio.ensure_future(thread.call(block))
            await asyncio.to_thread(busy.wait)  # the thread is taken
            queued = asyncio.ensure_future(thread.call(ran.append, "queued"))
            await asyncio.sleep(0)  # queued
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            release.set()
            await first
            assert await thread.call(lambda: "after") == "after"
        finally:
            thread.shutdown()

    asyncio.run(main())
    assert ran == []


def test_a_call_under_way_when_cancelled_finishes() -> None:
    ran: list[str] = []
    release = threading.Event()
    busy = threading.Event()

    def block() -> None:
        busy.set()
        release.wait()
        ran.append("finished")

    async def main() -> None:
        thread = StoreThread("t")
        try:
            first = asyncio.ensure_future(thread.call(block))
            await asyncio.to_thread(busy.wait)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            release.set()
            assert await thread.call(lambda: "next") == "next"
        finally:
            thread.shutdown()

    asyncio.run(main())
    assert ran == ["finished"]


def test_each_event_loop_gets_its_own_results() -> None:
    thread = StoreThread("t")
    try:
        for k in range(3):
            assert asyncio.run(thread.call(lambda k=k: k)) == k
    finally:
        thread.shutdown()


def test_results_reach_loops_in_other_threads() -> None:
    thread = StoreThread("t")
    results: list[int] = []

    def in_a_loop(k: int) -> None:
        async def main() -> int:
            got = await asyncio.gather(*(thread.call(lambda j=j: j) for j in range(50)))
            return sum(got) + k

        results.append(asyncio.run(main()))

    others = [threading.Thread(target=in_a_loop, args=(k,)) for k in range(4)]
    for t in others:
        t.start()
    for t in others:
        t.join()
    thread.shutdown()
    assert sorted(results) == [1225 + k for k in range(4)]


def test_shutdown_runs_the_calls_made_then_refuses_new_ones() -> None:
    release = threading.Event()

    async def main() -> list[str]:
        thread = StoreThread("t")
        first = asyncio.ensure_future(thread.call(release.wait))
        later = [asyncio.ensure_future(thread.call(lambda k=k: f"call {k}")) for k in range(3)]
        await asyncio.sleep(0)  # all made
        release.set()
        done = await first
        assert done is True
        closing = asyncio.ensure_future(thread.call(lambda: "closing"))
        await asyncio.sleep(0)
        thread.shutdown()  # the calls made before it run, their results handed over
        out = [await f for f in later] + [await closing]
        with pytest.raises(RuntimeError, match="after shutdown"):
            await thread.call(lambda: "late")
        assert not thread._thread.is_alive()
        return out

    assert asyncio.run(main()) == ["call 0", "call 1", "call 2", "closing"]


def test_a_thread_nobody_shut_down_ends_with_its_owner() -> None:
    async def main() -> threading.Thread:
        thread = StoreThread("t")
        assert await thread.call(lambda: 1) == 1
        return thread._thread

    worker = asyncio.run(main())
    gc.collect()
    worker.join(timeout=30)
    assert not worker.is_alive()


def test_the_owner_is_not_kept_alive_by_its_thread() -> None:
    thread = StoreThread("t")
    ref = weakref.ref(thread)
    worker = thread._thread
    del thread
    gc.collect()
    assert ref() is None
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert all(q.stopping for q in _sqlite_thread._live)


def test_without_an_eventfd_results_go_back_by_call_soon_threadsafe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(_sqlite_thread.os, "eventfd", raising=False)

    async def main() -> list[int]:
        thread = StoreThread("t")
        try:
            return await asyncio.gather(*(thread.call(lambda k=k: k) for k in range(100)))
        finally:
            thread.shutdown()

    assert asyncio.run(main()) == list(range(100))


def test_with_threads_calls_run_at_once_up_to_that_many() -> None:
    """The PostgreSQL store's: up to `threads` calls at once, a thread started only when
    none is free; `resize` raises the bound."""
    started = threading.Barrier(3, timeout=30)

    def meet() -> str:
        started.wait()  # returns only when three calls are under way together
        return threading.current_thread().name

    async def main() -> tuple[list[str], int, int]:
        pool = StoreThread("tether-pg", threads=2)
        try:
            assert await pool.call(lambda: 1) == 1
            assert len(pool._threads) == 1  # one free thread was enough
            pool.resize(3)
            names = await asyncio.gather(*(pool.call(meet) for _ in range(3)))
            return names, len(pool._threads), pool._max_workers
        finally:
            await asyncio.to_thread(pool.shutdown)

    names, threads, most = asyncio.run(main())
    assert names == ["tether-pg"] * 3
    assert (threads, most) == (3, 3)
