"""`recovery.deliverables.recheck_ops` asks a tool's reconcile with what the run's
`tool_env` carries (its fencing token, its shared services), through the narrow
`ports.PartsHost`: a host that is only that port is enough."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tether import ledger as L
from tether import loop_hold
from tether.clock import FakeClock
from tether.runtime.ops.ports import ToolEnv
from tether.runtime.recovery import deliverables
from tether.runtime.run.state import RunState
from tether.store.base import OpRecord
from tether.tools.registry import Reconciliation, ToolContext, tool

SERVICES = {"tickets": object()}


class Reads:
    """The store reads the recheck makes: the task's succeeded ops."""

    def __init__(self, ops: list[OpRecord]) -> None:
        self.ops = ops

    async def get_ops(
        self,
        task_id: str,
        statuses: Collection[str] | None = None,
        *,
        op_ids: Collection[str] | None = None,
        round: int | None = None,
        tools: Collection[str] | None = None,
    ) -> list[OpRecord]:
        return [
            o
            for o in self.ops
            if (statuses is None or o.status in statuses)
            and (op_ids is None or o.op_id in op_ids)
            and (tools is None or o.tool in tools)
        ]


def host(ops: list[OpRecord], tools: list[Any]) -> Any:
    """Only the members of `PartsHost` the recheck reads (no flat `services`, `token`)."""
    return SimpleNamespace(
        journal=SimpleNamespace(task_id="t1"),
        view=SimpleNamespace(task=SimpleNamespace(version=3), state=RunState(), workspace=None),
        store=Reads(ops),
        tools=tools,
        tool_env=ToolEnv(
            token=7,
            workspace=Path("."),
            services=SERVICES,
            guard=None,
            clock=FakeClock(),
            inline_wait_max=0.0,
        ),
    )


async def test_recheck_gives_reconcile_the_runs_services_and_token() -> None:
    seen: list[ToolContext] = []

    async def find_ticket(op: Any, ctx: ToolContext) -> Reconciliation:
        seen.append(ctx)
        return Reconciliation("not_done" if ctx.services is SERVICES else "unknown")

    @tool(effect="write", service="tickets", reconcile=find_ticket)
    async def create_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
        return {}

    skeleton = L.Skeleton("o", (L.ItemDef("a", "A"),))
    ledger = L.complete(L.Ledger.new(skeleton), "a", ["op:o1"]).ledger
    op = OpRecord(
        op_id="o1",
        task_id="t1",
        round=1,
        call_index=0,
        tool="create_ticket",
        args={"title": "x"},
        args_hash="h",
        effect="write",
        status="succeeded",
    )
    after, broken = await deliverables.recheck_ops(host([op], [create_ticket]), ledger)

    assert [(c.fencing_token, c.task_version, c.op_id) for c in seen] == [(7, 3, "o1")]
    assert seen[0].services is SERVICES
    # The service says the ticket is gone: the item it proved opens again.
    assert [(b.item, b.ref) for b in broken] == [("a", "op:o1")]
    assert after.item("a").status != "done"


async def test_a_reconcile_that_holds_the_loop_at_recovery_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recovery's recheck times an async reconcile as a round's is (`loop_hold`): one
    that blocks is told as an `audit.warning` for the recovery's journal; an awaiting
    one is not."""
    monkeypatch.setattr(loop_hold, "WARN_SECONDS", 0.05)

    async def blocking(op: Any, ctx: ToolContext) -> Reconciliation:
        time.sleep(0.1)  # noqa: ASYNC251 (the blocking under test)
        return Reconciliation("done")

    async def awaiting(op: Any, ctx: ToolContext) -> Reconciliation:
        await asyncio.sleep(0.1)
        return Reconciliation("done")

    for reconcile, expected in ((blocking, ["reconcile send_mail"]), (awaiting, [])):

        @tool(effect="write", reconcile=reconcile)
        async def send_mail(to: str) -> str:
            return "sent"

        skeleton = L.Skeleton("o", (L.ItemDef("a", "A"),))
        ledger = L.complete(L.Ledger.new(skeleton), "a", ["op:o1"]).ledger
        op = OpRecord(
            op_id="o1", task_id="t1", round=1, call_index=0, tool="send_mail",
            args={"to": "x"}, args_hash="h", effect="write", status="succeeded",
        )  # fmt: skip
        told: list[Any] = []
        after, broken = await deliverables.recheck_ops(host([op], [send_mail]), ledger, told)
        assert broken == [] and after.item("a").status == "done"
        assert [w.details["what"] for w in told] == expected
        assert all(w.code == "loop_held" for w in told)
