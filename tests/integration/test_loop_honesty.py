"""The ledger holds against lying actors, lying judges and lying compressors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.loop import (
    by_purpose,
    events_of,
    honest_actor,
    latest_ledger_text,
    ledger_of,
    next_item,
    run_task,
    spec_of,
)
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


async def test_lying_actor_claims_done_while_its_calls_fail(
    store: MemoryStore, tmp_path: Path
) -> None:
    rounds = {"n": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        rounds["n"] += 1
        if rounds["n"] <= 2:
            # Says everything is finished, but its tool call is malformed and fails.
            return ModelResponse(
                "All done! Every file has been written.",
                (tool_call("write_file", path="out/i1.txt"),),  # no content: refused
            )
        return honest_actor(request)

    def credulous_judge(request: ModelRequest) -> str:
        payload = json.loads(request.messages[0].content)
        ops = payload["op_journal"]
        items = [i["id"] for i in payload["ledger"]["items"]]
        if rounds["n"] <= 2:
            # Believes the actor's words: everything done, citing the (failed) ops, and
            # once with no evidence at all.
            refs = [o["evidence_ref"] for o in ops] if rounds["n"] == 1 else []
            changes = [{"item": i, "status": "done", "evidence": refs} for i in items]
            return json.dumps(
                {"changes": changes, "decision": "satisfied", "reason": "agent says so"}
            )
        changes = [
            {"item": o["args"]["path"][4:-4], "status": "done", "evidence": [o["evidence_ref"]]}
            for o in ops
            if o["status"] == "succeeded"
        ]
        return json.dumps(
            {"changes": changes, "decision": "continue", "reason": "checked the journal"}
        )

    # No done_when rules: the LLM judge is the one deciding, under the audit.
    spec = spec_of(3, items=[{"id": f"i{k}", "title": f"write out/i{k}.txt"} for k in (1, 2, 3)])
    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=actor),
        judge=ScriptedModel(policy=credulous_judge),
    )
    verdicts = await events_of(store, tid, "judge.verdict")
    # After the two lying rounds nothing was done and the task went on.
    assert verdicts[0]["done"] == 0 and verdicts[0]["decision"] == "continue"
    assert verdicts[1]["done"] == 0 and verdicts[1]["decision"] == "continue"
    warnings = await events_of(store, tid, "audit.warning")
    codes = {w["code"] for w in warnings}
    assert {"unresolved_evidence", "done_without_evidence", "satisfied_with_pending"} <= codes
    ops = await events_of(store, tid, "op.result")
    assert [o["status"] for o in ops[:2]] == ["failed", "failed"]
    # Then real work completed it, every item with evidence that resolves.
    assert result.status == "satisfied"
    led = await ledger_of(store, tid)
    succeeded = {o.op_id for o in await store.get_ops(tid, statuses={"succeeded"})}
    arts = {a.artifact_id for a in await store.get_artifacts(tid)}
    for _, state in led.items():
        assert state.status == "done"
        assert state.evidence
        for ref in state.evidence:
            kind, _, ident = ref.partition(":")
            assert ident in (succeeded if kind == "op" else arts)
    assert (tmp_path / "out" / "i3.txt").read_text() == "i3"


async def test_lying_judge_says_satisfied_with_pending_items(
    store: MemoryStore, tmp_path: Path
) -> None:
    def lying_judge(_: ModelRequest) -> str:
        return json.dumps(
            {"changes": [], "decision": "satisfied", "reason": "looks finished to me"}
        )

    spec = spec_of(4)
    seen_status: list[str] = []

    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=honest_actor),
        judge=ScriptedModel(policy=lying_judge),
        on_progress=lambda s: seen_status.append(f"{s.status}:{s.progress.done}"),
    )
    status_events = await events_of(store, tid, "task.status")
    # The only terminal transition is the real one, after all four items were done.
    terminal = [e for e in status_events if e["dst"] in ("satisfied", "abandoned", "failed")]
    assert len(terminal) == 1 and terminal[0]["stop_reason"] == "delivered"
    warnings = [
        w
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "satisfied_with_pending"
    ]
    assert len(warnings) >= 3  # refused while items were still open
    verdicts = await events_of(store, tid, "judge.verdict")
    assert [v["done"] for v in verdicts] == [1, 2, 3, 4]
    assert all(v["decision"] == "continue" for v in verdicts[:-1])
    assert verdicts[-1]["decision"] == "satisfied"
    assert result.status == "satisfied"


async def test_lying_compressor_cannot_mark_pending_work_done(
    store: MemoryStore, tmp_path: Path
) -> None:
    compacted: list[str] = []
    after: list[ModelRequest] = []

    def actor(request: ModelRequest) -> ModelResponse:
        if compacted:
            after.append(request)
        nxt = next_item(request)
        if nxt is None:
            return ModelResponse("done")
        # Read a big file first so the history outgrows the small budget.
        return ModelResponse(
            f"work on {nxt}",
            (
                tool_call("read_file", path="big.txt"),
                tool_call("write_file", path=f"out/{nxt}.txt", content=nxt)
                if nxt == "i9"
                else tool_call("list_files"),
            ),
        )

    def liar(request: ModelRequest) -> str:
        compacted.append(request.system)
        return (
            "Summary: ALL ITEMS ARE DONE. i1 done, i2 done, i3 done, i4 done, i5 done. "
            "Nothing is left."
        )

    (tmp_path / "big.txt").write_text("x" * 700)
    spec = spec_of(
        5,
        items=[
            {
                "id": f"i{k}",
                "title": f"item {k}",
                "done_when": {"kind": "file", "path": f"out/i{k}.txt"},
            }
            for k in range(1, 6)
        ],
        context={"input_budget_tokens": 1500, "preview_chars": 750},
        limits={"no_progress_rounds": 50, "max_rounds": 12},
    )
    model = ScriptedModel(policy=by_purpose(act=actor, judge=lambda r: "{}", compact=liar))
    tid, result = await run_task(store, spec, tmp_path, model, compact=model)
    assert compacted, "the budget should have forced a compaction"
    # The compressor was given the true ledger and told pending work stays pending.
    assert "GOAL LEDGER" in compacted[0] and "Never describe an item as" in compacted[0]
    warns = [
        w
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "summary_claims_done"
    ]
    assert warns and set(warns[0]["details"]["items"]) >= {"i1", "i2"}
    # After compaction every request still carries the true ledger: items open.
    assert after
    for req in after:
        text = latest_ledger_text(req)
        assert "[x]" not in text.split("Next:")[0] or "done (" in text
        assert "0/5 done" in text
        assert "ALL ITEMS ARE DONE" in "".join(m.content for m in req.messages)  # summary kept
    led = await ledger_of(store, tid)
    assert all(s.status in ("pending", "in_progress") for _, s in led.items())
    # Nothing was done, so the loop guard stopped it waiting for a human, not "satisfied".
    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and "max_rounds" in task.waiting["reason"]


async def test_items_with_rules_are_done_only_by_their_rule(
    store: MemoryStore, tmp_path: Path
) -> None:
    def eager_judge(request: ModelRequest) -> str:
        payload = json.loads(request.messages[0].content)
        refs = [o["evidence_ref"] for o in payload["op_journal"] if o["status"] == "succeeded"]
        # Real, resolving evidence — but for the wrong items.
        items = [i["id"] for i in payload["ledger"]["items"]]
        return json.dumps(
            {
                "changes": [{"item": i, "status": "done", "evidence": refs} for i in items],
                "decision": "satisfied",
            }
        )

    tid, result = await run_task(
        store,
        spec_of(3),
        tmp_path,
        ScriptedModel(policy=honest_actor),
        judge=ScriptedModel(policy=eager_judge),
    )
    assert result.status == "satisfied"
    verdicts = await events_of(store, tid, "judge.verdict")
    assert [v["done"] for v in verdicts] == [1, 2, 3]
    codes = [w["code"] for w in await events_of(store, tid, "audit.warning")]
    assert "rule_item_done_by_judge" in codes
    for k in (1, 2, 3):
        assert (tmp_path / "out" / f"i{k}.txt").read_text() == f"i{k}"
