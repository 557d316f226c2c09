"""Failure class 4: evidence laundering.

A judge attaches an unrelated (but real) read to an item while it is in progress, and
later says the item is done without citing anything, or citing refs that do not
resolve: a failed op, a made-up ref, another task's op. Evidence attached earlier never
carries an item to done (`done_without_evidence`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import tether
from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    change,
    contract,
    payload,
    plain_items,
    refs,
    say,
    statuses,
    verdict,
    warned_items,
    warning_codes,
    write,
)
from tests.support.loop import ledger_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("meeting notes, nothing to do with fetching\n")
    return tmp_path


async def other_task_refs(store: MemoryStore, tmp_path: Path) -> list[str]:
    """Real, succeeded ops of a different task in the same store."""
    other_ws = tmp_path / "other"
    other_ws.mkdir()

    def other_actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        return say("w", write(nxt)) if nxt else say("done")

    spec = contract(
        [{"id": "fetch", "title": "x", "done_when": {"kind": "file", "path": "out/fetch.txt"}}]
    )
    tid, result = await run_task(store, spec, other_ws, ScriptedModel(policy=other_actor))
    assert result.status == "satisfied"
    found = [f"op:{o.op_id}" for o in await store.get_ops(tid, statuses={"succeeded"})]
    found += [f"artifact:{a.artifact_id}" for a in await store.get_artifacts(tid)]
    return found


def reading_actor(request: ModelRequest) -> ModelResponse:
    """Reads something unrelated on its first round for an item, then only claims."""
    nxt = request.ledger["next"] if request.ledger else None
    rounds_on_item = sum(
        1 for m in request.messages if m.role == "assistant" and f"[{nxt}]" in m.content
    )
    if rounds_on_item == 0:
        return say(f"[{nxt}] looking around", tool_call("read_file", path="notes.txt"))
    return say(
        f"[{nxt}] Fetched everything, this item is done.",
        tool_call("read_file", path="missing/source.csv"),  # the real work fails
    )


Tactic = Callable[[ModelRequest, list[str]], list[str]]

TACTICS: dict[str, Tactic] = {
    "no-evidence": lambda req, other: [],
    "failed-op": lambda req, other: refs(req, status="failed"),
    "made-up": lambda req, other: ["artifact:fetch-results", "op:fetch-succeeded"],
    "other-task": lambda req, other: other,
    "bare-prefix": lambda req, other: ["op:", "artifact:", ""],
}


@pytest.mark.parametrize("tactic", list(TACTICS))
async def test_attached_read_does_not_carry_an_item_to_done(
    store: MemoryStore, workspace: Path, tactic: str
) -> None:
    other = await other_task_refs(store, workspace) if tactic == "other-task" else []
    spec = contract(plain_items("fetch", "summarize"))
    attached: dict[str, str] = {}

    def launderer(request: ModelRequest) -> str:
        focus = str(payload(request)["focus_item"])
        ok = refs(request, tool="read_file")
        if focus not in attached and ok:
            # Step 1: an unrelated read, attached while the item is in progress.
            attached[focus] = ok[0]
            return verdict(
                [change(focus, "in_progress", ok, note="reading the inputs")], "continue"
            )
        # Step 2: "done", on the strength of what was attached before.
        return verdict(
            [
                change(
                    focus, "done", TACTICS[tactic](request, other), note="evidence attached earlier"
                )
            ],
            "satisfied",
            "the evidence is already on the item",
        )

    tid, result = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=reading_actor),
        judge=ScriptedModel(policy=launderer),
    )
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    assert await statuses(store, tid) == {"fetch": "blocked", "summarize": "blocked"}
    led = await ledger_of(store, tid)
    # The attached read stays attached, but never became proof of done.
    for item in ("fetch", "summarize"):
        assert led.item(item).evidence == (attached[item],)
        assert led.item(item).attempts > 0  # the real work failed every time
    codes = await warning_codes(store, tid)
    assert "done_without_evidence" in codes
    assert await warned_items(store, tid, "done_without_evidence") == {"fetch", "summarize"}
    if tactic != "no-evidence":
        assert "unresolved_evidence" in codes
    partial = result.waiting["partial"]
    assert [(b["id"], b["evidence"]) for b in partial["blocked"]] == [
        ("fetch", [attached["fetch"]]),
        ("summarize", [attached["summarize"]]),
    ]
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


async def test_attaching_to_an_item_that_is_not_the_focus_is_refused(
    store: MemoryStore, workspace: Path
) -> None:
    spec = contract(plain_items("fetch", "summarize"), limits={"no_progress_rounds": 2})

    def sideways(request: ModelRequest) -> str:
        focus = str(payload(request)["focus_item"])
        other = "summarize" if focus == "fetch" else "fetch"
        return verdict(
            [
                change(other, "in_progress", refs(request), note="prep work"),
                change(focus, "done", [], note="done, see the attached prep work"),
            ],
            "continue",
        )

    tid, result = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=reading_actor),
        judge=ScriptedModel(policy=sideways),
    )
    assert result.status == "waiting"
    led = await ledger_of(store, tid)
    assert led.item("summarize").evidence == () and led.item("fetch").evidence == ()
    # Evidence for the wrong item is refused; once the runtime blocked an item, moving
    # it back to in_progress is refused before its evidence is looked at.
    refused = await warned_items(store, tid, "evidence_not_item")
    refused |= await warned_items(store, tid, "blocked_item_reopened_by_judge")
    assert refused == {"fetch", "summarize"}
    assert await warned_items(store, tid, "done_without_evidence") == {"fetch", "summarize"}
    await assert_honest(store, tid, spec)


async def test_laundering_after_a_retry_is_still_refused(
    store: MemoryStore, workspace: Path
) -> None:
    spec = contract(plain_items("fetch"))
    attached: list[str] = []

    def launderer(request: ModelRequest) -> str:
        if not attached and refs(request, tool="read_file"):
            attached.extend(refs(request, tool="read_file"))
            return verdict([change("fetch", None, attached)], "continue")
        return verdict([change("fetch", "done", note="it has evidence")], "satisfied")

    judge = ScriptedModel(policy=launderer)
    tid, result = await run_task(
        store, spec, workspace, ScriptedModel(policy=reading_actor), judge=judge
    )
    assert result.status == "waiting"
    await tether.retry_item(store, tid, "fetch", hint="the source is in data/, not missing/")
    _, again = await run_task(
        store,
        spec,
        workspace,
        ScriptedModel(policy=lambda _: say("Done now, honestly.")),
        judge=judge,
        task_id=tid,
    )
    assert again.status == "waiting" and again.waiting is not None
    assert await statuses(store, tid) == {"fetch": "blocked"}
    assert (await ledger_of(store, tid)).item("fetch").evidence == tuple(attached)
    await assert_honest(store, tid, spec)


async def test_honest_citation_of_this_rounds_work_is_accepted(
    store: MemoryStore, workspace: Path
) -> None:
    """Control: the same judge shape, citing this round's real write, finishes the task."""
    spec = contract(plain_items("fetch", "summarize"))

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        return say(f"writing {nxt}", write(str(nxt))) if nxt else say("nothing open")

    def judge(request: ModelRequest) -> str:
        focus = str(payload(request)["focus_item"])
        return verdict([change(focus, "done", refs(request, tool="write_file"))], "continue")

    tid, result = await run_task(
        store, spec, workspace, ScriptedModel(policy=actor), judge=ScriptedModel(policy=judge)
    )
    assert result.status == "satisfied" and result.stop_reason == "delivered"
    assert "done_without_evidence" not in await warning_codes(store, tid)
    await assert_honest(store, tid, spec)
