"""`Worker(concurrency=N)` on SQLite and PostgreSQL: up to N runs at once, oldest first,
each isolated from the others, drained on stop, never a task claimed twice.

The actor of every task is gated: it reports that its round is under way (an asyncio
event per task and round) and waits until the test opens the gate, so that the tests
see several rounds in flight at once and decide when they end. No sleeps: every wait is
on an event, a queue or `run()` returning, bounded by `LIMIT`.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
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
from tether.runtime.engine import ModelSet, RunResult
from tether.runtime.tasks import create_task
from tether.runtime.worker import Worker
from tether.spec import TaskSpec
from tether.store import Store
from tether.store.base import Lease, StoredEvent

#: Generous bound for a wait; reaching it is a failure.
LIMIT = 60.0
NAME = re.compile(r"^t\d+$")


@pytest.fixture
async def db(sql_backend: Backend) -> AsyncIterator[Store]:
    store = await sql_backend.open()
    try:
        yield store
    finally:
        await store.close()


async def wind_down(w: Any, gates: Any, running: asyncio.Task[Any]) -> None:
    """Whatever the test did: let every gated run go, stop the worker and wait for it."""
    gates.open_all()
    w.stop.set()
    await asyncio.wait_for(running, LIMIT)


async def queue(store: Store, tmp_path: Path, n: int, items: int = 2) -> str:
    """Task `t{n}` working in `tmp_path/t{n}`; one fake second after the previous one
    (the store claims the task updated longest ago first)."""
    ws = tmp_path / f"t{n}"
    ws.mkdir()
    task = await create_task(store, spec_of(items, name=f"t{n}"), workspace=ws)
    clock = getattr(store, "clock", None)
    assert isinstance(clock, FakeClock)
    clock.advance(1)
    return task.task_id


class Gates:
    """The actors of every task, gated per task: `entered[name]` is set when a round of
    task `name` is in its model call; the call returns once `open(name)` (or
    `open_all()`) is called. `in_flight` / `most` count the model calls under way."""

    def __init__(self, *, raise_in: dict[str, BaseException] | None = None) -> None:
        self.entered: dict[str, asyncio.Queue[int]] = defaultdict(asyncio.Queue)
        self._gates: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.in_flight = 0
        self.most = 0
        self.rounds: dict[str, int] = defaultdict(int)
        self.raise_in = raise_in or {}
        self.built: list[str] = []

    def open(self, name: str) -> None:
        self._gates[name].set()

    def open_all(self) -> None:
        for name in list(self._gates):
            self._gates[name].set()
        self._all = True

    _all = False

    def models_for(self, spec: TaskSpec) -> ModelSet:
        name = spec.name
        self.built.append(name)

        async def policy(request: ModelRequest) -> ModelResponse:
            self.rounds[name] += 1
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                self.entered[name].put_nowait(self.rounds[name])
                if not self._all:
                    await self._gates[name].wait()
                if name in self.raise_in:
                    raise self.raise_in[name]
                return honest_actor(request)
            finally:
                self.in_flight -= 1

        return ModelSet(actor=ScriptedModel(policy=policy, name=name))

    async def wait_entered(self, name: str) -> int:
        """The round number of the next round of `name` to enter its model call."""
        return await asyncio.wait_for(self.entered[name].get(), LIMIT)


class Reports:
    def __init__(self) -> None:
        self.results: asyncio.Queue[RunResult] = asyncio.Queue()
        self.errors: asyncio.Queue[tuple[str, Exception]] = asyncio.Queue()

    def on_result(self, result: RunResult) -> None:
        self.results.put_nowait(result)

    def on_error(self, task_id: str, exc: Exception) -> None:
        self.errors.put_nowait((task_id, exc))


def make_worker(
    store: Store, models: Any, reports: Reports, *, worker_id: str = "w1", **kw: Any
) -> Worker:
    return Worker(
        store,
        models,
        worker_id=worker_id,
        lease_ttl=30,
        clock=getattr(store, "clock", None),
        on_result=reports.on_result,
        on_error=reports.on_error,
        **kw,
    )


def claims_of(store: Store, into: list[str]) -> None:
    """Record the task ids `store.claim` hands out, in order (the test's own spy)."""
    real = store.claim

    async def claim(*args: Any, **kwargs: Any) -> Lease | None:
        lease = await real(*args, **kwargs)
        if lease is not None and kwargs.get("task_id") is None:
            into.append(lease.task_id)
        return lease

    store.claim = claim  # type: ignore[method-assign]


def one_holder_at_a_time(tid: str, evs: list[StoredEvent]) -> list[str]:
    """Events numbered without a gap; each claim raises the token; every event written
    under a lease carries the latest claim's token. The claims' owners, in order."""
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1)), f"{tid}: gaps"
    owners: list[str] = []
    token = 0
    for e in evs:
        if e.type == "lease.claimed":
            assert e.data["token"] > token, f"{tid}: token {e.data['token']} after {token}"
            token = e.data["token"]
            owners.append(e.data["worker_id"])
        elif e.fencing_token is not None:
            assert e.fencing_token == token, f"{tid}: event {e.seq} under an old token"
    return owners


# --------------------------------------------------------------------------- N at once


async def test_runs_up_to_n_tasks_at_once_oldest_first(db: Store, tmp_path: Path) -> None:
    ids = [await queue(db, tmp_path, n) for n in range(5)]
    claimed: list[str] = []
    claims_of(db, claimed)
    gates, reports = Gates(), Reports()
    w = make_worker(db, gates.models_for, reports, concurrency=3, once=True)
    running = asyncio.create_task(w.run())
    try:
        # The three oldest are in their first round together; the others wait.
        for n in range(3):
            assert await gates.wait_entered(f"t{n}") == 1
        assert gates.in_flight == 3
        assert claimed == ids[:3]
        leases = [await db.get_task(t) for t in ids[:3]]
        assert {t.lease_owner for t in leases} == {"w1"}
        assert all(t.status == "queued" for t in [await db.get_task(t) for t in ids[3:]])
        # A slot freed is taken by the oldest task still queued.
        gates.open("t1")
        assert (await asyncio.wait_for(reports.results.get(), LIMIT)).task_id == ids[1]
        assert await gates.wait_entered("t3") == 1
        assert claimed == [*ids[:3], ids[3]]
        gates.open_all()
        stats = await asyncio.wait_for(running, LIMIT)
    finally:
        await wind_down(w, gates, running)
    assert (stats.ran, stats.failed) == (5, 0)
    assert claimed == ids  # oldest first, each once
    assert gates.most == 3  # never more than the concurrency
    for n, tid in enumerate(ids):
        task = await db.get_task(tid)
        assert (task.status, task.lease_owner) == ("satisfied", None)
        assert (tmp_path / f"t{n}" / "out" / "i2.txt").read_text() == "i2"
        assert one_holder_at_a_time(tid, list(await db.read_events(tid))) == ["w1"]
    # Each task ran with its own models, built once for its run.
    assert sorted(gates.built) == sorted(f"t{n}" for n in range(5))


async def test_a_long_task_starves_no_one(db: Store, tmp_path: Path) -> None:
    """Two slots; one task holds a slot for its whole (long) run while the other slot
    works through the queue strictly oldest first, each task claimed once."""
    long = await queue(db, tmp_path, 0, items=3)
    short = [await queue(db, tmp_path, n) for n in range(1, 6)]
    claimed: list[str] = []
    claims_of(db, claimed)
    gates, reports = Gates(), Reports()
    w = make_worker(db, gates.models_for, reports, concurrency=2, once=True)
    running = asyncio.create_task(w.run())
    try:
        assert await gates.wait_entered("t0") == 1  # the long task's first round
        for n in range(1, 6):  # the short ones pass through the other slot, in order
            gates.open(f"t{n}")
            result = await asyncio.wait_for(reports.results.get(), LIMIT)
            assert (result.task_id, result.status) == (short[n - 1], "satisfied")
        assert gates.rounds["t0"] == 1  # still in its first round all along
        gates.open_all()
        stats = await asyncio.wait_for(running, LIMIT)
    finally:
        await wind_down(w, gates, running)
    assert (stats.ran, stats.failed) == (6, 0)
    assert claimed == [long, *short]
    assert (await db.get_task(long)).status == "satisfied"


async def test_max_tasks_counts_the_runs_under_way(db: Store, tmp_path: Path) -> None:
    ids = [await queue(db, tmp_path, n) for n in range(4)]
    gates, reports = Gates(), Reports()
    gates.open_all()
    w = make_worker(db, gates.models_for, reports, concurrency=3, max_tasks=2)
    stats = await asyncio.wait_for(w.run(), LIMIT)
    assert stats.ran == 2
    assert [(await db.get_task(t)).status for t in ids] == [
        "satisfied",
        "satisfied",
        "queued",
        "queued",
    ]


def test_concurrency_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.UserError, match="concurrency"):
        Worker(None, ModelSet(actor=ScriptedModel(policy=honest_actor)), concurrency=0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- isolation


@pytest.mark.parametrize("where", ["commit", "model"])
async def test_a_crashing_round_touches_no_other_run(db: Store, tmp_path: Path, where: str) -> None:
    """Task t1's round crashes while t0 and t2 are mid-round — an exception out of the
    engine (its commit raises: reported and held back by the worker), or out of its
    model (the engine's own failure handling) — and t0 and t2 go on from where they
    were: still in their round, their lease and token unchanged; then they finish."""
    ids = [await queue(db, tmp_path, n, items=2) for n in range(3)]
    boom = RuntimeError("a bug under the round")
    gates = Gates(raise_in={"t1": boom} if where == "model" else None)
    reports = Reports()
    if where == "commit":
        real_commit = db.commit

        async def commit(task_id: str, *args: Any, **kwargs: Any) -> Any:
            if task_id == ids[1] and gates.rounds["t1"] >= 1:
                raise boom
            return await real_commit(task_id, *args, **kwargs)

        db.commit = commit  # type: ignore[method-assign]
    w = make_worker(db, gates.models_for, reports, concurrency=3, once=True, retry_delay=30)
    running = asyncio.create_task(w.run())
    try:
        for n in range(3):
            assert await gates.wait_entered(f"t{n}") == 1
        before = {t: (await db.get_task(t)).fencing_token for t in (ids[0], ids[2])}
        gates.open("t1")
        if where == "commit":
            failed_id, exc = await asyncio.wait_for(reports.errors.get(), LIMIT)
            assert (failed_id, exc) == (ids[1], boom)
        else:
            ended = await asyncio.wait_for(reports.results.get(), LIMIT)
            assert ended.task_id == ids[1] and ended.status != "satisfied"
        # The others are still in their first round, their leases untouched.
        assert gates.in_flight == 2
        for tid in (ids[0], ids[2]):
            task = await db.get_task(tid)
            assert (task.lease_owner, task.fencing_token) == ("w1", before[tid])
        gates.open("t0")
        gates.open("t2")
        stats = await asyncio.wait_for(running, LIMIT)
    finally:
        await wind_down(w, gates, running)
    assert (stats.ran, stats.failed) == ((2, 1) if where == "commit" else (3, 0))
    for tid in (ids[0], ids[2]):
        task = await db.get_task(tid)
        assert task.status == "satisfied"
        assert one_holder_at_a_time(tid, list(await db.read_events(tid))) == ["w1"]
    assert (await db.get_task(ids[1])).status != "satisfied"
    assert reports.errors.empty()


async def test_models_that_cannot_be_built_hold_back_that_task_only(
    db: Store, tmp_path: Path
) -> None:
    ids = [await queue(db, tmp_path, n) for n in range(3)]
    gates, reports = Gates(), Reports()
    gates.open_all()

    def models_for(spec: TaskSpec) -> ModelSet:
        if spec.name == "t1":
            raise errors.UserError("model 'openai:x' needs an API key")
        return gates.models_for(spec)

    w = make_worker(db, models_for, reports, concurrency=3, once=True)
    stats = await asyncio.wait_for(w.run(), LIMIT)
    assert (stats.ran, stats.failed) == (2, 1)
    assert reports.errors.get_nowait()[0] == ids[1]
    statuses = [(await db.get_task(t)).status for t in ids]
    assert statuses == ["satisfied", "queued", "satisfied"]


# --------------------------------------------------------------------------- drain


async def test_stop_drains_every_run_and_hands_the_leases_back(db: Store, tmp_path: Path) -> None:
    """Three tasks in their second round's model call when stop is set (as SIGTERM
    does): no new claim; each run stops there (the engine abandons a model call in
    flight at a stop: nothing of that round is written, a resume asks again) with its
    first round committed, ends `interrupted` and gives its lease back; the fourth task
    is never claimed."""
    ids = [await queue(db, tmp_path, n, items=4) for n in range(3)]
    waiting = await queue(db, tmp_path, 3)
    gates, reports = Gates(), Reports()
    w = make_worker(db, gates.models_for, reports, concurrency=3)
    running = asyncio.create_task(w.run())
    try:
        for n in range(3):
            assert await gates.wait_entered(f"t{n}") == 1
        # Opened and closed again with no await between: a run whose first round ended
        # before the others' began cannot pass its second round's gate still open.
        for n in range(3):
            gates.open(f"t{n}")
        gates._gates.clear()  # close the gates again: the second rounds wait in them
        for n in range(3):
            assert await gates.wait_entered(f"t{n}") == 2
        w.stop.set()
        stats = await asyncio.wait_for(running, LIMIT)
    finally:
        await wind_down(w, gates, running)
    assert (stats.ran, stats.failed) == (3, 0)
    results = sorted(
        (reports.results.get_nowait() for _ in range(3)), key=lambda r: ids.index(r.task_id)
    )
    assert [r.task_id for r in results] == ids and all(r.interrupted for r in results)
    for n, tid in enumerate(ids):
        task = await db.get_task(tid)
        assert task.lease_owner is None
        assert task.status not in ("satisfied", "failed", "cancelled", "abandoned")
        done = (await db.get_ledger(tid)).to_ledger().progress().done
        assert done == 1, f"t{n}: {done} items done"
        assert gates.rounds[f"t{n}"] == 2  # no third round started
        evs = list(await db.read_events(tid))
        assert one_holder_at_a_time(tid, evs) == ["w1"]
    assert [e.type for e in await db.read_events(waiting)] == ["task.created"]

    # Another worker goes on with them from there.
    gates.open_all()
    again = make_worker(db, gates.models_for, Reports(), worker_id="w2", concurrency=4, once=True)
    stats = await asyncio.wait_for(again.run(), LIMIT)
    assert stats.ran == 4
    assert {(await db.get_task(t)).status for t in [*ids, waiting]} == {"satisfied"}


# --------------------------------------------------------------------------- many workers


async def test_several_concurrent_workers_never_claim_a_task_twice(
    sql_backend: Backend, tmp_path: Path
) -> None:
    """Three workers, each on its own store handle with concurrency 3, on twelve tasks:
    each task is run by one holder at a time, to the end, exactly once."""
    stores = [await sql_backend.open() for _ in range(3)]
    try:
        ids = [await queue(stores[0], tmp_path, n) for n in range(12)]
        gates = Gates()
        gates.open_all()
        workers = [
            make_worker(s, gates.models_for, Reports(), worker_id=f"w{k}", concurrency=3, once=True)
            for k, s in enumerate(stores)
        ]
        stats = await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers)), LIMIT * 2)
        assert sum(s.ran for s in stats) == 12 and sum(s.failed for s in stats) == 0
        owners = set()
        for tid in ids:
            task = await stores[0].get_task(tid)
            assert (task.status, task.lease_owner) == ("satisfied", None)
            evs = list(await stores[0].read_events(tid))
            holders = one_holder_at_a_time(tid, evs)
            assert len(holders) == 1, (tid, holders)  # claimed once, run once
            owners.update(holders)
        assert sorted(gates.built) == sorted(f"t{n}" for n in range(12))
        assert owners <= {"w0", "w1", "w2"}
    finally:
        for s in stores:
            await s.close()


async def test_stop_lets_every_tool_call_in_flight_finish_and_commit(
    db: Store, tmp_path: Path
) -> None:
    """Two tasks inside a tool call when stop is set: each call finishes, its result is
    committed with the round (the item done by its `done_when` rule), then the run ends
    `interrupted` with its lease handed back."""
    from tether.models.scripted import tool_call
    from tether.spec import parse_spec
    from tether.tools.registry import ToolRegistry, tool

    inside: asyncio.Queue[str] = asyncio.Queue()
    release = asyncio.Event()

    async def slow_step(item: str) -> str:
        """One step that takes a while."""
        inside.put_nowait(item)
        await release.wait()
        return f"did {item}"

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = (request.ledger or {}).get("next")
        if not nxt:
            return ModelResponse("All closed.")
        return ModelResponse(f"doing {nxt}", (tool_call("slow_step", item=nxt),))

    ids = []
    for n in range(2):
        spec = parse_spec(
            {
                "name": f"t{n}",
                "objective": "two steps",
                "items": [
                    {"id": f"s{n}{k}", "title": f"step {k}",
                     "done_when": {"kind": "op", "tool": "slow_step", "args": {"item": f"s{n}{k}"}}}
                    for k in (1, 2)
                ],
                "tools": ["slow_step"],
                "models": {"judge": "rules"},
            }
        )  # fmt: skip
        ids.append((await create_task(db, spec)).task_id)
        clock = getattr(db, "clock", None)
        assert isinstance(clock, FakeClock)
        clock.advance(1)
    reports = Reports()
    w = make_worker(
        db,
        ModelSet(actor=ScriptedModel(policy=actor)),
        reports,
        registry=ToolRegistry([tool(slow_step, effect="write", idempotent=True)]),
        concurrency=2,
    )
    running = asyncio.create_task(w.run())
    try:
        got = {await asyncio.wait_for(inside.get(), LIMIT) for _ in range(2)}
        assert got == {"s01", "s11"}
        w.stop.set()
        release.set()
        stats = await asyncio.wait_for(running, LIMIT)
    finally:
        release.set()
        w.stop.set()
        await asyncio.wait_for(running, LIMIT)
    assert (stats.ran, stats.failed) == (2, 0)
    for tid in ids:
        task = await db.get_task(tid)
        assert task.lease_owner is None and task.status == "queued"
        ledger = (await db.get_ledger(tid)).to_ledger()
        assert ledger.progress().done == 1  # the step in flight finished and was committed
    assert inside.empty()  # no second step started


async def test_a_fault_of_the_worker_itself_is_raised_after_the_other_runs_drain(
    db: Store, tmp_path: Path
) -> None:
    """A fault outside any task's run (here the caller's `on_result` raising) ends
    `run()` with that error, as it did one task at a time; the other run under way is
    first stopped at its step and handed back, not abandoned with its lease."""
    ids = [await queue(db, tmp_path, n, items=3) for n in range(2)]
    gates = Gates()
    fault = RuntimeError("the caller's report hook broke")

    def on_result(result: RunResult) -> None:
        raise fault

    w = Worker(
        db,
        gates.models_for,
        worker_id="w1",
        lease_ttl=30,
        clock=getattr(db, "clock", None),
        on_result=on_result,
        concurrency=2,
    )
    running = asyncio.create_task(w.run())
    try:
        for n in range(2):
            assert await gates.wait_entered(f"t{n}") == 1
        gates.open("t0")  # t0 runs to its end; its report raises
        with pytest.raises(RuntimeError, match="report hook broke"):
            await asyncio.wait_for(running, LIMIT)
    finally:
        gates.open_all()
        w.stop.set()
        if not running.done():
            await asyncio.wait_for(running, LIMIT)
    assert (await db.get_task(ids[0])).status == "satisfied"
    other = await db.get_task(ids[1])
    assert other.lease_owner is None and other.status == "queued"
    assert gates.rounds["t1"] == 1


# --------------------------------------------------------------------------- grace


async def _in_second_round(w: Worker, gates: Gates, names: list[str]) -> asyncio.Task[Any]:
    """`w` running, each task of `names` held in its second round's model call."""
    running = asyncio.create_task(w.run())
    for name in names:
        assert await gates.wait_entered(name) == 1
        gates.open(name)
    gates._gates.clear()  # closed again: the second rounds wait in them
    for name in names:
        assert await gates.wait_entered(name) == 2
    return running


async def test_a_grace_lets_the_rounds_in_flight_finish_their_model_call_and_commit(
    db: Store, tmp_path: Path
) -> None:
    """With a grace, a stop lets each round under way finish — its model call included —
    and commit it; no further round starts, no task is claimed, each lease is handed back."""
    ids = [await queue(db, tmp_path, n, items=4) for n in range(2)]
    waiting = await queue(db, tmp_path, 2)
    gates, reports, said = Gates(), Reports(), asyncio.Event()
    lines: list[str] = []

    def on_stopping(line: str) -> None:
        lines.append(line)
        said.set()

    w = make_worker(
        db, gates.models_for, reports, concurrency=2, grace=LIMIT, on_stopping=on_stopping
    )
    running = await _in_second_round(w, gates, ["t0", "t1"])
    try:
        w.stop.set()
        await asyncio.wait_for(said.wait(), LIMIT)
        assert not running.done()  # the model calls are still in flight, not abandoned
        assert w.drain.runs.is_set() and not w.drain.runs.stopped
        gates.open_all()
        stats = await asyncio.wait_for(running, LIMIT)
    finally:
        await wind_down(w, gates, running)
    assert (stats.ran, stats.failed) == (2, 0)
    assert "2 run(s) finish their round" in lines[0] and len(lines) == 1
    for n, tid in enumerate(ids):
        task = await db.get_task(tid)
        assert (task.status, task.lease_owner) == ("queued", None)
        assert (await db.get_ledger(tid)).to_ledger().progress().done == 2  # round 2 kept
        assert gates.rounds[f"t{n}"] == 2  # and no third one
    assert [e.type for e in await db.read_events(waiting)] == ["task.created"]


@pytest.mark.parametrize("how", ["grace over", "asked again"])
async def test_after_the_grace_a_run_stops_at_a_safe_point_and_another_worker_takes_it_at_once(
    db: Store, tmp_path: Path, how: str
) -> None:
    """A model call that outlasts the grace (or a second signal) is abandoned: the round
    in flight leaves nothing, the first one stays committed, and the lease is released —
    not left to expire (the fake clock never moves): the next worker claims it at once."""
    tid = await queue(db, tmp_path, 0, items=3)
    gates, lines = Gates(), []
    grace = 0.05 if how == "grace over" else LIMIT
    w = make_worker(db, gates.models_for, Reports(), grace=grace, on_stopping=lines.append)
    running = await _in_second_round(w, gates, ["t0"])
    try:
        w.drain.signalled()  # as SIGTERM does
        if how == "asked again":
            w.drain.signalled()
        stats = await asyncio.wait_for(running, LIMIT)
    finally:
        await wind_down(w, gates, running)
    assert (stats.ran, stats.failed) == (1, 0)
    assert any(line.startswith(how) for line in lines), lines
    task = await db.get_task(tid)
    assert (task.status, task.lease_owner) == ("queued", None)
    assert (await db.get_ledger(tid)).to_ledger().progress().done == 1

    again = make_worker(db, gates.models_for, Reports(), worker_id="w2", once=True)
    assert (await asyncio.wait_for(again.run(), LIMIT)).ran == 1
    assert (await db.get_task(tid)).status == "satisfied"


async def test_pool_size_is_checked_and_sizes_the_postgres_pool(db: Store) -> None:
    """`pool_size` sizes the connections of a PostgreSQL store's pool (and its threads);
    SQLite has no pool to size; a size below 1 is refused."""
    gates = Gates()
    with pytest.raises(errors.UserError, match="pool size"):
        make_worker(db, gates.models_for, Reports(), pool_size=0)
    make_worker(db, gates.models_for, Reports(), pool_size=3)
    pool = getattr(db, "_pool", None)
    if pool is not None:
        # Held at that size (not grown on demand as runs wait for a connection).
        assert (pool.min_size, pool.max_size) == (3, 3)
        pool.wait(timeout=LIMIT)
        assert pool.get_stats()["pool_size"] == 3
        assert db._executor._max_workers == 3  # type: ignore[attr-defined]
