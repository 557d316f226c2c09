"""`runtime.takeover.confirm_stopped` on an injected clock: a holder whose long lease is
not renewed for one lease period is taken over (journaled, then fenced by a forced
claim); one that renews, or a claim by another worker, stops the takeover."""

from __future__ import annotations

from pathlib import Path

import pytest

import tether
from tests.support.loop import events_of, spec_of
from tether import errors
from tether.clock import FakeClock
from tether.runtime.takeover import confirm_stopped
from tether.store.memory import MemoryStore


class RenewingClock(FakeClock):
    """Time passes only in sleeps; the holder renews its lease during the third one."""

    def __init__(self, store: MemoryStore, task_id: str, token: int) -> None:
        super().__init__()
        self.store, self.task_id, self.token, self.sleeps = store, task_id, token, 0

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        self.sleeps += 1
        if self.sleeps == 3:
            await self.store.renew(self.task_id, self.token, 600)


async def _held(tmp_path: Path, clock: FakeClock) -> tuple[MemoryStore, str, int]:
    store = await MemoryStore.open(clock=clock)
    tid = (await tether.create_task(store, spec_of(1), workspace=tmp_path)).task_id
    lease = await store.claim("far-host:1", 600, task_id=tid)
    assert lease is not None
    return store, tid, lease.token


async def test_a_silent_long_lease_is_taken_over_after_one_period(tmp_path: Path) -> None:
    clock = FakeClock()
    store, tid, token = await _held(tmp_path, clock)
    start = clock.now()
    watched = await confirm_stopped(store, tid, clock=clock, poll=5)
    assert watched.previous_owner == "far-host:1"
    assert clock.now() - start == pytest.approx(600)  # one full lease period
    (warning,) = await events_of(store, tid, "audit.warning")
    assert warning["code"] == "lease_taken_over"
    assert warning["details"]["previous_owner"] == "far-host:1"
    lease = await store.claim("me:2", 60, task_id=tid, force=True)
    assert lease is not None and lease.token > token
    with pytest.raises(errors.StaleLease):
        await store.renew(tid, token, 600)


async def test_a_renewal_during_the_watch_refuses_the_takeover(tmp_path: Path) -> None:
    store, tid, token = await _held(tmp_path, FakeClock())
    clock = RenewingClock(store, tid, token)
    store.clock = clock
    with pytest.raises(errors.UserError, match="renewed the lease"):
        await confirm_stopped(store, tid, clock=clock, poll=5)
    task = await store.get_task(tid)
    assert (task.lease_owner, task.fencing_token) == ("far-host:1", token)
    assert await events_of(store, tid, "audit.warning") == []


async def test_no_live_lease_means_nothing_to_watch(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    tid = (await tether.create_task(store, spec_of(1), workspace=tmp_path)).task_id
    watched = await confirm_stopped(store, tid, clock=clock)
    assert (watched.previous_owner, watched.watched) == (None, 0.0)
