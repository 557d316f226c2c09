"""Changing a running task: new versions of its contract, and messages to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.loop import events_of, honest_actor, ledger_of, run_task, spec_of
from tether import errors
from tether.edits import edit_task, tell
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.store.base import TaskPatch
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


async def test_raising_max_rounds_lets_a_stopped_task_go_on(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = spec_of(4, limits={"max_rounds": 2})
    tid, first = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor))
    assert first.status == "waiting" and "max_rounds" in first.waiting["reason"]  # type: ignore[index]
    task = await edit_task(store, tid, {"limits": {"max_rounds": 10}}, by="ana")
    assert (task.status, task.version) == ("queued", 2)
    assert task.spec["limits"]["max_rounds"] == 10
    assert task.spec["limits"]["no_progress_rounds"] == spec.limits.no_progress_rounds  # merged
    led = await ledger_of(store, tid)
    assert [s.status for _, s in led.items()] == ["done", "done", "pending", "pending"]
    _, done = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor), task_id=tid)
    assert done.status == "satisfied"
    (edited,) = await events_of(store, tid, "task.edited")
    assert (edited["old_version"], edited["new_version"], edited["by"]) == (1, 2, "ana")
    turns = await events_of(store, tid, "turn.started")
    assert turns[-1]["epoch"] is True and turns[-1]["epoch_reason"] == "goal changed"


async def test_raising_a_budget_resumes_a_suspended_task(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = spec_of(3, budget={"rounds": 1})
    tid, first = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor))
    assert first.status == "suspended"
    await edit_task(store, tid, {"budget": {"rounds": 50}})
    _, done = await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor), task_id=tid)
    assert done.status == "satisfied"


async def test_items_added_changed_and_dropped(store: MemoryStore, tmp_path: Path) -> None:
    spec = spec_of(3)
    tid, first = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=2
    )
    assert first.status == "queued"
    items = [i.model_dump(mode="json") for i in spec.items]
    items[1]["title"] = "write out/i2.txt again, differently"  # i2 changes: starts over
    del items[2]  # i3 is dropped
    items.append(
        {
            "id": "i4",
            "title": "write out/i4.txt",
            "done_when": {"kind": "file", "path": "out/i4.txt"},
        }
    )
    task = await edit_task(store, tid, {"items": items, "objective": "write the new files"})
    led = await ledger_of(store, tid)
    assert [d.id for d, _ in led.items()] == ["i1", "i2", "i4"]
    assert led.item("i1").status == "done" and led.item("i1").evidence  # kept
    assert led.item("i2").status == "pending" and not led.item("i2").evidence
    assert led.skeleton.objective == "write the new files"
    (edited,) = await events_of(store, tid, "task.edited")
    assert edited["invalidated"] == ["i2"]
    seen: list[ModelRequest] = []

    def actor(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return honest_actor(request)

    _, done = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor), task_id=tid)
    assert done.status == "satisfied" and task.version == 2
    assert "write the new files" in seen[0].system and "i4" in seen[0].system


async def test_a_bad_edit_is_refused_and_changes_nothing(
    store: MemoryStore, tmp_path: Path
) -> None:
    tid, _ = await run_task(
        store, spec_of(2), tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    before = await store.get_task(tid)
    for bad in ({"items": []}, {"limits": {"max_rounds": -1}}, {"nonsense": 1}, {}):
        with pytest.raises(errors.UserError):
            await edit_task(store, tid, bad)
    after = await store.get_task(tid)
    assert (after.version, after.spec, after.last_seq) == (
        before.version,
        before.spec,
        before.last_seq,
    )


async def test_the_workspace_cannot_be_edited(store: MemoryStore, tmp_path: Path) -> None:
    tid, _ = await run_task(
        store, spec_of(2), tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    before = await store.get_task(tid)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(errors.UserError, match="workspace is fixed when the task is created"):
        await edit_task(store, tid, {"workspace": str(elsewhere)})
    after = await store.get_task(tid)
    assert (after.version, after.spec, after.workspace) == (
        before.version,
        before.spec,
        before.workspace,
    )
    # an edit that leaves it as it is goes through
    task = await edit_task(store, tid, {"limits": {"max_rounds": 50}})
    assert task.version == 2 and task.workspace == before.workspace


async def test_a_running_task_is_edited_by_its_worker_later(
    store: MemoryStore, tmp_path: Path
) -> None:
    tid, _ = await run_task(
        store, spec_of(2), tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    lease = await store.claim("someone", 60, task_id=tid)
    assert lease is not None
    await store.commit(
        tid,
        lease.token,
        [],
        task=TaskPatch(status="running"),
    )
    task = await edit_task(store, tid, {"limits": {"max_rounds": 9}})
    assert (task.status, task.version) == ("running", 1)  # its worker applies it later
    (requested,) = await events_of(store, tid, "task.edit_requested")
    assert requested["changes"] == {"limits": {"max_rounds": 9}}


async def test_tell_answers_a_need_help(store: MemoryStore, tmp_path: Path) -> None:
    answered: list[str] = []

    def actor(request: ModelRequest) -> ModelResponse:
        said = [m.content for m in request.messages if "Message from the user" in m.content]
        if not said:
            return ModelResponse("NEED_HELP: which folder do the files go in?")
        answered.extend(said)
        return honest_actor(request)

    tid, first = await run_task(store, spec_of(1), tmp_path, ScriptedModel(policy=actor))
    assert first.status == "waiting" and first.waiting["kind"] == "human"  # type: ignore[index]
    task = await tell(store, tid, "they go in out/", by="ana")
    assert task.status == "queued"
    _, done = await run_task(store, spec_of(1), tmp_path, ScriptedModel(policy=actor), task_id=tid)
    assert done.status == "satisfied"
    assert answered and "they go in out/" in answered[0]
    with pytest.raises(errors.UserError):
        await tell(store, tid, "too late")  # satisfied: terminal
    with pytest.raises(errors.UserError):
        await tell(store, tid, "   ")


async def test_items_added_removed_and_changed_by_id(store: MemoryStore, tmp_path: Path) -> None:
    tid, _ = await run_task(
        store, spec_of(3), tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=2
    )
    task = await edit_task(
        store,
        tid,
        add_items=[{"id": "i9", "title": "write out/i9.txt"}],
        remove_items=["i3"],
        update_items={"i2": {"title": "write out/i2.txt twice"}},
        by="ana",
    )
    assert task.version == 2
    led = await ledger_of(store, tid)
    assert [d.id for d, _ in led.items()] == ["i1", "i2", "i9"]
    assert led.item("i1").status == "done" and led.item("i2").status == "pending"
    (edited,) = await events_of(store, tid, "task.edited")
    assert edited["invalidated"] == ["i2"] and edited["by"] == "ana"
    with pytest.raises(errors.UserError, match="no item 'i7'"):
        await edit_task(store, tid, remove_items=["i7"])
    assert (await store.get_task(tid)).version == 2
