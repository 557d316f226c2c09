"""The runs a worker has under way, each an asyncio task of its own (a slot)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("tether.worker")

#: The longest a worker waits for a run it started to start its first turn before it
#: claims again while other runs are under way (`Slots.start_paced`), in seconds.
START_PACE = 0.05


class Slots:
    """Starts runs, waits for one to end, and waits for all of them when the worker stops.

    A run that raised past its own handling (a fault of the worker itself, never a
    task's) is raised by `reap` and `wait`, as one run at a time would have raised it.
    """

    def __init__(self, worker_id: str, stop: asyncio.Event) -> None:
        self.worker_id = worker_id
        self.stop = stop
        self.running: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self.running)

    def start(self, run: Coroutine[Any, Any, None], name: str) -> None:
        """Run `run` as an asyncio task of its own."""
        self.running.add(asyncio.create_task(run, name=name))

    async def start_paced(
        self, run: Callable[[Callable[[], None]], Coroutine[Any, Any, None]], name: str, pace: float
    ) -> None:
        """Start `run(started)` (see `start`); with other runs under way, return once it
        calls `started` (its first turn has started) or ends, or after `pace` seconds.

        A task's start (its reads, its contract, recovery, the turn's start) is paid
        once, on the one event loop: a wave of runs ending together would otherwise
        start as many at once, and the rounds of the runs under way would wait for all
        of those starts. A start is a few milliseconds; one that takes longer (an MCP
        server starting) holds the next claim up for `pace` at most. With no other run
        under way there is nothing to hold up: no wait."""
        began = asyncio.Event()

        async def go() -> None:
            try:
                await run(began.set)
            finally:
                began.set()

        self.start(go(), name)
        if len(self.running) > 1 and pace > 0 and not began.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(began.wait(), pace)

    async def wait(self) -> None:
        """Wait until a run ends (its slot is free) or `stop` is set (see the class)."""
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({*self.running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await asyncio.gather(stopping, return_exceptions=True)
        self.reap()

    def reap(self) -> None:
        """Forget the runs that ended; raise what one of them raised (see the class)."""
        done = [t for t in self.running if t.done()]
        self.running.difference_update(done)
        raised = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
        for exc in raised[1:]:
            log.error("worker %s: a run raised: %r", self.worker_id, exc)
        if raised:
            raise raised[0]

    async def drain(self) -> None:
        """Wait for the runs under way: with `stop` set each ends after its current step,
        commits and gives its lease back. If the caller is cancelled (not stopped), they
        are cancelled too, and waited for (each gives its lease back)."""
        if not self.running:
            return
        self.stop.set()  # no run outlives the worker's `run()`
        runs = set(self.running)
        try:
            ended = await asyncio.gather(*runs, return_exceptions=True)
        except asyncio.CancelledError:
            for t in runs:
                t.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            raise
        finally:
            self.running.clear()
        for exc in ended:
            if isinstance(exc, Exception):
                log.error("worker %s: a run raised while stopping: %r", self.worker_id, exc)
