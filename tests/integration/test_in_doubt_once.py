"""An approval to resend an op in doubt permits one send, not a standing permission:
when the resent call's outcome is lost too, a human is asked again."""

from __future__ import annotations

from pathlib import Path

import tether
from tests.support.loop import events_of
from tether import approvals
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry


def actor(request: ModelRequest) -> ModelResponse:
    if any(m.role == "tool" for m in request.messages):
        return ModelResponse("waiting for the result")
    return ModelResponse("sending", (tether.tool_call("send_notice", to="team"),))


async def run(
    store: MemoryStore, tid: str | None, sent: list[str], tmp_path: Path
) -> tuple[str, tether.RunResult]:
    @tether.tool(effect="send", idempotent=False)
    def send_notice(to: str, ctx: tether.ToolContext) -> str:
        """Send a notice; the connection drops after the send every time."""
        sent.append(ctx.op_id)
        raise tether.OutcomeUnknown("the connection dropped after sending")

    spec = tether.parse_spec(
        {
            "objective": "notify the team",
            "items": [
                {"id": "n", "title": "notify", "done_when": {"kind": "op", "tool": "send_notice"}}
            ],
            "tools": [{"name": "send_notice", "approval": False}],
            "models": {"judge": "rules"},
        }
    )
    if tid is None:
        tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(send_notice)
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
    )
    return tid, await engine.run(tid)


async def test_each_lost_outcome_asks_a_human_again(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    sent: list[str] = []
    tid, first = await run(store, None, sent, tmp_path)
    assert first.status == "waiting" and len(sent) == 1
    (req1,) = await approvals.pending(store, tid)
    assert req1.request["kind"] == "op_in_doubt"
    await approvals.decide(store, tid, req1.request_id, "approve", by="ops")  # send it again

    _, second = await run(store, tid, sent, tmp_path)
    # One resend, whose outcome was lost again: a new question, not a third send.
    assert second.status == "waiting" and len(sent) == 2
    (req2,) = await approvals.pending(store, tid)
    assert req2.request_id != req1.request_id and req2.op_id == req1.op_id
    assert set(sent) == {req1.op_id}  # always the same idempotency key

    _, third = await run(store, tid, sent, tmp_path)  # a resume only waits again
    assert third.status == "waiting" and len(sent) == 2

    await approvals.decide(store, tid, req2.request_id, "done", by="ops", result="delivered")
    _, done = await run(store, tid, sent, tmp_path)
    assert done.status == "satisfied" and len(sent) == 2
    asked = [e["request_id"] for e in await events_of(store, tid, "approval.requested")]
    assert asked == [req1.request_id, req2.request_id]
