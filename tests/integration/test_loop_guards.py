"""Loop guards: milestone round limits, budgets, unreadable verdicts, failing providers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.loop import by_purpose, events_of, honest_actor, run_task, spec_of
from tether import errors
from tether.models.base import ModelRequest, ModelResponse, Usage
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore
from tether.tokens import Calibrator


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def _stuck(_: ModelRequest) -> ModelResponse:
    return ModelResponse("looking around", (tool_call("list_files"),))


async def test_milestone_round_limit_waits_for_a_human(store: MemoryStore, tmp_path: Path) -> None:
    spec = spec_of(
        2,
        milestones=[{"id": "m1", "title": "first"}],
        items=[
            {"id": "i1", "title": "t1", "milestone": "m1",
             "done_when": {"kind": "file", "path": "out/i1.txt"}},
            {"id": "i2", "title": "t2", "done_when": {"kind": "file", "path": "out/i2.txt"}},
        ],
        limits={"max_rounds_per_milestone": 3, "no_progress_rounds": 100},
    )  # fmt: skip
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=_stuck))
    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and "milestone m1 used its 3 rounds" in task.waiting["reason"]
    assert task.usage["rounds"] == 3
    assert task.current_milestone == "m1"


async def test_budget_thresholds_then_suspension(store: MemoryStore, tmp_path: Path) -> None:
    def costly(request: ModelRequest) -> ModelResponse:
        resp = _stuck(request)
        return ModelResponse(resp.text, resp.tool_calls, Usage(input_tokens=900, output_tokens=100))

    spec = spec_of(1, budget={"tokens": 5000}, limits={"no_progress_rounds": 100})
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=costly))
    assert result.status == "suspended"
    marks = [(e["resource"], e["percent"]) for e in await events_of(store, tid, "budget.threshold")]
    assert marks == [("tokens", 50), ("tokens", 80), ("tokens", 100)]
    task = await store.get_task(tid)
    used = task.usage["input_tokens"] + task.usage["output_tokens"]
    # The hard cap is never exceeded by more than one model call.
    assert 5000 <= used <= 5000 + 1000
    assert task.waiting is not None and task.waiting["kind"] == "budget"
    status = [e["dst"] for e in await events_of(store, tid, "task.status")]
    assert status[-1] == "suspended"


async def test_unreadable_verdict_is_retried_once_then_no_change(
    store: MemoryStore, tmp_path: Path
) -> None:
    answers = iter(["I think it went well!", "still not JSON"] + ['{"decision": "continue"}'] * 20)
    judge = ScriptedModel(policy=lambda r: next(answers))
    tid, result = await run_task(
        store, spec_of(2), tmp_path, ScriptedModel(policy=honest_actor), judge=judge
    )
    assert result.status == "satisfied"
    warns = [
        w for w in await events_of(store, tid, "audit.warning") if w["code"] == "verdict_unparsed"
    ]
    assert len(warns) == 1
    calls = [e for e in await events_of(store, tid, "model.called") if e["purpose"] == "judge"]
    assert [c["round"] for c in calls[:3]] == [1, 1, 2]  # one retry in round 1
    # The rules still moved the ledger in round 1: an unreadable verdict blocks nothing.
    verdicts = await events_of(store, tid, "judge.verdict")
    assert verdicts[0]["done"] == 1


class _Down:
    name = "down"

    def __init__(self, transient: bool) -> None:
        self.transient = transient

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise errors.ModelError("503 service unavailable", transient=self.transient, status=503)


@pytest.mark.parametrize(("transient", "kind"), [(True, "external"), (False, "human")])
async def test_a_failing_provider_makes_the_task_wait_not_die(
    store: MemoryStore, tmp_path: Path, transient: bool, kind: str
) -> None:
    tid, result = await run_task(store, spec_of(1), tmp_path, _Down(transient))  # type: ignore[arg-type]
    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == kind
    assert (task.wake_at is not None) == transient
    failed = await events_of(store, tid, "model.failed")
    assert len(failed) == 1 and failed[0]["transient"] is transient


async def test_the_estimator_follows_the_providers_counts(
    store: MemoryStore, tmp_path: Path
) -> None:
    cal = Calibrator()
    for _ in range(10):
        cal.observe(1000, 1500)
    assert cal.ratio == pytest.approx(1.5)
    assert cal.scale(2000) >= 2900
    cal.observe(1000, 10)  # an absurd report is clamped, not trusted
    assert cal.ratio > 1.0

    def heavy(request: ModelRequest) -> ModelResponse:
        # A provider whose tokenizer counts twice what we estimate.
        from tether import tokens

        resp = honest_actor(request)
        est = tokens.estimate_request(request)
        return ModelResponse(
            resp.text, resp.tool_calls, Usage(input_tokens=2 * est, output_tokens=5)
        )

    tid, result = await run_task(store, spec_of(3), tmp_path, ScriptedModel(policy=heavy))
    assert result.status == "satisfied"
    task = await store.get_task(tid)
    assert 1.8 <= task.usage["token_ratio"] <= 2.0


async def test_per_purpose_usage_is_tracked(store: MemoryStore, tmp_path: Path) -> None:
    model = ScriptedModel(
        policy=by_purpose(act=honest_actor, judge=lambda r: '{"decision": "continue"}')
    )
    tid, _ = await run_task(store, spec_of(2), tmp_path, model, judge=model)
    usage = (await store.get_task(tid)).usage
    assert usage["by_purpose"]["act"]["calls"] == 2
    assert usage["by_purpose"]["judge"]["calls"] == 2
    assert usage["model_calls"] == 4


async def test_a_milestone_budget_suspends_the_task(store: MemoryStore, tmp_path: Path) -> None:
    def costly(request: ModelRequest) -> ModelResponse:
        resp = _stuck(request)
        return ModelResponse(resp.text, resp.tool_calls, Usage(input_tokens=400, output_tokens=100))

    spec = spec_of(
        2,
        milestones=[{"id": "m1", "title": "first", "budget": {"tokens": 2000}}],
        items=[
            {"id": "i1", "title": "t1", "milestone": "m1",
             "done_when": {"kind": "file", "path": "out/i1.txt"}},
            {"id": "i2", "title": "t2", "done_when": {"kind": "file", "path": "out/i2.txt"}},
        ],
        limits={"no_progress_rounds": 100},
    )  # fmt: skip
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=costly))
    assert result.status == "suspended"
    marks = [(e["scope"], e["percent"]) for e in await events_of(store, tid, "budget.threshold")]
    assert marks == [("milestone:m1", 50), ("milestone:m1", 80), ("milestone:m1", 100)]
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["scope"] == "milestone:m1"
    assert 2000 <= task.usage["milestone_usage"]["m1"]["tokens"] <= 2000 + 500
