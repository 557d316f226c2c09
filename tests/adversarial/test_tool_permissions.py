"""Failure class 7: tools the contract did not grant.

With no `tools:` list a task may use the built-in read-only tools only; a write is
refused as not permitted (and nothing is written). A contract that names a tool nobody
registered is refused at start: `SpecError` from `Engine.run`, exit code 2 from
`tether run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.adversarial import (
    act_requests,
    assert_honest,
    assert_status_agrees,
    change,
    payload,
    refs,
    say,
    statuses,
    verdict,
    warning_codes,
)
from tests.support.cli import DONE, assert_clean_error, spec_dict, tether
from tests.support.loop import events_of, run_task
from tether import errors
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.spec import parse_spec
from tether.store.memory import MemoryStore
from tether.tools.builtin.files import default_registry
from tether.tools.registry import tool


@pytest.fixture
async def store() -> MemoryStore:
    return await MemoryStore.open()


def no_tools_spec(**extra: Any) -> Any:
    return parse_spec(
        {
            "objective": "summarise the notes",
            "items": [
                {"id": "read", "title": "read the notes"},
                {
                    "id": "save",
                    "title": "save the summary",
                    "done_when": {"kind": "op", "tool": "write_file"},
                },
            ],
            "limits": {"no_progress_rounds": 2},
            **extra,
        }
    )


def sneaky_actor(request: ModelRequest) -> ModelResponse:
    """Reads, and tries every way of writing it can think of."""
    return say(
        "reading the notes and saving the summary",
        tool_call("read_file", path="notes.txt"),
        tool_call("list_files", path="."),
        tool_call("write_file", path="out/summary.txt", content="summary"),
        tool_call("append_file", path="notes.txt", content="\nappended"),
    )


async def test_no_tools_list_allows_reads_and_refuses_writes(
    store: MemoryStore, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("the notes\n")
    spec = no_tools_spec()

    def judge(request: ModelRequest) -> str:
        focus = payload(request)["focus_item"]
        reads = refs(request, tool="read_file")
        if focus == "read" and reads:
            return verdict([change("read", "done", reads)], "continue")
        return verdict([], "continue")

    actor = ScriptedModel(policy=sneaky_actor)
    tid, result = await run_task(store, spec, tmp_path, actor, judge=ScriptedModel(policy=judge))
    offered = {t.name for t in act_requests(actor)[0].tools}
    assert {"read_file", "list_files"} <= offered
    assert not offered & {"write_file", "append_file"}
    ops = await store.get_ops(tid)
    by_tool: dict[str, set[str]] = {}
    for o in ops:
        by_tool.setdefault(o.tool, set()).add(o.status)
    assert by_tool["read_file"] == {"succeeded"} and by_tool["list_files"] == {"succeeded"}
    assert by_tool["write_file"] == {"failed"} and by_tool["append_file"] == {"failed"}
    refused = [o for o in ops if o.tool in ("write_file", "append_file")]
    assert all(o.error and o.error["class"] == "not_permitted" for o in refused)
    assert all("not permitted" in o.error["message"] for o in refused if o.error)
    # Nothing was written.
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "notes.txt").read_text() == "the notes\n"
    # The read item is done by its read; the save item can never be done.
    assert await statuses(store, tid) == {"read": "done", "save": "blocked"}
    assert result.status == "waiting" and result.waiting is not None
    assert result.waiting["kind"] == "decision"
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


def custom_registry(store: MemoryStore, stamped: list[str]) -> Any:
    """The default tools plus a custom write tool and a custom read tool."""

    @tool(effect="write")
    def stamp(label: str) -> str:
        """Stamp a label somewhere."""
        stamped.append(label)
        return f"stamped {label}"

    @tool(effect="read")
    def peek(label: str) -> str:
        """Look at a label."""
        return f"label {label} looks fine"

    registry = default_registry(lambda: store)
    registry.add(stamp)
    registry.add(peek)
    return registry


def stamping_actor(_: ModelRequest) -> ModelResponse:
    return say("stamp it", tool_call("stamp", label="x"), tool_call("peek", label="x"))


async def test_no_tools_list_refuses_registered_custom_write_tools(
    store: MemoryStore, tmp_path: Path
) -> None:
    stamped: list[str] = []
    actor = ScriptedModel(policy=stamping_actor)
    tid, _ = await run_task(
        store, no_tools_spec(), tmp_path, actor, registry=custom_registry(store, stamped)
    )
    assert stamped == []
    results = {e["tool"]: e for e in await events_of(store, tid, "op.result")}
    assert results["stamp"]["status"] == "failed"
    assert "not permitted" in results["stamp"]["error"]
    assert "stamp" not in {t.name for t in act_requests(actor)[0].tools}
    task = await store.get_task(tid)
    assert task.status == "waiting" and task.waiting is not None
    assert task.waiting["kind"] == "decision"
    assert await statuses(store, tid) == {"read": "blocked", "save": "blocked"}
    assert "item_blocked" in await warning_codes(store, tid)


async def test_no_tools_list_permits_only_the_builtin_read_tools(
    store: MemoryStore, tmp_path: Path
) -> None:
    actor = ScriptedModel(policy=stamping_actor)
    tid, _ = await run_task(
        store, no_tools_spec(), tmp_path, actor, registry=custom_registry(store, [])
    )
    offered = {t.name for t in act_requests(actor)[0].tools}
    assert offered <= {"list_files", "read_file", "read_artifact"}, offered
    results = {e["tool"]: e for e in await events_of(store, tid, "op.result")}
    assert results["peek"]["status"] == "failed"


async def test_contract_naming_an_unregistered_tool_is_refused_at_start(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = parse_spec(
        {
            "objective": "file a ticket",
            "items": [{"id": "ticket", "title": "file the ticket"}],
            "tools": ["read_file", "create_tikcet"],
        }
    )
    actor = ScriptedModel(policy=lambda _: say("never asked"))
    with pytest.raises(errors.SpecError, match="create_tikcet"):
        await run_task(store, spec, tmp_path, actor)
    assert actor.calls == 0
    (task,) = await store.list_tasks()
    assert task.status not in ("running", "satisfied") and task.lease_owner is None
    assert await events_of(store, task.task_id, "round.started") == []


def test_cli_run_with_an_unregistered_tool_exits_2(tmp_path: Path) -> None:
    data = spec_dict(2, tools=["write_file", "wirte_file"])
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    db = tmp_path / "t.db"
    proc = tether("run", "spec.yaml", "--model", DONE, "--db", f"sqlite:///{db}", cwd=tmp_path)
    assert_clean_error(proc, 2, "wirte_file", "not registered")
    assert not (tmp_path / "out").exists()


async def test_done_when_rule_naming_an_unregistered_tool_is_refused_at_start(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = parse_spec(
        {
            "objective": "write the file",
            "items": [
                {"id": "a", "title": "write a", "done_when": {"kind": "op", "tool": "wirte_file"}}
            ],
            "tools": ["write_file"],
        }
    )
    actor = ScriptedModel(
        policy=lambda _: say("writing", tool_call("write_file", path="a", content="a"))
    )
    with pytest.raises(errors.SpecError, match="wirte_file"):
        await run_task(store, spec, tmp_path, actor)
    assert actor.calls == 0


async def test_evidence_from_naming_an_unregistered_tool_is_refused_at_start(
    store: MemoryStore, tmp_path: Path
) -> None:
    spec = parse_spec(
        {
            "objective": "write and index",
            "items": [
                {"id": "a", "title": "write a"},
                {"id": "index", "title": "index", "evidence_from": {"tools": ["lsit_files"]}},
            ],
            "tools": ["write_file", "list_files"],
        }
    )
    actor = ScriptedModel(policy=lambda _: say("listing", tool_call("list_files", path=".")))
    try:
        await run_task(store, spec, tmp_path, actor)
    except errors.SpecError as exc:
        assert "lsit_files" in str(exc)
        return
    raise AssertionError("a contract linking evidence from an unregistered tool was accepted")
