"""Injected time: the runtime never reads the wall clock ad hoc.

Hours of timeouts, leases and backoffs are tested in milliseconds with `FakeClock`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Source of wall time (unix seconds) and of sleeping."""

    def now(self) -> float:
        """Unix time in seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait (or pretend to wait) this many seconds."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Unix time in seconds."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that only moves when told to (or when slept on)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        """The fake current time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance instead of waiting; yields once to the loop."""
        self._now += max(0.0, seconds)
        await asyncio.sleep(0)
