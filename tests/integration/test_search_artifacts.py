"""`search_artifacts`: the model finds stored artifacts again by a few words, every hit
names an id it can cite, and invalidated artifacts are history (left out, or marked).

Against every store (memory, SQLite FTS5, PostgreSQL full-text search), as a tool call
and in a run of the loop where the id found is what the claim cites."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import run_task
from tether import artifacts as A
from tether import errors
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.round.context import SUMMARY_PREFIX
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import Store
from tether.tools.builtin.files import default_registry
from tether.tools.builtin.sources import source_tools
from tether.tools.registry import Tool, ToolContext

REF = re.compile(r"^\d+\. artifact:(\S+) ", re.M)
SOURCES = [
    {"id": "B", "version": "2.0", "location": "b.md"},
    {"id": "C", "version": "1", "location": "c.md"},
]


class Calls:
    """Calls the tools as the runtime would, one op id per call."""

    def __init__(self, store: Store, task_id: str, token: int, ws: Path) -> None:
        self.store, self.task_id, self.token, self.ws = store, task_id, token, ws
        self.tools: dict[str, Tool] = {t.name: t for t in source_tools(lambda: store)}
        self.n = 0

    async def __call__(self, name: str, **args: Any) -> str:
        self.n += 1
        ctx = ToolContext(
            op_id=f"{self.task_id}.r{self.n}.c0",
            task_id=self.task_id,
            task_version=(await self.store.get_task(self.task_id)).version,
            fencing_token=self.token,
            workspace=self.ws,
            logger=logging.getLogger("test"),
        )
        return str(await self.tools[name].fn(args, ctx))


@pytest.fixture
async def call(store: Store, tmp_path: Path) -> Calls:
    (tmp_path / "b.md").write_text("# B 2.0\nB costs 35 euros and weighs 2 kilograms.\n")
    (tmp_path / "c.md").write_text("# C\nC ships with a charger.\n")
    spec = parse_spec({"objective": "o", "items": [{"id": "i", "title": "t"}], "sources": SOURCES})
    task = await create_task(store, spec, workspace=tmp_path)
    lease = await store.claim("w", 60, task_id=task.task_id)
    assert lease is not None
    return Calls(store, task.task_id, lease.token, tmp_path)


def _id(text: str, what: str) -> str:
    return text.split(what, 1)[1].split()[0]


async def test_a_hit_names_an_id_that_record_claim_accepts(call: Calls) -> None:
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    await call("read_source", source="C")
    ev = _id(
        await call("record_evidence", source_artifact=snap, excerpt="B costs 35 euros"),
        "evidence artifact ",
    )
    found = await call("search_artifacts", query="what does B cost in euros?", kinds=["evidence"])
    assert found.startswith("1 artifact match")
    assert REF.findall(found) == [ev] and "source B 2.0" in found
    assert "[euros]" in found.lower()
    # The id found is evidence the claim may cite.
    claim = await call("record_claim", text="B is cheap", evidence=REF.findall(found))
    assert (await call.store.get_artifact(_id(claim, "claim artifact "))).deps == (
        f"artifact:{ev}",
    )
    # Without a kind, the snapshot the excerpt came from is found as well; C's is not.
    everything = await call("search_artifacts", query="euros")
    assert set(REF.findall(everything)) == {ev, snap}
    assert "no stored artifact matches" in await call("search_artifacts", query="zeppelin")
    limited = await call("search_artifacts", query="euros kilograms charger", limit=1)
    assert len(REF.findall(limited)) == 1


async def test_invalidated_artifacts_are_left_out_or_marked_as_history(call: Calls) -> None:
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    ev = _id(
        await call("record_evidence", source_artifact=snap, excerpt="B costs 35 euros"),
        "evidence artifact ",
    )
    task = await call.store.get_task(call.task_id)
    await edit_task(call.store, call.task_id, A.source_changes(task.spec, ["B=3.0"]))
    assert "no stored artifact matches" in await call("search_artifacts", query="euros")
    history = await call("search_artifacts", query="euros", include_invalid=True)
    assert set(REF.findall(history)) == {ev, snap}
    assert history.count("INVALID, history only, do not cite") == 2
    assert "changed from version 2.0 to 3.0" in history
    with pytest.raises(errors.ToolFailed, match="not a valid evidence"):
        await call("record_claim", text="B is cheap", evidence=[ev])


async def test_hostile_queries_are_words_only(call: Calls) -> None:
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    for query in ('euros" OR "*', "NEAR(euros", "body:euros", "euros')); --", "-euros"):
        assert REF.findall(await call("search_artifacts", query=query)) == [snap]
    assert "no stored artifact matches" in await call("search_artifacts", query='"*" ()')


def _product_policy(found: dict[str, str]) -> Any:
    """Reads B, quotes it, then, having "forgotten" the evidence id, finds it again with
    search_artifacts and claims with what the search named."""

    def policy(request: ModelRequest) -> ModelResponse:
        tools = [m for m in request.messages if m.role == "tool"]
        last = tools[-1].content if tools else ""
        if not tools:
            return ModelResponse("read", (tool_call("read_source", source="B"),))
        if "cite snapshot artifact" in last:
            snap = _id(last, "cite snapshot artifact ")
            call = tool_call("record_evidence", source_artifact=snap, excerpt="B costs 35 euros")
            return ModelResponse("quote", (call,))
        if last.startswith("evidence artifact"):
            call = tool_call("search_artifacts", query="price of B euros", kinds=["evidence"])
            return ModelResponse("find it again", (call,))
        if "match" in last and "claim" not in found:
            found["search"] = last
            ids = REF.findall(last)
            return ModelResponse("claim", (tool_call("record_claim", text="B: 35€", evidence=ids),))
        found["claim"] = last
        return ModelResponse("done")

    return policy


async def test_in_a_run_the_claim_cites_the_evidence_the_search_found(
    store: Store, tmp_path: Path
) -> None:
    (tmp_path / "b.md").write_text("# B 2.0\nB costs 35 euros.\n")
    spec = parse_spec(
        {
            "objective": "a cited claim about B's price",
            "sources": SOURCES[:1],
            "items": [
                {
                    "id": "claim",
                    "title": "a claim about B citing evidence",
                    "done_when": {"kind": "artifact", "artifact_kind": "claim"},
                }
            ],
            "tools": ["read_source", "record_evidence", "record_claim", "search_artifacts"],
            "limits": {"no_progress_rounds": 6},
        }
    )
    found: dict[str, str] = {}
    tid, result = await run_task(
        store, spec, tmp_path, ScriptedModel(policy=_product_policy(found))
    )
    assert result.status == "satisfied", result
    arts = {a.kind: a for a in await store.get_artifacts(tid)}
    assert REF.findall(found["search"]) == [arts["evidence"].artifact_id]
    assert arts["claim"].deps == (f"artifact:{arts['evidence'].artifact_id}",)


def test_search_artifacts_is_a_built_in_read_tool() -> None:
    tool = default_registry(lambda: None).get("search_artifacts")  # type: ignore[arg-type,return-value]
    assert tool is not None and tool.effect == "read"


async def test_outputs_and_summaries_trimmed_from_the_context_are_found_again(
    store: Store, tmp_path: Path
) -> None:
    """A long run compacts its context; the large output read early and the
    compressor's summary are no longer in it, and search_artifacts finds both."""
    (tmp_path / "data.txt").write_text("zanzibar inventory line. " * 120)
    searches: list[str] = []

    step = [0]

    def actor(request: ModelRequest) -> ModelResponse:
        compacted = any(SUMMARY_PREFIX in m.content for m in request.messages)
        last = next((m.content for m in reversed(request.messages) if m.role == "tool"), "")
        if step[0] == 0 and not compacted:
            return ModelResponse("reading", (tool_call("read_file", path="data.txt"),))
        step[0] += 1
        if step[0] == 1:
            call = tool_call("search_artifacts", query="zanzibar", kinds=["tool_output"])
            return ModelResponse("where was it?", (call,))
        if step[0] == 2:
            searches.append(last)
            call = tool_call("search_artifacts", query="warehouse", kinds=["summary"])
            return ModelResponse("and the summary?", (call,))
        if step[0] == 3:
            searches.append(last)
            return ModelResponse(
                "write", (tool_call("write_file", path="out/i1.txt", content="x"),)
            )
        return ModelResponse("done")

    def policy(request: ModelRequest) -> object:
        if request.purpose == "compact":
            return "Read data.txt; the warehouse code is QX-77."
        return actor(request)

    spec = parse_spec(
        {
            "objective": "find it again",
            "items": [
                {"id": "i1", "title": "t", "done_when": {"kind": "file", "path": "out/i1.txt"}}
            ],
            "tools": ["read_file", "write_file", "search_artifacts"],
            "context": {"input_budget_tokens": 1500, "preview_chars": 200},
            "limits": {"max_rounds": 80, "no_progress_rounds": 100},
        }
    )
    model = ScriptedModel(policy=policy, keep_requests=1)
    tid, result = await run_task(store, spec, tmp_path, model, compact=model)
    assert result.status == "satisfied", result
    assert len(searches) == 2, searches
    outputs = {a.artifact_id for a in await store.get_artifacts(tid) if a.kind == "tool_output"}
    assert REF.findall(searches[0]) and set(REF.findall(searches[0])) <= outputs
    assert "[zanzibar]" in searches[0].lower()
    summaries = [a for a in await store.get_artifacts(tid) if a.kind == "summary"]
    assert summaries and REF.findall(searches[1])[0] in {a.artifact_id for a in summaries}
    assert "proves nothing" in searches[1]
