"""A model that has its deliverable accepted, then writes over it (empty, or other
text) while working on the next item: the earlier item's evidence no longer stands for
the file, so the task is not delivered with it until the item is done again. A later
append or a fuller version that keeps what was accepted is no break."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.adversarial import (
    assert_honest,
    change,
    contract,
    journal,
    plain_items,
    say,
    verdict,
    warned_items,
    write,
)
from tests.support.loop import run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.base import Store

ACCEPTED = "alpha: the figures, checked\n"


def judge(request: ModelRequest) -> str:
    """Accepts each written out/<item>.txt with text in it, citing the write."""
    changes = []
    for o in journal(request):
        path = str(o["args"].get("path", ""))
        if o["status"] == "succeeded" and o["args"].get("content") and path.startswith("out/"):
            changes.append(change(path[4:-4], "done", [o["evidence_ref"]]))
    return verdict(changes)


@pytest.mark.parametrize(
    ("later", "breaks"),
    [
        (tool_call("write_file", path="out/a.txt", content=""), True),
        (tool_call("write_file", path="out/a.txt", content="alpha: nothing\n"), True),
        (tool_call("write_file", path="./out//a.txt", content="alpha: nothing\n"), True),
        (tool_call("append_file", path="out/a.txt", content="appendix\n"), False),
        (tool_call("write_file", path="out/a.txt", content=f"intro\n{ACCEPTED}more\n"), False),
    ],
    ids=["emptied", "replaced", "respelled", "appended", "fuller"],
)
async def test_a_deliverable_written_over_after_acceptance(
    store: Store, tmp_path: Path, later: object, breaks: bool
) -> None:
    spec = contract(plain_items("a", "b"), limits={"max_rounds": 8})
    first = True

    def actor(request: ModelRequest) -> ModelResponse:
        nonlocal first
        nxt = request.ledger["next"] if request.ledger else None
        if nxt == "a":
            return say("a", write("a", ACCEPTED))
        if nxt == "b" and first:
            first = False
            return say("b, and a touch to a", later, write("b"))  # type: ignore[arg-type]
        return say("b", write("b")) if nxt else say("all done")

    tid, res = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=actor), judge=ScriptedModel(policy=judge)
    )
    await assert_honest(store, tid, spec)
    assert res.status == "satisfied", res
    text = (tmp_path / "out" / "a.txt").read_text()
    assert ACCEPTED in text  # never delivered without what was accepted
    assert (await warned_items(store, tid, "deliverable_broken") == {"a"}) is breaks
