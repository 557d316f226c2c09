"""A lost response that reconcile proves done is a success for the service's shared
breaker: three of them in a row must not open it for every task on the database, while
lost responses that reconcile cannot prove done still count as failures."""

from __future__ import annotations

from pathlib import Path

import tether
from tests.support.loop import events_of
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.store.memory import MemoryStore
from tether.tools.breaker import ServiceGuard
from tether.tools.builtin.files import default_registry
from tether.tools.retry import RetryPolicy

SVC = "tickets"


async def _run(tmp_path: Path, *, proven: bool) -> tuple[MemoryStore, str, dict[str, int]]:
    """One round of three `post` calls; every send happens but its answer is lost.
    `proven`: reconcile finds the ticket (done), else it says not done and the
    idempotent tool is sent again, successfully this time."""
    sent: dict[str, int] = {}

    async def look(op: tether.OpRecord, ctx: tether.ToolContext) -> tether.Reconciliation:
        if proven:
            return tether.Reconciliation("done", f"ticket {op.op_id} exists")
        return tether.Reconciliation("not_done")

    @tether.tool(
        effect="write",
        idempotent=not proven,
        service=SVC,
        reconcile=look,
        retry=RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0),
    )
    def post(title: str, ctx: tether.ToolContext) -> str:
        """Opens a ticket; the first answer for each op is lost."""
        sent[ctx.op_id] = sent.get(ctx.op_id, 0) + 1
        if sent[ctx.op_id] == 1:
            raise errors.OutcomeUnknown("connection reset after sending")
        return f"ticket {title}"

    def actor(request: ModelRequest) -> ModelResponse:
        if any(m.role == "tool" for m in request.messages):
            return ModelResponse("done")
        calls = tuple(tether.tool_call("post", title=f"t{n}") for n in range(3))
        return ModelResponse("posting", calls)

    store = await MemoryStore.open()
    spec = tether.parse_spec(
        {
            "objective": "post three tickets",
            "items": [{"id": "p", "title": "p", "done_when": {"kind": "op", "tool": "post"}}],
            "tools": [{"name": "post", "approval": False}],
            # Opens when all of at least three calls failed.
            "services": {SVC: {"min_calls": 3, "failure_rate": 1.0}},
            "models": {"judge": "rules"},
        }
    )
    tid = (await tether.create_task(store, spec, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(post)
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
    )
    await engine.run(tid)
    return store, tid, sent


async def test_three_reconciled_lost_responses_leave_the_breaker_closed(tmp_path: Path) -> None:
    store, tid, sent = await _run(tmp_path, proven=True)
    assert list(sent.values()) == [1, 1, 1]  # never sent twice: reconcile proved each
    assert (await store.get_task(tid)).status == "satisfied"
    reconciled = await events_of(store, tid, "op.reconciled")
    assert [r["outcome"] for r in reconciled] == ["done", "done", "done"]
    assert await events_of(store, tid, "breaker.changed") == []
    state = await ServiceGuard(store).state(SVC)
    assert state["state"] == "closed"
    assert [ok for _, ok in state["calls"]] == [True, True, True]


async def test_lost_responses_reconcile_cannot_prove_still_count_as_failures(
    tmp_path: Path,
) -> None:
    store, tid, sent = await _run(tmp_path, proven=False)
    assert list(sent.values()) == [2, 2, 2]  # "not done": sent again with the same key
    assert (await store.get_task(tid)).status == "satisfied"
    state = await ServiceGuard(store).state(SVC)
    assert state["state"] == "closed"
    # Each lost response was a failure, each resend a success.
    assert [ok for _, ok in state["calls"]] == [False, True] * 3
