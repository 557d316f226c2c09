"""MCP servers under supervision in real runs: a server process that dies mid-task is
restarted and the task finishes; a server that never comes back parks the task on its
service's breaker instead of blocking the item; a write lost in flight goes to a human."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tether import approvals
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.memory import MemoryStore

from .loop_support import events_of

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")


def spec(tools: list[str], env: dict[str, str] | None = None, **more: Any) -> Any:
    return parse_spec(
        {
            "objective": "use the notes server",
            "items": [
                {
                    "id": "i1",
                    "title": "add 40 and 2",
                    "done_when": {"kind": "op", "tool": "notes__add", "args": {"a": 40, "b": 2}},
                }
            ],
            "tools": tools,
            "models": {"judge": "rules"},
            "limits": {"no_progress_rounds": 20, "max_rounds": 10},
            "mcp_servers": [
                {
                    "name": "notes",
                    "command": sys.executable,
                    "args": [SERVER],
                    "env": env or {},
                    "timeout": 10,
                    "restart_attempts": 2,
                }
            ],
            **more,
        }
    )


def results_of(request: ModelRequest) -> list[str]:
    return [str(m.content) for m in request.messages if m.role == "tool"]


async def test_server_dying_mid_task_is_restarted_and_the_task_finishes(tmp_path: Path) -> None:
    marker = str(tmp_path / "crashed")

    def policy(request: ModelRequest) -> ModelResponse:
        n = len(results_of(request))
        if n == 0:
            return ModelResponse("who serves", (tool_call("notes__pid"),))
        if n == 1:  # the server exits in the middle of this call
            return ModelResponse("look", (tool_call("notes__crash_once", marker=marker),))
        if n == 2:
            return ModelResponse("who serves now", (tool_call("notes__pid"),))
        return ModelResponse("adding", (tool_call("notes__add", a=40, b=2),))

    store = await MemoryStore.open()
    allow = ["notes__pid", "notes__crash_once", "notes.add"]
    task = await create_task(store, spec(allow), workspace=tmp_path)
    result = await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    assert result.status == "satisfied", result
    ops = await events_of(store, task.task_id, "op.result")
    assert [o["tool"] for o in ops] == [
        "notes__pid",
        "notes__crash_once",
        "notes__pid",
        "notes__add",
    ]
    assert all(o["status"] == "succeeded" for o in ops)
    assert ops[1]["summary"] == "survived"  # retried on the restarted server
    assert ops[0]["summary"] != ops[2]["summary"]  # another process answers
    retries = await events_of(store, task.task_id, "op.retry_scheduled")
    assert [r["error_class"] for r in retries] == ["transient"]
    assert "connection was lost" in retries[0]["error"]
    ledger = (await store.get_ledger(task.task_id)).to_ledger()
    assert ledger.item("i1").status == "done" and ledger.item("i1").attempts == 0


async def test_server_that_never_comes_back_parks_the_task(tmp_path: Path) -> None:
    marker = str(tmp_path / "crashed")

    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse("look", (tool_call("notes__crash_once", marker=marker),))

    store = await MemoryStore.open()
    task = await create_task(
        store,
        spec(
            ["notes__crash_once", "notes__add"],
            env={"MCP_TEST_START_ONCE": str(tmp_path / "started")},
            services={"notes": {"min_calls": 1, "failure_rate": 1.0, "cooldown_seconds": 600}},
        ),
        workspace=tmp_path,
    )
    result = await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    assert result.status == "waiting", result
    assert result.waiting is not None and result.waiting["kind"] == "external"
    assert "notes" in result.waiting["reason"]
    breakers = await events_of(store, task.task_id, "breaker.changed")
    assert any(b["service"] == "notes" and b["dst"] == "open" for b in breakers)
    ledger = (await store.get_ledger(task.task_id)).to_ledger()
    item = ledger.item("i1")
    assert item.status not in ("blocked", "skipped")
    assert item.attempts == 0
    ops = await events_of(store, task.task_id, "op.result")
    assert ops and all(o["error_class"] == "transient" for o in ops)


async def test_write_lost_in_flight_goes_to_a_human(tmp_path: Path) -> None:
    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse("crash it", (tool_call("notes__crash"),))

    store = await MemoryStore.open()
    task = await create_task(store, spec(["notes__crash", "notes__add"]), workspace=tmp_path)
    result = await Engine(store, ModelSet(ScriptedModel(policy=policy))).run(task.task_id)
    assert result.status == "waiting", result
    (req,) = await approvals.pending(store, task.task_id)
    assert req.request_id.endswith(".in_doubt")
    warnings = await events_of(store, task.task_id, "audit.warning")
    assert any(w["code"] == "op_in_doubt" for w in warnings)
