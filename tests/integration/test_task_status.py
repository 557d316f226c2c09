"""`task_status`: a task's state as one object, whose `to_dict()` is `status --json`."""

from __future__ import annotations

from pathlib import Path

import pytest

import tether
from tests.support.loop import honest_actor, run_task, spec_of
from tether.models.scripted import ScriptedModel
from tether.store.base import Store


async def test_task_status_of_a_finished_task(store: Store, tmp_path: Path) -> None:
    task_id, _ = await run_task(
        store, spec_of(2, models={"judge": "rules"}), tmp_path, ScriptedModel(policy=honest_actor)
    )
    status = await tether.task_status(store, task_id)
    assert status.status == "satisfied"
    assert (status.progress.done, status.progress.total) == (2, 2)
    assert status.budget["used"]["rounds"] == status.task.usage["rounds"] > 0
    doc = status.to_dict()
    assert doc == await tether.status_dict(store, task_id)
    assert doc["ledger"]["progress"] == status.progress.to_dict()
    assert [i["id"] for i in doc["ledger"]["items"]] == ["i1", "i2"]
    assert all(i["status"] == "done" and i["evidence"] for i in doc["ledger"]["items"])


async def test_task_status_of_an_unknown_task(store: Store) -> None:
    with pytest.raises(tether.TaskNotFound):
        await tether.task_status(store, "t-nope")
