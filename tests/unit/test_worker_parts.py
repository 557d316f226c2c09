"""The parts of the worker: its slots, the tasks it holds back and those it passes over."""

from __future__ import annotations

import asyncio

import pytest

from tether.runtime.worker.held import HeldBack, PassedOver
from tether.runtime.worker.slots import Slots
from tether.store.memory import MemoryStore


def test_a_failing_task_is_held_back_longer_each_time_up_to_the_cap() -> None:
    held = HeldBack(MemoryStore(), "w", retry_delay=30.0, max_retry_delay=100.0)
    assert [held.failed("t1") for _ in range(4)] == [30.0, 60.0, 100.0, 100.0]
    assert held.failed("t2") == 30.0  # per task
    held.ran("t1")
    assert held.failed("t1") == 30.0  # a run starts the count again


def test_a_task_is_passed_over_until_its_time_comes() -> None:
    passed = PassedOver()
    assert passed.pass_over("t1", 60.0) is True
    assert passed.pass_over("t1", 60.0) is False  # already passed over
    assert passed.pass_over("t2", -1.0) is True
    assert passed.now() == ["t1"]  # t2's time has come


async def test_a_run_that_raises_is_raised_once_its_slot_is_reaped() -> None:
    slots = Slots("w", asyncio.Event())

    async def boom() -> None:
        raise RuntimeError("the worker's own fault")

    slots.start(boom(), name="boom")
    assert len(slots) == 1
    with pytest.raises(RuntimeError, match="own fault"):
        await slots.wait()
    assert len(slots) == 0


async def test_draining_stops_the_runs_and_waits_for_them() -> None:
    stop = asyncio.Event()
    slots = Slots("w", stop)
    ended: list[str] = []

    async def run(name: str) -> None:
        await stop.wait()
        ended.append(name)

    slots.start(run("a"), name="a")
    slots.start(run("b"), name="b")
    await slots.drain()
    assert stop.is_set() and sorted(ended) == ["a", "b"] and len(slots) == 0


async def test_a_start_waits_for_the_run_before_it_to_start_its_turn_at_most_the_pace() -> None:
    """With runs under way, `start_paced` returns once the new run says it started (or
    ended), or after the pace; alone, or with no pace, at once."""
    slots = Slots("w", asyncio.Event())
    said = asyncio.Event()
    log: list[str] = []

    async def run(started: object, *, say: bool, end: bool = False) -> None:
        await asyncio.sleep(0.01)
        if say:
            log.append("started")
            started()  # type: ignore[operator]
        if not end:
            await said.wait()

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await slots.start_paced(lambda s: run(s, say=False), "alone", 10.0)
    assert loop.time() - t0 < 1.0 and not log  # no other run: no wait
    await slots.start_paced(lambda s: run(s, say=True), "second", 10.0)
    assert log == ["started"]
    t0 = loop.time()
    await slots.start_paced(lambda s: run(s, say=False), "silent", 0.05)
    assert 0.04 < loop.time() - t0 < 5.0  # the pace, at most
    await slots.start_paced(lambda s: run(s, say=False, end=True), "ends", 10.0)
    assert len(slots) == 4 or len(slots) == 3  # the run that ended released the claim
    t0 = loop.time()
    await slots.start_paced(lambda s: run(s, say=False), "unpaced", 0.0)
    assert loop.time() - t0 < 1.0
    said.set()
    await slots.drain()
