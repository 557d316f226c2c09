"""Item order in a running task: an item never starts before its predecessors are
finished, and an item whose predecessor is blocked waits with that reason: the task
asks a human instead of being delivered with the gap."""

from __future__ import annotations

from pathlib import Path

from tests.support.loop import events_of, ledger_of, next_item, run_task, spec_of
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.base import Store


def _items() -> list[dict[str, object]]:
    return [
        # `a` wants text the actor never writes: the runtime blocks it.
        {
            "id": "a",
            "title": "A",
            "done_when": {"kind": "file", "path": "out/a.txt", "contains": "!"},
        },
        {
            "id": "b",
            "title": "B",
            "after": ["a"],
            "done_when": {"kind": "file", "path": "out/b.txt"},
        },
        {"id": "c", "title": "C", "done_when": {"kind": "file", "path": "out/c.txt"}},
        {
            "id": "d",
            "title": "D",
            "after": ["c"],
            "done_when": {"kind": "file", "path": "out/d.txt"},
        },
    ]


async def test_a_blocked_predecessor_holds_its_successor(store: Store, tmp_path: Path) -> None:
    asked: list[str | None] = []

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = next_item(request)
        asked.append(nxt)
        if nxt is None:
            return ModelResponse("nothing to do")
        return ModelResponse(
            nxt, (tool_call("write_file", path=f"out/{nxt}.txt", content=f"{nxt} {len(asked)}"),)
        )

    spec = spec_of(items=_items(), limits={"no_progress_rounds": 2})
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    led = await ledger_of(store, tid)
    assert [led.item(i).status for i in "abcd"] == ["blocked", "pending", "done", "done"]
    # b was never named Next, so it was never started, and d came only after c.
    assert "b" not in asked and asked.index("d") > asked.index("c")
    assert not (tmp_path / "out" / "b.txt").exists()
    assert result.status == "waiting"
    decision = (await events_of(store, tid, "decision.requested"))[-1]
    held = {r["id"]: r for r in decision["partial"]["remaining"]}
    assert held["b"]["held_by"] == ["a"]
    verdicts = await events_of(store, tid, "judge.verdict")
    assert "b waits for a" in verdicts[-1]["reason"]


async def test_a_rule_met_early_waits_for_the_predecessor(store: Store, tmp_path: Path) -> None:
    # d's file is there from the start (not fresh-checked), yet d is done only after c.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "d.txt").write_text("early")
    items = _items()[2:]
    items[1]["done_when"] = {"kind": "file", "path": "out/d.txt", "fresh": False}

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = next_item(request)
        if nxt is None:
            return ModelResponse("nothing to do")
        return ModelResponse(nxt, (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),))

    tid, result = await run_task(store, spec_of(items=items), tmp_path, ScriptedModel(policy=actor))
    assert result.status == "satisfied"
    verdicts = await events_of(store, tid, "judge.verdict")
    first = {c["item"] for c in verdicts[0]["changes"] if c["field"] == "status"}
    assert first == {"c", "d"}  # one verdict: c by its rule, then d after it
    changes = [c["item"] for v in verdicts for c in v["changes"] if c["field"] == "status"]
    assert changes.index("c") < changes.index("d")
