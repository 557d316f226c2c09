"""Results that arrive stamped with an older task version: after an edit that changes
the goal they go to history and change nothing current (the item is not credited with
them; a call that never left is not sent); after an edit of limits only they still
count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.loop import events_of, ledger_of, next_item
from tether import approvals
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry

ITEM = {"id": "n", "title": "notify", "done_when": {"kind": "op", "tool": "send_notice"}}
GOAL_EDIT = {"items": [{**ITEM, "title": "notify the whole team"}]}
LIMIT_EDIT = {"limits": {"max_rounds": 50}}


class Outside:
    """The notice service: the first send's answer is lost, later ones arrive."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def tool(self, *, approval: bool) -> tether.Tool:
        @tether.tool(effect="send" if approval else "write", idempotent=False)
        def send_notice(to: str, ctx: tether.ToolContext) -> str:
            """Send a notice."""
            self.sent.append(ctx.op_id)
            if len(self.sent) == 1 and not approval:
                raise tether.OutcomeUnknown("the connection dropped after sending")
            return f"sent to {to}"

        return send_notice


def actor(request: ModelRequest) -> ModelResponse:
    """Sends while the ledger names the item as the next one."""
    if next_item(request) is None:
        return ModelResponse("everything is done")
    return ModelResponse("sending", (tether.tool_call("send_notice", to="team"),))


async def run(
    store: MemoryStore, tid: str | None, outside: Outside, tmp_path: Path, *, approval: bool
) -> tuple[str, tether.RunResult]:
    spec = tether.parse_spec(
        {
            "objective": "notify the team",
            "items": [ITEM],
            "tools": [{"name": "send_notice", "approval": approval}],
            "models": {"judge": "rules"},
        }
    )
    if tid is None:
        tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(outside.tool(approval=approval))
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
    )
    return tid, await engine.run(tid)


async def _in_doubt_then_edited(
    tmp_path: Path, edit: dict[str, Any]
) -> tuple[MemoryStore, str, Outside, tether.RunResult]:
    """A send whose answer was lost (a human must say), then an edit, then the human
    says it did happen, then the task goes on."""
    store = await MemoryStore.open()
    outside = Outside()
    tid, first = await run(store, None, outside, tmp_path, approval=False)
    assert first.status == "waiting"
    (doubt,) = await approvals.pending(store, tid)
    assert doubt.request["kind"] == "op_in_doubt"
    await edit_task(store, tid, edit, by="ana")
    await approvals.decide(store, tid, doubt.request_id, "done", by="ops")
    _, result = await run(store, tid, outside, tmp_path, approval=False)
    return store, tid, outside, result


async def test_a_late_result_after_a_goal_edit_is_history_only(tmp_path: Path) -> None:
    store, tid, outside, result = await _in_doubt_then_edited(tmp_path, GOAL_EDIT)
    first = f"{tid}.r1.c0"
    (late,) = [o for o in await store.get_ops(tid) if o.op_id == first]
    assert late.status == "succeeded" and late.task_version == 1
    assert (late.result or {})["superseded_by"] == 2
    # The item was credited with the send of the new version, not the late result.
    assert result.status == "satisfied"
    evidence = (await ledger_of(store, tid)).item("n").evidence
    assert f"op:{first}" not in evidence
    assert len(evidence) == 1 and outside.sent == [first, evidence[0].removeprefix("op:")]
    results = [e["op_id"] for e in await events_of(store, tid, "op.result")]
    assert first in results  # in the history all the same


async def test_a_late_result_after_a_limit_edit_still_counts(tmp_path: Path) -> None:
    store, tid, outside, result = await _in_doubt_then_edited(tmp_path, LIMIT_EDIT)
    first = f"{tid}.r1.c0"
    assert result.status == "satisfied"
    assert (await ledger_of(store, tid)).item("n").evidence == (f"op:{first}",)
    assert outside.sent == [first]  # never sent again


@pytest.mark.parametrize("edit", [GOAL_EDIT, LIMIT_EDIT])
async def test_a_call_waiting_for_approval_across_an_edit(
    tmp_path: Path, edit: dict[str, Any]
) -> None:
    store = await MemoryStore.open()
    outside = Outside()
    tid, first = await run(store, None, outside, tmp_path, approval=True)
    assert first.status == "waiting"
    (asked,) = await approvals.pending(store, tid)
    await edit_task(store, tid, edit, by="ana")
    await approvals.decide(store, tid, asked.request_id, "approve", by="ops")
    _, again = await run(store, tid, outside, tmp_path, approval=True)
    call = f"{tid}.r1.c0"
    if edit is LIMIT_EDIT:
        # The goal is the same: the approved call goes, once, and counts.
        assert again.status == "satisfied" and outside.sent == [call]
        return
    # The goal changed: the call decided for the old one is not sent; the model decides
    # again and that call asks for its own approval.
    assert outside.sent == []
    (op,) = [o for o in await store.get_ops(tid) if o.op_id == call]
    assert op.status == "failed" and (op.error or {})["class"] == "superseded"
    assert again.status == "waiting"
    (new,) = await approvals.pending(store, tid)
    assert new.request_id != asked.request_id and new.op_id != call
