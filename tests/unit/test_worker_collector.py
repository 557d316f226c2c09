"""`runtime.worker.collector`: a worker process's full collections at quiet moments."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from tether.runtime.worker.collector import QuietCollector


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(3000, 10, 10)
    gc.collect()  # the young collections counted from 0
    yield
    gc.set_threshold(*before)
    if enabled:
        gc.enable()
    else:
        gc.disable()


class Node:
    """A cycle: only a full collection frees one that outlived two young collections."""

    def __init__(self) -> None:
        self.me = self


def _old_cycle() -> weakref.ref[Node]:
    node = Node()
    ref = weakref.ref(node)
    gc.collect(0)
    gc.collect(1)  # promoted to the oldest generation, as a run's graph is when it ends
    del node
    return ref


async def test_the_older_generations_are_handed_over_and_given_back() -> None:
    collector = QuietCollector(asyncio.get_running_loop(), every=7, period=10)
    collector.start()
    try:
        # Young collections stay automatic; generation 1 only as a backstop past the
        # point where the collector would have collected anyway.
        assert gc.get_threshold() == (3000, 14, 1)
    finally:
        collector.stop()
    assert gc.get_threshold() == (3000, 10, 10)


async def test_a_quiet_loop_gets_a_full_collection_after_enough_young_ones() -> None:
    loop = asyncio.get_running_loop()
    collector = QuietCollector(loop, every=3, period=10)
    ref = _old_cycle()
    collector._tick(loop.time())  # on time, nothing else ready: a quiet moment
    assert ref() is not None  # no young collection since the last older one: not yet
    assert collector.collections == 0
    for _ in range(3):
        gc.collect(0)
    collector._tick(loop.time())
    assert (collector.collections, collector.forced) == (1, 0)
    assert ref() is None  # the old cycle freed
    assert gc.get_count()[1] == 0
    collector.stop()


async def test_it_calls_itself_back_on_its_loop() -> None:
    collector = QuietCollector(asyncio.get_running_loop(), every=1, period=0.01)
    collector.start()
    try:
        ref = _old_cycle()
        gc.collect(0)
        for _ in range(500):  # a quiet moment comes (or, busy, half as many again)
            if collector.collections:
                break
            gc.collect(0)
            await asyncio.sleep(0.01)
        assert collector.collections >= 1
        assert ref() is None
    finally:
        collector.stop()
    assert collector._handle is None


async def test_a_busy_loop_waits_then_collects_anyway() -> None:
    loop = asyncio.get_running_loop()
    collector = QuietCollector(loop, every=4, period=10)
    for _ in range(4):
        gc.collect(0)
    late = loop.time() - 1.0  # a tick a second late: the loop is busy
    collector._tick(late)
    assert collector.collections == 0
    for _ in range(2):
        gc.collect(0)  # half as many again: collected even though busy
    collector._tick(late)
    assert (collector.collections, collector.forced) == (1, 1)
    collector.stop()


async def test_a_process_that_turns_its_collector_off_is_left_alone() -> None:
    loop = asyncio.get_running_loop()
    collector = QuietCollector(loop, every=1, period=10)
    gc.collect(0)
    gc.disable()
    collector._tick(loop.time())
    assert collector.collections == 0
    assert collector._handle is None  # no longer called back
