"""A tool may decide while it runs that a call needs a human: `ApprovalRequired`."""

from __future__ import annotations

from pathlib import Path

import pytest

import tether
from tests.support.loop import events_of
from tether import approvals
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry


class Payments:
    """An outside system counting refunds by idempotency key."""

    def __init__(self) -> None:
        self.refunds: dict[str, int] = {}
        self.asked = 0


def setup(pay: Payments) -> tether.Tool:
    @tether.tool(effect="write", idempotent=True)
    def refund(amount: int, ctx: tether.ToolContext) -> str:
        """Refund an amount; over 100 needs a human's approval."""
        if amount > 100 and not ctx.approved:
            pay.asked += 1
            raise tether.ApprovalRequired(f"a refund of {amount} is over the 100 limit")
        pay.refunds[ctx.op_id] = amount
        return f"refunded {amount}"

    return refund


def actor(request: ModelRequest) -> ModelResponse:
    tool_msgs = [m for m in request.messages if m.role == "tool"]
    if tool_msgs:
        return ModelResponse("done")
    return ModelResponse("refunding", (tether.tool_call("refund", amount=420),))


async def run(
    store: MemoryStore, tid: str | None, pay: Payments, tmp_path: Path
) -> tuple[str, tether.RunResult]:
    spec = tether.parse_spec(
        {
            "objective": "refund the customer",
            "items": [
                {"id": "r", "title": "refund", "done_when": {"kind": "op", "tool": "refund"}}
            ],
            "tools": ["refund"],
            "models": {"judge": "rules"},
        }
    )
    if tid is None:
        tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(setup(pay))
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
    )
    return tid, await engine.run(tid)


async def test_the_call_waits_and_runs_once_approved(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    pay = Payments()
    tid, first = await run(store, None, pay, tmp_path)
    assert first.status == "waiting" and first.waiting is not None
    assert first.waiting["kind"] == "approval"
    (req,) = await approvals.pending(store, tid)
    assert req.request["impact"] == "the tool asks: a refund of 420 is over the 100 limit"
    assert pay.refunds == {}
    # A resume while the request is pending only waits again: no new request, no effect.
    _, again = await run(store, tid, pay, tmp_path)
    assert again.status == "waiting" and len(await approvals.pending(store, tid)) == 1
    assert pay.refunds == {}
    await approvals.decide(store, tid, req.request_id, "approve", by="ops")
    _, done = await run(store, tid, pay, tmp_path)
    assert done.status == "satisfied"
    assert list(pay.refunds.values()) == [420]
    assert list(pay.refunds) == [req.op_id]  # the same idempotency key
    assert len(await events_of(store, tid, "approval.requested")) == 1


@pytest.mark.parametrize("reason", ["", "not without a manager"])
async def test_a_rejection_goes_back_to_the_model(tmp_path: Path, reason: str) -> None:
    store = await MemoryStore.open()
    pay = Payments()
    tid, _ = await run(store, None, pay, tmp_path)
    (req,) = await approvals.pending(store, tid)
    await approvals.decide(store, tid, req.request_id, "reject", by="ops", reason=reason)
    _, after = await run(store, tid, pay, tmp_path)
    assert pay.refunds == {}
    results = await events_of(store, tid, "op.result")
    assert results[-1]["status"] == "failed" and results[-1]["error_class"] == "rejected"
    assert "not permitted: ops rejected refund" in results[-1]["error"]
    if reason:
        assert reason in results[-1]["error"]
    # The item's only call was refused: it is not done, and the task does not pretend.
    assert after.status == "waiting"
