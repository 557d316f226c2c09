"""Replay follows every shape of log the runtime writes around a wait: a task waiting
for a decision (a blocked item) is run again with nothing answered — once, three times,
after a forced takeover of a silent lease — or after an answered `tell`, a waiver and a
worker's claim, the watchdog's suspension of the unanswered wait; and a run killed in
the middle of a round, marked stalled by the watchdog (or not) and resumed. Each replay
matches the whole recording (`runtime.replay`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.loop import spec_of
from tether import decisions, errors
from tether.clock import FakeClock
from tether.edits import tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.report.replay import replay_task
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.takeover import confirm_stopped
from tether.runtime.tasks import create_task
from tether.runtime.watch import sweep as watch
from tether.store.memory import MemoryStore
from tether.tools.registry import ToolContext, tool
from tether.tools.retry import RetryPolicy

from ..e2e.decision_policies import stubborn
from .test_tool_safety import make_spec, registry_with


@dataclass
class Recording:
    """A task being recorded: its store, clock and the model its runs use."""

    store: MemoryStore
    clock: FakeClock
    task_id: str
    #: The act call (1-based) at which the model hangs until its run is killed.
    hang_at: int | None = None
    calls: int = 0
    hanging: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set to let a hanging model answer (never set for a run that is killed).
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def policy(self, request: ModelRequest) -> ModelResponse | str:
        if request.purpose == "act":
            self.calls += 1
            if self.calls == self.hang_at:
                self.hang_at = None
                self.hanging.set()
                await self.release.wait()  # or until the run is killed
        return stubborn(request)

    def engine(self, worker: str = "w") -> Engine:
        model = ScriptedModel(policy=self.policy)
        return Engine(
            self.store, ModelSet(actor=model), lease_ttl=30, clock=self.clock, worker_id=worker
        )

    async def run(self, *, force: bool = False) -> str:
        return (await self.engine().run(self.task_id, force=force)).status

    async def killed_in_a_round(self) -> None:
        """Run until the model hangs in a round, then kill the run there (a worker
        process killed: nothing of the round is committed, the task stays running)."""
        driver = asyncio.create_task(self.engine("doomed").run(self.task_id))
        await self.hanging.wait()
        driver.cancel()
        with pytest.raises(asyncio.CancelledError):
            await driver
        assert (await self.store.get_task(self.task_id)).status == "running"


async def _recording(tmp_path: Path, hang_at: int | None = None) -> Recording:
    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    spec = spec_of(3, limits={"no_progress_rounds": 2})
    task = await create_task(store, spec, workspace=tmp_path)
    return Recording(store, clock, task.task_id, hang_at=hang_at)


async def _again(r: Recording) -> None:
    assert await r.run() == "waiting"


async def _three_times(r: Recording) -> None:
    for _ in range(3):
        await _again(r)


async def _forced_takeover(r: Recording) -> None:
    # A worker that looked alive holds the lease: `resume --force` watches it for one
    # lease period, journals the takeover and takes it.
    assert await r.store.claim("far-host:1", 600, task_id=r.task_id) is not None
    assert (await confirm_stopped(r.store, r.task_id, clock=r.clock, poll=5)).previous_owner
    assert await r.run(force=True) == "waiting"


async def _told_then_run(r: Recording) -> None:
    await _again(r)
    await tell(r.store, r.task_id, "About item i2: write it like the others", by="ana")
    assert await r.run() == "waiting"


async def _waived_then_a_worker(r: Recording) -> None:
    await _again(r)
    await decisions.waive_item(r.store, r.task_id, "i2", reason="not needed", by="ana")
    result = await r.engine("worker-2").run_next()
    assert result is not None and result.status == "satisfied"


async def _suspended_by_the_watchdog(r: Recording) -> None:
    r.clock.advance(25 * 3600)  # nobody answered for a day
    report = await watch.sweep(r.store, clock=r.clock)
    assert report.escalated == [r.task_id]
    assert (await r.store.get_task(r.task_id)).status == "suspended"
    await _again(r)


async def _abandoned(r: Recording) -> None:
    await _again(r)
    await decisions.abandon_task(r.store, r.task_id, reason="the source is gone", by="ana")


WAITING: dict[str, Callable[[Recording], Awaitable[None]]] = {
    "run_again_changing_nothing": _again,
    "three_runs_in_a_row": _three_times,
    "forced_takeover_of_a_silent_lease": _forced_takeover,
    "answered_tell_then_run": _told_then_run,
    "waived_then_a_workers_claim": _waived_then_a_worker,
    "suspended_by_the_watchdog_then_run": _suspended_by_the_watchdog,
    "run_again_then_abandoned": _abandoned,
}


async def _assert_replays(r: Recording) -> None:
    events = await r.store.read_events(r.task_id)
    result = await replay_task(r.store, r.task_id)
    assert result.divergence is None, result.divergence
    assert result.stopped_at is None, result.stopped_at
    assert result.until == events[-1].seq
    assert result.events == len([e for e in events if e.type not in _UNCOMPARED])
    assert result.rounds == len([e for e in events if e.type == "round.committed"])


_UNCOMPARED = {"lease.claimed", "lease.released", "lease.renewed", "notice.sent"}


@pytest.mark.parametrize("shape", list(WAITING))
async def test_a_waiting_task_replays_through(tmp_path: Path, shape: str) -> None:
    r = await _recording(tmp_path)
    assert await r.run() == "waiting"
    await WAITING[shape](r)
    events = await r.store.read_events(r.task_id)
    assert sum(e.type == "recovery.started" for e in events) >= 1  # a run after the wait
    await _assert_replays(r)


@pytest.mark.parametrize("marked", [True, False], ids=["stall_mark", "no_mark"])
async def test_a_run_killed_in_a_round_replays_through_its_recovery(
    tmp_path: Path, marked: bool
) -> None:
    r = await _recording(tmp_path, hang_at=2)
    await r.killed_in_a_round()
    if marked:
        r.clock.advance(700)  # past the watchdog's stalled_after
        report = await watch.sweep(r.store, clock=r.clock)
        assert report.stalled == [r.task_id]
    assert await r.run() == "waiting"
    await _assert_replays(r)


async def test_a_message_while_a_round_ran_stops_the_replay_there(tmp_path: Path) -> None:
    # Not a crash: the run went on after the message, which its next round's request
    # carried (so the model wrote i2 and the task was delivered). Replay cannot place
    # the message within the round, so it stops before it and says so.
    r = await _recording(tmp_path, hang_at=2)
    driver = asyncio.create_task(r.run())
    await r.hanging.wait()
    await tell(r.store, r.task_id, "About item i2: write it", by="ana")
    r.release.set()
    assert await driver == "satisfied"  # the model read the hint in its next round
    told = next(e for e in await r.store.read_events(r.task_id) if e.type == "user.message")
    result = await replay_task(r.store, r.task_id)
    assert result.divergence is None, result.divergence
    assert result.stopped_at is not None and result.stopped_at.startswith(f"event {told.seq}:")
    assert result.until == told.seq - 1


async def test_a_task_parked_for_a_retry_and_run_again_replays_through(tmp_path: Path) -> None:
    # A backoff too long to wait out in the worker parks the task `waiting` until a
    # stored time; the run after it is a claim of its own, replayed at its recorded time.
    busy = {"n": 1}

    @tool(effect="write", idempotent=True, retry=RetryPolicy(max_attempts=3, base_delay=1))
    def flaky(x: str, ctx: ToolContext) -> str:
        if busy["n"] > 0:
            busy["n"] -= 1
            raise errors.RetryLater("busy", delay=3600)
        return "ok"

    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    registry = registry_with(flaky)
    model = ScriptedModel([ModelResponse("go", (tool_call("flaky", x="1"),)), "NEED_HELP: done?"])
    tid = (await create_task(store, make_spec(["flaky"]), workspace=tmp_path)).task_id

    def engine() -> Engine:
        return Engine(store, ModelSet(model), registry=registry, clock=clock)

    parked = await engine().run(tid)
    assert parked.status == "waiting" and (parked.waiting or {}).get("until")
    clock.advance(3601)
    assert (await engine().run(tid)).status == "waiting"  # now for the question
    (op,) = await store.get_ops(tid)
    assert op.status == "succeeded"
    result = await replay_task(store, tid, registry=registry)
    assert result.divergence is None, result.divergence
    assert result.stopped_at is None, result.stopped_at


async def test_a_run_killed_while_a_tool_call_was_out_replays_through(tmp_path: Path) -> None:
    # The worker died with a write out (intended, no result); the next run's recovery
    # finds it in doubt and sends it again with its op id (the tool is idempotent).
    hanging = asyncio.Event()
    calls = {"n": 0}

    @tool(effect="write", idempotent=True)
    async def slow_write(x: str, ctx: ToolContext) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            hanging.set()
            await asyncio.Event().wait()  # until the run is killed
        return "ok"

    clock = FakeClock()
    store = await MemoryStore.open(clock=clock)
    registry = registry_with(slow_write)
    model = ScriptedModel(
        [ModelResponse("go", (tool_call("slow_write", x="1"),)), "NEED_HELP: done?"]
    )
    tid = (await create_task(store, make_spec(["slow_write"]), workspace=tmp_path)).task_id

    def engine() -> Engine:
        return Engine(store, ModelSet(model), registry=registry, clock=clock)

    driver = asyncio.create_task(engine().run(tid))
    await hanging.wait()
    driver.cancel()
    with pytest.raises(asyncio.CancelledError):
        await driver
    assert (await engine().run(tid)).status == "waiting"
    (op,) = await store.get_ops(tid)
    assert op.status == "succeeded" and calls["n"] == 2
    result = await replay_task(store, tid, registry=registry)
    assert result.divergence is None, result.divergence
    assert result.stopped_at is None, result.stopped_at
    assert calls["n"] == 2  # the replay called a stand-in, never the tool
