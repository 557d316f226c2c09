"""Reaching a running task: pause it, tell it something, edit it — each honoured at the
run's next round boundary — and act on a task whose owner is gone."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.loop import events_of, honest_actor, ledger_of, run_task, spec_of
from tether import errors, lifecycle
from tether import events as ev
from tether.edits import edit_task, tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.runtime.engine import Engine, ModelSet, RunResult
from tether.runtime.round import history
from tether.runtime.takeover import owner_gone
from tether.runtime.tasks import cancel, create_task, pause, status_dict, unpause
from tether.store.base import Store, TaskPatch

Actor = Callable[[ModelRequest], Awaitable[ModelResponse]]


def blocking_actor(at_call: int) -> tuple[Actor, asyncio.Event, asyncio.Event, list[ModelRequest]]:
    """An honest actor whose `at_call`-th request blocks until `release` is set
    (`entered` says it is there: the run is mid-turn, inside a round)."""
    entered, release = asyncio.Event(), asyncio.Event()
    seen: list[ModelRequest] = []

    async def actor(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) == at_call:
            entered.set()
            await release.wait()
        return honest_actor(request)

    return actor, entered, release, seen


async def start(
    store: Store, tmp_path: Path, n_items: int, actor: Actor
) -> tuple[str, asyncio.Task[RunResult]]:
    task = await create_task(store, spec_of(n_items), workspace=tmp_path)
    engine = Engine(store, ModelSet(actor=ScriptedModel(policy=actor)), lease_ttl=30)
    return task.task_id, asyncio.create_task(engine.run(task.task_id))


async def test_pause_mid_turn_stops_at_the_round_boundary_and_resume_finishes(
    store: Store, tmp_path: Path
) -> None:
    actor, entered, release, seen = blocking_actor(2)
    tid, running = await start(store, tmp_path, 4, actor)
    await entered.wait()
    result = await pause(store, tid, by="ana", reason="lunch")
    assert (result.outcome, result.status) == ("requested", "running")
    release.set()
    ended = await running
    assert ended.status == "paused"
    assert len(seen) == 2  # the round under way finished; no third model call
    led = await ledger_of(store, tid)
    assert [s.status for _, s in led.items()] == ["done", "done", "pending", "pending"]
    moves = await events_of(store, tid, "task.status")
    assert (moves[-1]["src"], moves[-1]["dst"], moves[-1]["reason"]) == (
        "running",
        "paused",
        "paused by ana: lunch",
    )
    assert await store.claim("a-worker", 30) is None  # no worker takes a paused task
    again = await pause(store, tid)
    assert again.outcome == "already_paused"
    _, done = await run_task(
        store, spec_of(4), tmp_path, ScriptedModel(policy=honest_actor), task_id=tid
    )
    assert done.status == "satisfied"


async def test_pause_of_a_task_nobody_runs_is_at_once_and_unpause_queues_it(
    store: Store, tmp_path: Path
) -> None:
    tid, first = await run_task(
        store, spec_of(3), tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    assert first.status == "queued"
    result = await pause(store, tid, by="ana")
    assert (result.outcome, result.status) == ("paused", "paused")
    assert (await store.get_task(tid)).status == "paused"
    task = await unpause(store, tid, by="ana")
    assert task.status == "queued"
    with pytest.raises(errors.UserError, match="not paused"):
        await unpause(store, tid)


async def test_tell_mid_turn_reaches_the_very_next_model_request(
    store: Store, tmp_path: Path
) -> None:
    actor, entered, release, seen = blocking_actor(1)
    tid, running = await start(store, tmp_path, 3, actor)
    await entered.wait()
    await tell(store, tid, "name the files in lowercase", by="ana")
    release.set()
    assert (await running).status == "satisfied"
    told = "Message from the user: name the files in lowercase"
    assert not any(told in m.content for m in seen[0].messages)
    assert any(told in m.content for m in seen[1].messages)
    # The request rebuilt from the log is the one the model saw.
    calls = [
        e.data
        for e in await store.read_events(tid, types={"model.called"})
        if e.data["purpose"] == "act"
    ]
    rebuilt = await history.rebuild_request(store, tid, calls[1]["request"])
    assert rebuilt.messages == seen[1].messages


async def test_edit_of_a_running_task_is_applied_at_the_next_round(
    store: Store, tmp_path: Path
) -> None:
    actor, entered, release, _ = blocking_actor(1)
    tid, running = await start(store, tmp_path, 2, actor)
    await entered.wait()
    task = await edit_task(
        store,
        tid,
        add_items=[
            {
                "id": "extra",
                "title": "write out/extra.txt",
                "done_when": {"kind": "file", "path": "out/extra.txt"},
            }
        ],
        by="ana",
    )
    assert (task.status, task.version) == ("running", 1)  # queued, not yet applied
    with pytest.raises(errors.SpecError):  # a bad edit is refused at once
        await edit_task(store, tid, {"limits": {"max_rounds": -3}})
    release.set()
    done = await running
    assert done.status == "satisfied", done.waiting
    (requested,) = await store.read_events(tid, types={"task.edit_requested"})
    (edited,) = await events_of(store, tid, "task.edited")
    assert (edited["old_version"], edited["new_version"], edited["request"]) == (
        1,
        2,
        requested.seq,
    )
    final = await store.get_task(tid)
    assert final.version == 2 and [i["id"] for i in final.spec["items"]] == ["i1", "i2", "extra"]
    # The model worked on the new contract in the same run: the item it added is done.
    led = await ledger_of(store, tid)
    assert led.item("extra").status == "done"
    turns = await events_of(store, tid, "turn.started")
    assert turns[-1]["epoch_reason"] == "goal changed"


async def gone_task(store: Store, tmp_path: Path) -> str:
    """A task left `running` under the lease of a process of this machine that is gone."""
    tid, first = await run_task(
        store, spec_of(3), tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    assert first.status == "queued"
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()  # its pid is gone now
    owner = f"{socket.gethostname()}:{proc.pid}"
    lease = await store.claim(owner, 3600, task_id=tid)
    assert lease is not None
    task = await store.get_task(tid)
    change, patch = lifecycle.transition(task, "running", "start")
    await store.commit(tid, lease.token, [change], task=TaskPatch(**patch))
    return tid


@pytest.mark.parametrize("verb", ["edit", "cancel", "pause", "tell"])
async def test_a_dead_owner_does_not_lock_the_task(store: Store, tmp_path: Path, verb: str) -> None:
    tid = await gone_task(store, tmp_path)
    doc = await status_dict(store, tid)
    assert doc["status"] == "running" and "is gone" in doc["owner_gone"]
    if verb == "edit":
        task = await edit_task(store, tid, {"limits": {"max_rounds": 9}}, by="ana")
        assert (task.status, task.version) == ("queued", 2)
    elif verb == "cancel":
        assert (await cancel(store, tid, by="ana")).outcome == "cancelled"
    elif verb == "pause":
        assert (await pause(store, tid, by="ana")).outcome == "paused"
    else:
        assert (await tell(store, tid, "hello", by="ana")).status == "stalled"
    warnings = await events_of(store, tid, "audit.warning")
    assert any(w["code"] == "lease_taken_over" for w in warnings)
    doc = await status_dict(store, tid)
    assert doc["owner_gone"] is None and doc["lease"]["owner"] is None


async def test_an_expired_lease_is_owner_gone(store: Store, tmp_path: Path) -> None:
    tid = await gone_task(store, tmp_path)
    task = await store.get_task(tid)
    expiry = task.lease_expiry or 0.0
    assert owner_gone(task, expiry + 1) == f"the lease of {task.lease_owner} expired"
    assert owner_gone(task, expiry - 1) == f"process {task.lease_owner} is gone"
    me = f"{socket.gethostname()}:{os.getpid()}"  # a live owner: this very process
    assert owner_gone(replace(task, lease_owner=me), expiry - 1) is None
    assert owner_gone(replace(task, status="waiting"), expiry + 1) is None


async def test_an_edit_during_the_last_round_is_applied_when_the_run_ends(
    store: Store, tmp_path: Path
) -> None:
    actor, entered, release, _ = blocking_actor(2)  # the second and last item's call
    tid, running = await start(store, tmp_path, 2, actor)
    await entered.wait()
    extra = {"id": "extra", "title": "x", "done_when": {"kind": "file", "path": "out/extra.txt"}}
    await edit_task(store, tid, add_items=[extra], by="ana")
    release.set()
    done = await running
    assert done.status == "satisfied"
    assert (await store.get_task(tid)).version == 2
    assert (await ledger_of(store, tid)).item("extra").status == "done"
    moves = [(m["src"], m["dst"]) for m in await events_of(store, tid, "task.status")]
    assert ("satisfied", "queued") in moves  # delivered, re-opened by the edit, delivered


async def test_a_pause_during_a_round_that_ends_the_run_still_pauses(
    store: Store, tmp_path: Path
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def asks(request: ModelRequest) -> ModelResponse:
        entered.set()
        await release.wait()
        return ModelResponse("NEED_HELP: which folder?")

    tid, running = await start(store, tmp_path, 2, asks)
    await entered.wait()
    assert (await pause(store, tid, by="ana")).outcome == "requested"
    release.set()
    assert (await running).status == "paused"
    moves = [(m["src"], m["dst"]) for m in await events_of(store, tid, "task.status")]
    assert moves[-2:] == [("running", "waiting"), ("waiting", "paused")]


async def test_an_edit_left_pending_by_a_dead_owner_goes_under_a_later_one(
    store: Store, tmp_path: Path
) -> None:
    tid = await gone_task(store, tmp_path)
    # Requested while its worker lived; the worker died before the next round.
    await store.commit(tid, None, [ev.EditRequested(changes={"limits": {"max_rounds": 7}})])
    task = await edit_task(store, tid, {"limits": {"max_rounds": 9}}, by="ana")
    assert (task.version, task.spec["limits"]["max_rounds"]) == (3, 9)
    (requested,) = await store.read_events(tid, types={"task.edit_requested"})
    edited = await events_of(store, tid, "task.edited")
    assert [(e["new_version"], e["request"]) for e in edited] == [(2, requested.seq), (3, None)]
