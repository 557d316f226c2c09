"""MCP servers under supervision in real runs: a server process that dies mid-task is
restarted and the task finishes; a server that never comes back parks the task (on its
service's breaker, or on its own when the breaker stays closed) instead of blocking the
item; a write lost in flight goes to a human; the server's stderr is in the messages."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.support.loop import events_of
from tether import approvals
from tether.cli.views import status_view
from tether.clock import FakeClock
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.tasks import create_task, status_dict
from tether.spec import parse_spec
from tether.store.memory import MemoryStore

SERVER = str(Path(__file__).resolve().parents[1] / "mcp_server.py")


def spec(
    tools: list[str], env: dict[str, str] | None = None, restarts: int = 2, **more: Any
) -> Any:
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
                    "restart_attempts": restarts,
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
    # The server's last words reach the human who must decide.
    assert "crash() was called" in req.request["what"]
    assert result.waiting is not None and "crash() was called" in result.waiting["reason"]


def rendered_status(doc: dict[str, Any]) -> str:
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(status_view(doc))
    return console.export_text()


async def test_server_down_for_a_while_costs_the_item_nothing(tmp_path: Path) -> None:
    """The server dies mid-call and refuses the next eight starts: three rounds' calls
    find it down (each exhausting its retries, the breaker staying closed), which would
    block the item three times over were they the item's failures. They are held back
    instead, and once the server is back the task finishes with the item done."""
    marker = str(tmp_path / "crashed")
    rounds: list[int] = []

    def policy(request: ModelRequest) -> ModelResponse:
        rounds.append(len(results_of(request)))
        if "survived" not in " ".join(results_of(request)):
            return ModelResponse("look", (tool_call("notes__crash_once", marker=marker),))
        return ModelResponse("adding", (tool_call("notes__add", a=40, b=2),))

    clock = FakeClock()
    store = await MemoryStore.open()
    task = await create_task(
        store,
        spec(
            ["notes__crash_once", "notes__add"],
            env={"MCP_TEST_START_ONCE": str(tmp_path / "started"), "MCP_TEST_DOWN_STARTS": "8"},
            restarts=1,
            services={"notes": {"min_calls": 50}},
        ),
        workspace=tmp_path,
    )
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), clock=clock, inline_wait_max=1e6)
    result = await engine.run(task.task_id)
    assert result.status == "satisfied", result
    ops = await events_of(store, task.task_id, "op.result")
    held, done = ops[:-2], ops[-2:]
    assert len(held) == 3 and all(o["error_class"] == "transient" for o in held)
    assert all("could not be restarted" in o["error"] for o in held)
    assert all("this server is down" in o["error"] for o in held)  # its stderr
    assert [(o["tool"], o["status"]) for o in done] == [
        ("notes__crash_once", "succeeded"),
        ("notes__add", "succeeded"),
    ]
    ledger = (await store.get_ledger(task.task_id)).to_ledger()
    item = ledger.item("i1")
    assert item.status == "done" and item.attempts == 0
    warnings = await events_of(store, task.task_id, "audit.warning")
    assert not [w for w in warnings if w["code"] in ("item_blocked", "non_convergent")]
    breakers = await events_of(store, task.task_id, "breaker.changed")
    assert not [b for b in breakers if b["dst"] == "open"]  # the breaker stayed closed


async def test_server_that_stays_down_parks_the_task_and_status_says_why(tmp_path: Path) -> None:
    """With the breaker closed the whole time, a server that never comes back parks the
    task (not its item), and `tether status` shows the server's last stderr lines."""
    marker = str(tmp_path / "crashed")

    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse("look", (tool_call("notes__crash_once", marker=marker),))

    store = await MemoryStore.open()
    task = await create_task(
        store,
        spec(
            ["notes__crash_once", "notes__add"],
            env={"MCP_TEST_START_ONCE": str(tmp_path / "started")},
            restarts=1,
        ),
        workspace=tmp_path,
    )
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), clock=FakeClock())
    result = await engine.run(task.task_id)
    assert result.status == "waiting", result
    assert result.waiting is not None and result.waiting["kind"] == "external"
    doc = await status_dict(store, task.task_id)
    shown = rendered_status(doc)
    for text in (doc["waiting"]["reason"], shown):
        assert "notes__crash_once" in text and "could not be restarted" in text
        assert "will not start again" in text  # the server's stderr
    (item,) = doc["ledger"]["items"]
    assert item["status"] in ("pending", "in_progress")
    assert item["attempts"] == 0 and item["breaker"] == 0
    breakers = await events_of(store, task.task_id, "breaker.changed")
    assert not [b for b in breakers if b["dst"] == "open"]


@pytest.mark.parametrize("volatile", [False, None], ids=["declared-stable", "volatile"])
async def test_transient_failure_exhausting_its_retries_counts_once(
    tmp_path: Path, volatile: bool | None
) -> None:
    """A read that times out on every attempt fails once for its item, not once per
    attempt: one step towards non-convergence. For a read whose answers change by
    themselves (the default of an open-world MCP read) it is the service's "not now"
    instead, and counts toward nothing."""

    def policy(request: ModelRequest) -> ModelResponse:
        if not results_of(request):
            return ModelResponse("wait", (tool_call("notes__slow_read", seconds=30),))
        return ModelResponse("adding", (tool_call("notes__add", a=40, b=2),))

    store = await MemoryStore.open()
    data = spec(["notes__slow_read", "notes__add"]).model_dump()
    data["mcp_servers"][0]["timeout"] = 1
    if volatile is not None:
        data["tools"] = [{"name": "notes__slow_read", "volatile": volatile}, "notes__add"]
    task = await create_task(store, parse_spec(data), workspace=tmp_path)
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), clock=FakeClock())
    result = await engine.run(task.task_id)
    assert result.status == "satisfied", result
    retries = await events_of(store, task.task_id, "op.retry_scheduled")
    assert len(retries) == 2 and all("no answer within 1" in r["error"] for r in retries)
    ops = await events_of(store, task.task_id, "op.result")
    assert [(o["tool"], o["status"]) for o in ops] == [
        ("notes__slow_read", "failed"),
        ("notes__add", "succeeded"),
    ]
    item = (await store.get_ledger(task.task_id)).to_ledger().item("i1")
    # One failure, not one per retry: one step towards non-convergence, and no attempt
    # (only a failure the item has seen before is one).
    assert item.status == "done" and item.attempts == 0
    counted = list((await store.get_task(task.task_id)).usage.get("failure_keys", {}).values())
    assert counted == ([1] if volatile is False else [])


async def test_dead_server_probed_by_a_short_cooldown_blocks_no_item(tmp_path: Path) -> None:
    """The issue's case: a server that never comes back, a breaker with a short cool-down
    that keeps letting a probe through. Each probe restarts (and fails to restart) the
    server; no item is charged, none is blocked, and the task stops on its round limit
    with both items still open."""
    marker = str(tmp_path / "crashed")

    def policy(request: ModelRequest) -> ModelResponse:
        return ModelResponse("look", (tool_call("notes__crash_once", marker=marker),))

    data = spec(
        ["notes__crash_once", "notes__add"],
        env={"MCP_TEST_START_ONCE": str(tmp_path / "started")},
        restarts=1,
        services={"notes": {"min_calls": 1, "failure_rate": 1.0, "cooldown_seconds": 0.5}},
    ).model_dump()
    data["items"].append({"id": "i2", "title": "add 1 and 1"})
    data["limits"]["max_rounds"] = 5
    clock = FakeClock()  # the breaker's cool-downs pass in no time
    store = await MemoryStore.open(clock=clock)
    task = await create_task(store, parse_spec(data), workspace=tmp_path)
    engine = Engine(store, ModelSet(ScriptedModel(policy=policy)), clock=clock, inline_wait_max=1e6)
    result = await engine.run(task.task_id)
    assert result.status == "waiting" and result.waiting is not None, result
    assert "max_rounds" in result.waiting["reason"]
    probes = [
        b
        for b in await events_of(store, task.task_id, "breaker.changed")
        if b["dst"] == "half_open"
    ]
    assert len(probes) >= 2  # the dead server was probed again and again
    ledger = (await store.get_ledger(task.task_id)).to_ledger()
    for item_id in ("i1", "i2"):
        item = ledger.item(item_id)
        assert item.status not in ("blocked", "skipped") and item.attempts == 0, item
    warnings = await events_of(store, task.task_id, "audit.warning")
    assert not [w for w in warnings if w["code"] in ("item_blocked", "non_convergent")]
