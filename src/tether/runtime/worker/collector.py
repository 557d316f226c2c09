"""A worker process's older collections, made at a quiet moment of its event loop.

What the collector finds in a worker (`benchmarks/scale_bench.py --probe`, concurrency
64 on PostgreSQL, issue 22): its young collections free almost nothing (about 0.3
objects per round in generation 0, none in generation 1), because what a round
allocates dies by reference counting; the garbage in cycles is each run's own object
graph (its engine, state, journal, heartbeat and asyncio task, about 200 objects),
which lives for the whole run, so it has long been promoted to the oldest generation
when the run ends: only a full collection frees it. Yet CPython's automatic
generation-1 collection, every 10 young ones, walked tens of thousands of live
objects for 15–30 ms holding the GIL, a pause taken by every run whose round was under
way: 47–85 rounds in 1,000 held one, and they were often most of the slowest 1%.

So, in a `tether worker`, `QuietCollector` takes the older generations over: the young
collections stay automatic (a few ms each), and the full collection that frees the
ended runs' graphs is made once `every` young collections have happened (about 2,000
rounds of the benchmark), from a callback of the worker's event loop at a moment when
it has nothing else ready to run and was not running late, so that the pause falls
between rounds rather than in the middle of others'. If no such moment comes by half
as many young collections again, it collects anyway; and the thresholds it leaves in
place (generation 1 every `2 * every` young collections, a full one at every second of
those, CPython's growth rule permitting) collect by themselves should the loop stop
calling it (a closed loop): the garbage stays bounded either way.

A full collection is a longer pause than a generation-1 one (it walks every object not
frozen: the runs in flight and the garbage since the last one), but it is 10–15x rarer
than they were: 6–7 rounds in 1,000 held one, at a load that made it last ~0.2 s of
CPU (`docs/capacity.md`).
"""

from __future__ import annotations

import asyncio
import gc
import time

#: Young (generation-0) collections between two full collections.
FULL_EVERY = 100


class QuietCollector:
    """Makes the full collections of the process on `loop` at its quiet moments (see the
    module), checking every `period` seconds. `collections`, `forced` and `pause_s` say
    what it did (for a probe or a test)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, every: int = FULL_EVERY, period: float = 0.1
    ) -> None:
        self.loop = loop
        self.every = every
        self.period = period
        #: A tick later than this (seconds; the GIL's switch interval) means the loop was
        #: busy: not a quiet moment.
        self.late = 0.005
        self.collections = 0
        self.forced = 0
        self.pause_s = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._thresholds: tuple[int, int, int] | None = None

    def start(self) -> None:
        """Take the older generations over (the thresholds set as in the module)."""
        self._thresholds = gc.get_threshold()
        young = self._thresholds[0]
        # Generation 1 collected automatically only past the forced point (a backstop if
        # the loop stops calling back), and generation 2 at every second one of those.
        gc.set_threshold(young, self.every * 2, 1)
        self._schedule()

    def stop(self) -> None:
        """Hand the older generations back to the thresholds found at `start`."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def _schedule(self) -> None:
        due = self.loop.time() + self.period
        self._handle = self.loop.call_at(due, self._tick, due)

    def _ready(self) -> int:
        """The callbacks ready to run in this turn of the loop besides this one (asyncio's
        queue; a loop without one, uvloop's, is judged by its lateness alone)."""
        try:
            return len(vars(self.loop).get("_ready", ()))
        except TypeError:  # no __dict__
            return 0

    def _tick(self, due: float) -> None:
        self._handle = None
        if not gc.isenabled():  # the process's own choice since: left to it
            return
        young = gc.get_count()[1]  # young collections since the last older one
        if young >= self.every:
            quiet = self.loop.time() - due <= self.late and not self._ready()
            if quiet or young >= self.every * 3 // 2:
                started = time.perf_counter()
                gc.collect()
                self.pause_s = time.perf_counter() - started
                self.collections += 1
                self.forced += not quiet
        self._schedule()


__all__ = ["FULL_EVERY", "QuietCollector"]
