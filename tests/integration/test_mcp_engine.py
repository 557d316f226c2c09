"""MCP tools in a real run: listed from a real server process, permissioned, journaled."""

from __future__ import annotations

import sys
from pathlib import Path

from tether import approvals
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.memory import MemoryStore

from .loop_support import events_of

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")


def spec(tools: list[str]) -> object:
    return parse_spec(
        {
            "objective": "use the notes server",
            "items": [{"id": "i1", "title": "add and clean up"}],
            "tools": tools,
            "models": {"judge": "rules"},
            "limits": {"no_progress_rounds": 20, "max_rounds": 6},
            "mcp_servers": [{"name": "notes", "command": sys.executable, "args": [SERVER]}],
        }
    )


def policy(request: ModelRequest) -> ModelResponse:
    results = [m.content for m in request.messages if m.role == "tool"]
    if not results:
        return ModelResponse("adding", (tool_call("add", a=2, b=3),))
    if len(results) == 1:
        return ModelResponse("cleaning", (tool_call("delete_note", name="old"),))
    return ModelResponse("NEED_HELP: finished what I can")


async def test_mcp_tools_run_through_the_engine(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    task = await create_task(store, spec(["add", "delete_note"]), workspace=tmp_path)  # type: ignore[arg-type]
    model = ScriptedModel(policy=policy)
    result = await Engine(store, ModelSet(model)).run(task.task_id)
    # `add` is read-only and ran; `delete_note` is destructive and waits for approval.
    assert result.status == "waiting"
    ops = await events_of(store, task.task_id, "op.result")
    assert ops[0]["tool"] == "add" and ops[0]["status"] == "succeeded" and "5" in ops[0]["summary"]
    (req,) = await approvals.pending(store, task.task_id)
    assert "delete_note" in req.request["what"]
    act = next(r for r in model.requests if r.purpose == "act")
    assert {t.name for t in act.tools} >= {"add", "delete_note", "read_artifact"}
    assert "put_note" not in {t.name for t in act.tools}  # not on the allowlist


async def test_mcp_tool_not_on_the_allowlist_is_not_permitted(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    task = await create_task(store, spec(["add"]), workspace=tmp_path)  # type: ignore[arg-type]
    await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    ops = await events_of(store, task.task_id, "op.result")
    assert [o["tool"] for o in ops] == ["add", "delete_note"]
    assert ops[1]["error_class"] == "not_permitted" and "not allowed" in ops[1]["error"]
