"""Overwriting a file that was there before the task started waits for a human.

A file the task made itself (in an earlier round or earlier in the same round) may be
rewritten freely, a new file needs no approval, and the contract can relax the rule
(`tools: [{name: write_file, approval: false}]`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.loop import events_of, run_task
from tether import approvals
from tether.models.base import ModelRequest, ModelResponse, ToolCall
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import RunResult
from tether.spec import parse_spec
from tether.store.memory import MemoryStore

Step = Sequence[ToolCall]


def spec_with(tools: list[Any]) -> Any:
    return parse_spec(
        {
            "objective": "edit some files",
            "items": [{"id": "i1", "title": "edit the files"}],
            "tools": tools,
            "models": {"judge": "rules"},
            "limits": {"no_progress_rounds": 50, "max_rounds": 12},
        }
    )


DEFAULT_TOOLS: list[Any] = ["write_file", "append_file", "read_file"]


def scripted(*steps: Step) -> ScriptedModel:
    """One step (its tool calls) per round, then a request for help that ends the run.

    The step is chosen by how many tool results the model has seen, so a resumed task
    carries on where it stopped."""

    def policy(request: ModelRequest) -> ModelResponse:
        seen = sum(1 for m in request.messages if m.role == "tool")
        done = 0
        for k, step in enumerate(steps):
            if seen == done:
                return ModelResponse(f"step {k}", tuple(step))
            done += len(step)
        return ModelResponse("NEED_HELP: nothing left to do")

    return ScriptedModel(policy=policy)


def write(path: str, content: str) -> ToolCall:
    return tool_call("write_file", path=path, content=content)


def append(path: str, content: str) -> ToolCall:
    return tool_call("append_file", path=path, content=content)


async def run(
    store: MemoryStore,
    tmp_path: Path,
    model: ScriptedModel,
    tools: list[Any] | None = None,
    task_id: str | None = None,
) -> tuple[str, RunResult]:
    return await run_task(
        store, spec_with(tools or DEFAULT_TOOLS), tmp_path, model, task_id=task_id
    )


def asks_approval(result: RunResult) -> bool:
    """The run stopped for a human's approval of an op."""
    return result.status == "waiting" and (result.waiting or {}).get("kind") == "approval"


def finished(result: RunResult) -> bool:
    """The script ran out (the model asked for help), not stopped for an approval."""
    return result.status == "waiting" and (result.waiting or {}).get("kind") == "human"


async def tool_results(store: MemoryStore, task_id: str) -> list[tuple[str, str]]:
    return [(r["tool"], r["status"]) for r in await events_of(store, task_id, "op.result")]


async def test_overwriting_a_pre_existing_file_waits_and_runs_once_approved(
    tmp_path: Path,
) -> None:
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "x.txt"
    target.write_text("the user's original")
    store = await MemoryStore.open()
    model = scripted([write("out/x.txt", "replaced")], [write("out/x.txt", "again")])
    tid, result = await run(store, tmp_path, model)

    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "approval"
    assert target.read_text() == "the user's original"
    (req,) = await approvals.pending(store, tid)
    assert req.request["impact"] == "overwrites out/x.txt, which existed before the task started"
    assert req.request["effect"] == "overwrite" and req.request["tool"] == "write_file"
    (asked,) = await events_of(store, tid, "approval.requested")
    assert "existed before the task started" in asked["impact"]
    (op,) = await store.get_ops(tid, tools=["write_file"])
    assert op.status == "awaiting_approval" and op.effect == "overwrite"

    await approvals.decide(store, tid, req.request_id, "approve", by="alice")
    _, result = await run(store, tmp_path, model, task_id=tid)
    assert target.read_text() == "replaced"
    (first, *_) = await store.get_ops(tid, tools=["write_file"])
    assert first.status == "succeeded" and first.effect == "overwrite"
    # Still not the task's own file: the next overwrite asks again.
    assert asks_approval(result)
    (req2,) = await approvals.pending(store, tid)
    assert req2.request_id != req.request_id
    assert target.read_text() == "replaced"


async def test_a_rejected_overwrite_leaves_the_original(tmp_path: Path) -> None:
    target = tmp_path / "notes.md"
    target.write_text("keep me")
    store = await MemoryStore.open()
    model = scripted([write("notes.md", "clobbered")])
    tid, result = await run(store, tmp_path, model)
    assert asks_approval(result)
    (req,) = await approvals.pending(store, tid)
    await approvals.decide(store, tid, req.request_id, "reject", by="bob", reason="mine")
    _, result = await run(store, tmp_path, model, task_id=tid)
    assert finished(result)
    assert target.read_text() == "keep me"
    assert await tool_results(store, tid) == [("write_file", "failed")]
    (res,) = await events_of(store, tid, "op.result")
    assert res["error_class"] == "rejected"


async def test_files_the_task_created_are_rewritten_without_approval(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    model = scripted(
        [write("out/a.txt", "v1")],  # a new file: no approval
        [write("out/a.txt", "v2")],  # the task's own file, made in an earlier round
        [append("./out/a.txt", "+")],  # the same file under another spelling
        [write("b.txt", "1"), append("b.txt", "2"), write("b.txt", "3")],  # one round
        [append("log.md", "one\n")],  # append_file creates a file too
        [append("log.md", "two\n")],
    )
    tid, result = await run(store, tmp_path, model)
    assert finished(result)
    assert await approvals.pending(store, tid) == []
    assert await events_of(store, tid, "approval.requested") == []
    assert (tmp_path / "out" / "a.txt").read_text() == "v2+"
    assert (tmp_path / "b.txt").read_text() == "3"
    assert (tmp_path / "log.md").read_text() == "one\ntwo\n"
    results = await tool_results(store, tid)
    assert len(results) == 8 and all(status == "succeeded" for _, status in results)
    ops = await store.get_ops(tid, tools=["write_file", "append_file"])
    assert {o.effect for o in ops} == {"write"}


async def test_a_new_file_needs_no_approval(tmp_path: Path) -> None:
    (tmp_path / "other.txt").write_text("unrelated")
    store = await MemoryStore.open()
    tid, result = await run(store, tmp_path, scripted([write("fresh/new.txt", "hello")]))
    assert finished(result)
    assert await approvals.pending(store, tid) == []
    assert (tmp_path / "fresh" / "new.txt").read_text() == "hello"
    assert (tmp_path / "other.txt").read_text() == "unrelated"


async def test_the_contract_can_relax_overwrite_approval(tmp_path: Path) -> None:
    target = tmp_path / "x.txt"
    target.write_text("original")
    store = await MemoryStore.open()
    tools: list[Any] = [{"name": "write_file", "approval": False}, "append_file"]
    model = scripted([write("x.txt", "replaced")], [append("x.txt", "!")])
    tid, result = await run(store, tmp_path, model, tools)
    assert target.read_text() == "replaced"
    # Only write_file was relaxed: appending to the user's file still asks.
    assert asks_approval(result)
    (req,) = await approvals.pending(store, tid)
    assert req.request["tool"] == "append_file"


async def test_approval_true_asks_even_for_a_new_file(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    tools: list[Any] = [{"name": "write_file", "approval": True}]
    tid, result = await run(store, tmp_path, scripted([write("new.txt", "x")]), tools)
    assert asks_approval(result)
    (req,) = await approvals.pending(store, tid)
    assert req.request["effect"] == "write"
    assert not (tmp_path / "new.txt").exists()


async def test_appending_to_a_pre_existing_file_asks(tmp_path: Path) -> None:
    target = tmp_path / "journal.md"
    target.write_text("day 1\n")
    store = await MemoryStore.open()
    model = scripted([append("journal.md", "day 2\n")])
    tid, result = await run(store, tmp_path, model)
    assert result.status == "waiting"
    task = await store.get_task(tid)
    assert task.waiting is not None and task.waiting["kind"] == "approval"
    (req,) = await approvals.pending(store, tid)
    assert req.request["tool"] == "append_file"
    impact = "overwrites journal.md, which existed before the task started"
    assert req.request["impact"] == impact
    assert target.read_text() == "day 1\n"
    await approvals.decide(store, tid, req.request_id, "approve")
    _, result = await run(store, tmp_path, model, task_id=tid)
    assert finished(result)
    assert target.read_text() == "day 1\nday 2\n"
