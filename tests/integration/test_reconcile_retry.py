"""A reconcile that fails for a passing reason is asked again on the tool's schedule
before a human must decide."""

from __future__ import annotations

from pathlib import Path

import tether
from tests.support.loop import events_of
from tether import approvals, errors
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry
from tether.tools.retry import RetryPolicy


async def _run(tmp_path: Path, reconcile_failures: int) -> tuple[MemoryStore, str, list[str]]:
    done: dict[str, str] = {}
    asked: list[str] = []

    async def look(op: tether.OpRecord, ctx: tether.ToolContext) -> tether.Reconciliation:
        asked.append(op.op_id)
        if len(asked) <= reconcile_failures:
            raise errors.RetryLater("503 Service Unavailable", delay=0.01)
        return (
            tether.Reconciliation("done", done[op.op_id])
            if op.op_id in done
            else (tether.Reconciliation("not_done"))
        )

    @tether.tool(
        effect="send",
        idempotent=False,
        reconcile=look,
        retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05),
    )
    def notify(to: str, ctx: tether.ToolContext) -> str:
        """Sends, but the answer is lost."""
        done[ctx.op_id] = f"sent to {to}"
        raise errors.OutcomeUnknown("connection reset after sending")

    def actor(request: ModelRequest) -> ModelResponse:
        if any(m.role == "tool" for m in request.messages):
            return ModelResponse("done")
        return ModelResponse("notifying", (tether.tool_call("notify", to="team"),))

    store = await MemoryStore.open()
    spec = tether.parse_spec(
        {
            "objective": "notify",
            "items": [{"id": "n", "title": "n", "done_when": {"kind": "op", "tool": "notify"}}],
            "tools": [{"name": "notify", "approval": False}],
            "models": {"judge": "rules"},
        }
    )
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(notify)
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
    )
    await engine.run(tid)
    return store, tid, asked


async def test_a_passing_reconcile_failure_is_retried(tmp_path: Path) -> None:
    store, tid, asked = await _run(tmp_path, reconcile_failures=1)
    assert len(asked) == 2
    assert (await store.get_task(tid)).status == "satisfied"
    assert await approvals.pending(store, tid) == []
    (rec,) = await events_of(store, tid, "op.reconciled")
    assert rec["outcome"] == "done"


async def test_a_reconcile_that_keeps_failing_goes_to_a_human(tmp_path: Path) -> None:
    store, tid, asked = await _run(tmp_path, reconcile_failures=10)
    assert len(asked) == 3  # the tool's policy: 3 attempts
    task = await store.get_task(tid)
    assert task.status == "waiting" and task.waiting is not None
    (req,) = await approvals.pending(store, tid)
    assert req.request["kind"] == "op_in_doubt"
