"""Verified deliverables: a done item whose workspace file is deleted or altered is
reopened by recovery and by the check before delivery, on every store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.loop import events_of, honest_actor, ledger_of, run_task, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.rebuild import rebuild
from tether.store.base import Store
from tether.tools.builtin.files import default_registry


async def _steps(store: Store, tid: str) -> dict[str, list[dict[str, object]]]:
    found: dict[str, list[dict[str, object]]] = {}
    for e in await events_of(store, tid, "recovery.step"):
        found.setdefault(str(e["step"]), []).append(dict(e["details"]))
    return found


async def test_a_deleted_deliverable_reopens_its_item_on_resume(
    store: Store, tmp_path: Path
) -> None:
    spec = spec_of(2)
    tid, first = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    assert first.status != "satisfied"
    assert (await ledger_of(store, tid)).item("i1").status == "done"
    (tmp_path / "out" / "i1.txt").unlink()

    _, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=honest_actor), task_id=tid
    )
    steps = await _steps(store, tid)
    broken = steps["deliverables"][0]["broken"]
    assert [(b["item"], "missing" in b["reason"]) for b in broken] == [("i1", True)]  # type: ignore[index]
    assert steps["ledger"][0]["reopened"] == ["i1"]
    assert (await rebuild(store, tid))["consistent"]
    # The item was redone before the task could be delivered.
    assert result.status == "satisfied"
    assert (tmp_path / "out" / "i1.txt").read_text() == "i1"


async def test_an_altered_deliverable_is_found_with_its_hash(store: Store, tmp_path: Path) -> None:
    spec = spec_of(2)
    tid, _ = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=honest_actor), max_rounds_this_run=1
    )
    (tmp_path / "out" / "i1.txt").write_text("someone else's text")
    await run_task(store, spec, tmp_path, ScriptedModel(policy=honest_actor), task_id=tid)
    broken = (await _steps(store, tid))["deliverables"][0]["broken"]
    assert len(broken) == 1 and "changed since it was accepted" in broken[0]["reason"]  # type: ignore[index]


async def test_a_deliverable_deleted_before_delivery_reopens_the_item(
    store: Store, tmp_path: Path
) -> None:
    deleted: list[str] = []

    def actor(request: ModelRequest) -> ModelResponse:
        response = honest_actor(request)
        target = tmp_path / "out" / "i1.txt"
        writes_i2 = (
            bool(response.tool_calls)
            and (response.tool_calls[0].arguments or {}).get("path") == "out/i2.txt"
        )
        if writes_i2 and target.exists() and not deleted:
            # The first deliverable vanishes while the last item is being written.
            target.unlink()
            deleted.append("i1")
        return response

    tid, result = await run_task(store, spec_of(2), tmp_path, ScriptedModel(policy=actor))
    assert deleted == ["i1"]
    warnings = [
        w for w in await events_of(store, tid, "audit.warning") if w["code"] == "deliverable_broken"
    ]
    assert [w["details"]["item"] for w in warnings] == ["i1"]
    assert result.status == "satisfied"
    assert (tmp_path / "out" / "i1.txt").read_text() == "i1"
    assert (await rebuild(store, tid))["consistent"]
    verdicts = await events_of(store, tid, "judge.verdict")
    assert any(v["judges"] == ["deliverables"] for v in verdicts)


def _ticket_tools(tickets: dict[str, str], fail: list[bool]) -> Any:
    async def find(op: Any, ctx: tether.ToolContext) -> tether.Reconciliation:
        if fail:
            raise RuntimeError("the ticket service is down")
        found = tickets.get(ctx.op_id)
        return tether.Reconciliation("done", found) if found else tether.Reconciliation("not_done")

    @tether.tool(effect="write", reconcile=find)
    def create_ticket(title: str, ctx: tether.ToolContext) -> str:
        """File a ticket."""
        return tickets.setdefault(ctx.op_id, title)

    registry = default_registry(lambda: None)  # type: ignore[arg-type,return-value]
    registry.add(create_ticket)
    return registry


def _ticket_actor(request: ModelRequest) -> ModelResponse:
    nxt = request.ledger["next"] if request.ledger else None
    if nxt is None:
        return ModelResponse("done")
    return ModelResponse("filing", (tool_call("create_ticket", title=nxt),))


@pytest.mark.parametrize("service_down", [False, True])
async def test_op_evidence_is_asked_again_on_resume(
    store: Store, tmp_path: Path, service_down: bool
) -> None:
    tickets: dict[str, str] = {}
    fail: list[bool] = []
    spec = spec_of(
        items=[
            {
                "id": f"t{k}",
                "title": f"ticket {k}",
                "done_when": {"kind": "op", "tool": "create_ticket", "args": {"title": f"t{k}"}},
            }
            for k in (1, 2)
        ],
        tools=["create_ticket"],
    )
    registry = _ticket_tools(tickets, fail)
    tid, _ = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=_ticket_actor),
        registry=registry,
        max_rounds_this_run=1,
    )
    (first,) = tickets
    tickets.clear()  # someone deleted the ticket in the service
    if service_down:
        fail.append(True)
    _, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=_ticket_actor), registry=registry, task_id=tid
    )
    assert result.status == "satisfied"
    broken = (await _steps(store, tid))["deliverables"][0]["broken"]
    if service_down:
        # The service could not tell: doubt is not proof of loss, nothing reopens.
        assert broken == [] and sorted(tickets.values()) == ["t2"]
    else:
        assert [(b["item"], b["ref"]) for b in broken] == [("t1", f"op:{first}")]  # type: ignore[index]
        assert sorted(tickets.values()) == ["t1", "t2"]
