"""Failure class 3: a judge that skips, blocks, waives or abandons.

Only the runtime blocks, only a human (or the contract, for optional items) skips or
waives, and only a human abandons. A judge's `blocked`/`skipped`/`waived` is an
`audit.warning` (`judge_proposed_<status>`) plus an entry in the partial-completion
record, never a status change; its `abandon` is a question for a human.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tether
from tests.support.adversarial import (
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
    warnings,
    write,
)
from tests.support.loop import events_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def writer(request: ModelRequest) -> ModelResponse:
    nxt = request.ledger["next"] if request.ledger else None
    return say(f"writing {nxt}", write(nxt)) if nxt else say("nothing open")


def idle(_: ModelRequest) -> ModelResponse:
    return say("This cannot be done with the tools I have; the judge should skip it.")


def focus_of(request: ModelRequest) -> str | None:
    focus = payload(request)["focus_item"]
    return str(focus) if focus else None


CONTRACTS = {
    "rules": lambda: contract(op_rule_items("fetch", "parse", "report")),
    "no-rules": lambda: contract(plain_items("fetch", "parse", "report")),
    "mixed": lambda: contract(
        op_rule_items("fetch") + plain_items("parse") + op_rule_items("report")
    ),
}


@pytest.mark.parametrize("kind", list(CONTRACTS))
async def test_judge_blocking_other_items_changes_nothing(
    store: MemoryStore, tmp_path: Path, kind: str
) -> None:
    spec = CONTRACTS[kind]()
    ruled = {i.id for i in spec.items if i.done_when is not None}

    def blocking_judge(request: ModelRequest) -> str:
        focus = focus_of(request)
        changes = [
            change(i, "blocked", note=f"{i} looks impossible, give up on it")
            for i in open_ids(request)
            if i != focus
        ]
        if focus and focus not in ruled:
            changes.append(change(focus, "done", refs(request, tool="write_file")))
        return verdict(changes, "satisfied", "the rest is blocked anyway")

    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=writer),
        judge=ScriptedModel(policy=blocking_judge),
    )
    assert result.status == "satisfied" and result.stop_reason == "delivered"
    assert set((await statuses(store, tid)).values()) == {"done"}
    proposed = await warnings(store, tid, "judge_proposed_blocked")
    assert {w["details"]["item"] for w in proposed} == {"parse", "report"}
    assert all("give up" in w["details"]["note"] for w in proposed)
    # Nothing was ever blocked: no item_blocked warning, no status change to blocked.
    assert await warned_items(store, tid, "item_blocked") == set()
    for upd in await events_of(store, tid, "ledger.updated"):
        assert all(c.get("after") != "blocked" for c in upd["diff"] if c["field"] == "status")
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


@pytest.mark.parametrize("kind", list(CONTRACTS))
async def test_judge_skips_waives_and_blocks_an_idle_task(
    store: MemoryStore, tmp_path: Path, kind: str
) -> None:
    spec = CONTRACTS[kind]()
    notes = {
        "fetch": ("skipped", "the source is offline; skip it"),
        "parse": ("waived", "the user would surely waive this"),
        "report": ("blocked", "depends on parse"),
    }

    def proposing_judge(request: ModelRequest) -> str:
        return verdict(
            [change(i, st, note=note) for i, (st, note) in notes.items()],
            "satisfied",
            "nothing more can be done, so we are finished",
        )

    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=idle),
        judge=ScriptedModel(policy=proposing_judge),
    )
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    # Every item blocked by the runtime (no progress), none skipped or waived.
    assert await statuses(store, tid) == dict.fromkeys(notes, "blocked")
    partial = result.waiting["partial"]
    assert partial["skipped"] == [] and partial["waived"] == []
    assert all(b["reason"].startswith("no progress") for b in partial["blocked"])
    assert partial["proposed"] == {
        i: {"status": st, "note": note} for i, (st, note) in notes.items()
    }
    codes = await warning_codes(store, tid)
    assert {
        "judge_proposed_skipped",
        "judge_proposed_waived",
        "judge_proposed_blocked",
        "satisfied_with_pending",
        "satisfied_with_gaps",
    } <= codes
    assert await events_of(store, tid, "item.waived") == []
    assert await terminal_transitions(store, tid) == []
    await assert_honest(store, tid, spec)
    doc = await assert_status_agrees(store, tid)
    assert doc["waivers"] == []


async def test_retry_forgets_the_judges_proposal_for_that_item(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(plain_items("fetch", "parse"))

    def judge(request: ModelRequest) -> str:
        return verdict([change(focus_of(request) or "fetch", "skipped", note="meh")], "continue")

    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=idle), judge=ScriptedModel(policy=judge)
    )
    assert result.waiting is not None
    assert set(result.waiting["partial"]["proposed"]) == {"fetch", "parse"}
    await tether.retry_item(store, tid, "fetch", hint="use the mirror")
    quiet = ScriptedModel(policy=lambda _: verdict([], "continue"))
    _, again = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=idle), judge=quiet, task_id=tid
    )
    assert again.waiting is not None and again.waiting["kind"] == "decision"
    assert set(again.waiting["partial"]["proposed"]) == {"parse"}
    assert await statuses(store, tid) == {"fetch": "blocked", "parse": "blocked"}
    assert len(await events_of(store, tid, "decision.requested")) == 2
    await assert_honest(store, tid, spec)


async def test_judge_abandon_asks_a_human_and_is_not_terminal(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(op_rule_items("fetch", "parse"))
    mood = {"give_up": True}

    def moody_judge(request: ModelRequest) -> str:
        if mood["give_up"]:
            return verdict(
                [change("fetch", "blocked", note="hopeless")], "abandon", "this task is hopeless"
            )
        return verdict([], "continue", "carry on")

    judge = ScriptedModel(policy=moody_judge)
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=idle), judge=judge)
    assert result.status == "waiting" and result.stop_reason is None
    assert result.waiting is not None and result.waiting["kind"] == "human"
    assert "abandon" in result.waiting["reason"] and "hopeless" in result.waiting["reason"]
    assert {"judge_proposed_abandon", "judge_proposed_blocked"} <= await warning_codes(store, tid)
    assert await terminal_transitions(store, tid) == []
    assert await statuses(store, tid) == {"fetch": "in_progress", "parse": "pending"}
    # The human lets it go on: the work gets done.
    mood["give_up"] = False
    _, resumed = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=writer), judge=judge, task_id=tid
    )
    assert resumed.status == "satisfied" and resumed.stop_reason == "delivered"
    await assert_honest(store, tid, spec)


async def test_judge_cannot_mark_a_rule_item_done_with_the_wrong_write(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(op_rule_items("fetch"), limits={"no_progress_rounds": 2})

    def sloppy_actor(_: ModelRequest) -> ModelResponse:
        return say("saved it (close enough)", write("fetched"))  # out/fetched.txt, not fetch

    def lenient_judge(request: ModelRequest) -> str:
        return verdict([change("fetch", "done", refs(request))], "satisfied", "a file was written")

    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=sloppy_actor),
        judge=ScriptedModel(policy=lenient_judge),
    )
    assert result.status == "waiting"
    assert await statuses(store, tid) == {"fetch": "blocked"}
    assert "rule_item_done_by_judge" in await warning_codes(store, tid)
    await assert_honest(store, tid, spec)


# --- optional items and waivers (regressions: these were bugs before 0ba47f6) --------------


async def test_optional_item_may_end_skipped(store: MemoryStore, tmp_path: Path) -> None:
    spec = contract(
        [*op_rule_items("core"), {"id": "extras", "title": "nice-to-have polish", "optional": True}]
    )

    def actor(request: ModelRequest) -> ModelResponse:
        if request.ledger and request.ledger["next"] == "core":
            return say("writing core", write("core"))
        return say("extras is optional; skipping it")

    def judge(request: ModelRequest) -> str:
        return verdict(
            [change("extras", "skipped", note="optional and not needed")], "satisfied", "core done"
        )

    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=actor), judge=ScriptedModel(policy=judge)
    )
    await assert_honest(store, tid, spec)
    assert await statuses(store, tid) == {"core": "done", "extras": "skipped"}
    assert (result.status, result.stop_reason) == ("satisfied", "delivered_with_waivers")
    doc = await assert_status_agrees(store, tid)
    assert [(w["id"], w["status"]) for w in doc["waivers"]] == [("extras", "skipped")]


async def test_optional_item_the_runtime_would_block_ends_skipped(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(
        [
            {"id": "extras", "title": "nice-to-have polish", "optional": True},
            *op_rule_items("core"),
        ]
    )

    def actor(request: ModelRequest) -> ModelResponse:
        if request.ledger and request.ledger["next"] == "core":
            return say("writing core", write("core"))
        return say("All items are complete.")  # never works on extras

    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert await statuses(store, tid) == {"extras": "skipped", "core": "done"}
    assert (result.status, result.stop_reason) == ("satisfied", "delivered_with_waivers")
    assert await warned_items(store, tid, "item_skipped") == {"extras"}
    assert await warned_items(store, tid, "item_blocked") == set()
    await assert_honest(store, tid, spec)


async def test_a_judge_cannot_skip_an_item_that_is_not_optional(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(op_rule_items("core") + plain_items("extras"))

    def actor(request: ModelRequest) -> ModelResponse:
        if request.ledger and request.ledger["next"] == "core":
            return say("writing core", write("core"))
        return say("extras is optional; skipping it")

    def judge(request: ModelRequest) -> str:
        return verdict([change("extras", "skipped", note="looks optional")], "satisfied")

    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=actor), judge=ScriptedModel(policy=judge)
    )
    assert await statuses(store, tid) == {"core": "done", "extras": "blocked"}
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["partial"]["proposed"] == {
        "extras": {"status": "skipped", "note": "looks optional"}
    }
    await assert_honest(store, tid, spec)


async def test_judge_cannot_reopen_a_waived_item(store: MemoryStore, tmp_path: Path) -> None:
    spec = contract(plain_items("legacy", "feature"))
    phase: dict[str, Any] = {"n": 0}

    def judge(request: ModelRequest) -> str:
        if phase["n"] == 0:
            return verdict([], "continue")
        return verdict(
            [change("legacy", "in_progress", note="actually, let us do legacy after all")],
            "continue",
        )

    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=idle), judge=ScriptedModel(policy=judge)
    )
    assert result.waiting is not None and result.waiting["kind"] == "decision"
    await tether.waive_item(store, tid, "legacy", reason="legacy is retired", by="pm")
    await tether.retry_item(store, tid, "feature", hint="try again", by="pm")
    phase["n"] = 1
    await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=idle),
        judge=ScriptedModel(policy=judge),
        task_id=tid,
        max_rounds_this_run=1,
    )
    assert (await statuses(store, tid))["legacy"] == "waived"
    assert await warned_items(store, tid, "waived_item_changed_by_judge") == {"legacy"}
    await assert_honest(store, tid, spec)


async def test_reviewer_cannot_reopen_a_waived_item(store: MemoryStore, tmp_path: Path) -> None:
    spec = contract(op_rule_items("core") + plain_items("legacy"), review=True)

    def actor(request: ModelRequest) -> ModelResponse:
        if request.ledger and request.ledger["next"] == "core":
            return say("writing core", write("core"))
        return say("legacy cannot be done")

    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=actor))
    assert result.waiting is not None and result.waiting["kind"] == "decision"
    await tether.waive_item(store, tid, "legacy", reason="legacy is retired", by="pm")
    reviewer = ScriptedModel(
        policy=lambda _: '{"passed": false, "gaps": ["legacy is missing"], "reopen": ["legacy"]}'
    )
    await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=actor),
        review=reviewer,
        task_id=tid,
        max_rounds_this_run=1,
    )
    assert (await statuses(store, tid))["legacy"] == "waived"
