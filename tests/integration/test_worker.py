"""The library worker (`tether.runtime.worker.Worker`) on SQLite and PostgreSQL.

Scripted models, a `FakeClock` shared by the store and the engines (a parked task wakes
when the test moves the clock), and no sleeps: the tests wait on the worker's own
reports (`on_result`, `on_error`) and on `run()` returning.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Backend
from tests.support.loop import honest_actor, spec_of
from tether import errors
from tether.clock import FakeClock
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.engine import Engine, ModelSet, RunResult, Snapshot
from tether.runtime.tasks import create_task
from tether.runtime.worker import Worker
from tether.spec import TaskSpec
from tether.store import Store

#: Generous bound for a run of a few scripted rounds; reaching it is a failure.
LIMIT = 60.0


@pytest.fixture
async def db(sql_backend: Backend) -> AsyncIterator[Store]:
    store = await sql_backend.open()
    try:
        yield store
    finally:
        await store.close()


async def queue(store: Store, tmp_path: Path, name: str, spec: TaskSpec | None = None) -> str:
    """A queued task working in `tmp_path/name`; one fake second after the previous one
    (the store claims the oldest first)."""
    ws = tmp_path / name
    ws.mkdir()
    task = await create_task(store, spec or spec_of(2), workspace=ws)
    clock = getattr(store, "clock", None)
    assert isinstance(clock, FakeClock)
    clock.advance(1)
    return task.task_id


def honest() -> ModelSet:
    """An actor that writes the Next item's file; rules judge."""
    return ModelSet(actor=ScriptedModel(policy=honest_actor))


class Reports:
    """The worker's reports, as queues a test can wait on."""

    def __init__(self) -> None:
        self.results: asyncio.Queue[RunResult] = asyncio.Queue()
        self.errors: asyncio.Queue[tuple[str, Exception]] = asyncio.Queue()

    def on_result(self, result: RunResult) -> None:
        self.results.put_nowait(result)

    def on_error(self, task_id: str, exc: Exception) -> None:
        self.errors.put_nowait((task_id, exc))

    async def next_result(self) -> RunResult:
        return await asyncio.wait_for(self.results.get(), LIMIT)


def worker(store: Store, clock: FakeClock, models: Any, reports: Reports, **kw: Any) -> Worker:
    return Worker(
        store,
        models,
        worker_id="w1",
        lease_ttl=30,
        clock=clock,
        on_result=reports.on_result,
        on_error=reports.on_error,
        **kw,
    )


# --------------------------------------------------------------------------- claim and run


@pytest.mark.parametrize("per_task", [False, True], ids=["one-model-set", "models-per-spec"])
async def test_runs_every_queued_task_to_the_end(
    db: Store, clock: FakeClock, tmp_path: Path, per_task: bool
) -> None:
    ids = [await queue(db, tmp_path, f"ws{n}") for n in range(3)]
    built: list[TaskSpec] = []
    closed: list[str] = []

    class ClosingModel(ScriptedModel):
        async def aclose(self) -> None:
            closed.append(self.name)

    def models_for(spec: TaskSpec) -> ModelSet:
        built.append(spec)
        return ModelSet(actor=ClosingModel(policy=honest_actor, name=f"m{len(built)}"))

    reports = Reports()
    w = worker(db, clock, models_for if per_task else honest(), reports, once=True)
    stats = await asyncio.wait_for(w.run(), LIMIT)

    assert (stats.ran, stats.failed) == (3, 0)
    done = [reports.results.get_nowait() for _ in range(3)]
    # Oldest first, each to the end.
    assert [r.task_id for r in done] == ids
    assert {r.status for r in done} == {"satisfied"}
    for n, tid in enumerate(ids):
        task = await db.get_task(tid)
        assert task.status == "satisfied" and task.lease_owner is None
        assert (tmp_path / f"ws{n}" / "out" / "i2.txt").read_text() == "i2"
    if per_task:
        # Built from each task's own spec, and closed after its run.
        assert [s.name for s in built] == ["files"] * 3
        assert closed == ["m1", "m2", "m3"]


async def test_max_tasks_bounds_the_run(db: Store, clock: FakeClock, tmp_path: Path) -> None:
    ids = [await queue(db, tmp_path, f"ws{n}") for n in range(3)]
    stats = await asyncio.wait_for(worker(db, clock, honest(), Reports(), max_tasks=2).run(), LIMIT)
    assert stats.ran == 2
    assert [(await db.get_task(t)).status for t in ids] == ["satisfied", "satisfied", "queued"]


# --------------------------------------------------------------------------- parked tasks


async def test_a_parked_task_is_picked_up_when_its_wake_time_comes(
    db: Store, clock: FakeClock, tmp_path: Path
) -> None:
    calls = 0

    def flaky_then_honest(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:  # the provider is down: the engine parks the task for 60 s
            raise errors.ModelError("503 from the provider", transient=True)
        return honest_actor(request)

    tid = await queue(db, tmp_path, "ws")
    reports = Reports()
    w = worker(
        db,
        clock,
        ModelSet(actor=ScriptedModel(policy=flaky_then_honest)),
        reports,
        poll_interval=0.01,
    )
    running = asyncio.create_task(w.run())
    try:
        parked = await reports.next_result()
        assert (parked.task_id, parked.status) == (tid, "waiting")
        task = await db.get_task(tid)
        assert task.wake_at == pytest.approx(clock.now() + 60)
        assert task.lease_owner is None
        # Not claimable before its time, by this worker or any other.
        assert await db.claim("probe", 5) is None

        clock.advance(61)
        w.notify()
        woken = await reports.next_result()
        assert (woken.task_id, woken.status) == (tid, "satisfied")
    finally:
        w.stop.set()
        stats = await asyncio.wait_for(running, LIMIT)
    assert (stats.ran, stats.failed) == (2, 0)
    assert (await db.get_task(tid)).status == "satisfied"


# --------------------------------------------------------------------------- shutdown


async def test_stop_finishes_the_current_step_and_claims_nothing_more(
    db: Store, clock: FakeClock, tmp_path: Path
) -> None:
    first = await queue(db, tmp_path, "ws1", spec_of(5))
    second = await queue(db, tmp_path, "ws2")
    stop = asyncio.Event()

    def on_progress(snap: Snapshot) -> None:
        if snap.round >= 1:
            stop.set()  # as SIGTERM would, in the middle of the first task

    reports = Reports()
    w = worker(db, clock, honest(), reports, stop=stop, on_progress=on_progress)
    stats = await asyncio.wait_for(w.run(), LIMIT)

    assert (stats.ran, stats.failed) == (1, 0)
    result = reports.results.get_nowait()
    assert result.task_id == first and result.interrupted
    task = await db.get_task(first)
    assert task.status not in ("satisfied", "failed", "cancelled", "abandoned")
    assert task.lease_owner is None  # given back: another worker may go on with it
    # The round in progress was finished and recorded; the next one never started.
    progress = (await db.get_ledger(first)).to_ledger().progress()
    assert (progress.done, progress.total) == (1, 5)
    assert (tmp_path / "ws1" / "out" / "i1.txt").is_file()
    assert not (tmp_path / "ws1" / "out" / "i2.txt").exists()
    assert (await db.get_task(second)).status == "queued"


async def test_stop_ends_an_idle_wait(db: Store, clock: FakeClock) -> None:
    real_claim = db.claim
    found_nothing = asyncio.Event()

    async def claim(*args: Any, **kwargs: Any) -> Any:
        lease = await real_claim(*args, **kwargs)
        if lease is None:
            found_nothing.set()
        return lease

    db.claim = claim  # type: ignore[method-assign]
    try:
        w = worker(db, clock, honest(), Reports(), poll_interval=3600)
        running = asyncio.create_task(w.run())
        await asyncio.wait_for(found_nothing.wait(), LIMIT)
        # Nothing to do: the worker waits its hour, but stop must not wait for it.
        w.stop.set()
        stats = await asyncio.wait_for(running, 5)
    finally:
        del db.claim
    assert (stats.ran, stats.failed) == (0, 0)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("where", ["engine", "models"])
async def test_a_failing_task_is_reported_held_back_and_the_loop_goes_on(
    db: Store, clock: FakeClock, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first task fails: the engine raises, or its models cannot be built (the
    # worker raises).
    bad = await queue(db, tmp_path, "bad")
    good = await queue(db, tmp_path, "good")
    if where == "engine":
        real_run = Engine.run_claimed

        async def run_claimed(self: Engine, lease: Any, *args: Any, **kwargs: Any) -> Any:
            if lease.task_id == bad:
                await self.store.release(lease.task_id, lease.token)  # as the engine does
                raise errors.SpecError("the engine cannot run this task")
            return await real_run(self, lease, *args, **kwargs)

        monkeypatch.setattr(Engine, "run_claimed", run_claimed)
    built: list[TaskSpec] = []

    def models_for(spec: TaskSpec) -> ModelSet:
        built.append(spec)
        if where == "models" and len(built) == 1:
            raise errors.UserError("model 'openai:x' needs an API key")
        return honest()

    reports = Reports()
    w = worker(db, clock, models_for, reports, once=True, retry_delay=30)
    stats = await asyncio.wait_for(w.run(), LIMIT)

    # Reported once, not retried in a loop; the next task ran to the end.
    assert (stats.ran, stats.failed) == (1, 1)
    failed_id, exc = reports.errors.get_nowait()
    assert failed_id == bad and isinstance(exc, errors.TetherError)
    assert reports.errors.empty()
    assert reports.results.get_nowait().task_id == good
    assert (await db.get_task(good)).status == "satisfied"
    bad_task = await db.get_task(bad)
    assert bad_task.status == "queued"
    # The hold is given back when the worker ends, so the task can be fixed and run.
    assert bad_task.lease_owner is None


async def test_a_held_back_task_waits_out_its_delay(
    db: Store, clock: FakeClock, tmp_path: Path
) -> None:
    bad = await queue(db, tmp_path, "bad")

    def no_models(spec: TaskSpec) -> ModelSet:
        raise errors.UserError("model 'openai:x' needs an API key")

    reports = Reports()
    w = worker(db, clock, no_models, reports, poll_interval=0.01, retry_delay=30)
    running = asyncio.create_task(w.run())
    try:
        failed_id, _ = await asyncio.wait_for(reports.errors.get(), LIMIT)
        assert failed_id == bad
        task = await db.get_task(bad)
        assert task.lease_owner == "w1" and task.lease_expiry == pytest.approx(clock.now() + 30)
        assert await db.claim("other", 5) is None  # held back from every worker

        clock.advance(31)  # the delay is over: tried again, and held back twice as long
        w.notify()
        failed_again, _ = await asyncio.wait_for(reports.errors.get(), LIMIT)
        assert failed_again == bad
        assert (await db.get_task(bad)).lease_expiry == pytest.approx(clock.now() + 60)
    finally:
        w.stop.set()
        stats = await asyncio.wait_for(running, LIMIT)
    assert (stats.ran, stats.failed) == (0, 2)
    assert (await db.get_task(bad)).lease_owner is None


async def test_a_task_naming_a_tool_this_worker_lacks_is_handed_back_and_passed_over(
    db: Store, clock: FakeClock, tmp_path: Path
) -> None:
    # Workers may register different tools: this one lacks the task's, so it hands the
    # task back at once (another worker may claim it now), runs the next, counts no
    # failure, and looks at the task again only after `retry_delay`.
    other = await queue(db, tmp_path, "other", spec_of(1, tools=["write_file", "elsewhere"]))
    mine = await queue(db, tmp_path, "mine")
    reports = Reports()
    w = worker(db, clock, honest(), reports, poll_interval=0.01, retry_delay=30)
    running = asyncio.create_task(w.run())
    try:
        assert (await reports.next_result()).task_id == mine
        task = await db.get_task(other)
        assert (task.status, task.lease_owner) == ("queued", None)
        assert [e.type for e in await db.read_events(other)] == ["task.created"]
        token = task.fencing_token
        assert token == 1  # looked at once: passed over since, not claimed in a loop
        clock.advance(31)
        w.notify()
        for _ in range(int(LIMIT * 100)):  # looked at again: claimed, then handed back
            again = await db.get_task(other)
            if again.fencing_token > token and again.lease_owner is None:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the worker did not look at the task again after its delay")
        lease = await db.claim("able", 60)  # handed back again: free for a worker with it
        assert lease is not None and lease.task_id == other
    finally:
        w.stop.set()
        stats = await asyncio.wait_for(running, LIMIT)
    assert (stats.ran, stats.failed) == (1, 0)
    assert reports.errors.empty()


async def test_a_dead_same_host_owners_task_is_taken_once_it_missed_two_renewals(
    db: Store, clock: FakeClock, tmp_path: Path
) -> None:
    # The owner's pid is gone from this machine; still, while its lease is being renewed
    # (a process of another pid namespace under the same host name), it is not taken.
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    owner = f"{socket.gethostname()}:{gone.pid}"
    tid = await queue(db, tmp_path, "dead")
    held = await db.claim(owner, 60)
    assert held is not None
    clock.advance(39)  # silent, but not yet for two renewals (40 s of a 60 s lease)
    await db.renew(tid, held.token, 60)  # alive after all: renewed
    clock.advance(39)
    reports = Reports()
    stats = await asyncio.wait_for(worker(db, clock, honest(), reports, once=True).run(), LIMIT)
    assert (stats.ran, (await db.get_task(tid)).lease_owner) == (0, owner)

    clock.advance(2)  # 41 s without a renewal: two missed; the lease has 19 s to go
    stats = await asyncio.wait_for(worker(db, clock, honest(), reports, once=True).run(), LIMIT)
    assert stats.ran == 1
    task = await db.get_task(tid)
    assert (task.status, task.fencing_token) == ("satisfied", held.token + 1)


async def test_a_failing_claim_is_retried(db: Store, clock: FakeClock, tmp_path: Path) -> None:
    tid = await queue(db, tmp_path, "ws")
    real_claim = db.claim
    failures = 0

    async def claim(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise errors.StoreError("the database went away")
        return await real_claim(*args, **kwargs)

    reports = Reports()
    w = worker(db, clock, honest(), reports, poll_interval=0.001)
    db.claim = claim  # type: ignore[method-assign]
    running = asyncio.create_task(w.run())
    try:
        result = await reports.next_result()
    finally:
        w.stop.set()
        await asyncio.wait_for(running, LIMIT)
        del db.claim
    assert (result.task_id, result.status) == (tid, "satisfied")
    assert failures == 2
