"""Adversaries whose own tests raise the limits (to reach another guard first), refused at
the contract's default limits: a model that loops on the same call gets each item
blocked within `no_progress_rounds` rounds of its last new one, long before a milestone's
round limit or a budget would stop it, and the task waits for a human's decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adversarial._honest import block_events
from tests.support.adversarial import assert_honest, assert_status_agrees, statuses
from tests.support.loop import run_task, spec_of
from tether.models.base import ModelRequest, ModelResponse, Usage
from tether.models.scripted import ScriptedModel, tool_call
from tether.spec import Limits
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def _stuck(_: ModelRequest) -> ModelResponse:
    # As in test_loop_guards: the same listing, round after round.
    return ModelResponse("looking around", (tool_call("list_files"),))


def _costly(request: ModelRequest) -> ModelResponse:
    resp = _stuck(request)
    return ModelResponse(resp.text, resp.tool_calls, Usage(input_tokens=400, output_tokens=100))


@pytest.mark.parametrize(
    ("policy", "extra"),
    [
        (_stuck, {"milestones": [{"id": "m1", "title": "first"}]}),
        (_costly, {"budget": {"tokens": 50_000}}),
        (_costly, {"milestones": [{"id": "m1", "title": "first", "budget": {"tokens": 20_000}}]}),
    ],
    ids=["milestone", "task-budget", "milestone-budget"],
)
async def test_a_looping_model_is_blocked_at_default_limits(
    store: MemoryStore, tmp_path: Path, policy: object, extra: dict[str, object]
) -> None:
    items = [
        {"id": "i1", "title": "t1", "done_when": {"kind": "file", "path": "out/i1.txt"}},
        {"id": "i2", "title": "t2", "done_when": {"kind": "file", "path": "out/i2.txt"}},
    ]
    if "milestones" in extra:
        items[0]["milestone"] = "m1"
    spec = spec_of(2, items=items, **extra)
    assert spec.limits == Limits()
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=policy))  # type: ignore[arg-type]
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    assert await statuses(store, tid) == {"i1": "blocked", "i2": "blocked"}
    npr = spec.limits.no_progress_rounds
    # The first listing is new; the repeats that follow are not (i2's first listing is
    # new for i2, the same call's result is the same).
    assert [(r, i) for r, i, _ in await block_events(store, tid)] == [
        (1 + npr, "i1"),
        (2 + 2 * npr, "i2"),
    ]
    task = await store.get_task(tid)
    assert task.usage["rounds"] == 2 + 2 * npr
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)
