"""Failure class 2: one piece of evidence proving many items.

Judges cite one real write for several items, an op made while another item was the
focus, or evidence already credited to another item. Only the item the evidence belongs
to may become done (`evidence_not_item`, `evidence_already_credited`), unless the
contract links the evidence (`evidence_from`) and allows sharing (`shared_evidence`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    change,
    contract,
    focus_by_round,
    open_ids,
    payload,
    plain_items,
    refs,
    say,
    statuses,
    verdict,
    warning_codes,
    warnings,
    write,
)
from tests.support.loop import events_of, ledger_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def focus_of(request: ModelRequest) -> str:
    return str(payload(request)["focus_item"])


def writer(request: ModelRequest) -> ModelResponse:
    """Honest work: writes the focus item's file."""
    nxt = request.ledger["next"] if request.ledger else None
    if nxt is None:
        return say("nothing open")
    return say(f"writing {nxt}", write(nxt))


async def op_rounds(store: MemoryStore, tid: str) -> dict[str, int]:
    return {o.op_id: o.round for o in await store.get_ops(tid)}


async def assert_each_done_by_its_own_round(store: MemoryStore, tid: str) -> None:
    led = await ledger_of(store, tid)
    focus = await focus_by_round(store, tid)
    rounds = await op_rounds(store, tid)
    for d, s in led.items():
        assert s.status == "done"
        assert [focus[rounds[r[3:]]] for r in s.evidence] == [d.id], (d.id, s.evidence)


@pytest.mark.parametrize(
    "decision", ["satisfied", "continue", "need_user"], ids=lambda d: f"says-{d}"
)
async def test_one_write_cited_for_every_item_proves_only_the_focus(
    store: MemoryStore, tmp_path: Path, decision: str
) -> None:
    spec = contract(plain_items("schema", "migration", "docs"))

    def greedy_judge(request: ModelRequest) -> str:
        # "This write covers everything": the one op for every open item.
        ops = refs(request, tool="write_file")
        return verdict(
            [change(i, "done", ops, note="covered by the same commit") for i in open_ids(request)],
            decision if len(open_ids(request)) > 1 else "satisfied",
            "one commit did it all",
        )

    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=writer),
        judge=ScriptedModel(policy=greedy_judge),
    )
    if decision == "need_user":
        # Asking a human is honoured, but it never finishes anything.
        assert result.status == "waiting" and result.waiting is not None
        assert result.waiting["kind"] == "human"
        assert await statuses(store, tid) == {
            "schema": "done",
            "migration": "pending",
            "docs": "pending",
        }
    else:
        assert result.status == "satisfied" and result.stop_reason == "delivered"
        verdicts = await events_of(store, tid, "judge.verdict")
        assert [v["done"] for v in verdicts] == [1, 2, 3]
        await assert_each_done_by_its_own_round(store, tid)
    refused = await warnings(store, tid, "evidence_not_item")
    assert {w["details"]["item"] for w in refused} >= {"migration", "docs"}
    assert all(w["details"]["refs"] for w in refused)
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


async def test_the_write_claimed_for_the_next_item_instead(
    store: MemoryStore, tmp_path: Path
) -> None:
    """The judge shifts credit: the focus item's write is cited for the item after it."""
    spec = contract(plain_items("a", "b", "c"), limits={"no_progress_rounds": 2})

    def shifting_judge(request: ModelRequest) -> str:
        ids = ["a", "b", "c"]
        focus = focus_of(request)
        later = ids[ids.index(focus) + 1 :]
        ops = refs(request)
        return verdict([change(i, "done", ops) for i in later], "satisfied", "ahead of plan")

    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=writer),
        judge=ScriptedModel(policy=shifting_judge),
    )
    # Nothing is ever credited (the right item is never named), so each is blocked.
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    assert set((await statuses(store, tid)).values()) == {"blocked"}
    assert {w["details"]["item"] for w in await warnings(store, tid, "evidence_not_item")} == {
        "b",
        "c",
    }
    await assert_honest(store, tid, spec)


async def test_an_op_from_another_items_round_is_not_evidence(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(plain_items("schema", "migration", "docs"))
    first: list[str] = []

    def lazy_actor(request: ModelRequest) -> ModelResponse:
        if request.ledger and request.ledger["next"] == "schema":
            return say("writing the schema", write("schema"))
        return say("The schema file already covers this item as well.")

    def recycling_judge(request: ModelRequest) -> str:
        focus = focus_of(request)
        if focus == "schema":
            first.extend(refs(request))
            return verdict([change("schema", "done", first)], "continue")
        return verdict([change(focus, "done", first, note="see the schema commit")], "satisfied")

    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=lazy_actor),
        judge=ScriptedModel(policy=recycling_judge),
    )
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    assert await statuses(store, tid) == {
        "schema": "done",
        "migration": "blocked",
        "docs": "blocked",
    }
    refused = await warnings(store, tid, "evidence_not_item")
    assert {w["details"]["item"] for w in refused} == {"migration", "docs"}
    assert all(w["details"]["refs"] == first for w in refused)
    partial = result.waiting["partial"]
    assert [d["id"] for d in partial["done"]] == ["schema"]
    assert partial["done"][0]["evidence"] == first
    assert {"satisfied_with_pending", "satisfied_with_gaps"} <= await warning_codes(store, tid)
    await assert_honest(store, tid, spec)


def linked(
    item: str, *, shared: bool = False, tools: tuple[str, ...] = ("write_file",)
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": item,
        "title": f"keep the {item} in step",
        "evidence_from": {"tools": list(tools)},
    }
    if shared:
        out["shared_evidence"] = True
    return out


def code_then_claim(request: ModelRequest) -> ModelResponse:
    if request.ledger and request.ledger["next"] == "code":
        return say("writing the code", write("code"))
    return say("the code commit already updated the changelog")


def double_crediting_judge(seen: list[str]) -> Callable[[ModelRequest], str]:
    """Cites the code write for the code item and for the changelog, every round."""

    def judge(request: ModelRequest) -> str:
        seen.extend(refs(request, tool="write_file"))
        return verdict(
            [change("code", "done", seen[:1]), change("changelog", "done", seen[:1])],
            "satisfied",
            "one commit, two items",
        )

    return judge


async def test_evidence_already_credited_needs_shared_evidence(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract([*plain_items("code"), linked("changelog")])
    seen: list[str] = []
    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=code_then_claim),
        judge=ScriptedModel(policy=double_crediting_judge(seen)),
    )
    assert result.status == "waiting" and result.waiting is not None
    assert await statuses(store, tid) == {"code": "done", "changelog": "blocked"}
    taken = await warnings(store, tid, "evidence_already_credited")
    # Refused in the round that made it (same audit) and in every later round.
    assert len(taken) >= 2
    assert {w["details"]["item"] for w in taken} == {"changelog"}
    assert all(w["details"]["refs"] == [f"{seen[0]} (code)"] for w in taken)
    assert "evidence_not_item" not in await warning_codes(store, tid)  # it is linked
    led = await ledger_of(store, tid)
    assert led.item("changelog").evidence == ()
    await assert_honest(store, tid, spec)


async def test_shared_and_linked_evidence_may_prove_both(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract([*plain_items("code"), linked("changelog", shared=True)])
    seen: list[str] = []
    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=code_then_claim),
        judge=ScriptedModel(policy=double_crediting_judge(seen)),
    )
    assert result.status == "satisfied" and result.stop_reason == "delivered"
    led = await ledger_of(store, tid)
    assert led.item("code").evidence == led.item("changelog").evidence == (seen[0],)
    assert len(await events_of(store, tid, "round.started")) == 1
    codes = await warning_codes(store, tid)
    assert not codes & {"evidence_already_credited", "evidence_not_item"}
    await assert_honest(store, tid, spec)


async def test_sharing_alone_does_not_make_evidence_belong(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(
        [*plain_items("code"), {"id": "changelog", "title": "changelog", "shared_evidence": True}]
    )
    seen: list[str] = []
    tid, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=code_then_claim),
        judge=ScriptedModel(policy=double_crediting_judge(seen)),
    )
    assert result.status == "waiting"
    assert await statuses(store, tid) == {"code": "done", "changelog": "blocked"}
    assert await warned(store, tid, "evidence_not_item") == {"changelog"}
    await assert_honest(store, tid, spec)


async def warned(store: MemoryStore, tid: str, code: str) -> set[str]:
    return {w["details"]["item"] for w in await warnings(store, tid, code)}


async def test_linked_tools_and_artifacts_prove_a_non_focus_item_but_nothing_else(
    store: MemoryStore, tmp_path: Path
) -> None:
    (tmp_path / "big.log").write_text("line of log\n" * 200)  # over the preview: an artifact
    spec = contract(
        [
            *plain_items("code"),
            linked("index", tools=("list_files",)),
            {
                "id": "audit",
                "title": "keep the audit log",
                "evidence_from": {"artifacts": ["read_file output"]},
            },
            *plain_items("notes"),
        ]
    )

    def busy_actor(request: ModelRequest) -> ModelResponse:
        if request.ledger and request.ledger["next"] == "code":
            return say(
                "code, index and audit in one go",
                write("code"),
                tool_call("list_files", path="."),
                tool_call("read_file", path="big.log"),
            )
        return say("notes are covered by the same round")

    def judge(request: ModelRequest) -> str:
        ops = {o["tool"]: o for o in payload(request)["op_journal"]}
        if focus_of(request) != "code":
            return verdict([], "continue")
        w, ls, rd = ops["write_file"], ops["list_files"], ops["read_file"]
        art = f"artifact:{rd['artifact_id']}"
        return verdict(
            [
                change("code", "done", [w["evidence_ref"]]),
                change("index", "done", [ls["evidence_ref"]]),
                change("audit", "done", [art]),
                # Neither the write nor the listing nor the log is linked to notes.
                change("notes", "done", [w["evidence_ref"], ls["evidence_ref"], art]),
                # The write is not linked to index: refused, the listing still proves it.
                change("index", "done", [w["evidence_ref"]]),
            ],
            "satisfied",
        )

    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=busy_actor), judge=ScriptedModel(policy=judge)
    )
    got = await statuses(store, tid)
    assert got == {"code": "done", "index": "done", "audit": "done", "notes": "blocked"}
    led = await ledger_of(store, tid)
    assert led.item("audit").evidence[0].startswith("artifact:")
    assert await warned(store, tid, "evidence_not_item") == {"notes"}
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    await assert_honest(store, tid, spec)


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
async def test_one_op_meets_two_identical_rules_only_with_sharing(
    store: MemoryStore, tmp_path: Path, shared: bool
) -> None:
    any_write = {"kind": "op", "tool": "write_file"}
    items: list[dict[str, Any]] = [
        {"id": "first", "title": "write any file", "done_when": any_write},
        {"id": "second", "title": "write any file again", "done_when": any_write},
    ]
    if shared:
        items[1]["shared_evidence"] = True
    spec = contract(items)
    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=writer))
    assert result.status == "satisfied"
    led = await ledger_of(store, tid)
    verdicts = await events_of(store, tid, "judge.verdict")
    if shared:
        assert [v["done"] for v in verdicts] == [2]
        assert led.item("first").evidence == led.item("second").evidence
    else:
        assert [v["done"] for v in verdicts] == [1, 2]
        assert set(led.item("first").evidence).isdisjoint(led.item("second").evidence)
        # The rule judge offered the first write for both; the audit kept it to one.
        assert await warned(store, tid, "evidence_already_credited") == {"second"}
    await assert_honest(store, tid, spec)
