"""The runtime and requests that closed: a call whose request closed is never sent,
and a re-opened task asks again about an op in doubt whose request closed with the
task, instead of taking the close for an answer (which would send it again)."""

from __future__ import annotations

from pathlib import Path

import tether
from tether import approvals, decisions, edits
from tether.models.base import ModelRequest, ModelResponse
from tether.store import Store, open_store
from tether.tools.builtin.files import default_registry


def actor(request: ModelRequest) -> ModelResponse:
    if any(m.role == "tool" for m in request.messages):
        return ModelResponse("waiting for the result")
    return ModelResponse("sending", (tether.tool_call("send_notice", to="team"),))


async def run(store: Store, tid: str | None, sent: list[str], tmp_path: Path) -> tuple[str, str]:
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
    return tid, (await engine.run(tid)).status


async def test_an_op_in_doubt_closed_with_its_task_is_asked_about_again_on_reopen(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/t.db")
    try:
        sent: list[str] = []
        tid, status = await run(store, None, sent, tmp_path)
        assert status == "waiting" and len(sent) == 1
        (doubt,) = await approvals.pending(store, tid)
        assert doubt.request["kind"] == "op_in_doubt"
        await decisions.abandon_task(store, tid, reason="later", by="ana")
        (closed,) = await store.get_approvals(tid)
        assert closed.status == "closed"
        # An edit re-opens the task; the run must not take the close for "send again".
        await edits.edit_task(store, tid, {"limits": {"max_rounds": 50}}, by="ana")
        _, status = await run(store, tid, sent, tmp_path)
        assert status == "waiting" and len(sent) == 1, sent
        (again,) = await approvals.pending(store, tid)
        assert again.request_id == f"{doubt.request_id}.reopened2"
        assert again.op_id == doubt.op_id and again.request["kind"] == "op_in_doubt"
        await approvals.decide(store, tid, again.request_id, "done", by="ana", result="sent")
        _, status = await run(store, tid, sent, tmp_path)
        assert status == "satisfied" and len(sent) == 1
    finally:
        await store.close()


def two_items(request: ModelRequest) -> ModelResponse:
    item = (request.ledger or {}).get("next")
    if item is None:
        return ModelResponse("All done.")
    return ModelResponse(f"doing {item}", (tether.tool_call(f"do_{item}", x=1),))


async def test_waiving_an_item_whose_exhausted_call_awaits_a_person_never_tries_it_again(
    tmp_path: Path,
) -> None:
    calls: list[str] = []

    @tether.tool(
        effect="write",
        retry=tether.RetryPolicy(max_attempts=1, base_delay=0, on_exhausted="ask_human"),
    )
    def do_a(x: int, ctx: tether.ToolContext) -> str:
        """Always down."""
        calls.append(ctx.op_id)
        raise tether.ToolFailed("the service is down", retryable=True)

    @tether.tool(effect="write")
    def do_b(x: int) -> str:
        """Works."""
        return "ok"

    spec = tether.parse_spec(
        {
            "objective": "two calls",
            "items": [
                {"id": i, "title": i, "done_when": {"kind": "op", "tool": f"do_{i}"}}
                for i in ("a", "b")
            ],
            "tools": ["do_a", "do_b"],
            "models": {"judge": "rules"},
        }
    )
    store = await open_store(f"sqlite:///{tmp_path}/t.db")
    try:
        tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
        registry = default_registry(lambda: store)
        registry.add(do_a)
        registry.add(do_b)

        async def go() -> str:
            engine = tether.Engine(
                store, tether.ModelSet(tether.ScriptedModel(policy=two_items)), registry=registry
            )
            return (await engine.run(tid)).status

        assert await go() == "waiting" and len(calls) == 1
        (asked,) = await approvals.pending(store, tid)
        assert asked.request["kind"] == "op_exhausted"
        await decisions.waive_item(store, tid, "a", reason="not today", by="ana")
        (closed,) = await store.get_approvals(tid)
        assert closed.status == "closed" and "item a waived by ana" in str(closed.decision)
        assert await go() == "satisfied"
        assert len(calls) == 1  # never tried again
        task = await store.get_task(tid)
        assert task.stop_reason == "delivered_with_waivers"
        (op,) = await store.get_ops(tid, op_ids={asked.op_id or ""})
        assert op.status == "failed" and "was closed" in str(op.error)
    finally:
        await store.close()
