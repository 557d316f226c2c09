"""A task that crashes again and again before finishing a round fails, instead of being
restarted forever."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.loop import events_of, honest_actor, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.store.memory import MemoryStore


class Crashing:
    """A model whose process dies (SystemExit stands for a SIGKILL) at every call, or
    from call `works_from` on answers honestly."""

    name = "crashing"

    def __init__(self, works_from: int | None = None) -> None:
        self.calls = 0
        self.works_from = works_from

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.works_from is not None and self.calls >= self.works_from:
            return honest_actor(request)
        raise SystemExit("the worker died")


async def _restart(store: MemoryStore, tid: str, model: Crashing) -> str | None:
    try:
        result = await Engine(store, ModelSet(model), lease_ttl=30).run(tid, force=True)
    except SystemExit:
        return None
    return result.status


async def test_a_crash_loop_ends_failed(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    spec = spec_of(2, limits={"max_crash_restarts": 3})
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    model = Crashing()
    outcomes = [await _restart(store, tid, model) for _ in range(6)]
    # The first run starts the task and crashes; three restarts crash too; the next one
    # does not ask the model again: the task fails.
    assert outcomes[:4] == [None] * 4 and outcomes[4] == "failed"
    task = await store.get_task(tid)
    assert (task.status, task.stop_reason) == ("failed", "environment_unrecoverable")
    assert model.calls == 4
    (warning,) = [
        w for w in await events_of(store, tid, "audit.warning") if w["code"] == "crash_loop"
    ]
    assert "crashed 4 times in a row" in warning["message"]


@pytest.mark.parametrize("works_from", [2, 4])
async def test_a_crash_then_progress_resets_the_count(tmp_path: Path, works_from: int) -> None:
    store = await MemoryStore.open()
    spec = spec_of(2, limits={"max_crash_restarts": 3})
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    model = Crashing(works_from=works_from)
    results = [await _restart(store, tid, model) for _ in range(works_from)]
    assert results[-1] == "satisfied"
