"""`Engine.run(reconnect_for=...)` (what `tether run` uses): a commit whose connection is
lost is never sent again blindly.

A store that loses its connection in the middle of one commit — either after the commit
landed (the answer was lost) or before (the request was lost) — and then does not answer
for a few calls, as a restarting server would. Every commit of a run is hit in turn
(each one a fresh run): the run waits, takes the task up from what the store holds and
finishes it; the tool's effects, counted outside the store, happen once per item, and
the events are numbered without a gap. Past `reconnect_for` seconds without an answer
it raises `StoreUnavailable` saying so, and a later run finishes the task.
The real thing, against a PostgreSQL server that is killed: `test_pg_server`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.loop import next_item
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry

N_ITEMS = 2
LOST = "PostgreSQL at postgresql://db failed: server closed the connection unexpectedly"


class CutOffStore(MemoryStore):
    """Commit number `at` fails as a lost connection does: after landing (`landed`) or
    before. Then the next `down` reads fail as well (the server is away)."""

    at = 0
    landed = False
    down = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Set when the cut-off commit has failed.
        self.outage = asyncio.Event()

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.commits = getattr(self, "commits", 0) + 1
        if self.commits == self.at:
            if self.landed:
                await super().commit(*args, **kwargs)
            self.away = self.down
            self.outage.set()
            raise errors.StoreUnavailable(LOST)
        return await super().commit(*args, **kwargs)

    async def get_task(self, task_id: str) -> Any:
        if getattr(self, "away", 0) > 0:
            self.away -= 1
            raise errors.StoreUnavailable(LOST)
        return await super().get_task(task_id)


async def setup(tmp_path: Path) -> tuple[CutOffStore, str, tether.Engine, dict[str, int]]:
    sent: dict[str, int] = {}  # the outside world: item -> effects

    async def look(op: tether.OpRecord, ctx: tether.ToolContext) -> tether.Reconciliation:
        item = str(op.args["item"])
        return tether.Reconciliation("done" if sent.get(item) else "not_done", {"item": item})

    @tether.tool(effect="write", idempotent=False, reconcile=look)
    def record(item: str, ctx: tether.ToolContext) -> dict[str, str]:
        """Records an item in the outside world."""
        sent[item] = sent.get(item, 0) + 1
        return {"item": item}

    def actor(request: ModelRequest) -> ModelResponse:
        item = next_item(request)
        if item is None:
            return ModelResponse("all done")
        return ModelResponse(f"recording {item}", (tether.tool_call("record", item=item),))

    store = await CutOffStore.open()
    spec = tether.parse_spec(
        {
            "objective": "record the items",
            "items": [
                {"id": f"i{k}", "title": f"i{k}",
                 "done_when": {"kind": "op", "tool": "record", "args": {"item": f"i{k}"}}}
                for k in range(1, N_ITEMS + 1)
            ],
            "tools": [{"name": "record", "approval": False}],
            "models": {"judge": "rules"},
        }
    )  # fmt: skip
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(record)
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
    )
    return store, tid, engine, sent


async def assert_finished_once(store: CutOffStore, tid: str, sent: dict[str, int]) -> None:
    task = await MemoryStore.get_task(store, tid)
    assert task.status == "satisfied", task
    assert sent == {f"i{k}": 1 for k in range(1, N_ITEMS + 1)}
    seqs = [e.seq for e in await store.read_events(tid)]
    assert seqs == list(range(1, len(seqs) + 1))


async def commits_of_a_clean_run(tmp_path: Path) -> int:
    store, tid, engine, sent = await setup(tmp_path)
    await engine.run(tid)
    await assert_finished_once(store, tid, sent)
    return int(store.commits)


@pytest.mark.parametrize("landed", [False, True], ids=["request-lost", "answer-lost"])
async def test_every_commit_cut_off_is_settled_not_resent(tmp_path: Path, landed: bool) -> None:
    total = await commits_of_a_clean_run(tmp_path / "clean")
    assert total >= 4
    for at in range(1, total + 1):
        folder = tmp_path / f"cut-{at}"
        folder.mkdir()
        store, tid, engine, sent = await setup(folder)
        store.at, store.landed, store.down = at, landed, 1
        result = await engine.run(tid, reconnect_for=30)
        assert result.status == "satisfied", (at, result)
        await assert_finished_once(store, tid, sent)


async def test_without_reconnect_for_the_error_is_raised_at_once(tmp_path: Path) -> None:
    store, tid, engine, _ = await setup(tmp_path)
    store.at, store.down = 3, 1000
    with pytest.raises(errors.StoreUnavailable, match="closed the connection"):
        await engine.run(tid)


async def test_past_reconnect_for_it_gives_up_and_a_later_run_finishes(tmp_path: Path) -> None:
    store, tid, engine, sent = await setup(tmp_path)
    store.at, store.down = 3, 10**9
    start = time.monotonic()
    with pytest.raises(errors.StoreUnavailable) as raised:
        await engine.run(tid, reconnect_for=0.5)
    assert time.monotonic() - start < 30
    assert "did not come back in 0.5 s" in str(raised.value)
    assert f"tether resume {tid}" in str(raised.value)
    store.away = 0  # the server is back
    # The lease the outage cut off is still the old run's; this process takes it back.
    result = await engine.run(tid, force=True)
    assert result.status == "satisfied"
    await assert_finished_once(store, tid, sent)


async def test_a_stop_during_the_outage_gives_up_at_once(tmp_path: Path) -> None:
    store, tid, engine, _ = await setup(tmp_path)
    store.at, store.down = 3, 10**9
    run = asyncio.ensure_future(engine.run(tid, reconnect_for=3600))
    await asyncio.wait_for(store.outage.wait(), 60)
    engine.stop.set()
    with pytest.raises(errors.StoreUnavailable, match="the database went away"):
        await asyncio.wait_for(run, 60)


class CutOffCreate(MemoryStore):
    """`create_task` loses its connection, after landing (`landed`) or before; then the
    next `down` reads fail too."""

    landed = False
    down = 0

    async def create_task(self, *args: Any, **kwargs: Any) -> Any:
        self.creates = getattr(self, "creates", 0) + 1
        if self.creates == 1:
            if self.landed:
                await super().create_task(*args, **kwargs)
            self.away = self.down
            raise errors.StoreUnavailable(LOST)
        return await super().create_task(*args, **kwargs)

    async def get_task(self, task_id: str) -> Any:
        if getattr(self, "away", 0) > 0:
            self.away -= 1
            raise errors.StoreUnavailable(LOST)
        return await super().get_task(task_id)


SPEC = {"objective": "o", "items": [{"id": "i1", "title": "i1"}]}


@pytest.mark.parametrize("landed", [False, True], ids=["request-lost", "answer-lost"])
async def test_a_creation_cut_off_is_looked_up_not_repeated(tmp_path: Path, landed: bool) -> None:
    store = await CutOffCreate.open()
    store.landed, store.down = landed, 2
    task = await tether.create_task(store, tether.parse_spec(SPEC), reconnect_for=30)
    # Exactly one task, created once: looked up when it had landed, created when not.
    assert [t.task_id for t in await store.list_tasks()] == [task.task_id]
    assert store.creates == (1 if landed else 2)
    assert [e.type for e in await store.read_events(task.task_id)] == ["task.created"]


async def test_a_creation_cut_off_past_reconnect_for_names_the_task_id(tmp_path: Path) -> None:
    store = await CutOffCreate.open()
    store.down = 10**9
    with pytest.raises(errors.StoreUnavailable, match=r"tether status t\w+") as raised:
        await tether.create_task(store, tether.parse_spec(SPEC), reconnect_for=0.3)
    assert "whether it was is unknown" in str(raised.value)
    with pytest.raises(errors.StoreUnavailable):  # without reconnect_for: at once
        await tether.create_task(CutOffCreate(), tether.parse_spec(SPEC))
