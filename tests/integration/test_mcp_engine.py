"""MCP tools in a real run: listed from a real server process, permissioned, journaled,
exposed as `<prefix>__<tool>`, and never shadowing (or shadowed by) another tool."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of
from tether import approvals, errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.memory import MemoryStore
from tether.tools.registry import ToolRegistry, tool

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")


def spec(tools: list[Any], servers: list[dict[str, Any]] | None = None) -> Any:
    return parse_spec(
        {
            "objective": "use the notes server",
            "items": [{"id": "i1", "title": "add and clean up"}],
            "tools": tools,
            "models": {"judge": "rules"},
            "limits": {"no_progress_rounds": 20, "max_rounds": 6},
            "mcp_servers": servers
            or [{"name": "notes", "command": sys.executable, "args": [SERVER]}],
        }
    )


def policy(request: ModelRequest) -> ModelResponse:
    results = [m.content for m in request.messages if m.role == "tool"]
    if not results:
        return ModelResponse("adding", (tool_call("notes__add", a=2, b=3),))
    if len(results) == 1:
        return ModelResponse("cleaning", (tool_call("notes__delete_note", name="old"),))
    return ModelResponse("NEED_HELP: finished what I can")


@pytest.mark.parametrize(
    "allow",
    [
        ["notes__add", "notes__delete_note"],
        ["notes.add", {"name": "notes.delete_note"}],  # the dotted spelling, normalised
    ],
)
async def test_mcp_tools_run_through_the_engine(tmp_path: Path, allow: list[Any]) -> None:
    store = await MemoryStore.open()
    task = await create_task(store, spec(allow), workspace=tmp_path)
    model = ScriptedModel(policy=policy)
    result = await Engine(store, ModelSet(model)).run(task.task_id)
    # `add` is read-only and ran; `delete_note` is destructive and waits for approval.
    assert result.status == "waiting"
    ops = await events_of(store, task.task_id, "op.result")
    assert ops[0]["tool"] == "notes__add" and ops[0]["status"] == "succeeded"
    assert "5" in ops[0]["summary"]
    (req,) = await approvals.pending(store, task.task_id)
    assert "notes__delete_note" in req.request["what"]
    act = next(r for r in model.requests if r.purpose == "act")
    names = {t.name for t in act.tools}
    assert names >= {"notes__add", "notes__delete_note", "read_artifact"}
    assert "notes__put_note" not in names  # not on the allowlist
    assert "add" not in names and "notes.add" not in names


async def test_mcp_tool_not_on_the_allowlist_is_not_permitted(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    task = await create_task(store, spec(["notes__add"]), workspace=tmp_path)
    await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    ops = await events_of(store, task.task_id, "op.result")
    assert [o["tool"] for o in ops] == ["notes__add", "notes__delete_note"]
    assert ops[1]["error_class"] == "not_permitted" and "not allowed" in ops[1]["error"]


async def test_unprefixed_name_of_a_prefixed_tool_is_not_registered(tmp_path: Path) -> None:
    store = await MemoryStore.open()
    task = await create_task(store, spec(["add"]), workspace=tmp_path)
    with pytest.raises(errors.SpecError) as info:
        await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    assert "not registered: add" in str(info.value) and "notes__add" in str(info.value)


async def test_mcp_tool_clashing_with_a_builtin_is_a_spec_error(tmp_path: Path) -> None:
    server = {
        "name": "shadow",
        "command": sys.executable,
        "args": [SERVER],
        "env": {"MCP_TEST_SHADOW": "1"},
        "prefix": "",
        "tools": ["read_file", "add"],
    }
    store = await MemoryStore.open()
    task = await create_task(store, spec(["add"], [server]), workspace=tmp_path)
    with pytest.raises(errors.SpecError) as info:
        await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    text = str(info.value)
    assert "'read_file'" in text and "MCP server 'shadow'" in text and "built-in" in text
    assert info.value.exit_code == 2


async def test_mcp_tool_clashing_with_a_registered_tool_is_a_spec_error(tmp_path: Path) -> None:
    @tool(effect="read")
    async def notes__add(a: int, b: int) -> int:
        """A registered tool that happens to have the exposed name of an MCP tool."""
        return a - b

    store = await MemoryStore.open()
    registry = ToolRegistry([notes__add])
    task = await create_task(store, spec(["notes__add"]), workspace=tmp_path)
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), registry=registry)
    with pytest.raises(errors.SpecError) as info:
        await engine.run(task.task_id)
    text = str(info.value)
    assert "'notes__add'" in text and "MCP server 'notes'" in text and "registered tool" in text


async def test_two_servers_clashing_is_a_spec_error(tmp_path: Path) -> None:
    servers = [
        {"name": "a", "command": sys.executable, "args": [SERVER], "prefix": "x", "tools": ["add"]},
        {"name": "b", "command": sys.executable, "args": [SERVER], "prefix": "x", "tools": ["add"]},
    ]
    store = await MemoryStore.open()
    task = await create_task(store, spec(["x__add"], servers), workspace=tmp_path)
    with pytest.raises(errors.SpecError) as info:
        await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    text = str(info.value)
    assert "'a'" in text and "'b'" in text and "'x__add'" in text


async def test_a_server_tool_with_a_huge_description_is_shown_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server whose tool description is 3 MB: the model is shown its first 4,096
    characters and a note, and the task runs at the default budget (before, the first
    round stopped with "the context budget ... is too small")."""
    server = {
        "name": "notes",
        "command": sys.executable,
        "args": [SERVER],
        "env": {"MCP_TEST_LONG_DESCRIPTION": "3000000"},
    }
    store = await MemoryStore.open()
    task = await create_task(store, spec(["notes__verbose"], [server]), workspace=tmp_path)
    calls = 0

    def verbose_once(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            return ModelResponse("looking", (tool_call("notes__verbose", x="a"),))
        return ModelResponse("NEED_HELP: nothing more to do")

    model = ScriptedModel(policy=verbose_once)
    with caplog.at_level("WARNING", logger="tether.tools.mcp"):
        result = await Engine(store, ModelSet(model)).run(task.task_id)
    assert result.status == "waiting", result
    ops = await events_of(store, task.task_id, "op.result")
    assert ops[0]["status"] == "succeeded" and "verbose a" in ops[0]["summary"]
    act = next(r for r in model.requests if r.purpose == "act")
    (shown,) = [t for t in act.tools if t.name == "notes__verbose"]
    assert shown.description.startswith("A tool with a very long description.")
    assert shown.description.endswith("characters]") and len(shown.description) < 4200
    assert "description cut by tether" in shown.description
    assert any("notes__verbose" in r.getMessage() for r in caplog.records)
