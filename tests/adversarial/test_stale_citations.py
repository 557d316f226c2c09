"""A model and judge that cite what no longer holds: a source read made stale by a
re-read in the same round (before its op is journaled, so nothing had sent it to
history yet), the snapshot and evidence that re-read invalidated, the search hits that
name them as history, and another task's evidence. Every store: none proves an item,
by the LLM judge or by an op rule."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.adversarial.test_source_forgery import Calls
from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    change,
    contract,
    journal,
    say,
    statuses,
    verdict,
)
from tests.support.loop import by_purpose, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.tasks import create_task
from tether.store.base import Store
from tether.tools.builtin.files import default_registry
from tether.tools.registry import ToolContext, tool

SOURCE = {"id": "C", "kind": "dataset", "version": "7", "location": "c.csv", "pin": "fingerprint"}


async def _foreign_evidence(store: Store, tmp_path: Path) -> str:
    """A valid evidence artifact of another task in the same store."""
    ws = tmp_path / "other"
    ws.mkdir()
    (ws / "c.csv").write_text("x,y\n1,2\n")
    task = await create_task(
        store, contract([{"id": "i", "title": "t"}], sources=[SOURCE]), workspace=ws
    )
    lease = await store.claim("w", 60, task_id=task.task_id)
    assert lease is not None
    call = Calls(store, task.task_id, lease.token, ws)
    await call("read_source", source="C")
    out = await call("record_evidence", source_artifact=f"{task.task_id}.r1.c0.fp", excerpt="1,2")
    return out.split("evidence artifact ", 1)[1].split()[0]


async def test_stale_and_foreign_citations_prove_nothing(store: Store, tmp_path: Path) -> None:
    foreign = await _foreign_evidence(store, tmp_path)
    (tmp_path / "c.csv").write_text("x,y\n1,2\n")

    @tool(name="mutate", effect="write")
    def mutate(ctx: ToolContext, content: str) -> str:
        """The world changes the dataset (the model cannot: it is a source)."""
        (tmp_path / "c.csv").write_text(content)
        return "changed"

    registry = default_registry(lambda: store)
    registry.add(mutate)
    spec = contract(
        [
            {"id": "facts", "title": "read the dataset"},
            {
                "id": "rule",
                "title": "read the dataset from its third character",
                "done_when": {"kind": "op", "tool": "read_source", "args": {"offset": 2}},
            },
            {"id": "cited", "title": "quote the dataset", "evidence_from": {"artifacts": ["C"]}},
        ],
        sources=[SOURCE],
        tools=["read_source", "record_evidence", "search_artifacts", "mutate"],
        limits={"max_rounds": 2},
    )
    tid = (await create_task(store, spec, workspace=tmp_path)).task_id
    acts = 0
    searched: list[str] = []

    def actor(request: ModelRequest) -> ModelResponse:
        nonlocal acts
        acts += 1
        if acts == 1:  # read and quote the dataset, which then changes; read it again
            return say(
                "all done",
                tool_call("read_source", source="C", offset=0),
                tool_call("record_evidence", source_artifact=f"{tid}.r1.c0.fp", excerpt="1,2"),
                tool_call("read_source", source="C", offset=2),  # the same version: c0's
                tool_call("mutate", content="x,y\n9,9\n"),
                tool_call("read_source", source="C", offset=1),  # not the rule's read
            )
        return say("all done", tool_call("search_artifacts", query="1,2", include_invalid=True))

    def judge(request: ModelRequest) -> str:
        ops = journal(request)
        stale_read = f"op:{tid}.r1.c0"
        hits: list[str] = []
        for o in ops:
            if o["tool"] == "search_artifacts":
                hits += re.findall(r"artifact:(\S+?)[ ;,)]", str(o.get("result", "")))
        searched.extend(hits)
        cited = [f"artifact:{tid}.r1.c0.fp", f"artifact:{tid}.r1.c1.ev", f"artifact:{foreign}"]
        changes: list[dict[str, Any]] = [
            change("facts", "done", [stale_read]),
            change("cited", "done", cited + [f"artifact:{h}" for h in hits]),
        ]
        return verdict(changes, decision="satisfied")

    _, res = await run_task(
        store,
        spec,
        tmp_path,
        ScriptedModel(policy=by_purpose(act=actor)),
        judge=ScriptedModel(policy=judge),
        registry=registry,
        task_id=tid,
    )
    assert res.status != "satisfied", res
    # The search named the invalidated evidence (as history); citing it did not help.
    assert f"{tid}.r1.c1.ev" in searched, searched
    got = await statuses(store, tid)
    assert got["facts"] != "done" and got["rule"] != "done" and got["cited"] != "done", got
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)
