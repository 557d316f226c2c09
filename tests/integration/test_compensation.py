"""What happens when a call's retries run out (`on_exhausted`), in process.

- `fail_item` (the default): the failure goes back to the model, nothing is undone;
- `ask_human`: the task waits for a person; "try again" gives the call a new schedule
  with the same op id, `--done` records it done, reject fails it (the model is told);
- `compensate`: the item's applied ops (a batch of ticket creations) are undone by the
  tool's `compensate` hook, newest first, each exactly once, and the item is blocked
  with the reason; a compensation that fails after its retries asks a person.

The crash windows of a compensation, against a real HTTP service, are in
`tests/reliability/test_compensation_crash.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.loop import events_of
from tests.support.tickets import Tickets
from tether import approvals
from tether.models.base import ModelRequest, ModelResponse
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry


def batch_actor(request: ModelRequest) -> ModelResponse:
    """Files the batch of three tickets in one round; then stops."""
    if any(m.role == "tool" for m in request.messages):
        return ModelResponse("the batch is filed as far as it goes")
    calls = tuple(tether.tool_call("create_ticket", title=t) for t in ("a", "b", "c"))
    return ModelResponse("filing the batch", calls)


def retrying_actor(request: ModelRequest) -> ModelResponse:
    """Files ticket `x`; files it again (a new call) after a failure; then stops."""
    tool_msgs = [m for m in request.messages if m.role == "tool"]
    if tool_msgs and not tool_msgs[-1].content.startswith("ERROR"):
        return ModelResponse("filed")
    return ModelResponse("filing", (tether.tool_call("create_ticket", title="x"),))


def spec(on_exhausted: str | None, done_title: str = "c") -> tether.TaskSpec:
    entry: dict[str, Any] = {"name": "create_ticket"}
    if on_exhausted is not None:
        entry["on_exhausted"] = on_exhausted
    return tether.parse_spec(
        {
            "objective": "file the batch",
            "items": [
                {
                    "id": "batch",
                    "title": "file tickets a, b and c",
                    "done_when": {
                        "kind": "op",
                        "tool": "create_ticket",
                        "args": {"title": done_title},
                    },
                }
            ],
            "tools": [entry],
            "models": {"judge": "rules"},
        }
    )


async def run(
    store: Store,
    tid: str | None,
    svc: Tickets,
    spec_: tether.TaskSpec,
    actor: Any,
    tmp_path: Path,
    clock: tether.Clock | None = None,
) -> tuple[str, tether.RunResult]:
    if tid is None:
        tid = (await tether.create_task(store, spec_, workspace=tmp_path)).task_id
    registry = default_registry(lambda: store)
    registry.add(svc.tools())
    engine = tether.Engine(
        store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry, clock=clock
    )
    return tid, await engine.run(tid)


async def ledger_of(store: Store, tid: str) -> tether.Ledger:
    return (await store.get_ledger(tid)).to_ledger()


async def ops_of(store: Store, tid: str) -> Mapping[str, tether.OpRecord]:
    return {o.op_id: o for o in await store.get_ops(tid)}


# ---------------------------------------------------------------- fail_item (default)


async def test_fail_item_default_sends_the_failure_to_the_model(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    tid, res = await run(store, None, svc, spec(None), batch_actor, tmp_path)
    # Nothing undone, nobody asked: the model heard of the failure and the item stays
    # open until the usual limits block it.
    assert svc.cancels == [] and len(svc.created) == 2
    assert await events_of(store, tid, "op.exhausted") == []
    assert await events_of(store, tid, "op.compensated") == []
    assert await store.get_approvals(tid) == []
    failed = (await ops_of(store, tid))[f"{tid}.r1.c2"]
    assert failed.status == "failed" and "gave up after 2 attempts" in failed.error["message"]
    assert "compensated" not in (await ledger_of(store, tid)).item("batch").note
    assert res.status != "failed"


async def test_fail_item_spelled_out_is_the_default(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    tid, _ = await run(store, None, svc, spec("fail_item"), batch_actor, tmp_path)
    assert svc.cancels == [] and len(svc.created) == 2
    assert await events_of(store, tid, "op.exhausted") == []


# ---------------------------------------------------------------- compensate


async def test_compensate_undoes_the_batch_newest_first_once_each(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    tid, res = await run(store, None, svc, spec("compensate"), batch_actor, tmp_path)
    a, b, c = (f"{tid}.r1.c{i}" for i in range(3))
    # c was tried twice (its policy), then b and a were cancelled in that order, once.
    assert svc.sends == [a, b, c, c]
    assert svc.cancels == [b, a]
    assert svc.created == {}
    # The item is blocked with the reason, and the task asks a person what next.
    assert res.status == "waiting" and res.waiting is not None
    assert res.waiting["kind"] == "decision"
    item = (await ledger_of(store, tid)).item("batch")
    assert item.status == "blocked"
    assert item.note.startswith("compensated after create_ticket failed")
    # Journaled: the plan with the failed call, then each compensation as an op.
    (plan,) = await events_of(store, tid, "op.exhausted")
    assert plan["op_id"] == c and plan["policy"] == "compensate"
    assert plan["compensate"] == [b, a] and plan["item"] == "batch"
    marks = await events_of(store, tid, "op.compensated")
    assert [(m["op_id"], m["by"], m["outcome"]) for m in marks] == [
        (b, f"{b}.compensate", "compensated"),
        (a, f"{a}.compensate", "compensated"),
    ]
    ops = await ops_of(store, tid)
    for op in (a, b):
        assert ops[f"{op}.compensate"].status == "succeeded"
        assert ops[f"{op}.compensate"].tool == "create_ticket.compensate"
        assert ops[op].result is not None and ops[op].result["compensation"] == "compensated"
    intents = [e["op_id"] for e in await events_of(store, tid, "op.intended")]
    assert intents.count(f"{b}.compensate") == intents.count(f"{a}.compensate") == 1
    # `tether status --json` lists them.
    from tether.runtime.tasks import status_dict

    doc = await status_dict(store, tid)
    assert [(c["op_id"], c["by"], c["outcome"], c["after"]) for c in doc["compensations"]] == [
        (b, f"{b}.compensate", "compensated", c),
        (a, f"{a}.compensate", "compensated", c),
    ]

    # Resuming runs nothing again.
    _, again = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert again.status == "waiting"
    assert svc.cancels == [b, a] and svc.sends == [a, b, c, c]


async def test_compensated_ops_are_no_evidence_and_a_retry_starts_afresh(
    tmp_path: Path,
) -> None:
    """`done_when` names ticket `a`, which was filed and then compensated: it proves
    nothing. After `tether retry` the item's new batch is what counts."""
    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 2})
    tid, res = await run(store, None, svc, spec("compensate", "a"), batch_actor, tmp_path)
    assert res.status == "waiting"
    assert (await ledger_of(store, tid)).item("batch").status == "blocked"
    from tether.decisions import retry_item

    await retry_item(store, tid, "batch", hint="the tracker is back")
    calls = {"n": 0}

    def again(request: ModelRequest) -> ModelResponse:
        calls["n"] += 1
        if calls["n"] > 1:
            return ModelResponse("done")
        names = ("a", "b", "c")
        return ModelResponse(
            "again", tuple(tether.tool_call("create_ticket", title=t) for t in names)
        )

    _, done = await run(store, tid, svc, spec("compensate", "a"), again, tmp_path)
    assert done.status == "satisfied", done
    assert sorted(svc.created.values()) == ["a", "b", "c"]
    evidence = (await ledger_of(store, tid)).item("batch").evidence
    assert evidence and all(".r1." not in ref for ref in evidence)


async def test_a_failing_compensation_asks_a_human_and_never_loops(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    tid = (await tether.create_task(store, spec("compensate"), workspace=tmp_path)).task_id
    a, b = f"{tid}.r1.c0", f"{tid}.r1.c1"
    svc.cancel_failing = {b: 10**6}
    _, res = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    # b's compensation was tried twice (its tool's schedule), then a person is asked;
    # a is not compensated yet (newest first: it waits behind b).
    assert svc.cancels == [b, b]
    assert res.status == "waiting" and res.waiting is not None
    assert res.waiting["kind"] == "human"
    rid = f"{b}.compensate.failed"
    assert res.waiting["request_id"] == rid
    (asked,) = await approvals.pending(store, tid)
    assert asked.request_id == rid and asked.request["kind"] == "compensation_failed"
    warn = [w for w in await events_of(store, tid, "audit.warning")]
    assert any(w["code"] == "compensation_failed" for w in warn)

    # A resume before anyone decides only waits again.
    _, still = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert still.status == "waiting" and svc.cancels == [b, b]

    # "Try again": a new schedule for the same compensation op; it fails again, and a
    # person is asked again (a new request), never a loop.
    await approvals.decide(store, tid, rid, "approve", by="ops")
    _, twice = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert svc.cancels == [b, b, b, b]
    assert twice.status == "waiting" and twice.waiting is not None
    assert twice.waiting["request_id"] == f"{rid}.2"

    # "Done by hand": b counts as undone; a is compensated next; the item is blocked.
    await approvals.decide(store, tid, f"{rid}.2", "done", by="ops")
    _, end = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert svc.cancels == [b, b, b, b, a]
    assert end.status == "waiting" and end.waiting is not None
    assert end.waiting["kind"] == "decision"
    marks = [(m["op_id"], m["outcome"]) for m in await events_of(store, tid, "op.compensated")]
    assert marks == [(b, "done_by_hand"), (a, "compensated")]
    assert (await ledger_of(store, tid)).item("batch").status == "blocked"


async def test_rejecting_a_failed_compensation_leaves_the_op(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    tid = (await tether.create_task(store, spec("compensate"), workspace=tmp_path)).task_id
    a, b = f"{tid}.r1.c0", f"{tid}.r1.c1"
    svc.cancel_failing = {b: 10**6}
    await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    await approvals.decide(store, tid, f"{b}.compensate.failed", "reject", by="ops")
    _, end = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert svc.cancels == [b, b, a]
    assert end.waiting is not None and end.waiting["kind"] == "decision"
    marks = [(m["op_id"], m["outcome"]) for m in await events_of(store, tid, "op.compensated")]
    assert marks == [(b, "left"), (a, "compensated")]
    assert list(svc.created) == [b]


# ---------------------------------------------------------------- ask_human


@pytest.mark.parametrize("decision", ["approve", "done", "reject"])
async def test_ask_human_waits_and_the_decision_continues(decision: str, tmp_path: Path) -> None:
    store = await MemoryStore.open()
    svc = Tickets(failing={"x": 2})
    spec_ = spec("ask_human", "x")
    tid, res = await run(store, None, svc, spec_, retrying_actor, tmp_path)
    op = f"{tid}.r1.c0"
    rid = f"{op}.exhausted"
    assert svc.sends == [op, op]
    assert res.status == "waiting" and res.waiting is not None
    assert res.waiting["kind"] == "human" and res.waiting["request_id"] == rid
    assert res.waiting["ops"] == [op]
    assert f"tether approve {tid} {rid}" in res.waiting["reason"]
    (asked,) = await approvals.pending(store, tid)
    assert asked.request["kind"] == "op_exhausted"
    requested = await events_of(store, tid, "approval.requested")  # what notices are made of
    assert [r["request_id"] for r in requested] == [rid]
    (exhausted,) = await events_of(store, tid, "op.exhausted")
    assert exhausted["policy"] == "ask_human" and exhausted["attempts"] == 2

    _, still = await run(store, tid, svc, spec_, retrying_actor, tmp_path)
    assert still.status == "waiting" and svc.sends == [op, op]

    await approvals.decide(store, tid, rid, decision, by="ops", result={"id": "T-by-hand"})
    _, end = await run(store, tid, svc, spec_, retrying_actor, tmp_path)
    assert end.status == "satisfied", end
    ops = await ops_of(store, tid)
    if decision == "approve":
        # Sent again with the same op id, on a fresh schedule: one more send succeeded.
        assert svc.sends == [op, op, op]
        assert ops[op].status == "succeeded"
    elif decision == "done":
        assert svc.sends == [op, op]
        assert ops[op].status == "succeeded" and "T-by-hand" in str(ops[op].result)
    else:
        # Failed as fail_item would: the model heard of it and filed a new call.
        assert ops[op].status == "failed"
        assert "decided not to try create_ticket again" in ops[op].error["message"]
        assert svc.sends[:2] == [op, op] and len(svc.sends) == 3 and svc.sends[2] != op


async def test_a_compensated_task_replays_without_undoing_anything(tmp_path: Path) -> None:
    from tether.report.replay import replay_task

    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    clock = tether.FakeClock()
    store = MemoryStore(clock=clock)  # recorded times the replay's clock can show again
    tid, _ = await run(store, None, svc, spec("compensate"), batch_actor, tmp_path, clock)
    assert svc.cancels
    cancels = list(svc.cancels)
    registry = default_registry(lambda: store)
    registry.add(svc.tools())
    result = await replay_task(store, tid, registry=registry)
    assert result.ok, json.dumps(result.to_dict()["divergence"])
    assert svc.cancels == cancels  # the replay ran no real compensation


async def test_only_the_items_current_stretch_is_compensated(tmp_path: Path) -> None:
    """Item `first` filed ticket x and is done; item `batch` filed a (one round) and b
    (the next) before c ran out of retries: b and a are undone, newest first; x, the
    work of another item, stays."""
    from tests.support.loop import next_item

    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    steps = {"batch": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        item = next_item(request)
        if item == "first":
            return ModelResponse("x", (tether.tool_call("create_ticket", title="x"),))
        if item != "batch" or steps["batch"] > 1:
            return ModelResponse("nothing more")
        steps["batch"] += 1
        titles = ("a",) if steps["batch"] == 1 else ("b", "c")
        calls = tuple(tether.tool_call("create_ticket", title=t) for t in titles)
        return ModelResponse("filing", calls)

    data = {
        "objective": "file x, then the batch",
        "items": [
            {"id": "first", "title": "file x",
             "done_when": {"kind": "op", "tool": "create_ticket", "args": {"title": "x"}}},
            {"id": "batch", "title": "file a, b and c",
             "done_when": {"kind": "op", "tool": "create_ticket", "args": {"title": "c"}}},
        ],
        "tools": [{"name": "create_ticket", "on_exhausted": "compensate"}],
        "models": {"judge": "rules"},
    }  # fmt: skip
    tid, res = await run(store, None, svc, tether.parse_spec(data), actor, tmp_path)
    x, a, b = f"{tid}.r1.c0", f"{tid}.r2.c0", f"{tid}.r3.c0"
    assert svc.created == {x: "x"}
    assert svc.cancels == [b, a]
    (plan,) = await events_of(store, tid, "op.exhausted")
    assert plan["compensate"] == [b, a] and plan["item"] == "batch"
    ledger = await ledger_of(store, tid)
    assert ledger.item("first").status == "done"
    assert ledger.item("batch").status == "blocked"
    assert res.waiting is not None and res.waiting["kind"] == "decision"


async def test_a_compensation_in_doubt_waits_for_a_human_like_any_op(tmp_path: Path) -> None:
    """The cancel of b takes effect but its answer is lost; the compensation is not
    idempotent and has no reconcile, so it is never sent again on a guess: a person
    says it happened, and the rest of the plan goes on."""
    store = await MemoryStore.open()
    svc = Tickets(failing={"c": 10**6})
    tid = (await tether.create_task(store, spec("compensate"), workspace=tmp_path)).task_id
    a, b = f"{tid}.r1.c0", f"{tid}.r1.c1"
    svc.cancel_lost = {b: 1}
    _, res = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert svc.cancels == [b]
    assert res.waiting is not None and res.waiting["request_id"] == f"{b}.compensate.in_doubt"
    _, still = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert still.status == "waiting" and svc.cancels == [b]
    await approvals.decide(store, tid, f"{b}.compensate.in_doubt", "done", by="ops")
    _, end = await run(store, tid, svc, spec("compensate"), batch_actor, tmp_path)
    assert svc.cancels == [b, a] and svc.created == {}
    assert end.waiting is not None and end.waiting["kind"] == "decision"
    marks = [(m["op_id"], m["outcome"]) for m in await events_of(store, tid, "op.compensated")]
    assert marks == [(b, "compensated"), (a, "compensated")]
