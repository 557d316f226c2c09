"""The ledger the models are given as data (`ModelRequest.ledger`) is the runtime's:
on every act and judge request it matches the round's focus and the stored ledger, so a
policy or a judge never has to trust (or parse) what the model wrote."""

from __future__ import annotations

from pathlib import Path

from tests.support.adversarial import (
    act_requests,
    change,
    contract,
    focus_by_round,
    op_rule_items,
    payload,
    plain_items,
    refs,
    say,
    verdict,
    write,
)
from tests.support.loop import ledger_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.store.memory import MemoryStore


async def test_act_and_judge_requests_carry_the_true_ledger(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    spec = contract(op_rule_items("a") + plain_items("b") + op_rule_items("c"))
    ids = ["a", "b", "c"]

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        return say(f"writing {nxt}; everything else is done too", write(str(nxt)))

    judged: list[ModelRequest] = []

    def lying_judge(request: ModelRequest) -> str:
        judged.append(request)
        focus = payload(request)["focus_item"]
        done = [change(focus, "done", refs(request))] if focus == "b" else []
        return verdict(done + [change(i, "done") for i in ids], "satisfied", "all done")

    model = ScriptedModel(policy=actor)
    tid, result = await run_task(
        store, spec, tmp_path, model, judge=ScriptedModel(policy=lying_judge)
    )
    assert result.status == "satisfied"
    focus = await focus_by_round(store, tid)
    acts = act_requests(model)
    assert len(acts) == len(focus) == 3
    for n, req in enumerate(acts, start=1):
        led = req.ledger
        assert led is not None
        assert led["next"] == focus[n] == ids[n - 1]
        assert [i["id"] for i in led["items"]] == ids
        by_id = {i["id"]: i for i in led["items"]}
        assert by_id[ids[n - 1]]["status"] == "in_progress"
        assert all(by_id[i]["status"] == "done" and by_id[i]["evidence"] for i in ids[: n - 1])
        assert all(by_id[i]["status"] == "pending" for i in ids[n:])
        assert led["progress"]["done"] == n - 1
    for req in judged:
        led = req.ledger
        assert led is not None
        data = payload(req)["ledger"]
        assert led["version"] == data["version"] and led["next"] == data["next"]
        assert [i["id"] for i in led["items"] if i["status"] == "done"] == data["done"]
    final = await ledger_of(store, tid)
    assert acts[-1].ledger is not None and acts[-1].ledger["version"] < final.version
