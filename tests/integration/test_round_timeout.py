"""A round that runs past `limits.round_timeout` is cancelled and counted as a crash of
its worker: the task is recovered by the next run, and one that hangs every time fails
after `limits.max_crash_restarts` instead of holding a worker forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.loop import events_of, honest_actor, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.store.memory import MemoryStore


class Hanging:
    """A model that never answers its first `hangs` calls (a stuck provider connection
    with no timeout of its own), then answers honestly."""

    name = "hanging"

    def __init__(self, hangs: int) -> None:
        self.hangs = hangs
        self.calls = 0
        self.cancelled = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls <= self.hangs:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return honest_actor(request)


async def _run(store: MemoryStore, tid: str, model: Hanging) -> tuple[str, bool]:
    # A short lease: the heartbeat that checks the round's age runs every 0.1 s.
    result = await asyncio.wait_for(
        Engine(store, ModelSet(model), lease_ttl=0.3).run(tid), timeout=60
    )
    return result.status, result.interrupted


async def test_a_hung_round_is_cancelled_and_the_task_recovers(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    spec = spec_of(2, limits={"round_timeout": 0.5})
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    model = Hanging(hangs=1)
    assert await _run(store, tid, model) == ("running", True)
    assert model.cancelled == 1
    (warning,) = await events_of(store, tid, "audit.warning")
    assert warning["code"] == "round_timeout" and "limits.round_timeout" in warning["message"]
    task = await store.get_task(tid)
    assert task.lease_owner is None  # given back: any worker may recover it now
    # The next run recovers it like a crash and finishes.
    assert await _run(store, tid, model) == ("satisfied", False)
    recoveries = await events_of(store, tid, "recovery.started")
    assert len(recoveries) == 1


async def test_a_round_that_always_hangs_ends_failed(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    spec = spec_of(2, limits={"round_timeout": 0.3, "max_crash_restarts": 2})
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    model = Hanging(hangs=100)
    results = [await _run(store, tid, model) for _ in range(4)]
    assert results[:3] == [("running", True)] * 3
    assert results[3] == ("failed", False)
    task = await store.get_task(tid)
    assert task.stop_reason == "environment_unrecoverable"
    codes = [w["code"] for w in await events_of(store, tid, "audit.warning")]
    assert codes == ["round_timeout"] * 3 + ["crash_loop"]
    assert model.calls == 3  # the failing run does not ask the model again


async def test_without_a_round_timeout_a_slow_round_is_left_alone(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    tid = (await create_task(store, spec_of(1), workspace=tmp_path)).task_id

    class Slow:
        name = "slow"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            await asyncio.sleep(0.5)  # several heartbeats of a 0.3 s lease
            return honest_actor(request)

    result = await Engine(store, ModelSet(Slow()), lease_ttl=0.3).run(tid)
    assert result.status == "satisfied"
    assert not [w for w in await events_of(store, tid, "audit.warning")]
