"""The runs a worker has under way, each an asyncio task of its own (a slot)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("tether.worker")


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
