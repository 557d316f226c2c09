"""A worker's stop in two steps: a drain within a grace, then a stop at a safe point.

When the worker is told to stop (its `stop` event, SIGINT or SIGTERM) it claims nothing
more and its runs are asked to end: each finishes the round it is in — a model call in
flight included — commits it, and gives its lease back. That is the drain. A run still
going when the grace is over (a slow model, a long tool call) is stopped at its next
safe point: a model call in flight is abandoned (nothing of its round is written, a
resume asks the model again), a tool call finishes and commits, and the lease is given
back at once (released, not left to expire), so that another worker takes the task up
without waiting. A second signal ends the grace at once. A grace of 0 is the stop at a
safe point straight away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

from tether import errors

log = logging.getLogger("tether.worker")

#: The longest grace accepted, in seconds (a day: a drain is not a pause).
MAX_GRACE = 86400.0
#: The most connections a worker's pool may hold (PostgreSQL's own default limit is 100).
MAX_POOL_SIZE = 1000


class RunStop(asyncio.Event):
    """The stop event the worker's runs see (each engine's `stop`), set in two steps.

    The engine reads it two ways: `is_set()` between the steps of a run (a set stop ends
    the run there, its lease given back) and `wait()` around a model call (which is
    abandoned when `wait()` returns). Once the worker's own `stop` is set (the drain),
    `is_set()` is true while `wait()` goes on waiting: no new round starts, and the round
    under way finishes with its model call. `set()` is the stop proper: `wait()` returns
    and a call in flight is abandoned.
    """

    def __init__(self, draining: asyncio.Event) -> None:
        super().__init__()
        # Read, not copied: a stop set in the middle of a step is seen at the next check.
        self.draining = draining
        self._hard = asyncio.Event()

    def is_set(self) -> bool:
        """True once draining or stopped."""
        return self.draining.is_set() or self._hard.is_set()

    def set(self) -> None:
        """Stop at the next safe point (see the class)."""
        self._hard.set()

    def clear(self) -> None:
        """Not stopped (a worker that runs again; its own `stop` is the caller's)."""
        self._hard.clear()

    async def wait(self) -> Literal[True]:
        """Return once `set()` is called (not when the drain begins)."""
        return await self._hard.wait()

    @property
    def stopped(self) -> bool:
        """True once `set()` was called."""
        return self._hard.is_set()


def check_grace(grace: float) -> float:
    """`grace` if it is a number of seconds from 0 to a day; a `UserError` otherwise."""
    if not (math.isfinite(grace) and 0 <= grace <= MAX_GRACE):
        raise errors.UserError(f"the grace must be from 0 to {MAX_GRACE:g} seconds, not {grace}")
    return grace


@runtime_checkable
class PooledStore(Protocol):
    """A store with a pool of connections to size (PostgreSQL's)."""

    def resize_pool(self, size: int) -> None:
        """Hold up to `size` connections from now on."""
        ...


def set_pool_size(store: object, size: int | None) -> None:
    """Let `store` hold up to `size` connections (None: as it was opened). Only a store
    with a pool (PostgreSQL) has one to size; SQLite has one writer connection."""
    if size is None:
        return
    if not 1 <= size <= MAX_POOL_SIZE:
        raise errors.UserError(f"the pool size must be from 1 to {MAX_POOL_SIZE}, not {size}")
    if not isinstance(store, PooledStore):
        log.info("pool size %d: this database has no connection pool; ignored", size)
        return
    store.resize_pool(size)


class Drain:
    """Turns the worker's `stop` into the runs' `RunStop` within `grace` seconds, and
    (`handle_signals`) SIGINT and SIGTERM into the worker's `stop` (the second one into
    the runs' stop at once). `busy()` says how many runs are under way, for the log;
    `on_stopping` gets each line said about the stop (the CLI prints it)."""

    def __init__(
        self,
        stop: asyncio.Event,
        grace: float,
        busy: Callable[[], int],
        on_stopping: Callable[[str], None] | None = None,
    ) -> None:
        self.stop = stop
        self.grace = check_grace(grace)
        self.runs = RunStop(stop)
        self.busy = busy
        self.on_stopping = on_stopping
        self._signals: list[signal.Signals] = []
        self._task: asyncio.Task[None] | None = None

    def start(self, handle_signals: bool) -> None:
        """Watch `stop` (and the signals) until `close()`."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self.signalled)
                    self._signals.append(sig)
        self.runs.clear()
        self._task = asyncio.create_task(self._enforce(), name="tether-worker-drain")

    def signalled(self) -> None:
        """A signal: the first starts the drain, the next one ends its grace now."""
        if self.stop.is_set() and not self.runs.stopped:
            self._say("asked again: stopping the runs at their next safe point now")
            self.runs.set()
        self.stop.set()

    async def _enforce(self) -> None:
        await self.stop.wait()
        busy = self.busy()
        if self.grace > 0 and busy:
            self._say(
                f"stopping: no new claim; {busy} run(s) finish their round "
                f"(grace {self.grace:g} s; signal again to stop them now)"
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.runs.wait(), self.grace)
            if not self.runs.stopped and self.busy():
                self._say(
                    f"grace over: stopping {self.busy()} run(s) at their next safe point "
                    "and handing their tasks back"
                )
        self.runs.set()

    def _say(self, line: str) -> None:
        log.info("%s", line)
        if self.on_stopping is not None:
            self.on_stopping(line)

    async def close(self) -> None:
        """Stop watching; the signals go back to their previous handlers."""
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        self._signals.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
