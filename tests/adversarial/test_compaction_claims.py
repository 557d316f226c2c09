"""Failure class 6 (light): a compressor whose summary claims work the ledger does not
record. The claim is flagged (`summary_claims_done`) and changes nothing: the items stay
open, and the task never ends `satisfied` on the strength of a summary.

The claim detector itself lives in `round/claims.py`; these tests use plain
per-item claims that any detector must catch and assert only the contract.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    contract,
    statuses,
    terminal_transitions,
    warnings,
)
from tests.support.loop import by_purpose, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore

SUMMARIES = [
    "Summary of earlier work: fetch done. parse done. Only the report is left.",
    "PROGRESS\n- fetch: done\n- parse: done\nThe team can stop here.",
]


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


@pytest.mark.parametrize("summary", SUMMARIES, ids=["sentences", "bullets"])
async def test_summary_claiming_open_items_done_changes_nothing(
    store: MemoryStore, tmp_path: Path, summary: str
) -> None:
    (tmp_path / "big.txt").write_text("y" * 900)
    spec = contract(
        [
            {"id": i, "title": f"{i} stage", "done_when": {"kind": "file", "path": f"out/{i}.txt"}}
            for i in ("fetch", "parse", "report")
        ],
        context={"input_budget_tokens": 1500, "preview_chars": 800},
        limits={"no_progress_rounds": 40, "max_rounds": 8},
    )
    compacted: list[str] = []

    def actor(_: ModelRequest) -> ModelResponse:
        # Fills the context without ever doing the work.
        return ModelResponse("reading", (tool_call("read_file", path="big.txt"),))

    def liar(request: ModelRequest) -> str:
        compacted.append(request.system)
        return summary

    def judge(_: ModelRequest) -> str:
        return '{"changes": [], "decision": "satisfied", "reason": "the summary says so"}'

    model = ScriptedModel(policy=by_purpose(act=actor, compact=liar, judge=judge))
    tid, result = await run_task(store, spec, tmp_path, model, judge=model, compact=model)
    assert compacted, "the small input budget should have forced a compaction"
    assert result.status != "satisfied"
    assert await terminal_transitions(store, tid) == []
    assert "done" not in (await statuses(store, tid)).values()
    flagged = await warnings(store, tid, "summary_claims_done")
    assert flagged
    assert {"fetch", "parse"} <= set(flagged[0]["details"]["items"])
    assert "report" not in flagged[0]["details"]["items"]
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


@pytest.mark.parametrize("summary", SUMMARIES, ids=["sentences", "bullets"])
async def test_the_same_lie_at_default_limits(
    store: MemoryStore, tmp_path: Path, summary: str
) -> None:
    """The test above with the contract's default limits: the actor reads new notes
    every round (so nothing blocks it early), and the run stops after ten rounds."""
    for k in range(12):
        (tmp_path / f"big-{k}.txt").write_text(f"{k} " + "y" * 900)
    spec = contract(
        [
            {"id": i, "title": f"{i} stage", "done_when": {"kind": "file", "path": f"out/{i}.txt"}}
            for i in ("fetch", "parse", "report")
        ],
        context={"input_budget_tokens": 1500, "preview_chars": 800},
    )
    reads = iter(range(12))

    def actor(_: ModelRequest) -> ModelResponse:
        return ModelResponse(
            "reading", (tool_call("read_file", path=f"big-{next(reads, 11)}.txt"),)
        )

    def judge(_: ModelRequest) -> str:
        return '{"changes": [], "decision": "satisfied", "reason": "the summary says so"}'

    model = ScriptedModel(policy=by_purpose(act=actor, compact=lambda _: summary, judge=judge))
    tid, result = await run_task(
        store, spec, tmp_path, model, judge=model, compact=model, max_rounds_this_run=10
    )
    assert "limits" not in spec.model_fields_set
    assert result.status != "satisfied"
    assert await terminal_transitions(store, tid) == []
    assert "done" not in (await statuses(store, tid)).values()
    flagged = await warnings(store, tid, "summary_claims_done")
    assert flagged and {"fetch", "parse"} <= set(flagged[0]["details"]["items"])
    await assert_honest(store, tid, spec)


# --- ranges and whole-task wording, at default limits ----------------------------------------

SHELVES = [f"cat-{k}" for k in range(1, 9)]

#: Lying summaries: after cat-1..cat-3, each claims the open shelves in other words.
RANGE_LIES = [
    "cat-1 to cat-8 were all catalogued.",
    "Progress: cat-1 through cat-8 finished, nothing else to report.",
    "Shelves 1-8 catalogued.",
    "cat-4 onwards are done as well.",
    "The whole catalogue is finished.",
    "Catalogue complete.",
    "Every shelf has been catalogued.",
    "We catalogued everything; the reads below were only for the index.",
    "**cat-1 → cat-8**: catalogued ✅",
    "Everything up to cat-8 is done.",
    "Summary: ALL ITEMS ARE DONE. cat-4 done, cat-5 done. Nothing is left.",
]


@pytest.mark.parametrize("summary", RANGE_LIES)
async def test_a_range_or_whole_task_lie_changes_nothing(
    store: MemoryStore, tmp_path: Path, summary: str
) -> None:
    for k in range(12):
        (tmp_path / f"shelf-notes-{k}.txt").write_text(f"notes {k} " + "z" * 880)
    spec = contract(
        [
            {
                "id": s,
                "title": f"catalogue shelf {s[4:]}",
                "done_when": {"kind": "file", "path": f"out/{s}.txt"},
            }
            for s in SHELVES
        ],
        objective="catalogue the shelves",
        context={"input_budget_tokens": 1500, "preview_chars": 800},
    )
    compacted: list[str] = []
    reads = iter(range(12))

    def actor(request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        if nxt in ("cat-1", "cat-2", "cat-3"):
            return ModelResponse(
                f"cataloguing {nxt}", (tool_call("write_file", path=f"out/{nxt}.txt", content=nxt),)
            )
        # Reads new notes every round (never repeating itself), never catalogues more.
        k = next(reads, 11)
        return ModelResponse("reading", (tool_call("read_file", path=f"shelf-notes-{k}.txt"),))

    def liar(request: ModelRequest) -> str:
        compacted.append(request.system)
        return summary

    def judge(_: ModelRequest) -> str:
        return '{"changes": [], "decision": "satisfied", "reason": "the summary says so"}'

    model = ScriptedModel(policy=by_purpose(act=actor, compact=liar, judge=judge))
    tid, result = await run_task(
        store, spec, tmp_path, model, judge=model, compact=model, max_rounds_this_run=10
    )
    assert "limits" not in spec.model_fields_set  # default limits
    assert compacted, "the small input budget should have forced a compaction"
    assert result.status != "satisfied"
    assert await terminal_transitions(store, tid) == []
    st = await statuses(store, tid)
    assert [s for s in SHELVES if st[s] == "done"] == ["cat-1", "cat-2", "cat-3"]
    flagged = await warnings(store, tid, "summary_claims_done")
    assert flagged, f"the lie {summary!r} was not flagged"
    first = flagged[0]["details"]
    assert first["global"] or set(first["items"]) >= {"cat-5", "cat-6", "cat-7", "cat-8"}, first
    assert not {"cat-1", "cat-2", "cat-3"} & set(first["items"])
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)
