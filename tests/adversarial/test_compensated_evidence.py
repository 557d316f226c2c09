"""An item proven by an op that a later compensation undid: ticket `a` proves item `a`
(its op rule), then the batch it was filed in fails and `on_exhausted: compensate`
cancels it. The item's evidence is history now: the rule judge reopens it at once (and
the check before delivery would), so the task is never delivered on a cancelled ticket
(here after a human waives the failed batch)."""

from __future__ import annotations

from pathlib import Path

import tether
from tests.support.adversarial import assert_honest, statuses
from tests.support.tickets import Tickets
from tether.decisions import waive_item
from tether.models.base import ModelRequest, ModelResponse
from tether.store.base import Store
from tether.tools.builtin.files import default_registry


def _spec() -> tether.TaskSpec:
    return tether.parse_spec(
        {
            "objective": "file the batch",
            "items": [
                {
                    "id": "batch",
                    "title": "file tickets a, b and c",
                    "done_when": {"kind": "op", "tool": "create_ticket", "args": {"title": "c"}},
                },
                {
                    "id": "a",
                    "title": "file ticket a",
                    "done_when": {"kind": "op", "tool": "create_ticket", "args": {"title": "a"}},
                },
            ],
            "tools": [{"name": "create_ticket", "on_exhausted": "compensate"}],
            "models": {"judge": "rules"},
            "limits": {"max_rounds": 8},
        }
    )


async def test_an_item_proven_by_a_compensated_op_is_not_delivered(
    store: Store, tmp_path: Path
) -> None:
    svc = Tickets(failing={"c": 99})
    calls = 0

    def actor(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        nxt = request.ledger["next"] if request.ledger else None
        if calls == 1:  # ticket a first (it proves item a at once), then the rest
            return ModelResponse("a", (tether.tool_call("create_ticket", title="a"),))
        if calls == 2:
            titles = ("b", "c")
            return ModelResponse(
                "b, c", tuple(tether.tool_call("create_ticket", title=t) for t in titles)
            )
        if nxt == "a":
            return ModelResponse("a again", (tether.tool_call("create_ticket", title="a"),))
        return ModelResponse("nothing more")

    async def run(tid: str) -> tether.RunResult:
        registry = default_registry(lambda: store)
        registry.add(svc.tools())
        engine = tether.Engine(
            store, tether.ModelSet(tether.ScriptedModel(policy=actor)), registry=registry
        )
        return await engine.run(tid)

    tid = (await tether.create_task(store, _spec(), workspace=tmp_path)).task_id
    first = await run(tid)
    assert first.status == "waiting", first
    await assert_honest(store, tid, _spec())
    # Item a was reopened as soon as its ticket was cancelled, and filed again.
    (live,) = (await store.get_ledger(tid)).to_ledger().item("a").evidence
    assert live[3:] in svc.created, (live, svc.created)
    assert len(svc.cancels) == 2
    await waive_item(store, tid, "batch", reason="the tracker refuses c")
    final = await run(tid)
    got = await statuses(store, tid)
    assert (final.status, got) == ("satisfied", {"batch": "waived", "a": "done"}), final
    (ref,) = (await store.get_ledger(tid)).to_ledger().item("a").evidence
    assert ref == live and ref[3:] in svc.created, (ref, svc.created)
    await assert_honest(store, tid, _spec())
