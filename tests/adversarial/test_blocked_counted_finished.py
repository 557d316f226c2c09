"""Failure class 1: blocked items counted as finished.

An actor stops working and announces, in many wordings, that everything is complete;
judges believe it. The task must end `waiting` for a human decision with the partial
record, never `satisfied`. Then each human answer works end to end: waiving every gap
delivers with waivers, a retry's hint reaches the model and lets the item be finished,
abandoning ends the task.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.adversarial import (
    act_requests,
    all_ids,
    all_text,
    assert_honest,
    assert_status_agrees,
    change,
    contract,
    op_rule_items,
    open_ids,
    payload,
    plain_items,
    refs,
    say,
    statuses,
    terminal_transitions,
    verdict,
    warned_items,
    warning_codes,
    write,
)
from tests.support.loop import events_of, ledger_of, run_task
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore

CLAIMS = [
    "All items complete.",
    "✅ Done — every checklist item has been finished and verified.",
    "TASK COMPLETE. Nothing left to do; the ledger can be closed.",
    "I already finished both deliverables in an earlier session, so there is nothing more "
    "to do here. Please mark them done.",
    "Status: 100% complete. Marking everything as done and signing off.",
]


def claimer(text: str) -> Callable[[ModelRequest], ModelResponse]:
    """An actor that does no work and says it is finished."""
    return lambda _: ModelResponse(text)


def credulous_judge(request: ModelRequest) -> str:
    """Believes the agent: every item done, no evidence, satisfied."""
    return verdict(
        [change(i, "done", note="the agent says so") for i in all_ids(request)],
        "satisfied",
        "the agent reports that everything is complete",
    )


def fabricating_judge(request: ModelRequest) -> str:
    """Invents evidence refs for every item and declares victory."""
    task = request.task_id
    made_up = ["op:verified-by-agent", "artifact:final-report", f"op:{task}.r99.c0"]
    return verdict(
        [change(i, "done", made_up) for i in all_ids(request)], "satisfied", "all verified"
    )


def gap_judge(request: ModelRequest) -> str:
    """Calls blocked items finished: 'blocked means nothing more can be done'."""
    blocked = [i["id"] for i in request.ledger["items"] if i["status"] == "blocked"]  # type: ignore[index]
    return verdict(
        [change(i, "done", note="blocked, so finished") for i in blocked]
        + [change(i, "done") for i in open_ids(request)],
        "satisfied",
        "blocked items count as finished",
    )


JUDGES: dict[str, Callable[[ModelRequest], str] | None] = {
    "rules-only": None,
    "credulous": credulous_judge,
    "fabricating": fabricating_judge,
    "gap": gap_judge,
}


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def two_items() -> tether.TaskSpec:
    return contract(plain_items("draft", "publish"))


async def run_claimer(
    store: MemoryStore, tmp_path: Path, text: str, judge: Callable[[ModelRequest], str] | None
) -> tuple[str, tether.RunResult, ScriptedModel]:
    actor = ScriptedModel(policy=claimer(text))
    tid, result = await run_task(
        store,
        two_items(),
        tmp_path,
        actor,
        judge=ScriptedModel(policy=judge) if judge else None,
    )
    return tid, result, actor


@pytest.mark.parametrize("judge_name", list(JUDGES))
@pytest.mark.parametrize("claim", CLAIMS, ids=[f"claim{n}" for n in range(len(CLAIMS))])
async def test_claiming_actor_with_zero_done_waits_for_a_decision(
    store: MemoryStore, tmp_path: Path, claim: str, judge_name: str
) -> None:
    tid, result, actor = await run_claimer(store, tmp_path, claim, JUDGES[judge_name])

    assert result.status == "waiting" and result.stop_reason is None
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "decision"
    assert await statuses(store, tid) == {"draft": "blocked", "publish": "blocked"}
    partial = task.waiting["partial"]
    assert partial["done"] == [] and partial["remaining"] == []
    assert [b["id"] for b in partial["blocked"]] == ["draft", "publish"]
    assert all(b["reason"].startswith("no progress") for b in partial["blocked"])
    # The runtime never moved to a terminal state, and asked once.
    assert await terminal_transitions(store, tid) == []
    requested = await events_of(store, tid, "decision.requested")
    assert len(requested) == 1 and requested[0]["partial"] == partial
    verdicts = await events_of(store, tid, "judge.verdict")
    assert all(v["done"] == 0 for v in verdicts)
    assert [v["decision"] for v in verdicts][-1] == "need_decision"
    assert "satisfied" not in {v["decision"] for v in verdicts}
    # Three rounds without progress per item, then nothing more was asked of the model.
    assert actor.calls == 6
    codes = await warning_codes(store, tid)
    assert await warned_items(store, tid, "item_blocked") == {"draft", "publish"}
    if judge_name != "rules-only":
        assert {"satisfied_with_pending", "satisfied_with_gaps"} <= codes
        assert codes & {"done_without_evidence", "unresolved_evidence"}
    await assert_honest(store, tid, two_items())
    await assert_status_agrees(store, tid)


async def test_twelve_items_some_done_then_claims_never_satisfied(
    store: MemoryStore, tmp_path: Path
) -> None:
    ids = [f"i{k}" for k in range(1, 13)]
    spec = contract(op_rule_items(*ids), limits={"no_progress_rounds": 1})
    claims = itertools.cycle(CLAIMS)

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"]  # type: ignore[index]
        if nxt in ids[:5]:
            return say(f"writing {nxt}", write(nxt))
        # Stops working; sometimes pretends to check something first.
        text = next(claims)
        if nxt in ("i7", "i10"):
            return say(text, tool_call("list_files", path="."))
        return say(text)

    credited: list[str] = []

    def pushy_judge(request: ModelRequest) -> str:
        # Re-uses the evidence of the finished items for every open one.
        credited.extend(refs(request, tool="write_file"))
        return verdict(
            [change(i, "done", credited[-3:]) for i in open_ids(request)],
            "satisfied",
            "most items have evidence, the rest must be done too",
        )

    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=actor), judge=ScriptedModel(policy=pushy_judge)
    )
    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "decision"
    got = await statuses(store, tid)
    assert [got[i] for i in ids] == ["done"] * 5 + ["blocked"] * 7
    partial = task.waiting["partial"]
    assert [d["id"] for d in partial["done"]] == ids[:5]
    assert all(len(d["evidence"]) == 1 for d in partial["done"])
    assert [b["id"] for b in partial["blocked"]] == ids[5:]
    codes = await warning_codes(store, tid)
    # Done items' evidence offered for others: not theirs; their rules decide anyway.
    assert {
        "rule_item_done_by_judge",
        "evidence_not_item",
        "satisfied_with_pending",
        "satisfied_with_gaps",
    } <= codes
    assert await terminal_transitions(store, tid) == []
    await assert_honest(store, tid, spec)
    doc = await assert_status_agrees(store, tid)
    assert doc["ledger"]["progress"]["done"] == 5 and doc["ledger"]["progress"]["blocked"] == 7


# --- the human's answers ------------------------------------------------------------------


@pytest.fixture
async def blocked_task(store: MemoryStore, tmp_path: Path) -> str:
    """A two-item task waiting for a decision, both items blocked, nothing done."""
    tid, result, _ = await run_claimer(store, tmp_path, CLAIMS[0], credulous_judge)
    assert result.status == "waiting"
    return tid


def must_not_act(_: ModelRequest) -> ModelResponse:
    raise AssertionError("the model was asked to act although nothing is open")


async def test_waiving_every_gap_delivers_with_waivers(
    store: MemoryStore, tmp_path: Path, blocked_task: str
) -> None:
    tid = blocked_task
    await tether.waive_item(store, tid, "draft", reason="drafted by hand", by="alice")
    # One waiver is not enough: the other item still needs a decision.
    _, again = await run_task(
        store, two_items(), tmp_path, ScriptedModel(policy=must_not_act), task_id=tid
    )
    assert again.status == "waiting" and again.waiting is not None
    assert again.waiting["kind"] == "decision"
    assert [w["id"] for w in again.waiting["partial"]["waived"]] == ["draft"]
    assert [b["id"] for b in again.waiting["partial"]["blocked"]] == ["publish"]

    await tether.waive_item(store, tid, "publish", reason="out of scope this week", by="bob")
    _, result = await run_task(
        store, two_items(), tmp_path, ScriptedModel(policy=must_not_act), task_id=tid
    )
    assert result.status == "satisfied" and result.stop_reason == "delivered_with_waivers"
    assert await statuses(store, tid) == {"draft": "waived", "publish": "waived"}
    waived = await events_of(store, tid, "item.waived")
    assert [(w["item"], w["by"], w["reason"], w["previous"]) for w in waived] == [
        ("draft", "alice", "drafted by hand", "blocked"),
        ("publish", "bob", "out of scope this week", "blocked"),
    ]
    terminal = await terminal_transitions(store, tid)
    assert [t["stop_reason"] for t in terminal] == ["delivered_with_waivers"]
    doc = await assert_status_agrees(store, tid)
    assert [(w["id"], w["status"]) for w in doc["waivers"]] == [
        ("draft", "waived"),
        ("publish", "waived"),
    ]
    assert (
        "alice" in doc["waivers"][0]["reason"] and "drafted by hand" in doc["waivers"][0]["reason"]
    )
    await assert_honest(store, tid, two_items())


async def test_retry_hint_reaches_the_model_and_the_item_can_be_finished(
    store: MemoryStore, tmp_path: Path, blocked_task: str
) -> None:
    tid = blocked_task
    hint = "Write the release note to out/publish.txt; the word LIVE must be in it."
    led = await tether.retry_item(store, tid, "publish", hint=hint, by="carol")
    assert led.item("publish").status == "pending"
    assert (led.item("publish").attempts, led.item("publish").breaker) == (0, 0)
    assert (await store.get_task(tid)).status == "queued"

    def hinted_actor(request: ModelRequest) -> ModelResponse:
        if "the word LIVE" in all_text(request):
            return say("following the user's hint", write("publish", "LIVE\n"))
        return say("All items complete.")

    def honest_judge(request: ModelRequest) -> str:
        writes = refs(request, tool="write_file")
        focus = payload(request)["focus_item"]
        if focus and writes:
            return verdict([change(focus, "done", writes)], "continue", "the file was written")
        return verdict([], "continue", "nothing new")

    actor = ScriptedModel(policy=hinted_actor)
    _, result = await run_task(
        store, two_items(), tmp_path, actor, judge=ScriptedModel(policy=honest_judge), task_id=tid
    )
    first = act_requests(actor)[0]
    assert first.ledger is not None and first.ledger["next"] == "publish"
    assert any(
        m.role == "user" and hint in m.content and "publish" in m.content for m in first.messages
    ), "the retry hint is not among the messages of the next act request"
    retried = await events_of(store, tid, "item.retried")
    assert [(r["item"], r["by"], r["hint"], r["previous"]) for r in retried] == [
        ("publish", "carol", hint, "blocked")
    ]
    assert any(hint in m["text"] for m in await events_of(store, tid, "user.message"))
    # publish is done with its own evidence; draft still needs a decision.
    assert await statuses(store, tid) == {"draft": "blocked", "publish": "done"}
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    assert [d["id"] for d in result.waiting["partial"]["done"]] == ["publish"]
    assert (tmp_path / "out" / "publish.txt").read_text() == "LIVE\n"
    await assert_honest(store, tid, two_items())

    await tether.waive_item(store, tid, "draft", reason="not needed", by="carol")
    _, final = await run_task(
        store, two_items(), tmp_path, ScriptedModel(policy=must_not_act), task_id=tid
    )
    assert final.status == "satisfied" and final.stop_reason == "delivered_with_waivers"
    doc = await assert_status_agrees(store, tid)
    assert [w["id"] for w in doc["waivers"]] == ["draft"]
    await assert_honest(store, tid, two_items())


async def test_retry_without_new_work_blocks_again_with_fresh_counters(
    store: MemoryStore, tmp_path: Path, blocked_task: str
) -> None:
    tid = blocked_task
    before = len(await events_of(store, tid, "round.started"))
    await tether.retry_item(store, tid, "draft", by="dave")
    actor = ScriptedModel(policy=claimer("I told you, it is all done already."))
    _, result = await run_task(
        store,
        two_items(),
        tmp_path,
        actor,
        judge=ScriptedModel(policy=credulous_judge),
        task_id=tid,
    )
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    assert await statuses(store, tid) == {"draft": "blocked", "publish": "blocked"}
    # The counters were reset: the item got its full no-progress allowance again.
    rounds = await events_of(store, tid, "round.started")
    assert [r["item"] for r in rounds[before:]] == ["draft"] * 3
    assert actor.calls == 3
    assert len(await events_of(store, tid, "decision.requested")) == 2
    await assert_honest(store, tid, two_items())


async def test_abandon_ends_the_task_for_good(
    store: MemoryStore, tmp_path: Path, blocked_task: str
) -> None:
    tid = blocked_task
    task = await tether.abandon_task(store, tid, reason="the client cancelled", by="erin")
    assert (task.status, task.stop_reason) == ("abandoned", "abandoned_by_user")
    assert task.waiting is None
    _, result = await run_task(
        store, two_items(), tmp_path, ScriptedModel(policy=must_not_act), task_id=tid
    )
    assert (result.status, result.stop_reason) == ("abandoned", "abandoned_by_user")
    terminal = await terminal_transitions(store, tid)
    assert len(terminal) == 1 and "erin" in terminal[0]["reason"]
    assert "the client cancelled" in terminal[0]["reason"]
    # A terminal task takes no more decisions.
    with pytest.raises(errors.UserError):
        await tether.waive_item(store, tid, "draft", reason="too late")
    with pytest.raises(errors.UserError):
        await tether.retry_item(store, tid, "draft")
    await assert_status_agrees(store, tid)


async def test_bad_decisions_are_refused_and_change_nothing(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(op_rule_items("a") + plain_items("b"))

    def actor(request: ModelRequest) -> ModelResponse:
        if request.ledger and request.ledger["next"] == "a":
            return say("writing a", write("a"))
        return say("all done, trust me")

    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert result.status == "waiting"
    before = await ledger_of(store, tid)
    with pytest.raises(errors.UserError, match="reason"):
        await tether.waive_item(store, tid, "b", reason="   ")
    with pytest.raises(errors.UserError, match="reason"):
        await tether.abandon_task(store, tid, reason="")
    with pytest.raises(errors.UserError, match="no item"):
        await tether.retry_item(store, tid, "zzz")
    with pytest.raises(errors.UserError, match="no item"):
        await tether.waive_item(store, tid, "zzz", reason="x")
    with pytest.raises(errors.UserError, match="done"):
        await tether.retry_item(store, tid, "a")
    with pytest.raises(errors.UserError, match="done"):
        await tether.waive_item(store, tid, "a", reason="x")
    after = await ledger_of(store, tid)
    assert after.version == before.version
    assert (await store.get_task(tid)).status == "waiting"
    await assert_honest(store, tid, spec)


@pytest.mark.parametrize(
    "cap",
    [{"limits": {"max_rounds": 6}}, {"budget": {"rounds": 6}}],
    ids=["max_rounds", "rounds-budget"],
)
async def test_waiving_every_gap_delivers_even_when_the_rounds_are_used_up(
    store: MemoryStore, tmp_path: Path, cap: dict[str, Any]
) -> None:
    # Two items, three rounds without progress each: blocked in rounds 3 and 6.
    spec = contract(plain_items("draft", "publish"), **cap)
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=claimer(CLAIMS[1])))
    assert result.waiting is not None and result.waiting["kind"] == "decision"
    for item in ("draft", "publish"):
        await tether.waive_item(store, tid, item, reason="not needed", by="pm")
    _, final = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=must_not_act), task_id=tid
    )
    assert (final.status, final.stop_reason) == ("satisfied", "delivered_with_waivers")
