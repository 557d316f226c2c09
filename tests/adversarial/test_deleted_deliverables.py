"""Deleting or altering a deliverable behind a done item never ends `satisfied`.

The evidence of a done item may be a workspace file: the rule judge's file evidence (path
and content hash recorded when it was accepted) or a `write_file` op the LLM judge cited.
Files live outside the store; recovery and the check before delivery look again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.adversarial import (
    assert_honest,
    change,
    contract,
    payload,
    plain_items,
    refs,
    say,
    verdict,
    warnings,
    write,
)
from tests.support.loop import ledger_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel
from tether.store.memory import MemoryStore


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def actor(request: ModelRequest) -> ModelResponse:
    nxt = request.ledger["next"] if request.ledger else None
    return say(f"writing {nxt}", write(nxt)) if nxt else say("everything is done")


def journal_judge(request: ModelRequest) -> str:
    """Credits each item with the write of its own file this round (op evidence)."""
    nxt = payload(request)["focus_item"]
    done = refs(request, tool="write_file")
    return verdict([change(nxt, "done", done)] if nxt and done else [])


async def test_op_evidence_of_a_deleted_file_reopens_on_resume(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(plain_items("a", "b"))
    judge = ScriptedModel(policy=journal_judge)
    tid, _ = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=actor), judge=judge, max_rounds_this_run=1
    )
    assert (await ledger_of(store, tid)).item("a").status == "done"
    (tmp_path / "out" / "a.txt").unlink()
    _, result = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=actor),
        judge=ScriptedModel(policy=journal_judge),
        task_id=tid,
    )
    assert result.status == "satisfied"
    # The item was done again on a new write, not on the write of the deleted file.
    assert (tmp_path / "out" / "a.txt").is_file()
    await assert_honest(store, tid, spec)


async def test_a_deliverable_that_cannot_come_back_is_a_gap_not_a_delivery(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = contract(
        [
            {
                "id": "a",
                "title": "write out/a.txt",
                "done_when": {"kind": "file", "path": "out/a.txt"},
            },
            {
                "id": "b",
                "title": "write out/b.txt",
                "done_when": {"kind": "file", "path": "out/b.txt"},
            },
        ],
        limits={"no_progress_rounds": 2},
    )
    calls = {"n": 0}

    def forgetful(request: ModelRequest) -> ModelResponse:
        # Writes a, then b while deleting a; afterwards never writes a again.
        calls["n"] += 1
        if calls["n"] == 1:
            return say("a", write("a"))
        if calls["n"] == 2:
            (tmp_path / "out" / "a.txt").unlink()
            return say("b", write("b"))
        return say("nothing left to do, I think")

    tid, result = await run_task(store, spec, tmp_path, ScriptedModel(policy=forgetful))
    assert result.status != "satisfied"
    led = await ledger_of(store, tid)
    assert led.item("a").status == "blocked" and led.item("b").status == "done"
    found = await warnings(store, tid, "deliverable_broken")
    assert [w["details"]["item"] for w in found] == ["a"]
    await assert_honest(store, tid, spec)
